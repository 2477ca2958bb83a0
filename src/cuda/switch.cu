// Row permutation kernels of the Switch SAE (arch/switch.cpp): the tokens of each expert
// gathered into one block of rows, and the per-row dot products of the router's gradient.
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

__global__ void gather_rows_kernel(float* dst, const float* src, const int32_t* rows_of,
                                   const float* scale, float beta, int64_t rows, int64_t cols) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        const float v = (scale ? scale[r] : 1.0f) * src[int64_t(rows_of[r]) * cols + c];
        dst[i] = beta == 0.0f ? v : beta * dst[i] + v;
    }
}

__global__ void gather_index_rows_kernel(int32_t* dst, const int32_t* src, const int32_t* rows_of,
                                         int64_t rows, int64_t width) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * width;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = src[int64_t(rows_of[i / width]) * width + i % width];
}

// One warp per row (grid-stride over rows); lanes sum a strided slice, then a butterfly.
__global__ void row_dots_kernel(const float* a, const float* b, int64_t rows, int64_t cols,
                                float* out) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < rows; r += warps) {
        float s = 0.0f;
        for (int64_t c = lane; c < cols; c += 32) s += a[r * cols + c] * b[r * cols + c];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) out[r] = s;
    }
}

__global__ void offset_indices_kernel(int32_t* idx, int64_t count, int32_t offset) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        idx[i] += offset;
}

}  // namespace

void gather_rows(cudaStream_t s, float* dst, const float* src, const int32_t* rows_of,
                 const float* scale, float beta, int64_t rows, int64_t cols) {
    if (rows * cols <= 0) return;
    gather_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(dst, src, rows_of, scale, beta,
                                                                    rows, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void gather_index_rows(cudaStream_t s, int32_t* dst, const int32_t* src, const int32_t* rows_of,
                       int64_t rows, int64_t width) {
    if (rows * width <= 0) return;
    gather_index_rows_kernel<<<blocks_for(rows * width), kThreads, 0, s>>>(dst, src, rows_of, rows,
                                                                           width);
    SAE_CUDA_LAUNCH_CHECK();
}

void row_dots(cudaStream_t s, const float* a, const float* b, int64_t rows, int64_t cols,
              float* out) {
    if (rows <= 0) return;
    row_dots_kernel<<<blocks_for(rows * 32), kThreads, 0, s>>>(a, b, rows, cols, out);
    SAE_CUDA_LAUNCH_CHECK();
}

void offset_indices(cudaStream_t s, int32_t* idx, int64_t count, int32_t offset) {
    if (count <= 0) return;
    offset_indices_kernel<<<blocks_for(count), kThreads, 0, s>>>(idx, count, offset);
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace saetrain::cuda
