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
#include "saetrain/perfmodel.h"  // MathMode

namespace saetrain {

struct CudaBackendOptions {
    int device = 0;
    // Precision of the GEMM operands (config gpu.gemm); products accumulate in fp32 and the
    // outputs stay fp32 in every mode.
    //   fp32: CUDA cores, results track the CPU backend (the default).
    //   tf32: tensor cores on fp32 operands (CUBLAS_COMPUTE_32F_FAST_TF32), 10-bit mantissas in
    //         the products; ~7x the fp32 rate on H100.
    //   bf16: operands rounded to bf16 (math::float_to_bf16_bits) into scratch copies before
    //         each GEMM, 8-bit mantissas; ~2x the tf32 rate. GEMMs with a dimension under 64
    //         (the b_dec correction) are memory-bound and stay fp32.
    MathMode gemm = MathMode::fp32;
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
