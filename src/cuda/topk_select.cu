// topk_select.cu — the TopK and BatchTopK selections: topk_forward (the k largest of each row),
// topk_forward_columns (AuxK's, among some columns), batch_threshold and select_above. The sparse
// decode and backward over what they select are in topk.cu.
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
// BatchTopK: the batch's threshold is a radix select over all rows (integer histograms, so
// exact), and the per-row selection above it an ordered block-scan compaction: both give the
// CPU backend's results bit for bit.
#include <algorithm>
#include <array>
#include <cstring>
#include <cub/block/block_scan.cuh>

#include "cuda_check.h"
#include "kernel_util.cuh"
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
    gather_columns_kernel<<<grid_for(rows * count, 256, 1 << 20), 256, 0, s>>>(pre, bias, cols,
                                                                               rows, n, count, sub);
    SAE_CUDA_LAUNCH_CHECK();
    topk_forward(s, ws, sub, zero, rows, count, k, idx, val, relu);  // workspace slot 0 only
    map_columns_kernel<<<grid_for(rows * k, 256, 1 << 20), 256, 0, s>>>(idx, cols, rows * k);
    SAE_CUDA_LAUNCH_CHECK();
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
