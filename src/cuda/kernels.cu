// Element-wise, row-wise and column-reduction kernels of the CUDA backend. Per-element math
// comes from sae_math.h, shared with the CPU backend.
#include <algorithm>

#include "cuda_check.h"
#include "kernel_util.cuh"
#include "kernels.h"
#include "saetrain/backend.h"

namespace saetrain::cuda {
namespace {

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

// v = pre + b_enc in place, z = v * H(v - theta) with theta = exp(log_threshold).
__global__ void jumprelu_forward_kernel(float* pre, const float* b_enc, const float* log_threshold,
                                        int64_t total, int64_t n, float* z) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i % n;
        const float v = pre[i] + b_enc[c];
        pre[i] = v;
        z[i] = math::jumprelu(v, expf(log_threshold[c]));
    }
}

// z = H(g) * relu(m), gate = relu(g), with g = pre + b_gate, m = pre * exp(r_mag) + b_mag.
__global__ void gated_forward_kernel(const float* pre, const float* b_gate, const float* r_mag,
                                     const float* b_mag, int64_t total, int64_t n, float* z,
                                     float* gate) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i % n;
        const float g = pre[i] + b_gate[c], m = pre[i] * expf(r_mag[c]) + b_mag[c];
        z[i] = math::gated(g, m);
        gate[i] = math::relu(g);
    }
}

__global__ void swap_kernel(float* a, float* b, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const float t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

// y = a x + b y; b == 0 overwrites (a NaN or Inf in y does not survive), as BLAS does.
__global__ void axpby_kernel(float* y, const float* x, float a, float b, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        y[i] = b == 0.0f ? a * x[i] : a * x[i] + b * y[i];
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                            math::AdamScalars a) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float pi = p[i], mi = m[i], vi = v[i];
        math::optimizer_update(pi, mi, vi, g[i], a);
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

// The JumpReLU and Gated backward kernels reduce columns as relu_backward does (32 x 8
// blocks over fixed row slices, then a finish kernel adding the slices in order), for several
// float sums and one int count per column. The two helpers below are that pattern's ends.

// Adds the kF float sums and the count each thread holds for column c over the block's row
// lanes (lane 0 first, then 1..7: a fixed order) and writes the block's results to row
// blockIdx.y of the partials: part_f[(j * slices + slice) * n + c] for sum j, part_i[slice * n
// + c] for the count.
template <int kF>
__device__ void store_col_partials(float (&f)[kF], int32_t count, int64_t c, int64_t n,
                                   float* part_f, int32_t* part_i) {
    __shared__ float sh_f[kF][kRowLanes][kColTile];
    __shared__ int32_t sh_i[kRowLanes][kColTile];
    for (int j = 0; j < kF; ++j) sh_f[j][threadIdx.y][threadIdx.x] = f[j];
    sh_i[threadIdx.y][threadIdx.x] = count;
    __syncthreads();
    if (threadIdx.y != 0 || c >= n) return;
    for (int l = 1; l < kRowLanes; ++l) {
        for (int j = 0; j < kF; ++j) f[j] += sh_f[j][l][threadIdx.x];
        count += sh_i[l][threadIdx.x];
    }
    for (int j = 0; j < kF; ++j) part_f[(j * int64_t(gridDim.y) + blockIdx.y) * n + c] = f[j];
    part_i[blockIdx.y * n + c] = count;
}

// Column c's totals: the partials of store_col_partials summed over the slices in order.
template <int kF>
__device__ void sum_col_partials(const float* part_f, const int32_t* part_i, int slices, int64_t n,
                                 int64_t c, float (&f)[kF], int32_t& count) {
    for (int j = 0; j < kF; ++j) f[j] = 0.0f;
    count = 0;
    for (int s = 0; s < slices; ++s) {
        for (int j = 0; j < kF; ++j) f[j] += part_f[(int64_t(j) * slices + s) * n + c];
        count += part_i[s * n + c];
    }
}

// dz -> dv in place (math::jumprelu_grad); per column: sum dv, sum dtheta, firing count, and
// with the penalties on the decoder norms (kNorms: norms set) the sums of their dL/d||W_dec||,
// of the tanh values (tanh_scale > 0) and of the pre-activation loss (dead_mask set).
template <bool kNorms>
__global__ void jumprelu_backward_kernel(const float* v, float* dz, const float* log_threshold,
                                         float bandwidth, float l0, const float* norms,
                                         float tanh_scale, const float* dead_mask, float pre_act,
                                         int64_t rows, int64_t n, int64_t rows_per, float* part_f,
                                         int32_t* part_i) {
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    float sums[kNorms ? 5 : 2] = {};  // dv, dtheta (, dnorm, tanh, pre-activation loss)
    int32_t fs = 0;
    if (c < n) {
        const float theta = expf(log_threshold[c]);
        const float width = math::jumprelu_width(bandwidth, theta);
        const float norm = kNorms ? norms[c] : 0.0f;
        const bool tanh = kNorms && tanh_scale > 0.0f;
        const bool dead = kNorms && dead_mask && dead_mask[c] != 0.0f;
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const float vv = v[r * n + c];
            float dv, dt, g = dz[r * n + c];
            if constexpr (kNorms) {
                if (tanh) {
                    float dn;
                    sums[3] += math::tanh_penalty_grad(math::jumprelu(vv, theta), norm, tanh_scale,
                                                       l0, g, dn);
                    sums[2] += dn;
                }
            }
            math::jumprelu_grad(vv, theta, width, g, tanh ? 0.0f : l0, dv, dt);
            if constexpr (kNorms) {
                if (dead) {
                    float dn;
                    sums[4] += math::pre_act_grad(vv, theta, norm, pre_act, dv, dt, dn);
                    sums[2] += dn;
                }
            }
            dz[r * n + c] = dv;
            sums[0] += dv;
            sums[1] += dt;
            fs += vv > theta;
        }
    }
    store_col_partials(sums, fs, c, n, part_f, part_i);
}

template <bool kNorms>
__global__ void jumprelu_backward_finish_kernel(const float* part_f, const int32_t* part_i,
                                                int slices, int64_t n, const float* log_threshold,
                                                float* db_enc, float* dlog_threshold,
                                                int32_t* fires, double* col_l0, float* norm_grad,
                                                double* col_tanh, double* col_pre) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        float sums[kNorms ? 5 : 2];
        int32_t f;
        sum_col_partials(part_f, part_i, slices, n, c, sums, f);
        db_enc[c] = sums[0];
        dlog_threshold[c] = sums[1] * expf(log_threshold[c]);  // d/dlog(theta) = theta d/dtheta
        fires[c] = f;
        col_l0[c] = f;
        if constexpr (kNorms) {
            norm_grad[c] = sums[2];
            col_tanh[c] = sums[3];
            col_pre[c] = sums[4];
        }
    }
}

// dz -> dpre in place (math::gated_grad); per column: sums of dg, dm, dm * pre * exp(r_mag)
// (dr_mag), dpre and relu(g), and the firing count of z.
__global__ void gated_backward_kernel(const float* pre, const float* b_gate, const float* r_mag,
                                      const float* b_mag, const float* norms, float l1,
                                      int64_t rows, int64_t n, int64_t rows_per, float* dz,
                                      const float* dgate, float* part_f, int32_t* part_i) {
    const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = min(rows, r0 + rows_per);
    float sums[5] = {};  // dg, dm, dr_mag, dpre, relu(g)
    int32_t fs = 0;
    if (c < n) {
        const float scale = expf(r_mag[c]), bg = b_gate[c], bm = b_mag[c], l1n = l1 * norms[c];
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
            const int64_t i = r * n + c;
            const float p = pre[i], g = p + bg, m = p * scale + bm;
            float dg, dm;
            math::gated_grad(g, m, dz[i], dgate[i], l1n, dg, dm);
            const float dp = dg + dm * scale;
            dz[i] = dp;
            sums[0] += dg;
            sums[1] += dm;
            sums[2] += dm * p * scale;
            sums[3] += dp;
            sums[4] += math::relu(g);
            fs += math::gated(g, m) > 0.0f;
        }
    }
    store_col_partials(sums, fs, c, n, part_f, part_i);
}

__global__ void gated_backward_finish_kernel(const float* part_f, const int32_t* part_i, int slices,
                                             int64_t n, const float* norms, float* db_gate,
                                             float* db_mag, float* dr_mag, float* dpre_col_sum,
                                             float* gate_col_sum, int32_t* fires, double* col_l1,
                                             double* col_l0) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n;
         c += int64_t(gridDim.x) * blockDim.x) {
        float sums[5];
        int32_t f;
        sum_col_partials(part_f, part_i, slices, n, c, sums, f);
        db_gate[c] = sums[0];
        db_mag[c] = sums[1];
        dr_mag[c] = sums[2];
        dpre_col_sum[c] = sums[3];
        gate_col_sum[c] = sums[4];
        fires[c] = f;
        col_l1[c] = double(sums[4]) * norms[c];
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
    const int64_t blocks = int64_t(sl.grid.x) * sl.grid.y;
    auto* part_x = ws.get<float>(0, sl.slices * d);
    auto* part_e = ws.get<float>(1, sl.slices * d);
    auto* part_d = ws.get<double>(2, 2 * blocks);
    residual_kernel<<<sl.grid, sl.block, 0, s>>>(xh, x, rows, d, sl.rows_per, grad_scale, part_x,
                                                 part_e, part_d, part_d + blocks);
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
    auto* part_g = ws.get<float>(0, sl.slices * n);
    auto* part_z = ws.get<float>(1, sl.slices * n);
    auto* part_f = ws.get<int32_t>(2, sl.slices * n);
    auto* col = ws.get<double>(3, 2 * n);
    relu_backward_kernel<<<sl.grid, sl.block, 0, s>>>(z, dz, norms, l1, rows, n, sl.rows_per,
                                                      part_g, part_z, part_f);
    SAE_CUDA_LAUNCH_CHECK();
    relu_backward_finish_kernel<<<grid_for(n), kThreads, 0, s>>>(
        part_g, part_z, part_f, sl.slices, n, norms, db_enc, z_col_sum, fires, col, col + n);
    SAE_CUDA_LAUNCH_CHECK();
    add_sum_to_stat(s, col, n, stats + kStatL1);
    add_sum_to_stat(s, col + n, n, stats + kStatL0);
}

void jumprelu_forward(cudaStream_t s, float* pre, const float* b_enc, const float* log_threshold,
                      int64_t rows, int64_t n, float* z) {
    if (rows * n <= 0) return;
    jumprelu_forward_kernel<<<grid_for(rows * n), kThreads, 0, s>>>(pre, b_enc, log_threshold,
                                                                    rows * n, n, z);
    SAE_CUDA_LAUNCH_CHECK();
}

void jumprelu_backward(cudaStream_t s, Workspace& ws, const JumpReluBackward& a) {
    const int64_t rows = a.rows, n = a.n;
    if (n <= 0) return;
    const RowSlices sl = row_slices(rows, n);
    const bool norms = a.norms != nullptr;
    auto* part_f = ws.get<float>(0, (norms ? 5 : 2) * sl.slices * n);
    auto* part_i = ws.get<int32_t>(1, sl.slices * n);
    auto* col = ws.get<double>(2, (norms ? 3 : 1) * n);
    if (norms) {
        jumprelu_backward_kernel<true><<<sl.grid, sl.block, 0, s>>>(
            a.v, a.dz_to_dpre, a.log_threshold, a.bandwidth, a.l0, a.norms, a.tanh_scale,
            a.dead_mask, a.pre_act, rows, n, sl.rows_per, part_f, part_i);
        SAE_CUDA_LAUNCH_CHECK();
        jumprelu_backward_finish_kernel<true><<<grid_for(n), kThreads, 0, s>>>(
            part_f, part_i, sl.slices, n, a.log_threshold, a.db_enc, a.dlog_threshold, a.fires, col,
            a.norm_grad, col + n, col + 2 * n);
    } else {
        jumprelu_backward_kernel<false><<<sl.grid, sl.block, 0, s>>>(
            a.v, a.dz_to_dpre, a.log_threshold, a.bandwidth, a.l0, nullptr, 0.0f, nullptr, 0.0f,
            rows, n, sl.rows_per, part_f, part_i);
        SAE_CUDA_LAUNCH_CHECK();
        jumprelu_backward_finish_kernel<false><<<grid_for(n), kThreads, 0, s>>>(
            part_f, part_i, sl.slices, n, a.log_threshold, a.db_enc, a.dlog_threshold, a.fires, col,
            nullptr, nullptr, nullptr);
    }
    SAE_CUDA_LAUNCH_CHECK();
    add_sum_to_stat(s, col, n, a.stats + kStatL0);
    if (norms && a.tanh_scale > 0.0f) add_sum_to_stat(s, col + n, n, a.stats + kStatL1);
    if (norms && a.dead_mask) add_sum_to_stat(s, col + 2 * n, n, a.stats + kStatAux);
}

void gated_forward(cudaStream_t s, const float* pre, const float* b_gate, const float* r_mag,
                   const float* b_mag, int64_t rows, int64_t n, float* z, float* gate) {
    if (rows * n <= 0) return;
    gated_forward_kernel<<<grid_for(rows * n), kThreads, 0, s>>>(pre, b_gate, r_mag, b_mag,
                                                                 rows * n, n, z, gate);
    SAE_CUDA_LAUNCH_CHECK();
}

void gated_backward(cudaStream_t s, Workspace& ws, const GatedBackward& a) {
    const int64_t rows = a.rows, n = a.n;
    if (n <= 0) return;
    const RowSlices sl = row_slices(rows, n);
    auto* part_f = ws.get<float>(0, 5 * sl.slices * n);
    auto* part_i = ws.get<int32_t>(1, sl.slices * n);
    auto* col = ws.get<double>(2, 2 * n);
    gated_backward_kernel<<<sl.grid, sl.block, 0, s>>>(a.pre, a.b_gate, a.r_mag, a.b_mag,
                                                       a.dec_norms, a.l1, rows, n, sl.rows_per,
                                                       a.dz_to_dpre, a.dgate, part_f, part_i);
    SAE_CUDA_LAUNCH_CHECK();
    gated_backward_finish_kernel<<<grid_for(n), kThreads, 0, s>>>(
        part_f, part_i, sl.slices, n, a.dec_norms, a.db_gate, a.db_mag, a.dr_mag, a.dpre_col_sum,
        a.gate_col_sum, a.fires, col, col + n);
    SAE_CUDA_LAUNCH_CHECK();
    add_sum_to_stat(s, col, n, a.stats + kStatL1);
    add_sum_to_stat(s, col + n, n, a.stats + kStatL0);
}

void axpby(cudaStream_t s, float* y, const float* x, float a, float b, int64_t n) {
    if (n <= 0) return;
    axpby_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, a, b, n);
    SAE_CUDA_LAUNCH_CHECK();
}

void swap(cudaStream_t s, float* a, float* b, int64_t n) {
    if (n <= 0) return;
    swap_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, n);
    SAE_CUDA_LAUNCH_CHECK();
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
