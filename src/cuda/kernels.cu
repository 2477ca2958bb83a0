// Element-wise, row-wise and column-reduction kernels of the CUDA backend. Per-element math
// comes from sae_math.h, shared with the CPU backend.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "saetrain/backend.h"

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

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;  // every lane holds the same sum (butterfly: same order on every lane)
}

// --- element-wise --------------------------------------------------------------------------
__global__ void fill_kernel(float* x, int64_t n, float value) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        x[i] = value;
}

__global__ void scale_kernel(float* x, int64_t rows, int64_t cols, int64_t ld, float beta) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
         i += int64_t(gridDim.x) * blockDim.x) {
        float& v = x[(i / cols) * ld + i % cols];
        v = beta == 0.0f ? 0.0f : beta * v;  // beta 0 overwrites, as BLAS does
    }
}

__global__ void sub_rows_kernel(float* out, const float* x, const float* bias, int64_t total,
                                int64_t cols) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = x[i] - bias[i % cols];
}

__global__ void broadcast_rows_kernel(float* out, const float* bias, int64_t total, int64_t cols) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = bias[i % cols];
}

__global__ void relu_forward_kernel(float* pre, const float* b_enc, int64_t total, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x)
        pre[i] = math::relu(pre[i] + b_enc[i % n]);
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                            math::AdamScalars a) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float pi = p[i], mi = m[i], vi = v[i];
        math::adam_update(pi, mi, vi, g[i], a);
        p[i] = pi, m[i] = mi, v[i] = vi;
    }
}

__global__ void widen_kernel(const uint16_t* src, float* dst, int64_t n, bool bf16) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = bf16 ? math::bf16_bits_to_float(src[i]) : math::fp16_bits_to_float(src[i]);
}

__global__ void round_to_bf16_kernel(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                     uint16_t* dst) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = math::float_to_bf16_bits(x[(i / cols) * ld + i % cols]);
}

// --- reductions ----------------------------------------------------------------------------
__global__ void sum_squares_kernel(const float* x, int64_t n, double* partial) {
    __shared__ double sh[kThreads];
    double s = 0;
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * kThreads)
        s += double(x[i]) * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: out = sum v (fixed order); optionally also stat += float(out).
__global__ void sum_doubles_kernel(const double* v, int64_t len, double* out, float* stat) {
    __shared__ double sh[kThreads];
    double s = 0;
    for (int64_t i = threadIdx.x; i < len; i += kThreads) s += v[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        if (out) *out = s;
        if (stat) *stat += static_cast<float>(s);
    }
}

// Column reductions use 32 x 8 blocks: 32 adjacent columns (coalesced rows), 8 row lanes;
// blockIdx.y takes one fixed slice of the rows. Partials [slices, cols] are summed in slice
// order by a second kernel.
constexpr int kColTile = 32, kRowLanes = 8;

struct RowSlices {
    int slices;
    int64_t rows_per;
};
RowSlices row_slices(int64_t rows, int64_t cols) {
    if (rows <= 0) return {1, 1};  // one empty slice: the partials come out zero
    // Enough blocks to fill a large GPU (~4 per SM on 132 SMs) without slices under 64 rows.
    const int64_t col_tiles = (cols + kColTile - 1) / kColTile;
    const int64_t want = std::max<int64_t>(1, 512 / col_tiles + 1);
    const int64_t slices = std::min<int64_t>(std::min<int64_t>((rows + 63) / 64, want), 1024);
    const int64_t per = (rows + slices - 1) / slices;
    return {static_cast<int>((rows + per - 1) / per), per};
}

__global__ void residual_kernel(float* xh, const float* x, int64_t rows, int64_t d,
                                int64_t rows_per, float grad_scale, float* part_x, float* part_e,
                                double* part_sse, double* part_sx2) {
    __shared__ float sh_x[kRowLanes][kColTile], sh_e[kRowLanes][kColTile];
    __shared__ double sh_d[kThreads];
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    float xs = 0, es = 0;
    double sse = 0, sx2 = 0;
    if (c < d) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const float xv = x[r * d + c];
            const float err = xh[r * d + c] - xv;
            const float e = grad_scale * err;
            xh[r * d + c] = e;
            sse += double(err) * err;
            sx2 += double(xv) * xv;
            xs += xv;
            es += e;
        }
    }
    sh_x[threadIdx.y][threadIdx.x] = xs;
    sh_e[threadIdx.y][threadIdx.x] = es;
    __syncthreads();
    if (threadIdx.y == 0 && c < d) {
        for (int l = 1; l < kRowLanes; ++l) xs += sh_x[l][threadIdx.x], es += sh_e[l][threadIdx.x];
        part_x[blockIdx.y * d + c] = xs;
        part_e[blockIdx.y * d + c] = es;
    }
    const int tid = threadIdx.y * kColTile + threadIdx.x;
    const int64_t b = blockIdx.y * int64_t(gridDim.x) + blockIdx.x;
    // block_sum indexes by threadIdx.x; use a flat copy instead for the 2-D block.
    sh_d[tid] = sse;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (tid < s) sh_d[tid] += sh_d[tid + s];
        __syncthreads();
    }
    if (tid == 0) part_sse[b] = sh_d[0];
    __syncthreads();
    sh_d[tid] = sx2;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (tid < s) sh_d[tid] += sh_d[tid + s];
        __syncthreads();
    }
    if (tid == 0) part_sx2[b] = sh_d[0];
}

// out_a[c] = sum_s part_a[s, c] (and out_b likewise), slices in order.
__global__ void sum_slices_kernel(const float* part_a, const float* part_b, int slices,
                                  int64_t cols, float* out_a, float* out_b) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols;
         c += int64_t(gridDim.x) * blockDim.x) {
        float a = 0, b = 0;
        for (int s = 0; s < slices; ++s) a += part_a[s * cols + c], b += part_b[s * cols + c];
        out_a[c] = a;
        out_b[c] = b;
    }
}

__global__ void relu_backward_kernel(const float* z, float* dz, const float* norms, float l1,
                                     int64_t rows, int64_t n, int64_t rows_per, float* part_g,
                                     float* part_z, int32_t* part_f) {
    __shared__ float sh_g[kRowLanes][kColTile], sh_z[kRowLanes][kColTile];
    __shared__ int32_t sh_f[kRowLanes][kColTile];
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    float gs = 0, zs = 0;
    int32_t fs = 0;
    if (c < n) {
        const float l1n = l1 * norms[c];
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const float zv = z[r * n + c];
            const float gv = math::relu_l1_grad(zv, dz[r * n + c], l1n);
            dz[r * n + c] = gv;
            gs += gv;
            zs += zv;
            fs += zv > 0.0f;
        }
    }
    sh_g[threadIdx.y][threadIdx.x] = gs;
    sh_z[threadIdx.y][threadIdx.x] = zs;
    sh_f[threadIdx.y][threadIdx.x] = fs;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        for (int l = 1; l < kRowLanes; ++l)
            gs += sh_g[l][threadIdx.x], zs += sh_z[l][threadIdx.x], fs += sh_f[l][threadIdx.x];
        part_g[blockIdx.y * n + c] = gs;
        part_z[blockIdx.y * n + c] = zs;
        part_f[blockIdx.y * n + c] = fs;
    }
}

__global__ void relu_backward_finish_kernel(const float* part_g, const float* part_z,
                                            const int32_t* part_f, int slices, int64_t n,
                                            const float* norms, float* db_enc, float* z_col_sum,
                                            int32_t* fires, double* col_l1, double* col_l0) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        float g = 0, zs = 0;
        int32_t f = 0;
        for (int s = 0; s < slices; ++s)
            g += part_g[s * n + c], zs += part_z[s * n + c], f += part_f[s * n + c];
        db_enc[c] = g;
        z_col_sum[c] = zs;
        fires[c] = f;
        col_l1[c] = double(zs) * norms[c];
        col_l0[c] = f;
    }
}

// --- row-wise (one warp per row of w [rows, cols]) -----------------------------------------
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ float row_dot(const float* a, const float* b, int64_t cols) {
    float s = 0;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32) s += a[c] * b[c];
    return warp_sum(s);
}

__global__ void row_norms_kernel(const float* w, int64_t rows, int64_t cols, float* norms) {
    const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
    if (r >= rows) return;
    const float* wr = w + r * cols;
    const float s = row_dot(wr, wr, cols);
    if (threadIdx.x % 32 == 0) norms[r] = sqrtf(s);
}

__global__ void project_out_kernel(const float* w, float* g, int64_t rows, int64_t cols) {
    const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
    if (r >= rows) return;
    const float* wr = w + r * cols;
    float* gr = g + r * cols;
    const float ww = row_dot(wr, wr, cols);
    if (ww <= 0.0f) return;
    const float s = row_dot(wr, gr, cols) / ww;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32) gr[c] -= s * wr[c];
}

__global__ void normalize_rows_kernel(float* w, int64_t rows, int64_t cols) {
    const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
    if (r >= rows) return;
    float* wr = w + r * cols;
    const float nrm = sqrtf(row_dot(wr, wr, cols));
    if (nrm <= 0.0f) return;
    const float inv = 1.0f / nrm;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32) wr[c] *= inv;
}

__global__ void add_norm_grad_kernel(const float* w, const float* coeff, float scale, float* g,
                                     int64_t rows, int64_t cols) {
    const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
    if (r >= rows) return;
    const float* wr = w + r * cols;
    const float nrm = sqrtf(row_dot(wr, wr, cols));
    if (nrm <= 0.0f) return;
    const float s = scale * coeff[r] / nrm;
    float* gr = g + r * cols;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32) gr[c] += s * wr[c];
}

int row_grid(int64_t rows) {
    return static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

// --- Workspace -----------------------------------------------------------------------------
Workspace::~Workspace() {
    for (void* p : p_)
        if (p) cudaFreeAsync(p, stream_);  // no throw from a destructor; errors surface later
}

void* Workspace::get(int slot, size_t bytes) {
    SAE_ENFORCE(slot >= 0 && slot < kSlots, "workspace slot {} out of range", slot);
    bytes = std::max<size_t>(bytes, 256);
    if (bytes > cap_[slot]) {
        if (p_[slot]) SAE_CUDA_CHECK(cudaFreeAsync(p_[slot], stream_));
        p_[slot] = nullptr;
        cap_[slot] = 0;
        SAE_CUDA_CHECK(cudaMallocAsync(&p_[slot], bytes, stream_));
        cap_[slot] = bytes;
    }
    return p_[slot];
}

// --- launchers -----------------------------------------------------------------------------
void fill(cudaStream_t s, float* x, int64_t n, float value) {
    if (n <= 0) return;
    fill_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, value);
    SAE_CUDA_LAUNCH_CHECK();
}

void scale(cudaStream_t s, float* x, int64_t rows, int64_t cols, int64_t ld, float beta) {
    if (rows * cols <= 0 || beta == 1.0f) return;
    scale_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(x, rows, cols, ld, beta);
    SAE_CUDA_LAUNCH_CHECK();
}

double sum_squares(cudaStream_t s, Workspace& ws, const float* x, int64_t n) {
    const int blocks = grid_for(n, kThreads * 8, 1024);  // fixed for a given n
    auto* part = ws.get<double>(0, blocks + 1);
    sum_squares_kernel<<<blocks, kThreads, 0, s>>>(x, n, part);
    SAE_CUDA_LAUNCH_CHECK();
    sum_doubles_kernel<<<1, kThreads, 0, s>>>(part, blocks, part + blocks, nullptr);
    SAE_CUDA_LAUNCH_CHECK();
    double out = 0;
    SAE_CUDA_CHECK(cudaMemcpyAsync(&out, part + blocks, sizeof(double), cudaMemcpyDeviceToHost, s));
    SAE_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
}

void sub_rows(cudaStream_t s, float* out, const float* x, const float* bias, int64_t rows,
              int64_t cols) {
    if (rows * cols <= 0) return;
    sub_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(out, x, bias, rows * cols, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void broadcast_rows(cudaStream_t s, float* out, const float* bias, int64_t rows, int64_t cols) {
    if (rows * cols <= 0) return;
    broadcast_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(out, bias, rows * cols, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void residual(cudaStream_t s, Workspace& ws, float* xh, const float* x, int64_t rows, int64_t d,
              float grad_scale, float* x_col_sum, float* db_dec, float* stats) {
    if (d <= 0) return;
    const RowSlices sl = row_slices(rows, d);
    const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile),
                    static_cast<unsigned>(sl.slices));
    const int64_t blocks = int64_t(grid.x) * grid.y;
    auto* part_x = ws.get<float>(0, sl.slices * d);
    auto* part_e = ws.get<float>(1, sl.slices * d);
    auto* part_d = ws.get<double>(2, 2 * blocks);
    residual_kernel<<<grid, dim3(kColTile, kRowLanes), 0, s>>>(
        xh, x, rows, d, sl.rows_per, grad_scale, part_x, part_e, part_d, part_d + blocks);
    SAE_CUDA_LAUNCH_CHECK();
    sum_slices_kernel<<<grid_for(d), kThreads, 0, s>>>(part_x, part_e, sl.slices, d, x_col_sum,
                                                       db_dec);
    SAE_CUDA_LAUNCH_CHECK();
    add_sum_to_stat(s, part_d, blocks, stats + kStatSse);
    add_sum_to_stat(s, part_d + blocks, blocks, stats + kStatSumSqX);
}

void relu_forward(cudaStream_t s, float* pre, const float* b_enc, int64_t rows, int64_t n) {
    if (rows * n <= 0) return;
    relu_forward_kernel<<<grid_for(rows * n), kThreads, 0, s>>>(pre, b_enc, rows * n, n);
    SAE_CUDA_LAUNCH_CHECK();
}

void relu_backward(cudaStream_t s, Workspace& ws, const float* z, float* dz, const float* norms,
                   float l1, int64_t rows, int64_t n, float* db_enc, float* z_col_sum,
                   int32_t* fires, float* stats) {
    if (n <= 0) return;
    const RowSlices sl = row_slices(rows, n);
    const dim3 grid(static_cast<unsigned>((n + kColTile - 1) / kColTile),
                    static_cast<unsigned>(sl.slices));
    auto* part_g = ws.get<float>(0, sl.slices * n);
    auto* part_z = ws.get<float>(1, sl.slices * n);
    auto* part_f = ws.get<int32_t>(2, sl.slices * n);
    auto* col = ws.get<double>(3, 2 * n);
    relu_backward_kernel<<<grid, dim3(kColTile, kRowLanes), 0, s>>>(
        z, dz, norms, l1, rows, n, sl.rows_per, part_g, part_z, part_f);
    SAE_CUDA_LAUNCH_CHECK();
    relu_backward_finish_kernel<<<grid_for(n), kThreads, 0, s>>>(
        part_g, part_z, part_f, sl.slices, n, norms, db_enc, z_col_sum, fires, col, col + n);
    SAE_CUDA_LAUNCH_CHECK();
    add_sum_to_stat(s, col, n, stats + kStatL1);
    add_sum_to_stat(s, col + n, n, stats + kStatL0);
}

void add_sum_to_stat(cudaStream_t s, const double* v, int64_t len, float* stat) {
    sum_doubles_kernel<<<1, kThreads, 0, s>>>(v, len, nullptr, stat);
    SAE_CUDA_LAUNCH_CHECK();
}

void row_norms(cudaStream_t s, const float* w, int64_t rows, int64_t cols, float* norms) {
    if (rows <= 0) return;
    row_norms_kernel<<<row_grid(rows), kThreads, 0, s>>>(w, rows, cols, norms);
    SAE_CUDA_LAUNCH_CHECK();
}

void project_out_parallel(cudaStream_t s, const float* w, float* g, int64_t rows, int64_t cols) {
    if (rows <= 0) return;
    project_out_kernel<<<row_grid(rows), kThreads, 0, s>>>(w, g, rows, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void normalize_rows(cudaStream_t s, float* w, int64_t rows, int64_t cols) {
    if (rows <= 0) return;
    normalize_rows_kernel<<<row_grid(rows), kThreads, 0, s>>>(w, rows, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void add_norm_grad(cudaStream_t s, const float* w, const float* coeff, float scale_, float* g,
                   int64_t rows, int64_t cols) {
    if (rows <= 0) return;
    add_norm_grad_kernel<<<row_grid(rows), kThreads, 0, s>>>(w, coeff, scale_, g, rows, cols);
    SAE_CUDA_LAUNCH_CHECK();
}

void adam(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n,
          const math::AdamScalars& a) {
    if (n <= 0) return;
    adam_kernel<<<grid_for(n), kThreads, 0, s>>>(p, g, m, v, n, a);
    SAE_CUDA_LAUNCH_CHECK();
}

void widen_16bit(cudaStream_t s, const uint16_t* src, float* dst, int64_t n, bool bf16) {
    if (n <= 0) return;
    widen_kernel<<<grid_for(n), kThreads, 0, s>>>(src, dst, n, bf16);
    SAE_CUDA_LAUNCH_CHECK();
}

void round_to_bf16(cudaStream_t s, const float* x, int64_t rows, int64_t cols, int64_t ld,
                   uint16_t* dst) {
    if (rows * cols <= 0) return;
    if (ld == cols) {  // packed: one flat pass, no index arithmetic
        cols = ld = rows * cols;
        rows = 1;
    }
    round_to_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(x, rows, cols, ld, dst);
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace saetrain::cuda
