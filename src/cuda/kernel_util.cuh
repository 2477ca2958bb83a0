// kernel_util.cuh (src/cuda) — what the CUDA backend's kernel files share: the block size, the
// grid for an element count, a block sum in a fixed order, and the column reductions' blocks
// over fixed row slices. Private to src/cuda; each
// translation unit gets its own copy (an unnamed namespace).
#pragma once

#include <algorithm>
#include <cstdint>

namespace saetrain::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int threads = kThreads, int64_t max_blocks = 65535LL * 16) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min((n + threads - 1) / threads, max_blocks)));
}

// Sum over a block of kThreads values in a fixed tree order (deterministic).
template <typename T>
__device__ T block_sum(T v, T* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const T r = sh[0];
    __syncthreads();
    return r;
}

// Column reductions use 32 x 8 blocks: 32 adjacent columns (coalesced rows), 8 row lanes;
// blockIdx.y takes one fixed slice of the rows. Partials [slices, cols] are summed in slice
// order by a second kernel.
constexpr int kColTile = 32, kRowLanes = 8;

struct RowSlices {
    int slices;
    int64_t rows_per;
    dim3 grid;   // (column tiles, slices): one block per kColTile columns of one slice
    dim3 block;  // (kColTile, kRowLanes)
};
RowSlices row_slices(int64_t rows, int64_t cols) {
    const int64_t col_tiles = (cols + kColTile - 1) / kColTile;
    int slices = 1;  // rows <= 0: one empty slice, the partials come out zero
    int64_t per = 1;
    if (rows > 0) {
        // Enough blocks to fill a large GPU (~4 per SM on 132 SMs) without slices under 64 rows.
        const int64_t want = std::max<int64_t>(1, 512 / col_tiles + 1);
        const int64_t most = std::min<int64_t>(std::min<int64_t>((rows + 63) / 64, want), 1024);
        per = (rows + most - 1) / most;
        slices = static_cast<int>((rows + per - 1) / per);
    }
    return {slices, per, dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(slices)),
            dim3(kColTile, kRowLanes)};
}

}  // namespace
}  // namespace saetrain::cuda
