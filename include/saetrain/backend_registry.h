// backend_registry.h — which Backend a rank trains on: the config's `backend` key, the devices
// the rank sees, and the backends this build has.
//
// Each backend directory (src/cpu, src/cuda) describes itself with one BackendKind; the
// registry (src/backend_registry.cpp) lists the kinds this build has, in the order `backend:
// auto` prefers them. Adding a backend: its directory, its CMake option, one line in that list;
// test_backend_parity runs every op of the new backend against the CPU's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "saetrain/backend.h"

namespace saetrain {

// What the config and the rank's placement ask of the backend.
struct BackendRequest {
    std::string choice = "auto";  // config `backend`: a kind's name, or auto
    int threads = 0;              // CPU threads (<= 0: every core the process may use)
    int local_rank = 0;           // rank on its node: the device is local_rank % devices
    std::string gemm = "fp32";    // gpu.gemm: fp32 | tf32 | bf16
    bool deterministic = true;    // gpu.deterministic
};

struct BackendKind {
    std::string name;   // the config's `backend:` value
    std::string label;  // in messages: "CUDA", "CPU"
    // Devices of this kind the process can see; a host backend sees 1.
    int (*devices)();
    // Said when the config names this kind but the rank sees no device of it.
    std::string no_device_hint;
    // Makes the backend; may add a remark for the start-up line to `note` (a setting that does
    // not apply to it).
    std::unique_ptr<Backend> (*create)(const BackendRequest& request, std::string* note);
};

const BackendKind& cpu_backend_kind();
const BackendKind& cuda_backend_kind();  // CUDA builds only

// The kinds this build has, most preferred first (auto takes the first with a device).
const std::vector<const BackendKind*>& backend_kinds();

// The backend the request names (or auto's choice). `note` says what auto chose and why, and
// what the chosen backend ignores.
// Throws saetrain::Error naming the `backend` key when the kind is not built or has no device.
std::unique_ptr<Backend> make_backend(const BackendRequest& request, std::string* note);

}  // namespace saetrain
