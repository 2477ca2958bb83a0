// arch_ops.h (src/cuda) — the CUDA backend's implementations of the architectures' own ops
// (include/saetrain/arch_ops.h): one line each in arch_ops_impls(), looked up by
// CudaBackend::arch_ops. A set without a line here is refused on this backend at start-up.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "kernels.h"  // defines: Workspace
#include "saetrain/arch_ops.h"

namespace saetrain::cuda {

// What an implementation queues its kernels on: the backend's stream and scratch (both outlive
// it; its destructor touches neither).
struct OpContext {
    cudaStream_t stream = nullptr;
    Workspace* ws = nullptr;
};

struct ArchOpsImpl {
    const ArchOpSet* set;
    std::unique_ptr<ArchOps> (*make)(const OpContext& ctx);
};

// Every architecture op set this backend implements.
const std::vector<ArchOpsImpl>& arch_ops_impls();

}  // namespace saetrain::cuda
