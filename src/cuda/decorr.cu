// The decorrelation penalty's kernels (decorr_grad, kernels.h): the latents' standardized
// activations, their Gram matrix's off-diagonal mean square and its gradient, summed in fixed
// orders (the same bits on every run).
#include "cuda_check.h"
#include "kernel_util.cuh"
#include "kernels.h"
#include "saetrain/backend.h"

namespace saetrain::cuda {
namespace {

// --- decorrelation penalty (decorr_grad) ---------------------------------------------------
// Column sums in double over [rows, n] by the 32 x 8 blocks over fixed row slices of the other
// column reductions: a block adds its row lanes in order (lane 0, then 1..7) and writes row
// blockIdx.y of the partials, part[(j * slices + slice) * n + c] for sum j; the finish kernels
// add the slices in order (decorr_col_sums). No atomics: the same bits on every run.
template <int kF>
__device__ void decorr_store_col_sums(double (&f)[kF], int64_t c, int64_t n, double* part) {
    __shared__ double sh[kF][kRowLanes][kColTile];
    for (int j = 0; j < kF; ++j) sh[j][threadIdx.y][threadIdx.x] = f[j];
    __syncthreads();
    if (threadIdx.y != 0 || c >= n) return;
    for (int l = 1; l < kRowLanes; ++l)
        for (int j = 0; j < kF; ++j) f[j] += sh[j][l][threadIdx.x];
    for (int j = 0; j < kF; ++j) part[(j * int64_t(gridDim.y) + blockIdx.y) * n + c] = f[j];
}

template <int kF>
__device__ void decorr_col_sums(const double* part, int slices, int64_t n, int64_t c,
                                double (&f)[kF]) {
    for (int j = 0; j < kF; ++j) f[j] = 0.0;
    for (int s = 0; s < slices; ++s)
        for (int j = 0; j < kF; ++j) f[j] += part[(int64_t(j) * slices + s) * n + c];
}

// u [rows, n] (zeroed) gets the pairs with val != 0. One thread per row walks its pairs in
// order, so a latent repeated in a row takes the row's last value there, as on the CPU.
__global__ void decorr_scatter_kernel(const float* z, const int32_t* idx, int64_t rows,
                                      int64_t width, int64_t n, float* u) {
    for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
         r += int64_t(gridDim.x) * blockDim.x) {
        for (int64_t j = 0; j < width; ++j) {
            const float v = z[r * width + j];
            if (v != 0.0f) u[r * n + idx[r * width + j]] = v;
        }
    }
}

// Per column: the sum of u (mean null), or of (u - mean[c])^2.
__global__ void decorr_moment_kernel(const float* u, const double* mean, int64_t rows, int64_t n,
                                     int64_t rows_per, double* part) {
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    double f[1] = {0.0};
    if (c < n) {
        if (mean) {
            const double m = mean[c];
            for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
                const double y = double(u[r * n + c]) - m;
                f[0] += y * y;
            }
        } else {
            for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) f[0] += u[r * n + c];
        }
    }
    decorr_store_col_sums(f, c, n, part);
}

__global__ void decorr_mean_kernel(const double* part, int slices, int64_t rows, int64_t n,
                                   double* mean) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        double f[1];
        decorr_col_sums(part, slices, n, c, f);
        mean[c] = f[0] / double(rows);
    }
}

// From the sums of squares about the mean: inv[c] = 1 / the column's norm (0 for a constant
// column), in double for the standardization and as float for the gradient.
__global__ void decorr_inv_norm_kernel(const double* part, int slices, int64_t n, double* inv,
                                       float* inv_norm) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        double f[1];
        decorr_col_sums(part, slices, n, c, f);
        const double v = f[0] > 0.0 ? 1.0 / sqrt(f[0]) : 0.0;
        inv[c] = v;
        inv_norm[c] = static_cast<float>(v);
    }
}

__global__ void decorr_center_kernel(float* u, const double* mean, const double* inv, int64_t total,
                                     int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i % n;
        u[i] = static_cast<float>((double(u[i]) - mean[c]) * inv[c]);
    }
}

// Block i: part[i] = sum over j != i of c[i, j]^2 in double (block_sum's fixed tree).
__global__ void decorr_offdiag_kernel(const float* c, int64_t n, double* part) {
    __shared__ double sh[kThreads];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {  // uniform across the block
        double s = 0;
        for (int64_t j = threadIdx.x; j < n; j += kThreads) {
            const double v = c[i * n + j];
            if (j != i) s += v * v;
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) part[i] = s;
    }
}

// One block: R = sqrt(sum part / (n (n - 1))) added to *stat; *factor = 2 / (n (n - 1) R), or
// 0 when R is not positive (NaN included): then decorr_apply leaves dz alone.
__global__ void decorr_rms_kernel(const double* part, int64_t n, float* stat, float* factor) {
    __shared__ double sh[kThreads];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        const double pairs = double(n) * double(n - 1);
        const double rms = sqrt(s / pairs);
        *stat += static_cast<float>(rms);
        *factor = rms > 0.0 ? static_cast<float>(2.0 / (pairs * rms)) : 0.0f;
    }
}

// c [n, n] -> G / factor: the diagonal zeroed (the factor is applied in decorr_apply, so the
// n x n matrix is not rewritten).
__global__ void decorr_zero_diagonal_kernel(float* c, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        c[i * n + i] = 0.0f;
}

// Per column: the sums of du and of u * du.
__global__ void decorr_grad_cols_kernel(const float* u, const float* du, int64_t rows, int64_t n,
                                        int64_t rows_per, double* part) {
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    double f[2] = {0.0, 0.0};
    if (c < n) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const float g = du[r * n + c];
            f[0] += g;
            f[1] += double(u[r * n + c]) * g;
        }
    }
    decorr_store_col_sums(f, c, n, part);
}

__global__ void decorr_grad_cols_finish_kernel(const double* part, int slices, int64_t rows,
                                               int64_t n, float* dmean, float* udu) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        double f[2];
        decorr_col_sums(part, slices, n, c, f);
        dmean[c] = static_cast<float>(f[0] / double(rows));
        udu[c] = static_cast<float>(f[1]);
    }
}

// The gradient through the standardization at u's element i (column c); sf = scale * factor
// (du, dmean and udu are those of G / factor, and linear in it).
__device__ __forceinline__ float decorr_dz(const float* u, const float* du, const float* inv_norm,
                                           const float* dmean, const float* udu, float sf,
                                           int64_t i, int64_t c) {
    return sf * inv_norm[c] * (du[i] - dmean[c] - u[i] * udu[c]);
}

__global__ void decorr_apply_dense_kernel(const float* u, const float* du, const float* inv_norm,
                                          const float* dmean, const float* udu, const float* factor,
                                          float scale, int64_t total, int64_t n, float* dz) {
    if (*factor == 0.0f) return;  // R not positive: no gradient
    const float sf = scale * *factor;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x)
        dz[i] += decorr_dz(u, du, inv_norm, dmean, udu, sf, i, i % n);
}

__global__ void decorr_apply_pairs_kernel(const float* z, const int32_t* idx, int64_t width,
                                          const float* u, const float* du, const float* inv_norm,
                                          const float* dmean, const float* udu, const float* factor,
                                          float scale, int64_t entries, int64_t n, float* dz) {
    if (*factor == 0.0f) return;
    const float sf = scale * *factor;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < entries;
         e += int64_t(gridDim.x) * blockDim.x) {
        if (z[e] == 0.0f) continue;
        const int64_t c = idx[e];
        dz[e] += decorr_dz(u, du, inv_norm, dmean, udu, sf, (e / width) * n + c, c);
    }
}

}  // namespace

void decorr_standardize(cudaStream_t s, Workspace& ws, const float* z, const int32_t* idx,
                        int64_t width, int64_t rows, int64_t n, float* u, float* inv_norm) {
    if (rows <= 0 || n <= 0) return;
    const int64_t total = rows * n;
    if (idx) {
        SAE_CUDA_CHECK(cudaMemsetAsync(u, 0, sizeof(float) * total, s));
        if (width > 0) {
            decorr_scatter_kernel<<<grid_for(rows), kThreads, 0, s>>>(z, idx, rows, width, n, u);
            SAE_CUDA_LAUNCH_CHECK();
        }
    } else {
        SAE_CUDA_CHECK(cudaMemcpyAsync(u, z, sizeof(float) * total, cudaMemcpyDeviceToDevice, s));
    }
    const RowSlices sl = row_slices(rows, n);
    auto* part = ws.get<double>(0, sl.slices * n);
    auto* col = ws.get<double>(1, 2 * n);
    double *mean = col, *inv = col + n;
    decorr_moment_kernel<<<sl.grid, sl.block, 0, s>>>(u, nullptr, rows, n, sl.rows_per, part);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_mean_kernel<<<grid_for(n), kThreads, 0, s>>>(part, sl.slices, rows, n, mean);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_moment_kernel<<<sl.grid, sl.block, 0, s>>>(u, mean, rows, n, sl.rows_per, part);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_inv_norm_kernel<<<grid_for(n), kThreads, 0, s>>>(part, sl.slices, n, inv, inv_norm);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_center_kernel<<<grid_for(total), kThreads, 0, s>>>(u, mean, inv, total, n);
    SAE_CUDA_LAUNCH_CHECK();
}

void decorr_gram(cudaStream_t s, Workspace& ws, float* c, int64_t n, bool grad, float* stat,
                 float* factor) {
    if (n <= 0) return;
    auto* part = ws.get<double>(0, n);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    decorr_offdiag_kernel<<<blocks, kThreads, 0, s>>>(c, n, part);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_rms_kernel<<<1, kThreads, 0, s>>>(part, n, stat, factor);
    SAE_CUDA_LAUNCH_CHECK();
    if (grad) {
        decorr_zero_diagonal_kernel<<<grid_for(n), kThreads, 0, s>>>(c, n);
        SAE_CUDA_LAUNCH_CHECK();
    }
}

void decorr_apply(cudaStream_t s, Workspace& ws, const float* z, const int32_t* idx, int64_t width,
                  int64_t rows, int64_t n, const float* u, const float* du, const float* inv_norm,
                  const float* factor, float scale, float* dz) {
    if (rows <= 0 || n <= 0) return;
    const RowSlices sl = row_slices(rows, n);
    auto* part = ws.get<double>(0, 2 * sl.slices * n);
    auto* col = ws.get<float>(1, 2 * n);
    float *dmean = col, *udu = col + n;
    decorr_grad_cols_kernel<<<sl.grid, sl.block, 0, s>>>(u, du, rows, n, sl.rows_per, part);
    SAE_CUDA_LAUNCH_CHECK();
    decorr_grad_cols_finish_kernel<<<grid_for(n), kThreads, 0, s>>>(part, sl.slices, rows, n, dmean,
                                                                    udu);
    SAE_CUDA_LAUNCH_CHECK();
    if (idx) {
        const int64_t entries = rows * width;
        if (entries <= 0) return;
        decorr_apply_pairs_kernel<<<grid_for(entries), kThreads, 0, s>>>(
            z, idx, width, u, du, inv_norm, dmean, udu, factor, scale, entries, n, dz);
    } else {
        decorr_apply_dense_kernel<<<grid_for(rows * n), kThreads, 0, s>>>(
            u, du, inv_norm, dmean, udu, factor, scale, rows * n, n, dz);
    }
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace saetrain::cuda
