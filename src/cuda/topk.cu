// TopK kernels: per-row selection, sparse decode and the sparse backward.
//
// Selection (one block per row), on order-preserving 32-bit keys of pre + b_enc. A row whose
// 16-bit key prefixes fit in shared memory (n up to ~110K on H100) is read from device memory
// once, and only the keys at or above a bound from group maxima are sorted
// (topk_pruned_kernel: ~k (1 + k / 2G) candidates for typical rows). The general method, for wider
// rows and as the pruned kernel's fallback: a 4-pass radix select finds the k-th largest key T; one
// pass then takes every element above T (shared atomics: order does not matter, the picks are
// sorted next) and the elements equal to T, all of them when all are needed, else the lowest-index
// ones (an ordered block scan). Either way a bitonic sort of the picks by (value desc, index asc)
// gives exactly the CPU backend's output, including its tie rule (the lower index wins). Histogram
// increments are aggregated per warp and bin: the first pass sees few distinct exponents, and 512
// threads hitting one counter would serialize.
//
// Backward, deterministic: entries (row, slot) are sorted by latent with a stable radix sort
// (cub::DeviceRadixSort), so each latent's gradient row is summed by one block in row order,
// like the CPU's counting sort, with no float atomics.
//
// BatchTopK: the batch's threshold is a radix select over all rows (integer histograms, so
// exact), and the per-row selection above it an ordered block-scan compaction: both give the
// CPU backend's results bit for bit.
#include <algorithm>
#include <array>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_check.h"
#include "kernels.h"
#include "saetrain/backend.h"

namespace saetrain::cuda {
namespace {

constexpr int kSelectThreads = 512;  // >= kMaxTopk / 2 comparators for the bitonic sort
// Sub-histograms per block: warps 2h and 2h+1 share one, so 16 warps' increments of the same
// bin (the first pass sees mostly one exponent) do not all queue on one shared-memory word,
// while two blocks of a 24,576-latent row cache still fit an SM (2 x ~110 KB).
constexpr int kHists = kSelectThreads / 64;

// Composite sort key: value order in the high word, then lower index first in the low word.
__device__ __forceinline__ unsigned long long pick_key(uint32_t key, uint32_t i) {
    return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - i);
}

// Adds 1 to hist[bin] for every lane with `active`, one atomic per distinct bin in the warp.
__device__ __forceinline__ void warp_count(unsigned* hist, uint32_t bin, bool active) {
    const unsigned lanes = __ballot_sync(0xffffffffu, active);
    if (!active) return;
    const unsigned same = __match_any_sync(lanes, bin);
    if ((threadIdx.x % 32) == static_cast<unsigned>(__ffs(same) - 1))
        atomicAdd(&hist[bin], static_cast<unsigned>(__popc(same)));
}

// The selection kernel's shared state (one row per block).
struct SelectShared {
    unsigned hist[kHists][256];
    unsigned long long picks[kMaxTopk];
    uint32_t prefix;
    int remaining, eq_total, gt_base, eq_base;
};

// After a pass's histogram is summed into hist[0]: the bin b where the count from the top
// first reaches `remaining` (0 if never), found by warp 0 with lane l holding bins 255 - 8l
// down to 248 - 8l. Sets sh.prefix (prefix with b at `shift`), sh.remaining (what is still to
// take from bin b) and sh.eq_total (bin b's count).
__device__ __forceinline__ void find_threshold_bin(SelectShared& sh, uint32_t prefix, int shift,
                                                   int remaining) {
    const int lane = threadIdx.x % 32;
    unsigned chunk = 0;
    for (int j = 0; j < 8; ++j) chunk += sh.hist[0][255 - 8 * lane - j];
    unsigned before = chunk;  // inclusive prefix over lanes, lane 0 = the top bins
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, before, o);
        if (lane >= o) before += v;
    }
    before -= chunk;
    const unsigned hit = __ballot_sync(0xffffffffu, static_cast<int>(before + chunk) >= remaining);
    const int owner = hit ? __ffs(hit) - 1 : 31;
    if (lane == owner) {
        int above = static_cast<int>(before), b = 255 - 8 * lane;
        for (int stop = b - 7; b > stop; --b) {
            if (above + static_cast<int>(sh.hist[0][b]) >= remaining) break;
            above += static_cast<int>(sh.hist[0][b]);
        }
        sh.prefix = prefix | (static_cast<uint32_t>(b) << shift);
        sh.remaining = remaining - above;
        sh.eq_total = static_cast<int>(sh.hist[0][b]);
    }
}

// 1. Radix select, 8 bits per pass from the top: after pass j, `prefix` holds the top 8(j+1)
//    bits of the k-th largest key T and `remaining` how many of the elements matching it must
//    be taken. Returns T; sh.remaining is then the count of keys == T to take.
template <class KeyAt>
__device__ __forceinline__ uint32_t radix_select(SelectShared& sh, KeyAt key_at, int n, int k) {
    const int tid = threadIdx.x;
    unsigned* my_hist = sh.hist[tid / 64];
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < kHists * 256; i += kSelectThreads) (&sh.hist[0][0])[i] = 0;
        __syncthreads();
        // Every lane of a warp runs the same number of iterations (warp_count is collective).
        for (int base = 0; base < n; base += kSelectThreads) {
            const int i = base + tid;
            const uint32_t key = i < n ? key_at(i) : 0u;
            warp_count(my_hist, (key >> shift) & 0xffu, i < n && (key & mask) == prefix);
        }
        __syncthreads();
        for (int b = tid; b < 256; b += kSelectThreads)
            for (int h = 1; h < kHists; ++h) sh.hist[0][b] += sh.hist[h][b];
        __syncthreads();
        if (tid < 32) find_threshold_bin(sh, prefix, shift, remaining);
        __syncthreads();
        prefix = sh.prefix;
        remaining = sh.remaining;
        mask |= 0xffu << shift;
    }
    return prefix;
}

// 2. Compaction into sh.picks. Keys > T all go in, in any order (the sort orders them); keys
//    == T too when all of them are needed (no tie to break: the usual case for real data);
//    otherwise the need_eq lowest indices among them, found by an ordered block scan.
template <class KeyAt, class Scan>
__device__ __forceinline__ void compact_picks(SelectShared& sh, typename Scan::TempStorage& tmp,
                                              KeyAt key_at, int n, int k, int k_pad, uint32_t T) {
    const int tid = threadIdx.x;
    const int need_eq = sh.remaining, n_gt = k - need_eq;
    // After the last pass the chosen bin counts the keys equal to T exactly.
    const bool take_all_eq = sh.eq_total == need_eq;
    if (tid == 0) sh.gt_base = 0, sh.eq_base = 0;
    for (int i = k + tid; i < k_pad; i += kSelectThreads) sh.picks[i] = 0;  // sorts last
    __syncthreads();
    for (int i = tid; i < n; i += kSelectThreads) {
        const uint32_t key = key_at(i);
        if (key > T || (take_all_eq && key == T))
            sh.picks[atomicAdd(&sh.gt_base, 1)] = pick_key(key, static_cast<uint32_t>(i));
    }
    __syncthreads();
    if (take_all_eq) return;
    for (int base = 0; base < n; base += kSelectThreads) {
        const int i = base + tid;
        const bool eq = i < n && key_at(i) == T;
        unsigned long long before, total;
        Scan(tmp).ExclusiveSum(static_cast<unsigned long long>(eq), before, total);
        const int eq_pos = sh.eq_base + static_cast<int>(before);
        if (eq && eq_pos < need_eq) sh.picks[n_gt + eq_pos] = pick_key(T, static_cast<uint32_t>(i));
        __syncthreads();  // everyone read the base (and the scan's storage is free again)
        if (tid == 0) sh.eq_base += static_cast<int>(total);
        __syncthreads();
        if (sh.eq_base >= need_eq) break;  // uniform across the block
    }
}

// 3. Bitonic sort of the k_pad picks, descending: value desc, then index asc (kBlock threads).
template <int kBlock = kSelectThreads>
__device__ __forceinline__ void bitonic_sort_desc(unsigned long long* picks, int k_pad) {
    for (int size = 2; size <= k_pad; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < k_pad / 2; t += kBlock) {
                const int a = 2 * stride * (t / stride) + t % stride, b = a + stride;
                const bool desc = (a & size) == 0;
                const unsigned long long va = picks[a], vb = picks[b];
                if ((va < vb) == desc) picks[a] = vb, picks[b] = va;
            }
        }
    }
    __syncthreads();
}

// The k best picks (sorted, first k of `picks`) to row `row`'s outputs (kBlock threads).
template <int kBlock = kSelectThreads>
__device__ __forceinline__ void write_picks(const unsigned long long* picks, int k, bool relu,
                                            int64_t row, int32_t* idx_out, float* val_out) {
    for (int j = threadIdx.x; j < k; j += kBlock) {
        const unsigned long long v = picks[j];
        const int64_t o = row * k + j;
        idx_out[o] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(v & 0xffffffffu));
        const float value = math::float_from_order_key(static_cast<uint32_t>(v >> 32));
        val_out[o] = relu ? math::relu(value) : value;
    }
}

// Selection of one row per block, the keys computed on the fly from device memory (L2) in each
// pass: for rows too wide for shared memory, and for the rows topk_pruned_kernel hands over
// (rows_list: the first *list_count of them, one per block; null: block b selects row b).
__global__ void __launch_bounds__(kSelectThreads)
    topk_select_kernel(const float* pre, const float* bias, int n, int k, int k_pad, bool relu,
                       const int* rows_list, const int* list_count, int32_t* idx_out,
                       float* val_out) {
    using Scan = cub::BlockScan<unsigned long long, kSelectThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ SelectShared sh;
    if (rows_list && static_cast<int>(blockIdx.x) >= *list_count) return;
    const int64_t row = rows_list ? rows_list[blockIdx.x] : blockIdx.x;
    const float* p = pre + row * n;
    auto key_at = [&](int i) -> uint32_t { return math::float_order_key(p[i] + bias[i]); };
    const uint32_t T = radix_select(sh, key_at, n, k);
    compact_picks<decltype(key_at), Scan>(sh, scan_tmp, key_at, n, k, k_pad, T);
    bitonic_sort_desc(sh.picks, k_pad);
    write_picks(sh.picks, k, relu, row, idx_out, val_out);
}

// --- selection pruned by group maxima ------------------------------------------------------
// A radix select looks at every key four times; most rows need far less. Split the row into G
// groups (each thread's keys, or a quad of threads'): the k-th largest group maximum T0 bounds
// the row's k-th largest key from below (the k groups with the largest maxima hold k distinct
// keys >= T0), so the row's top k are among the keys >= T0. For exchangeable values there are
// about k (1 + k / 2G) of those (~40 for k 32, G 64, whatever n is). So: one pass reads the row
// from device memory (16-byte loads), keeps each key's high 16 bits in shared memory and each
// thread's maximum of the full keys; T0 by counting among the G maxima; one pass over the
// shared prefixes finds the keys whose prefix reaches T0's (a few more than the candidates),
// recomputes those keys exactly from device memory (L2: just read) and appends the ones >= T0
// to a candidate list; a bitonic sort of the candidates by (value desc, index asc) gives the
// first k. A row with more than kPrunedCandidates candidates (heavy ties, adversarial orders)
// is listed for topk_select_kernel, launched after this one. Either way the output is the
// radix select's, bit for bit. 2 bytes of shared memory per latent: four blocks of 256 threads
// fit an SM up to n ~26K (48 KB each at n 24,576), so one block's sort overlaps three blocks'
// loads.
constexpr int kPrunedThreads = 256;
constexpr int kPrunedCandidates = 512;  // >= kMaxTopk: k picks always fit
struct PrunedShared {
    unsigned long long cand[kPrunedCandidates];
    uint32_t maxima[kPrunedThreads];
    int count;
    uint32_t t0;
};

__device__ __forceinline__ uint4 order_keys(float4 a, float4 b) {
    return make_uint4(math::float_order_key(a.x + b.x), math::float_order_key(a.y + b.y),
                      math::float_order_key(a.z + b.z), math::float_order_key(a.w + b.w));
}

// The row's key i recomputed from device memory; appended when it reaches t0.
__device__ __forceinline__ void check_candidate(PrunedShared& pr, const float* p, const float* bias,
                                                int i, uint32_t t0) {
    const uint32_t key = math::float_order_key(p[i] + bias[i]);
    if (key < t0) return;
    const int pos = atomicAdd(&pr.count, 1);
    if (pos < kPrunedCandidates) pr.cand[pos] = pick_key(key, static_cast<uint32_t>(i));
}

// kGroupLanes threads form a group: 4 (G = 64 groups) for k <= 64, 1 (G = 256) up to k 256.
template <int kGroupLanes>
__global__ void __launch_bounds__(kPrunedThreads, 4)
    topk_pruned_kernel(const float* pre, const float* bias, int n, int k, int k_pad, bool relu,
                       bool vec, int32_t* idx_out, float* val_out, int* overflow_rows,
                       int* overflow_count) {
    extern __shared__ uint2 row_hi_raw[];  // [ceil(n / 4)]: 4 key prefixes each
    auto* row_hi = reinterpret_cast<uint16_t*>(row_hi_raw);
    __shared__ PrunedShared pr;
    constexpr int kGroups = kPrunedThreads / kGroupLanes;
    const int tid = threadIdx.x;
    const float* p = pre + static_cast<int64_t>(blockIdx.x) * n;
    const int n4 = vec ? n / 4 : 0;  // vec: n % 4 == 0 and 16-byte aligned rows

    // 1. Key prefixes into shared memory; each thread's maximum key, then its group's.
    uint32_t mx = 0;
    {
        const auto* p4 = reinterpret_cast<const float4*>(p);
        const auto* b4 = reinterpret_cast<const float4*>(bias);
#pragma unroll 4
        for (int i = tid; i < n4; i += kPrunedThreads) {
            const uint4 key = order_keys(p4[i], b4[i]);
            row_hi_raw[i] = make_uint2((key.x >> 16) | (key.y & 0xffff0000u),
                                       (key.z >> 16) | (key.w & 0xffff0000u));
            mx = max(mx, max(max(key.x, key.y), max(key.z, key.w)));
        }
        for (int i = 4 * n4 + tid; i < n; i += kPrunedThreads) {
            const uint32_t key = math::float_order_key(p[i] + bias[i]);
            row_hi[i] = static_cast<uint16_t>(key >> 16);
            mx = max(mx, key);
        }
    }
    for (int o = 1; o < kGroupLanes; o <<= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (tid % kGroupLanes == 0) pr.maxima[tid / kGroupLanes] = mx;
    if (tid == 0) pr.count = 0;
    __syncthreads();

    // 2. T0, the k-th largest of the G maxima: the one with fewer than k above it and at least
    //    k at or above it (equal maxima all write the same value).
    if (tid < kGroups) {
        const uint32_t m = pr.maxima[tid];
        int above = 0, at_least = 0;
        for (int j = 0; j < kGroups; ++j) {
            const uint32_t o = pr.maxima[j];
            above += o > m;
            at_least += o >= m;
        }
        if (above < k && at_least >= k) pr.t0 = m;
    }
    __syncthreads();
    const uint32_t t0 = pr.t0, t0_hi = t0 >> 16;

    // 3. The candidates: prefixes >= T0's, checked exactly (few per row; most threads skip).
    for (int i = tid; i < n4; i += kPrunedThreads) {
        const uint2 h = row_hi_raw[i];
        if ((h.x & 0xffffu) >= t0_hi) check_candidate(pr, p, bias, 4 * i, t0);
        if ((h.x >> 16) >= t0_hi) check_candidate(pr, p, bias, 4 * i + 1, t0);
        if ((h.y & 0xffffu) >= t0_hi) check_candidate(pr, p, bias, 4 * i + 2, t0);
        if ((h.y >> 16) >= t0_hi) check_candidate(pr, p, bias, 4 * i + 3, t0);
    }
    for (int i = 4 * n4 + tid; i < n; i += kPrunedThreads)
        if (row_hi[i] >= t0_hi) check_candidate(pr, p, bias, i, t0);
    __syncthreads();
    const int count = pr.count;
    if (count > kPrunedCandidates) {  // uniform: topk_select_kernel takes the row
        if (tid == 0) overflow_rows[atomicAdd(overflow_count, 1)] = static_cast<int>(blockIdx.x);
        return;
    }
    int m_pad = k_pad;
    while (m_pad < count) m_pad <<= 1;
    for (int i = count + tid; i < m_pad; i += kPrunedThreads) pr.cand[i] = 0;  // sorts last
    bitonic_sort_desc<kPrunedThreads>(pr.cand, m_pad);
    write_picks<kPrunedThreads>(pr.cand, k, relu, blockIdx.x, idx_out, val_out);
}

// --- top-k among some columns (AuxK) ---------------------------------------------------------
// out [rows, count] = pre[r, cols[j]] + bias[cols[j]]: the selection's input, narrowed.
__global__ void gather_columns_kernel(const float* pre, const float* bias, const int32_t* cols,
                                      int64_t rows, int64_t n, int64_t count, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * count;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t c = cols[i % count];
        out[i] = pre[(i / count) * n + c] + bias[c];
    }
}
// idx[i] = cols[idx[i]]: the narrowed selection's positions back to latent ids.
__global__ void map_columns_kernel(int32_t* idx, const int32_t* cols, int64_t total) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x)
        idx[i] = cols[idx[i]];
}

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

// --- BatchTopK ------------------------------------------------------------------------------
constexpr int kBatchThreads = 256;  // one thread per histogram bin when clearing and flushing

// One pass of batch_threshold's radix select over all rows: hist[b] += the number of positive
// v = pre + b_enc whose bits match `prefix` under `mask` and whose 8-bit digit at `shift` is b
// (positive floats order like their bits). A thread owns one column (its bias read once) and
// walks rows blockIdx.y, + gridDim.y, ...; a block counts in shared memory, then adds its
// non-zero bins to the global counters. Integer counts: the totals do not depend on the order
// in which the atomics land.
__global__ void __launch_bounds__(kBatchThreads)
    batch_hist_kernel(const float* pre, const float* bias, int64_t rows, int64_t n, uint32_t prefix,
                      uint32_t mask, int shift, unsigned long long* hist) {
    __shared__ unsigned counts[256];
    counts[threadIdx.x] = 0;
    __syncthreads();
    const int64_t c = blockIdx.x * int64_t(kBatchThreads) + threadIdx.x;
    const float bc = c < n ? bias[c] : 0.0f;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {  // uniform: warp_count is collective
        const float v = c < n ? pre[r * n + c] + bc : 0.0f;
        const uint32_t u = __float_as_uint(v);
        warp_count(counts, (u >> shift) & 0xffu, v > 0.0f && (u & mask) == prefix);
    }
    __syncthreads();
    if (counts[threadIdx.x])
        atomicAdd(&hist[threadIdx.x], static_cast<unsigned long long>(counts[threadIdx.x]));
}

// select_above, one block per row: the latents with v = pre + b_enc > 0 and v >= threshold, in
// latent order. Each chunk of kBatchThreads latents is compacted by an exclusive block scan of
// the keep flags, so an entry's slot is its rank in the row, as on the CPU; slots past `width`
// are dropped and the rest padded with (0, 0). The row's count goes to *widest by an integer
// atomicMax (order-independent).
__global__ void __launch_bounds__(kBatchThreads)
    select_above_kernel(const float* pre, const float* bias, float threshold, int64_t n,
                        int64_t width, int32_t* idx, float* val, int* widest) {
    using Scan = cub::BlockScan<int, kBatchThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    const float* p = pre + blockIdx.x * n;
    int32_t* idx_r = idx + blockIdx.x * width;
    float* val_r = val + blockIdx.x * width;
    int count = 0;  // kept so far: the same in every thread (the scans' block aggregates)
    for (int64_t base = 0; base < n; base += kBatchThreads) {
        const int64_t i = base + threadIdx.x;
        const float v = i < n ? p[i] + bias[i] : 0.0f;
        const bool keep = v > 0.0f && v >= threshold;
        int before = 0, total = 0;
        Scan(scan_tmp).ExclusiveSum(keep ? 1 : 0, before, total);
        const int64_t slot = count + before;
        if (keep && slot < width) idx_r[slot] = static_cast<int32_t>(i), val_r[slot] = v;
        count += total;
        __syncthreads();  // scan_tmp is reused by the next chunk
    }
    for (int64_t j = (count < width ? count : width) + threadIdx.x; j < width; j += kBatchThreads)
        idx_r[j] = 0, val_r[j] = 0.0f;
    if (threadIdx.x == 0) atomicMax(widest, count);
}

int grid_for(int64_t n, int threads) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 1 << 20)));
}

}  // namespace

void topk_forward(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc, int64_t rows,
                  int64_t n, int64_t k, int32_t* idx, float* val, bool relu) {
    SAE_ENFORCE(k >= 1 && k <= kMaxTopk,
                "CUDA top-k supports 1 <= k <= {} (got k = {}); use a smaller sae.k", kMaxTopk, k);
    SAE_ENFORCE(k <= n && n < (int64_t(1) << 31), "top-k: k = {} > n_latents = {}", k, n);
    if (rows <= 0) return;
    int k_pad = 1;
    while (k_pad < k) k_pad <<= 1;
    // The pruned selection when the row's key prefixes fit in shared memory and k <= 256 (then
    // the radix select for the rows it hands over), else the radix select for every row.
    static const int optin = [] {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            cudaGetLastError(), v = 48 << 10;
        return v;
    }();
    static const size_t static_bytes = [] {
        cudaFuncAttributes a{}, b{};
        SAE_CUDA_CHECK(cudaFuncGetAttributes(&a, topk_pruned_kernel<4>));
        SAE_CUDA_CHECK(cudaFuncGetAttributes(&b, topk_pruned_kernel<1>));
        return std::max(a.sharedSizeBytes, b.sharedSizeBytes);
    }();
    static size_t raised_to = 0;  // the dynamic shared-memory limit is raised once per size
    const size_t row_bytes = static_cast<size_t>((n + 3) / 4) * sizeof(uint2);
    if (k <= kPrunedThreads && static_bytes + row_bytes <= static_cast<size_t>(optin)) {
        if (row_bytes > raised_to) {
            for (const void* f : {reinterpret_cast<const void*>(topk_pruned_kernel<4>),
                                  reinterpret_cast<const void*>(topk_pruned_kernel<1>)})
                SAE_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(row_bytes)));
            raised_to = row_bytes;
        }
        auto* list = ws.get<int>(0, rows + 1);  // [0]: how many rows overflowed, then their ids
        SAE_CUDA_CHECK(cudaMemsetAsync(list, 0, sizeof(int), s));
        const bool vec = n % 4 == 0 && (reinterpret_cast<uintptr_t>(pre) & 15u) == 0 &&
                         (reinterpret_cast<uintptr_t>(b_enc) & 15u) == 0;
        const auto kernel = k <= kPrunedThreads / 4 ? topk_pruned_kernel<4> : topk_pruned_kernel<1>;
        kernel<<<static_cast<unsigned>(rows), kPrunedThreads, row_bytes, s>>>(
            pre, b_enc, static_cast<int>(n), static_cast<int>(k), k_pad, relu, vec, idx, val,
            list + 1, list);
        SAE_CUDA_LAUNCH_CHECK();
        // The rows with too many candidates (usually none: every block but *list returns).
        topk_select_kernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, s>>>(
            pre, b_enc, static_cast<int>(n), static_cast<int>(k), k_pad, relu, list + 1, list, idx,
            val);
    } else {
        topk_select_kernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, s>>>(
            pre, b_enc, static_cast<int>(n), static_cast<int>(k), k_pad, relu, nullptr, nullptr,
            idx, val);
    }
    SAE_CUDA_LAUNCH_CHECK();
}

// The columns ascend, so the narrowed row orders ties like the whole row (lower index first)
// and its values are the same floats (pre + bias, then + 0: only -0 becomes +0, which the order
// keys do anyway): the selection is topk_forward's with the other columns at -inf.
void topk_forward_columns(cudaStream_t s, Workspace& ws, const float* pre, const float* bias,
                          int64_t rows, int64_t n, const int32_t* cols, int64_t count, int64_t k,
                          int32_t* idx, float* val, bool relu) {
    SAE_ENFORCE(k >= 1 && k <= count && count <= n,
                "top-k among columns: k = {} of {} columns of {}", k, count, n);
    if (rows <= 0) return;
    auto* sub = ws.get<float>(1, rows * count);
    auto* zero = ws.get<float>(2, count);
    SAE_CUDA_CHECK(cudaMemsetAsync(zero, 0, sizeof(float) * count, s));
    gather_columns_kernel<<<grid_for(rows * count, 256), 256, 0, s>>>(pre, bias, cols, rows, n,
                                                                      count, sub);
    SAE_CUDA_LAUNCH_CHECK();
    topk_forward(s, ws, sub, zero, rows, count, k, idx, val, relu);  // workspace slot 0 only
    map_columns_kernel<<<grid_for(rows * k, 256), 256, 0, s>>>(idx, cols, rows * k);
    SAE_CUDA_LAUNCH_CHECK();
}

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
            topk_dval_kernel<4><<<grid_for(entries * 32, 256), 256, 0, s>>>(
                a.derr, a.idx, a.val, a.w_dec, a.dval_extra, entries, a.k, a.d / 4, dval);
        else
            topk_dval_kernel<1><<<grid_for(entries * 32, 256), 256, 0, s>>>(
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
        topk_entries_kernel<<<grid_for(entries, 256), 256, 0, s>>>(a.idx, a.val, entries, n32,
                                                                   counts, keys, ids);
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
        topk_chunk_counts_kernel<<<grid_for(n + 1, 256), 256, 0, s>>>(sorted.start, n32, c32, nch,
                                                                      multi);
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

// The CPU backend's radix select (cpu_backend.cpp), with the histograms counted on the GPU:
// the host walks the same integer counts the same way, so the threshold is the same float.
float batch_threshold(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc,
                      int64_t rows, int64_t n, int64_t count) {
    if (rows <= 0 || n <= 0) return 0.0f;  // nothing positive
    auto* hist = ws.get<unsigned long long>(0, 256);
    const int64_t col_blocks = (n + kBatchThreads - 1) / kBatchThreads;
    // About 2048 blocks in all (a few per SM), each walking a fixed set of rows.
    const int64_t row_groups =
        std::clamp<int64_t>(2048 / col_blocks, 1, std::min<int64_t>(rows, 65535));
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_groups));
    std::array<unsigned long long, 256> h{};
    uint32_t prefix = 0, mask = 0;
    int64_t want = count;
    for (int shift = 24; shift >= 0; shift -= 8) {
        SAE_CUDA_CHECK(cudaMemsetAsync(hist, 0, sizeof(h), s));
        batch_hist_kernel<<<grid, kBatchThreads, 0, s>>>(pre, b_enc, rows, n, prefix, mask, shift,
                                                         hist);
        SAE_CUDA_LAUNCH_CHECK();
        SAE_CUDA_CHECK(cudaMemcpyAsync(h.data(), hist, sizeof(h), cudaMemcpyDeviceToHost, s));
        SAE_CUDA_CHECK(cudaStreamSynchronize(s));
        if (shift == 24) {
            int64_t positive = 0;
            for (unsigned long long c : h) positive += static_cast<int64_t>(c);
            if (positive == 0) return 0.0f;
            want = std::clamp<int64_t>(want, 1, positive);  // the smallest positive at most
        }
        int b = 255;  // the bin where the count from the top reaches `want`
        for (; b > 0 && static_cast<int64_t>(h[b]) < want; --b) want -= static_cast<int64_t>(h[b]);
        prefix |= static_cast<uint32_t>(b) << shift;
        mask |= 0xffu << shift;
    }
    float t;
    std::memcpy(&t, &prefix, sizeof(t));
    return t;
}

int64_t select_above(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc,
                     float threshold, int64_t rows, int64_t n, int64_t width, int32_t* idx,
                     float* val) {
    SAE_ENFORCE(n < (int64_t(1) << 31) && rows < (int64_t(1) << 31),
                "select_above: {} rows or {} latents exceed the int32 index range", rows, n);
    if (rows <= 0) return 0;
    auto* widest = ws.get<int>(0, 1);
    SAE_CUDA_CHECK(cudaMemsetAsync(widest, 0, sizeof(int), s));
    select_above_kernel<<<static_cast<unsigned>(rows), kBatchThreads, 0, s>>>(
        pre, b_enc, threshold, n, width, idx, val, widest);
    SAE_CUDA_LAUNCH_CHECK();
    int h = 0;
    SAE_CUDA_CHECK(cudaMemcpyAsync(&h, widest, sizeof(int), cudaMemcpyDeviceToHost, s));
    SAE_CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
}

}  // namespace saetrain::cuda
