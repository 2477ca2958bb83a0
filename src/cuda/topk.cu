// TopK kernels: per-row selection, sparse decode and the sparse backward.
//
// Selection (one block per row): a 4-pass radix select over order-preserving 32-bit keys of
// pre + b_enc finds the k-th largest key T; one ordered pass then takes every element above T
// and the lowest-index elements equal to T (a block scan keeps the index order), and a bitonic
// sort of the k picks by (value desc, index asc) gives exactly the CPU backend's output,
// including its tie rule (the lower index wins). Rows of up to 2^17 floats are read 5 times;
// the row stays in L2 on A100/H100 for a block's lifetime, so this is bandwidth-bound reading.
//
// Backward, deterministic: entries (row, slot) are sorted by latent with a stable radix sort
// (cub::DeviceRadixSort), so each latent's gradient row is summed by one block in row order,
// like the CPU's counting sort, with no float atomics.
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_check.h"
#include "kernels.h"
#include "saetrain/backend.h"

namespace saetrain::cuda {
namespace {

constexpr int kSelectThreads = 512;  // >= kMaxTopk / 2 comparators for the bitonic sort

// Composite sort key: value order in the high word, then lower index first in the low word.
__device__ __forceinline__ unsigned long long pick_key(uint32_t key, uint32_t i) {
    return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - i);
}

__global__ void __launch_bounds__(kSelectThreads)
    topk_select_kernel(const float* pre, const float* bias, int n, int k, int k_pad,
                       int32_t* idx_out, float* val_out) {
    using Scan = cub::BlockScan<unsigned long long, kSelectThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ unsigned hist[256];
    __shared__ unsigned long long picks[kMaxTopk];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining, s_gt_base, s_eq_base;
    const int tid = threadIdx.x;
    const float* p = pre + static_cast<int64_t>(blockIdx.x) * n;

    // 1. Radix select, 8 bits per pass from the top: after pass j, `prefix` holds the top
    //    8(j+1) bits of T and `remaining` how many of the elements matching it must be taken.
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += kSelectThreads) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += kSelectThreads) {
            const uint32_t key = math::float_order_key(p[i] + bias[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int above = 0, b = 255;
            for (; b > 0; --b) {
                if (above + static_cast<int>(hist[b]) >= remaining) break;
                above += static_cast<int>(hist[b]);
            }
            s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
            s_remaining = remaining - above;
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 0xffu << shift;
    }
    const uint32_t T = prefix;
    const int need_eq = remaining, n_gt = k - remaining;

    // 2. Ordered compaction: keys > T all go in; keys == T in index order until need_eq.
    if (tid == 0) s_gt_base = 0, s_eq_base = 0;
    for (int i = k + tid; i < k_pad; i += kSelectThreads) picks[i] = 0;  // sorts last
    __syncthreads();
    for (int base = 0; base < n; base += kSelectThreads) {
        const int i = base + tid;
        uint32_t key = 0;
        bool gt = false, eq = false;
        if (i < n) {
            key = math::float_order_key(p[i] + bias[i]);
            gt = key > T;
            eq = key == T;
        }
        const unsigned long long flag = (static_cast<unsigned long long>(gt) << 32) | eq;
        unsigned long long before, total;
        Scan(scan_tmp).ExclusiveSum(flag, before, total);
        const int gt_pos = s_gt_base + static_cast<int>(before >> 32);
        const int eq_pos = s_eq_base + static_cast<int>(before & 0xffffffffu);
        if (gt) picks[gt_pos] = pick_key(key, static_cast<uint32_t>(i));
        if (eq && eq_pos < need_eq) picks[n_gt + eq_pos] = pick_key(key, static_cast<uint32_t>(i));
        __syncthreads();  // everyone read the bases (and scan_tmp is free again)
        if (tid == 0) {
            s_gt_base += static_cast<int>(total >> 32);
            s_eq_base += static_cast<int>(total & 0xffffffffu);
        }
        __syncthreads();
        if (s_gt_base >= n_gt && s_eq_base >= need_eq) break;  // uniform across the block
    }

    // 3. Bitonic sort of the k_pad picks, descending: value desc, then index asc.
    for (int size = 2; size <= k_pad; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = tid; t < k_pad / 2; t += kSelectThreads) {
                const int a = 2 * stride * (t / stride) + t % stride, b = a + stride;
                const bool desc = (a & size) == 0;
                const unsigned long long va = picks[a], vb = picks[b];
                if ((va < vb) == desc) picks[a] = vb, picks[b] = va;
            }
        }
    }
    __syncthreads();
    for (int j = tid; j < k; j += kSelectThreads) {
        const unsigned long long v = picks[j];
        const int64_t o = static_cast<int64_t>(blockIdx.x) * k + j;
        idx_out[o] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(v & 0xffffffffu));
        val_out[o] = math::relu(math::float_from_order_key(static_cast<uint32_t>(v >> 32)));
    }
}

// x_hat[r] += sum_j val[r,j] * w_dec[idx[r,j]]: one block per row, j in order (as the CPU).
__global__ void sparse_decode_kernel(const int32_t* idx, const float* val, const float* w_dec,
                                     int k, int64_t d, float* x_hat) {
    __shared__ int32_t s_idx[kMaxTopk];
    __shared__ float s_val[kMaxTopk];
    const int64_t r = blockIdx.x;
    for (int j = threadIdx.x; j < k; j += blockDim.x)
        s_idx[j] = idx[r * k + j], s_val[j] = val[r * k + j];
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = x_hat[r * d + c];
        for (int j = 0; j < k; ++j) {
            const float a = s_val[j];
            if (a != 0.0f) acc += a * w_dec[static_cast<int64_t>(s_idx[j]) * d + c];
        }
        x_hat[r * d + c] = acc;
    }
}

// Active entries: counts per latent (integer atomics: exact), sort keys (latent, or n for an
// inactive entry so it sorts last) and entry ids.
__global__ void topk_entries_kernel(const int32_t* idx, const float* val, int64_t entries,
                                    int32_t n, int32_t* counts, int32_t* keys, int32_t* ids) {
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < entries;
         e += int64_t(gridDim.x) * blockDim.x) {
        const bool on = val[e] > 0.0f;
        if (on) atomicAdd(&counts[idx[e]], 1);
        keys[e] = on ? idx[e] : n;
        ids[e] = static_cast<int32_t>(e);
    }
}

// dval[e] = (val > 0) * derr[r] . w_dec[idx]: one warp per entry, fixed butterfly order. The
// warps stride over the entries: the grid is capped (grid_for), and rows * k can exceed what
// one warp per entry in a capped grid covers (2^20 blocks x 8 warps = 8,388,608 entries).
__global__ void topk_dval_kernel(const float* derr, const int32_t* idx, const float* val,
                                 const float* w_dec, int64_t entries, int64_t k, int64_t d,
                                 float* dval) {
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; e < entries;
         e += warps) {
        if (!(val[e] > 0.0f)) {  // uniform across the warp: one entry per warp
            if (lane == 0) dval[e] = 0.0f;
            continue;
        }
        const float* er = derr + (e / k) * d;
        const float* w = w_dec + static_cast<int64_t>(idx[e]) * d;
        float s = 0;
        for (int64_t c = lane; c < d; c += 32) s += er[c] * w[c];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) dval[e] = s;
    }
}

// One block per latent: its gradient rows from its entries, in row order.
__global__ void topk_grad_rows_kernel(const float* x, const float* derr, const float* val,
                                      const float* dval, const int32_t* start,
                                      const int32_t* sorted_ids, int64_t k, int64_t d,
                                      float* dw_enc, float* dw_dec, float* db_enc, int32_t* fires) {
    const int64_t l = blockIdx.x;
    const int32_t s = start[l], t = start[l + 1];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float gd = 0, ge = 0;
        for (int32_t q = s; q < t; ++q) {
            const int64_t e = sorted_ids[q], r = e / k;
            gd += val[e] * derr[r * d + c];
            ge += dval[e] * x[r * d + c];
        }
        dw_dec[l * d + c] = gd;
        dw_enc[l * d + c] = ge;
    }
    if (threadIdx.x == 0) {
        float gb = 0;
        for (int32_t q = s; q < t; ++q) gb += dval[sorted_ids[q]];
        db_enc[l] = gb;
        fires[l] = t - s;
    }
}

// Non-deterministic path: one block per active entry scatters into the gradient rows.
__global__ void topk_scatter_kernel(const float* x, const float* derr, const int32_t* idx,
                                    const float* val, const float* dval, int64_t k, int64_t d,
                                    float* dw_enc, float* dw_dec, float* db_enc, int32_t* fires) {
    const int64_t e = blockIdx.x;
    const float a = val[e];
    if (!(a > 0.0f)) return;
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

int grid_for(int64_t n, int threads) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 1 << 20)));
}

}  // namespace

void topk_forward(cudaStream_t s, const float* pre, const float* b_enc, int64_t rows, int64_t n,
                  int64_t k, int32_t* idx, float* val) {
    SAE_ENFORCE(k >= 1 && k <= kMaxTopk,
                "CUDA top-k supports 1 <= k <= {} (got k = {}); use a smaller sae.k", kMaxTopk, k);
    SAE_ENFORCE(k <= n && n < (int64_t(1) << 31), "top-k: k = {} > n_latents = {}", k, n);
    if (rows <= 0) return;
    int k_pad = 1;
    while (k_pad < k) k_pad <<= 1;
    topk_select_kernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, s>>>(
        pre, b_enc, static_cast<int>(n), static_cast<int>(k), k_pad, idx, val);
    SAE_CUDA_LAUNCH_CHECK();
}

void sparse_decode(cudaStream_t s, const int32_t* idx, const float* val, const float* w_dec,
                   int64_t rows, int64_t k, int64_t d, float* x_hat) {
    SAE_ENFORCE(k >= 1 && k <= kMaxTopk, "sparse_decode: k = {} outside [1, {}]", k, kMaxTopk);
    if (rows <= 0) return;
    const int threads = d >= 256 ? 256 : 128;
    sparse_decode_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(
        idx, val, w_dec, static_cast<int>(k), d, x_hat);
    SAE_CUDA_LAUNCH_CHECK();
}

void topk_backward(cudaStream_t s, Workspace& ws, bool deterministic, const float* x,
                   const float* derr, const int32_t* idx, const float* val, const float* w_dec,
                   int64_t rows, int64_t n, int64_t k, int64_t d, float* dw_enc, float* dw_dec,
                   float* db_enc, int32_t* fires, float* stats) {
    const int64_t entries = rows * k;
    SAE_ENFORCE(entries < (int64_t(1) << 31) && n < (int64_t(1) << 31),
                "topk_backward: {} entries or {} latents exceed the int32 index range", entries, n);
    auto* dval = ws.get<float>(0, std::max<int64_t>(entries, 1));
    if (entries > 0) {
        topk_dval_kernel<<<grid_for(entries * 32, 256), 256, 0, s>>>(derr, idx, val, w_dec, entries,
                                                                     k, d, dval);
        SAE_CUDA_LAUNCH_CHECK();
    }
    if (!deterministic) {
        SAE_CUDA_CHECK(cudaMemsetAsync(dw_enc, 0, sizeof(float) * n * d, s));
        SAE_CUDA_CHECK(cudaMemsetAsync(dw_dec, 0, sizeof(float) * n * d, s));
        SAE_CUDA_CHECK(cudaMemsetAsync(db_enc, 0, sizeof(float) * n, s));
        SAE_CUDA_CHECK(cudaMemsetAsync(fires, 0, sizeof(int32_t) * n, s));
        if (entries > 0) {
            topk_scatter_kernel<<<static_cast<unsigned>(entries), d >= 256 ? 256 : 128, 0, s>>>(
                x, derr, idx, val, dval, k, d, dw_enc, dw_dec, db_enc, fires);
            SAE_CUDA_LAUNCH_CHECK();
        }
        add_count_to_stat_kernel<<<1, 1, 0, s>>>(fires, n, stats + kStatL0);
        SAE_CUDA_LAUNCH_CHECK();
        return;
    }

    const int n32 = static_cast<int>(n), e32 = static_cast<int>(entries);
    auto* counts = ws.get<int32_t>(1, n + 1);
    auto* start = ws.get<int32_t>(2, n + 1);
    auto* keys = ws.get<int32_t>(3, 2 * std::max<int64_t>(entries, 1));
    auto* ids = ws.get<int32_t>(4, 2 * std::max<int64_t>(entries, 1));
    int32_t* keys_sorted = keys + std::max<int64_t>(entries, 1);
    int32_t* ids_sorted = ids + std::max<int64_t>(entries, 1);
    SAE_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (n + 1), s));
    if (entries > 0) {
        topk_entries_kernel<<<grid_for(entries, 256), 256, 0, s>>>(idx, val, entries, n32, counts,
                                                                   keys, ids);
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
    if (n > 0) {
        topk_grad_rows_kernel<<<static_cast<unsigned>(n), d >= 256 ? 256 : 128, 0, s>>>(
            x, derr, val, dval, start, ids_sorted, k, d, dw_enc, dw_dec, db_enc, fires);
        SAE_CUDA_LAUNCH_CHECK();
    }
    add_int_to_stat_kernel<<<1, 1, 0, s>>>(start + n, stats + kStatL0);
    SAE_CUDA_LAUNCH_CHECK();
}

}  // namespace saetrain::cuda
