// arch_ops.h — the backend ops that belong to one architecture, registered by it.
//
// Backend (backend.h) declares the ops the trainer and several architectures share: GEMM, the
// residual, the top-k selection with the sparse decoder and backward (TopK, BatchTopK, Switch,
// AuxK), the decorrelation penalty, the optimizer. An op that only one architecture runs
// (ReLU's and JumpReLU's activations, Gated's two paths, BatchTopK's batch threshold, Switch's
// row permutations) is that architecture's: it declares an interface deriving from ArchOps
// (include/saetrain/arch/<name>.h) and describes it with one ArchOpSet:
//   - its ops' names (what timings and messages call them),
//   - its CPU reference, the definition every backend is held to (test_backend_parity runs
//     every registered set's case against it on every backend); a backend whose memory is the
//     host's runs it (Backend::arch_ops' default),
//   - a forwarding wrapper, so that a ForwardingBackend (bench_step's per-op timing, tests that
//     record what the trainer asks) passes every op through its around() hook.
// A backend with device memory registers its own implementation (the CUDA backend:
// src/cuda/arch_ops.cpp); a backend without one refuses the architecture at start-up with one
// line (arch_check_backend, arch.h), never at the first step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace saetrain {

class Backend;

// The base of an architecture's op interface (ReluOps, JumpReluOps, SwitchOps, ...). An
// implementation is made by a backend on first use and lives as long as that backend; its
// destructor must not call the backend (which may be partly destroyed by then).
class ArchOps {
public:
    virtual ~ArchOps() = default;
};

// Runs one op, by name, through a wrapper's hook: hook(op, call) calls call() (ForwardingBackend's
// around()).
using OpHook = std::function<void(const std::string& op, const std::function<void()>& call)>;

struct ArchOpSet {
    std::string name;              // the architecture's: "jumprelu"
    std::vector<std::string> ops;  // its ops, as the hook and messages name them
    // The CPU reference, on a backend whose memory is the host's (pointers are host pointers).
    std::function<std::unique_ptr<ArchOps>(Backend& host)> reference;
    // `inner` (this set's interface) with every op passed through hook(op name, call).
    std::function<std::unique_ptr<ArchOps>(ArchOps& inner, OpHook hook)> forward;
};

// `be`'s implementation of `set`; throws Error naming the backend, the architecture and its
// ops when `be` has none.
ArchOps& require_arch_ops(Backend& be, const ArchOpSet& set);
// The same, as the set's interface (Ops derives from ArchOps).
template <class Ops>
Ops& arch_ops(Backend& be, const ArchOpSet& set) {
    return static_cast<Ops&>(require_arch_ops(be, set));
}

}  // namespace saetrain
