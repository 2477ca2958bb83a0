// The optimizer step in two passes (optimizer.h). Per-element math is sae_math.h's
// adam_update, the function the CPU backend runs; the projection and renormalization follow
// project_out_kernel and normalize_rows_kernel (kernels.cu) row for row, so the two backends
// differ only in the order of the row sums.
//
// Loads are 16 bytes wide where a range starts on a 4-float boundary (every segment of the
// usual layouts: d and n are multiples of 4), else scalar. Reductions use fixed grids and fixed
// orders: a step is reproducible run to run.
#include <algorithm>
#include <cstdint>

#include "cuda_check.h"
#include "kernels.h"
#include "optimizer.h"

namespace saetrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 1024;  // per reduction pass: a fixed grid for a given size

__device__ __forceinline__ float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;  // butterfly: every lane holds the same sum, in the same order
}

// Sum over the block in a fixed tree order; thread 0 writes it.
__device__ __forceinline__ void block_sum_to(double v, double* out) {
    __shared__ double sh[kThreads];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

__device__ __forceinline__ double sq4(float4 a) {
    return double(a.x) * a.x + double(a.y) * a.y + double(a.z) * a.z + double(a.w) * a.w;
}

// partial[blockIdx.x] = sum of x[i]^2 over this block's share of [0, n).
__global__ void __launch_bounds__(kThreads)
    sum_squares_part_kernel(const float* x, int64_t n, bool vec, double* partial) {
    const int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x,
                  stride = gridDim.x * int64_t(kThreads);
    double s = 0;
    int64_t i = t;
    if (vec) {
        const int64_t n4 = n / 4;
        const auto* x4 = reinterpret_cast<const float4*>(x);
        for (int64_t j = t; j < n4; j += stride) s += sq4(x4[j]);
        i = 4 * n4 + t;
    }
    for (; i < n; i += stride) s += double(x[i]) * x[i];
    block_sum_to(s, partial + blockIdx.x);
}

// The unit rows: one warp per row. s = (g . w) / ||w||^2 in float, as project_out_kernel
// computes it; then the sum of (g - s w)^2 (the projected gradient, never written).
__global__ void __launch_bounds__(kThreads)
    projected_sum_squares_kernel(const float* w, const float* g, int64_t rows, int64_t cols,
                                 bool vec, double* partial) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = gridDim.x * int64_t(kWarps);
    double acc = 0;
    for (int64_t r = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; r < rows; r += warps) {
        const float* wr = w + r * cols;
        const float* gr = g + r * cols;
        float ww = 0, gw = 0;
        if (vec) {
            for (int64_t c = lane; c < cols / 4; c += 32) {
                const float4 a = reinterpret_cast<const float4*>(wr)[c];
                const float4 b = reinterpret_cast<const float4*>(gr)[c];
                ww += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                gw += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) ww += wr[c] * wr[c], gw += wr[c] * gr[c];
        }
        ww = warp_sum_f(ww), gw = warp_sum_f(gw);
        const float s = ww > 0.0f ? gw / ww : 0.0f;
        if (vec) {
            for (int64_t c = lane; c < cols / 4; c += 32) {
                const float4 a = reinterpret_cast<const float4*>(wr)[c];
                const float4 b = reinterpret_cast<const float4*>(gr)[c];
                acc += sq4(make_float4(b.x - s * a.x, b.y - s * a.y, b.z - s * a.z, b.w - s * a.w));
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) {
                const float p = gr[c] - s * wr[c];
                acc += double(p) * p;
            }
        }
    }
    block_sum_to(acc, partial + blockIdx.x);
}

__global__ void sum_partials_kernel(const double* part, int64_t len, double* out) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < len; i += kThreads) s += part[i];
    block_sum_to(s, out);
}

__device__ __forceinline__ void adam4(float4& p, float4& m, float4& v, float4 g,
                                      const math::AdamScalars& a) {
    math::optimizer_update(p.x, m.x, v.x, g.x, a);
    math::optimizer_update(p.y, m.y, v.y, g.y, a);
    math::optimizer_update(p.z, m.z, v.z, g.z, a);
    math::optimizer_update(p.w, m.w, v.w, g.w, a);
}

// AdamW over [0, n): 16-byte loads and stores when vec.
__global__ void __launch_bounds__(kThreads)
    adam_flat_kernel(float* p, const float* g, float* m, float* v, int64_t n, bool vec,
                     math::AdamScalars a) {
    const int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x,
                  stride = gridDim.x * int64_t(kThreads);
    int64_t i = t;
    if (vec) {
        const int64_t n4 = n / 4;
        auto* p4 = reinterpret_cast<float4*>(p);
        auto* m4 = reinterpret_cast<float4*>(m);
        auto* v4 = reinterpret_cast<float4*>(v);
        const auto* g4 = reinterpret_cast<const float4*>(g);
        for (int64_t j = t; j < n4; j += stride) {
            float4 pj = p4[j], mj = m4[j], vj = v4[j];
            adam4(pj, mj, vj, g4[j], a);
            p4[j] = pj, m4[j] = mj, v4[j] = vj;
        }
        i = 4 * n4 + t;
    }
    for (; i < n; i += stride) {
        float pi = p[i], mi = m[i], vi = v[i];
        math::optimizer_update(pi, mi, vi, g[i], a);
        p[i] = pi, m[i] = mi, v[i] = vi;
    }
}

// The unit rows, one warp per row: the gradient's radial part projected out (s as above), AdamW
// on every element, then the row divided by its new norm (rows of norm 0 left alone, as
// normalize_rows does). The row's updated values are written, then re-read by the same lanes
// for the renormalization (from L1/L2: a row is cols * 4 bytes). With signum the iterate (m)
// and the average (v) are unit rows too: renormalized in the same pass (two passes over their
// memory fewer than normalize_rows on each: 0.12 ms of a 2 ms bf16 TopK step on an H100).
// A warp's row: the sum of squares of its elements (every lane gets it), and the row divided by
// the square root of such a sum (a row of norm 0 left alone, as normalize_rows does).
__device__ float row_sum_squares(const float* r, int64_t cols, int lane) {
    float ss = 0;
    for (int64_t c = lane; c < cols; c += 32) ss += r[c] * r[c];
    return warp_sum_f(ss);
}
__device__ float row_sum_squares4(const float4* r, int64_t c4, int lane) {
    float ss = 0;
    for (int64_t c = lane; c < c4; c += 32) {
        const float4 w = r[c];
        ss += w.x * w.x + w.y * w.y + w.z * w.z + w.w * w.w;
    }
    return warp_sum_f(ss);
}
__device__ void scale_row(float* r, int64_t cols, int lane, float sum_squares) {
    const float nrm = sqrtf(sum_squares);
    if (!(nrm > 0.0f)) return;
    const float inv = 1.0f / nrm;
    for (int64_t c = lane; c < cols; c += 32) r[c] *= inv;
}
__device__ void scale_row4(float4* r, int64_t c4, int lane, float sum_squares) {
    const float nrm = sqrtf(sum_squares);
    if (!(nrm > 0.0f)) return;
    const float inv = 1.0f / nrm;
    for (int64_t c = lane; c < c4; c += 32) {
        float4 w = r[c];
        w.x *= inv, w.y *= inv, w.z *= inv, w.w *= inv;
        r[c] = w;
    }
}

__global__ void __launch_bounds__(kThreads)
    adam_unit_rows_kernel(float* p, const float* g, float* m, float* v, int64_t rows, int64_t cols,
                          bool vec, math::AdamScalars a) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = gridDim.x * int64_t(kWarps);
    for (int64_t r = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; r < rows; r += warps) {
        float* pr = p + r * cols;
        const float* gr = g + r * cols;
        float* mr = m + r * cols;
        float* vr = v + r * cols;
        float ww = 0, gw = 0, pp = 0;
        if (vec) {
            auto* p4 = reinterpret_cast<float4*>(pr);
            auto* m4 = reinterpret_cast<float4*>(mr);
            auto* v4 = reinterpret_cast<float4*>(vr);
            const auto* g4 = reinterpret_cast<const float4*>(gr);
            const int64_t c4 = cols / 4;
            for (int64_t c = lane; c < c4; c += 32) {
                const float4 w = p4[c], b = g4[c];
                ww += w.x * w.x + w.y * w.y + w.z * w.z + w.w * w.w;
                gw += w.x * b.x + w.y * b.y + w.z * b.z + w.w * b.w;
            }
            ww = warp_sum_f(ww), gw = warp_sum_f(gw);
            const float s = ww > 0.0f ? gw / ww : 0.0f;
            for (int64_t c = lane; c < c4; c += 32) {
                float4 w = p4[c], mc = m4[c], vc = v4[c];
                const float4 b = g4[c];
                const float4 gp =
                    make_float4(b.x - s * w.x, b.y - s * w.y, b.z - s * w.z, b.w - s * w.w);
                adam4(w, mc, vc, gp, a);
                p4[c] = w, m4[c] = mc, v4[c] = vc;
                pp += w.x * w.x + w.y * w.y + w.z * w.z + w.w * w.w;
            }
            pp = warp_sum_f(pp);
            scale_row4(p4, c4, lane, pp);
            if (a.signum) {
                scale_row4(m4, c4, lane, row_sum_squares4(m4, c4, lane));
                scale_row4(v4, c4, lane, row_sum_squares4(v4, c4, lane));
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) ww += pr[c] * pr[c], gw += pr[c] * gr[c];
            ww = warp_sum_f(ww), gw = warp_sum_f(gw);
            const float s = ww > 0.0f ? gw / ww : 0.0f;
            for (int64_t c = lane; c < cols; c += 32) {
                float pc = pr[c], mc = mr[c], vc = vr[c];
                math::optimizer_update(pc, mc, vc, gr[c] - s * pc, a);
                pr[c] = pc, mr[c] = mc, vr[c] = vc;
                pp += pc * pc;
            }
            pp = warp_sum_f(pp);
            scale_row(pr, cols, lane, pp);
            if (a.signum) {
                scale_row(mr, cols, lane, row_sum_squares(mr, cols, lane));
                scale_row(vr, cols, lane, row_sum_squares(vr, cols, lane));
            }
        }
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int blocks_for(int64_t work, int64_t per_block) {
    return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

}  // namespace

double optimizer_grad_sum_squares(cudaStream_t s, Workspace& ws, const float* params,
                                  const float* grads, int64_t count, const UnitRows& unit) {
    // The flat ranges outside the unit rows (before and after them), then the unit rows.
    struct Flat {
        int64_t lo = 0, hi = 0;
        int blocks = 0;
    };
    Flat flat[2];
    if (unit.any()) {
        flat[0].hi = unit.offset;
        flat[1].lo = unit.offset + unit.rows * unit.cols, flat[1].hi = count;
    } else {
        flat[0].hi = count;
    }
    int total = 0;
    for (Flat& f : flat) {
        if (f.hi > f.lo) f.blocks = blocks_for(f.hi - f.lo, 8 * kThreads * 4);
        total += f.blocks;
    }
    const int row_blocks = unit.any() ? blocks_for(unit.rows, kWarps * 4) : 0;
    auto* part = ws.get<double>(0, total + row_blocks + 1);
    int at = 0;
    for (const Flat& f : flat) {
        if (f.blocks == 0) continue;
        const float* x = grads + f.lo;
        sum_squares_part_kernel<<<f.blocks, kThreads, 0, s>>>(x, f.hi - f.lo, aligned16(x),
                                                              part + at);
        SAE_CUDA_LAUNCH_CHECK();
        at += f.blocks;
    }
    if (row_blocks > 0) {
        const float* w = params + unit.offset;
        const float* g = grads + unit.offset;
        const bool vec = unit.cols % 4 == 0 && aligned16(w) && aligned16(g);
        projected_sum_squares_kernel<<<row_blocks, kThreads, 0, s>>>(w, g, unit.rows, unit.cols,
                                                                     vec, part + at);
        SAE_CUDA_LAUNCH_CHECK();
        at += row_blocks;
    }
    sum_partials_kernel<<<1, kThreads, 0, s>>>(part, at, part + at);
    SAE_CUDA_LAUNCH_CHECK();
    double out = 0;
    SAE_CUDA_CHECK(cudaMemcpyAsync(&out, part + at, sizeof(double), cudaMemcpyDeviceToHost, s));
    SAE_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
}

void optimizer_apply(cudaStream_t s, float* params, const float* grads, float* m, float* v,
                     const std::vector<AdamRange>& ranges, const UnitRows& unit,
                     math::AdamScalars scalars, float weight_decay) {
    const int64_t unit_end = unit.offset + unit.rows * unit.cols;
    const float lr = scalars.lr;
    for (const AdamRange& r : ranges) {
        if (r.count <= 0) continue;
        scalars.weight_decay = r.decay ? weight_decay : 0.0f;
        scalars.lr = lr * r.lr_scale;
        float* p = params + r.offset;
        const float* g = grads + r.offset;
        const bool vec =
            aligned16(p) && aligned16(g) && aligned16(m + r.offset) && aligned16(v + r.offset);
        const bool overlaps = unit.any() && r.offset < unit_end && unit.offset < r.offset + r.count;
        if (!overlaps) {
            adam_flat_kernel<<<blocks_for(r.count, 4 * kThreads * 4), kThreads, 0, s>>>(
                p, g, m + r.offset, v + r.offset, r.count, vec, scalars);
            SAE_CUDA_LAUNCH_CHECK();
            continue;
        }
        SAE_ENFORCE(r.offset == unit.offset && r.count == unit.rows * unit.cols,
                    "optimizer_apply: the range [{}, +{}) covers part of the unit rows [{}, {})",
                    r.offset, r.count, unit.offset, unit_end);
        adam_unit_rows_kernel<<<blocks_for(unit.rows, kWarps), kThreads, 0, s>>>(
            p, g, m + r.offset, v + r.offset, unit.rows, unit.cols, vec && unit.cols % 4 == 0,
            scalars);
        SAE_CUDA_LAUNCH_CHECK();  // signum: m and v renormalized there too
    }
}

}  // namespace saetrain::cuda
