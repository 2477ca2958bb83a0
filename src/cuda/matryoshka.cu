// The Matryoshka BatchTopK SAE's prefix mask (arch/matryoshka.cpp): a selection's values kept
// for the latents below a prefix, one thread per (idx, val) pair.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"

namespace saetrain::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 16)));
}

__global__ void prefix_mask_kernel(const int32_t* idx, const float* val, int64_t count,
                                   int64_t prefix, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = idx[i] < prefix ? val[i] : 0.0f;
}

}  // namespace

void prefix_mask(cudaStream_t s, const int32_t* idx, const float* val, int64_t count,
                 int64_t prefix, float* out) {
    if (count <= 0) return;
    prefix_mask_kernel<<<blocks_for(count), kThreads, 0, s>>>(idx, val, count, prefix, out);
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace saetrain::cuda
