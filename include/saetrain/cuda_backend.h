// cuda_backend.h — the Backend on one NVIDIA GPU (CUDA builds only).
//
// Everything runs in order on one stream the backend owns: alloc/free are stream-ordered
// (cudaMallocAsync), GEMMs go through cuBLASLt with the plan (descriptors, layouts, algorithm)
// cached per shape, and the SAE ops are kernels whose per-element math comes from sae_math.h.
// download() and sum_squares() wait for the stream (the trainer reads their results on the
// host); every other call returns once the work is queued. Reductions use a fixed split of
// the work, so results do not depend on timing: two runs of the same step agree bit for bit
// (with `deterministic`, also the sparse TopK backward).
#pragma once

#include <cstdint>
#include <memory>

#include "saetrain/backend.h"

namespace saetrain {

struct CudaBackendOptions {
    int device = 0;
    // GEMMs in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32): ~8x the fp32 peak on A100/H100, with a
    // 10-bit mantissa in the products. Off by default, so results track the CPU backend.
    bool tf32 = false;
    // Sparse TopK backward by sorting entries per latent (no float atomics): bit-reproducible.
    // Off: scatter with atomicAdd (fewer passes, run-to-run differences in the last bits).
    bool deterministic = true;
};

std::unique_ptr<Backend> make_cuda_backend(int device);
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

// The backend's stream as an opaque cudaStream_t (for NcclComm's ordering); `backend` must
// come from make_cuda_backend.
void* cuda_backend_stream(Backend& backend);

// Widens 16-bit activations on the device, in the backend's stream: dst[i] = float(src[i]),
// src holding fp16 bits (bf16 = false) or bf16 bits (bf16 = true). Both pointers are device
// memory of `backend`.
void cuda_widen_16bit(Backend& backend, const uint16_t* src, float* dst, int64_t n, bool bf16);

}  // namespace saetrain
