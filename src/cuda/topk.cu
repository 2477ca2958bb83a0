// topk.cu — the sparse side of the TopK kernels: sparse_decode (x_hat from a selection's
// (index, value) pairs) and topk_backward (the gradients through them). The selections that make
// the pairs are in topk_select.cu.
//
// Backward, deterministic: entries (row, slot) are sorted by latent with a stable radix sort
// (cub::DeviceRadixSort), so each latent's gradient row is summed by one block in row order,
// like the CPU's counting sort, with no float atomics.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_check.h"
#include "kernel_util.cuh"
#include "kernels.h"
#include "saetrain/backend.h"

namespace saetrain::cuda {
namespace {

// --- vector widths ---------------------------------------------------------------------------
// The sparse kernels move rows of d floats as V-float vectors: V = 4 (16-byte loads) when d % 4
// == 0 and every row pointer is 16-byte aligned, else V = 1. Per column the arithmetic is the
// same in both (acc += a * w in entry order), so results do not depend on V, except dval's dot
// product, whose partial sums group by vector.
template <int V>
struct VecOf;
template <>
struct VecOf<1> {
    using T = float;
};
template <>
struct VecOf<4> {
    using T = float4;
};
__device__ __forceinline__ void axpy(float a, float x, float& acc) { acc += a * x; }
__device__ __forceinline__ void axpy(float a, float4 x, float4& acc) {
    acc.x += a * x.x, acc.y += a * x.y, acc.z += a * x.z, acc.w += a * x.w;
}
__device__ __forceinline__ float dot(float a, float b) { return a * b; }
__device__ __forceinline__ float dot(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
template <typename T>
__device__ __forceinline__ T vzero() {
    if constexpr (sizeof(T) == sizeof(float))
        return 0.0f;
    else
        return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// x_hat[r] += sum_j val[r,j] * w_dec[idx[r,j]]: one block per row, j in order (as the CPU),
// four rows of W_dec in flight per thread. The row's pairs pass through shared memory kMaxTopk
// at a time (BatchTopK rows may keep more). dv = d / V columns.
template <int V>
__global__ void sparse_decode_kernel(const int32_t* idx, const float* val, const float* w_dec,
                                     int64_t k, int64_t dv, float* x_hat) {
    using T = typename VecOf<V>::T;
    __shared__ int32_t s_idx[kMaxTopk];
    __shared__ float s_val[kMaxTopk];
    const int64_t r = blockIdx.x;
    const T* w = reinterpret_cast<const T*>(w_dec);
    T* xh = reinterpret_cast<T*>(x_hat) + r * dv;
    for (int64_t j0 = 0; j0 < k; j0 += kMaxTopk) {
        const int m = static_cast<int>(k - j0 < kMaxTopk ? k - j0 : kMaxTopk);
        __syncthreads();  // the previous chunk is used up
        for (int j = threadIdx.x; j < m; j += blockDim.x)
            s_idx[j] = idx[r * k + j0 + j], s_val[j] = val[r * k + j0 + j];
        __syncthreads();
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
            T acc = xh[c];
            int j = 0;
            for (; j + 4 <= m; j += 4) {  // four independent loads, then the adds in order
                T w4[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    w4[u] = s_val[j + u] != 0.0f ? w[static_cast<int64_t>(s_idx[j + u]) * dv + c]
                                                 : vzero<T>();
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (s_val[j + u] != 0.0f) axpy(s_val[j + u], w4[u], acc);
            }
            for (; j < m; ++j)
                if (s_val[j] != 0.0f)
                    axpy(s_val[j], w[static_cast<int64_t>(s_idx[j]) * dv + c], acc);
            xh[c] = acc;
        }
    }
}

// Active entries: counts per latent (integer atomics: exact), sort keys (latent, or n for an
// inactive entry so it sorts last) and entry ids.
__global__ void topk_entries_kernel(const int32_t* idx, const float* val, int64_t entries,
                                    int32_t n, int32_t* counts, int32_t* keys, int32_t* ids) {
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < entries;
         e += int64_t(gridDim.x) * blockDim.x) {
        const bool on = val[e] != 0.0f;
        if (on) atomicAdd(&counts[idx[e]], 1);
        keys[e] = on ? idx[e] : n;
        ids[e] = static_cast<int32_t>(e);
    }
}

// dval[e] = (val != 0) * (derr[r] . w_dec[idx] + dval_extra[e]) (no extra term when
// dval_extra is null): one warp per entry, fixed butterfly order. The warps stride over the
// entries: the grid is capped (grid_for), and rows * k can exceed what one warp per entry in a
// capped grid covers (2^20 blocks x 8 warps = 8,388,608 entries). dv = d / V.
template <int V>
__global__ void topk_dval_kernel(const float* derr, const int32_t* idx, const float* val,
                                 const float* w_dec, const float* dval_extra, int64_t entries,
                                 int64_t k, int64_t dv, float* dval) {
    using T = typename VecOf<V>::T;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; e < entries;
         e += warps) {
        if (val[e] == 0.0f) {  // uniform across the warp: one entry per warp
            if (lane == 0) dval[e] = 0.0f;
            continue;
        }
        const T* er = reinterpret_cast<const T*>(derr) + (e / k) * dv;
        const T* w = reinterpret_cast<const T*>(w_dec) + static_cast<int64_t>(idx[e]) * dv;
        float s = 0;
        for (int64_t c = lane; c < dv; c += 32) s += dot(er[c], w[c]);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (dval_extra) s += dval_extra[e];  // after the dot product, as the CPU adds it
        if (lane == 0) dval[e] = s;
    }
}

// The deterministic backward sums each latent's entries in chunks of `chunk` entries, one block
// per chunk: a latent that fires on most tokens (common once training has shaped the
// dictionary) would otherwise be summed by one block while the rest of the GPU idles (measured:
// 2.7 ms instead of 0.5 ms per step on synthetic data after 300 steps, H100). A latent of one
// chunk is written directly; the chunks of a longer one go to partial rows that a second
// kernel adds in chunk order. Fixed order throughout: bit-reproducible.

// nch[l] = chunks of latent l; multi[l] = nch[l] when > 1 (partial rows it needs), else 0.
__global__ void topk_chunk_counts_kernel(const int32_t* start, int32_t n, int32_t chunk,
                                         int32_t* nch, int32_t* multi) {
    for (int32_t l = blockIdx.x * blockDim.x + threadIdx.x; l <= n; l += gridDim.x * blockDim.x) {
        const int32_t c = l < n ? (start[l + 1] - start[l] + chunk - 1) / chunk : 0;
        nch[l] = c;
        multi[l] = c > 1 ? c : 0;
    }
}

// One block per chunk (blocks past the last chunk return): its entries' contributions in
// entry (row) order. With `accumulate`, a latent of one chunk starts from the gradient's
// current value (as the CPU does); partial rows always start from zero. The chunk's entries
// (row, val, dval) are staged in shared memory kStage at a time, so the column loop issues four
// independent row loads of derr and of x per thread instead of a chain of dependent ones.
// dv = d / V. (Computing dval here instead, one warp per staged entry reading the latent's
// decoder row once, measured slower on an H100: 0.40 ms for this kernel against 0.24 + 0.12 ms
// for it and topk_dval_kernel, which gathers W_dec rows per entry.)
constexpr int kStage = 128;
template <int V>
__global__ void topk_grad_chunks_kernel(const float* x, const float* derr, const float* val,
                                        const float* dval, const int32_t* start,
                                        const int32_t* sorted_ids, const int32_t* chunk_start,
                                        const int32_t* slot_start, int32_t n, int32_t chunk,
                                        int64_t k, int64_t dv, bool accumulate, float* dw_enc,
                                        float* dw_dec, float* db_enc, float* part_enc,
                                        float* part_dec, float* part_b) {
    using T = typename VecOf<V>::T;
    __shared__ int64_t s_row[kStage];
    __shared__ float s_val[kStage], s_dval[kStage];
    const int32_t b = blockIdx.x;
    if (b >= chunk_start[n]) return;
    int32_t lo = 0, hi = n - 1;  // the latent l with chunk_start[l] <= b < chunk_start[l + 1]
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (chunk_start[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int32_t l = lo, j = b - chunk_start[l];
    const bool whole = chunk_start[l + 1] - chunk_start[l] == 1;
    const int32_t s = start[l] + j * chunk, t = min(start[l + 1], s + chunk);
    const int64_t slot = whole ? 0 : slot_start[l] + j;
    T* out_enc = reinterpret_cast<T*>(whole ? dw_enc : part_enc) + (whole ? l : slot) * dv;
    T* out_dec = reinterpret_cast<T*>(whole ? dw_dec : part_dec) + (whole ? l : slot) * dv;
    const T* xv = reinterpret_cast<const T*>(x);
    const T* ev = reinterpret_cast<const T*>(derr);
    const bool add = whole && accumulate;
    float gb = add && threadIdx.x == 0 ? db_enc[l] : 0.0f;
    for (int32_t q0 = s; q0 < t; q0 += kStage) {
        const int m = min(kStage, t - q0);
        __syncthreads();  // the previous stage is used up
        for (int i = threadIdx.x; i < m; i += blockDim.x) {
            const int64_t e = sorted_ids[q0 + i];
            s_row[i] = (e / k) * dv, s_val[i] = val[e], s_dval[i] = dval[e];
        }
        __syncthreads();
        const bool from_zero = q0 == s && !add;  // later stages continue from the output
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
            T gd = from_zero ? vzero<T>() : out_dec[c];
            T ge = from_zero ? vzero<T>() : out_enc[c];
            int i = 0;
            for (; i + 4 <= m; i += 4) {
                T e4[4], x4[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    e4[u] = ev[s_row[i + u] + c], x4[u] = xv[s_row[i + u] + c];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    axpy(s_val[i + u], e4[u], gd), axpy(s_dval[i + u], x4[u], ge);
            }
            for (; i < m; ++i)
                axpy(s_val[i], ev[s_row[i] + c], gd), axpy(s_dval[i], xv[s_row[i] + c], ge);
            out_dec[c] = gd;
            out_enc[c] = ge;
        }
        if (threadIdx.x == 0)
            for (int i = 0; i < m; ++i) gb += s_dval[i];
    }
    if (threadIdx.x == 0) {
        if (whole)
            db_enc[l] = gb;
        else
            part_b[slot] = gb;
    }
}

// One block per latent: zeros for a latent nobody selected (left alone with `accumulate`), the
// sum of its partial rows in chunk order for a latent of several chunks (added to the current
// value with `accumulate`); the firing count for every latent.
__global__ void topk_grad_finish_kernel(const int32_t* start, const int32_t* nch,
                                        const int32_t* slot_start, int64_t d, bool accumulate,
                                        float* dw_enc, float* dw_dec, float* db_enc, int32_t* fires,
                                        const float* part_enc, const float* part_dec,
                                        const float* part_b) {
    const int64_t l = blockIdx.x;
    const int32_t c = nch[l];
    if (threadIdx.x == 0) fires[l] = start[l + 1] - start[l];
    if (c == 1 || (c == 0 && accumulate)) return;
    const int64_t s0 = slot_start[l];
    for (int64_t col = threadIdx.x; col < d; col += blockDim.x) {
        float ge = accumulate ? dw_enc[l * d + col] : 0.0f;
        float gd = accumulate ? dw_dec[l * d + col] : 0.0f;
        for (int32_t j = 0; j < c; ++j)
            ge += part_enc[(s0 + j) * d + col], gd += part_dec[(s0 + j) * d + col];
        dw_enc[l * d + col] = ge;
        dw_dec[l * d + col] = gd;
    }
    if (threadIdx.x == 0) {
        float gb = accumulate ? db_enc[l] : 0.0f;
        for (int32_t j = 0; j < c; ++j) gb += part_b[s0 + j];
        db_enc[l] = gb;
    }
}

// Non-deterministic path: one block per active entry scatters into the gradient rows.
__global__ void topk_scatter_kernel(const float* x, const float* derr, const int32_t* idx,
                                    const float* val, const float* dval, int64_t k, int64_t d,
                                    float* dw_enc, float* dw_dec, float* db_enc, int32_t* fires) {
    const int64_t e = blockIdx.x;
    const float a = val[e];
    if (a == 0.0f) return;
    const int64_t l = idx[e], r = e / k;
    const float dv = dval[e];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        atomicAdd(&dw_dec[l * d + c], a * derr[r * d + c]);
        atomicAdd(&dw_enc[l * d + c], dv * x[r * d + c]);
    }
    if (threadIdx.x == 0) {
        atomicAdd(&db_enc[l], dv);
        atomicAdd(&fires[l], 1);
    }
}

__global__ void add_count_to_stat_kernel(const int32_t* counts, int64_t n, float* stat) {
    // One thread: a sum of n ints in order (n <= 2^17 latents; runs once per step).
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += counts[i];
    *stat += static_cast<float>(s);
}

__global__ void add_int_to_stat_kernel(const int32_t* v, float* stat) {
    *stat += static_cast<float>(*v);
}

}  // namespace

void sparse_decode(cudaStream_t s, const int32_t* idx, const float* val, const float* w_dec,
                   int64_t rows, int64_t k, int64_t d, float* x_hat) {
    SAE_ENFORCE(k >= 1, "sparse_decode: k = {} < 1", k);
    if (rows <= 0) return;
    // One thread per V columns, whole warps, at most 256.
    auto threads_for = [](int64_t cols) {
        return static_cast<int>(std::clamp<int64_t>((cols + 31) / 32 * 32, 32, 256));
    };
    if (d % 4 == 0 && aligned16(w_dec) && aligned16(x_hat))
        sparse_decode_kernel<4><<<static_cast<unsigned>(rows), threads_for(d / 4), 0, s>>>(
            idx, val, w_dec, k, d / 4, x_hat);
    else
        sparse_decode_kernel<1>
            <<<static_cast<unsigned>(rows), threads_for(d), 0, s>>>(idx, val, w_dec, k, d, x_hat);
    SAE_CUDA_LAUNCH_CHECK();
}

namespace {

// dval[e] = (val != 0) * derr[row] . w_dec[idx] (+ dval_extra[e]) for every entry, in workspace
// slot 0.
const float* topk_dval(cudaStream_t s, Workspace& ws, const SparseBackward& a) {
    const int64_t entries = a.rows * a.k;
    auto* dval = ws.get<float>(0, std::max<int64_t>(entries, 1));
    if (entries > 0) {
        if (a.d % 4 == 0 && aligned16(a.derr) && aligned16(a.w_dec))
            topk_dval_kernel<4><<<grid_for(entries * 32, 256, 1 << 20), 256, 0, s>>>(
                a.derr, a.idx, a.val, a.w_dec, a.dval_extra, entries, a.k, a.d / 4, dval);
        else
            topk_dval_kernel<1><<<grid_for(entries * 32, 256, 1 << 20), 256, 0, s>>>(
                a.derr, a.idx, a.val, a.w_dec, a.dval_extra, entries, a.k, a.d, dval);
        SAE_CUDA_LAUNCH_CHECK();
    }
    return dval;
}

// Scatter with atomicAdd: fewer passes, run-to-run differences in the last bits.
void topk_backward_atomic(cudaStream_t s, const SparseBackward& a, const float* dval) {
    const int64_t entries = a.rows * a.k, n = a.n, d = a.d;
    if (!a.accumulate) {
        SAE_CUDA_CHECK(cudaMemsetAsync(a.dw_enc, 0, sizeof(float) * n * d, s));
        SAE_CUDA_CHECK(cudaMemsetAsync(a.dw_dec, 0, sizeof(float) * n * d, s));
        SAE_CUDA_CHECK(cudaMemsetAsync(a.db_enc, 0, sizeof(float) * n, s));
    }
    SAE_CUDA_CHECK(cudaMemsetAsync(a.fires, 0, sizeof(int32_t) * n, s));
    if (entries > 0) {
        topk_scatter_kernel<<<static_cast<unsigned>(entries), d >= 256 ? 256 : 128, 0, s>>>(
            a.x, a.derr, a.idx, a.val, dval, a.k, d, a.dw_enc, a.dw_dec, a.db_enc, a.fires);
        SAE_CUDA_LAUNCH_CHECK();
    }
    add_count_to_stat_kernel<<<1, 1, 0, s>>>(a.fires, n, a.stats + kStatL0);
    SAE_CUDA_LAUNCH_CHECK();
}

// The active entries sorted by latent (workspace slots 1-5): start [n + 1] the exclusive prefix
// sum of the per-latent counts (start[n] = active entries), ids_sorted the entries in latent
// order, each latent's in entry order (a stable radix sort).
struct SortedEntries {
    const int32_t* start;
    const int32_t* ids_sorted;
    void* tmp;  // the scans' temporary storage
    size_t scan_bytes;
};
SortedEntries sort_entries_by_latent(cudaStream_t s, Workspace& ws, const SparseBackward& a) {
    const int64_t entries = a.rows * a.k, n = a.n;
    const int n32 = static_cast<int>(n), e32 = static_cast<int>(entries);
    auto* counts = ws.get<int32_t>(1, n + 1);
    auto* start = ws.get<int32_t>(2, n + 1);
    auto* keys = ws.get<int32_t>(3, 2 * std::max<int64_t>(entries, 1));
    auto* ids = ws.get<int32_t>(4, 2 * std::max<int64_t>(entries, 1));
    int32_t* keys_sorted = keys + std::max<int64_t>(entries, 1);
    int32_t* ids_sorted = ids + std::max<int64_t>(entries, 1);
    SAE_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (n + 1), s));
    if (entries > 0) {
        topk_entries_kernel<<<grid_for(entries, 256, 1 << 20), 256, 0, s>>>(a.idx, a.val, entries,
                                                                            n32, counts, keys, ids);
        SAE_CUDA_LAUNCH_CHECK();
    }
    // start = exclusive prefix sum of counts (counts[n] = 0, so start[n] = active entries).
    size_t scan_bytes = 0, sort_bytes = 0;
    int end_bit = 1;
    while ((int64_t(1) << end_bit) <= n) ++end_bit;  // keys in [0, n]
    SAE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, start, n32 + 1, s));
    SAE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, keys_sorted, ids,
                                                   ids_sorted, e32, 0, end_bit, s));
    void* tmp = ws.get(5, std::max(scan_bytes, sort_bytes));
    SAE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, counts, start, n32 + 1, s));
    if (entries > 0)
        SAE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, keys, keys_sorted, ids,
                                                       ids_sorted, e32, 0, end_bit, s));
    return {start, ids_sorted, tmp, scan_bytes};
}

// Each latent's gradient rows summed over its sorted entries in fixed chunks, partial rows of
// the latents with several chunks added in chunk order (workspace slots 6-7): bit-reproducible.
void topk_backward_sorted(cudaStream_t s, Workspace& ws, const SparseBackward& a,
                          const float* dval) {
    const int64_t entries = a.rows * a.k, n = a.n, d = a.d;
    const int n32 = static_cast<int>(n);
    const SortedEntries sorted = sort_entries_by_latent(s, ws, a);
    if (n > 0) {
        // Chunks of at least 32 entries, and at most ~4096 partial rows in all (a latent with
        // c > chunk entries needs ceil(c / chunk) <= 2c / chunk of them).
        const int64_t chunk = std::max<int64_t>(32, (entries + 2047) / 2048);
        const int64_t max_slots = 2 * entries / chunk + 1;
        const int64_t max_chunks = (entries + chunk - 1) / chunk + n;
        SAE_ENFORCE(max_chunks < (int64_t(1) << 31), "topk_backward: {} chunks", max_chunks);
        auto* meta = ws.get<int32_t>(6, 4 * (n + 1));
        int32_t *nch = meta, *multi = meta + (n + 1), *chunk_start = meta + 2 * (n + 1),
                *slot_start = meta + 3 * (n + 1);
        auto* part = ws.get<float>(7, max_slots * (2 * d + 1));
        float *part_enc = part, *part_dec = part + max_slots * d,
              *part_b = part + 2 * max_slots * d;
        const int c32 = static_cast<int>(chunk);
        topk_chunk_counts_kernel<<<grid_for(n + 1, 256, 1 << 20), 256, 0, s>>>(sorted.start, n32,
                                                                               c32, nch, multi);
        SAE_CUDA_LAUNCH_CHECK();
        // Same length as the counts scan: the same temporary storage serves.
        size_t scan_bytes = sorted.scan_bytes;
        SAE_CUDA_CHECK(
            cub::DeviceScan::ExclusiveSum(sorted.tmp, scan_bytes, nch, chunk_start, n32 + 1, s));
        SAE_CUDA_CHECK(
            cub::DeviceScan::ExclusiveSum(sorted.tmp, scan_bytes, multi, slot_start, n32 + 1, s));
        const int threads = d >= 256 ? 256 : 128;
        const bool vec = d % 4 == 0 && aligned16(a.x) && aligned16(a.derr) && aligned16(a.w_dec) &&
                         aligned16(a.dw_enc) && aligned16(a.dw_dec) && aligned16(part_enc) &&
                         aligned16(part_dec);
        if (vec)
            topk_grad_chunks_kernel<4>
                <<<static_cast<unsigned>(max_chunks),
                   static_cast<int>(std::clamp<int64_t>((d / 4 + 31) / 32 * 32, 32, 256)), 0, s>>>(
                    a.x, a.derr, a.val, dval, sorted.start, sorted.ids_sorted, chunk_start,
                    slot_start, n32, c32, a.k, d / 4, a.accumulate, a.dw_enc, a.dw_dec, a.db_enc,
                    part_enc, part_dec, part_b);
        else
            topk_grad_chunks_kernel<1><<<static_cast<unsigned>(max_chunks), threads, 0, s>>>(
                a.x, a.derr, a.val, dval, sorted.start, sorted.ids_sorted, chunk_start, slot_start,
                n32, c32, a.k, d, a.accumulate, a.dw_enc, a.dw_dec, a.db_enc, part_enc, part_dec,
                part_b);
        SAE_CUDA_LAUNCH_CHECK();
        topk_grad_finish_kernel<<<static_cast<unsigned>(n), threads, 0, s>>>(
            sorted.start, nch, slot_start, d, a.accumulate, a.dw_enc, a.dw_dec, a.db_enc, a.fires,
            part_enc, part_dec, part_b);
        SAE_CUDA_LAUNCH_CHECK();
    }
    add_int_to_stat_kernel<<<1, 1, 0, s>>>(sorted.start + n, a.stats + kStatL0);
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void topk_backward(cudaStream_t s, Workspace& ws, bool deterministic, const SparseBackward& a) {
    const int64_t entries = a.rows * a.k;
    SAE_ENFORCE(entries < (int64_t(1) << 31) && a.n < (int64_t(1) << 31),
                "topk_backward: {} entries or {} latents exceed the int32 index range", entries,
                a.n);
    const float* dval = topk_dval(s, ws, a);
    if (deterministic)
        topk_backward_sorted(s, ws, a, dval);
    else
        topk_backward_atomic(s, a, dval);
}

}  // namespace saetrain::cuda
