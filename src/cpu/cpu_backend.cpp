// CPU backend: OpenBLAS for the GEMMs, OpenMP for the passes over a batch. An architecture's own
// ops (arch_ops.h) run its CPU reference, beside the architecture in src/core/arch/: the
// default of Backend::arch_ops for a backend whose memory is the host's.
//
// Reductions are split into fixed column blocks and summed in block order, and GEMMs into tiles
// fixed by their shape, so results do not depend on the thread count or scheduling (exact resume
// and replica equality rely on it, and a rank's threads follow the cores other processes leave
// it, cores.h; the CPU references split theirs the same way, src/core/arch/reference.h).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/backend_registry.h"
#include "saetrain/error.h"
#include "saetrain/sae_math.h"

extern "C" void openblas_set_num_threads(int);

namespace saetrain {
namespace {

constexpr int64_t kColBlock = 256;  // columns per reduction block: 1 KiB of floats per row

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tiles of a GEMM's C [m, n] with inner dimension k (CpuBackend::gemm): powers of two of at
// most 1024 x 1024, the longer side halved (down to 64) while the GEMM has fewer than 16 tiles
// and a tile keeps 2^20 multiply-adds or more, then grown while a tile has fewer. Large tiles
// because each tile packs its own panels of A and B (OpenBLAS's threads share theirs): at
// 256 x 256 the encoder's GEMM of bench_step (4096 x 6144 x 768) ran 1.16x OpenBLAS's on 2
// threads, at 1024 x 1024 1.0-1.1x; at least 16 so that threads that come free take the rest.
// A function of the shape alone: the tiles, and so the GEMM's bits, never depend on how many
// threads compute them.
struct GemmTiles {
    int64_t rows, cols;
};
GemmTiles gemm_tiles(int64_t m, int64_t n, int64_t k) {
    constexpr int64_t kMaxSide = 1024, kMinSide = 64, kMinMacs = int64_t{1} << 20;
    constexpr int64_t kFewTiles = 16;
    const auto pow2_at_least = [](int64_t v) {
        int64_t p = 1;
        while (p < v) p *= 2;
        return p;
    };
    int64_t tm = std::min(pow2_at_least(std::max<int64_t>(m, 1)), kMaxSide);
    int64_t tn = std::min(pow2_at_least(std::max<int64_t>(n, 1)), kMaxSide);
    const auto tiles = [&] { return ceil_div(m, tm) * ceil_div(n, tn); };
    const int64_t kk = std::max<int64_t>(k, 1);
    while (tiles() < kFewTiles) {
        const bool cols = tn >= tm;  // the longer side; columns on a tie
        int64_t& side = cols ? tn : tm;
        if (side / 2 < kMinSide || side / 2 * (cols ? tm : tn) * kk < kMinMacs) break;
        side /= 2;
    }
    while (tm * tn * kk < kMinMacs && (tm < m || tn < n)) (tn < n ? tn : tm) *= 2;
    return {tm, tn};
}

// Keeps the k largest of a row (ties: the lower index wins) in a min-heap whose top is the
// current worst kept element. After the heap fills, most elements fail one comparison against
// the top, so a row costs about n comparisons plus a few heap updates.
struct TopkHeap {
    std::vector<std::pair<float, int32_t>> h;
    // std heap puts the "largest" by this order on top: make that the worst element. A functor
    // (not a function pointer) so the heap operations inline the comparison.
    struct WorseFirst {
        bool operator()(const std::pair<float, int32_t>& a,
                        const std::pair<float, int32_t>& b) const {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        }
    };
    static constexpr WorseFirst worse_first{};
    void select(const float* pre, const float* bias, int64_t n, int64_t k, int32_t* idx, float* val,
                bool relu) {
        h.resize(static_cast<size_t>(k));
        for (int64_t i = 0; i < k; ++i) h[i] = {pre[i] + bias[i], static_cast<int32_t>(i)};
        std::make_heap(h.begin(), h.end(), worse_first);
        auto consider = [&](int64_t i) {
            const float v = pre[i] + bias[i];
            if (v > h.front().first) {  // equal value: the kept one has the lower index
                std::pop_heap(h.begin(), h.end(), worse_first);
                h.back() = {v, static_cast<int32_t>(i)};
                std::push_heap(h.begin(), h.end(), worse_first);
            }
        };
        // Once the heap holds good values almost every block of 16 falls below its worst
        // element; one vectorized test skips the whole block.
        constexpr int64_t kBlock = 16;
        int64_t i = k;
        for (; i + kBlock <= n; i += kBlock) {
            const float thr = h.front().first;
            int any = 0;
            for (int64_t j = 0; j < kBlock; ++j) any |= (pre[i + j] + bias[i + j]) > thr;
            if (!any) continue;
            for (int64_t j = 0; j < kBlock; ++j) consider(i + j);
        }
        for (; i < n; ++i) consider(i);
        std::sort_heap(h.begin(), h.end(), worse_first);  // best first
        for (int64_t j = 0; j < k; ++j) {
            idx[j] = h[j].second;
            val[j] = relu ? math::relu(h[j].first) : h[j].first;
        }
    }
};

// The same selection as TopkHeap (ties: the lower index), faster when a row has many blocks of
// 16 per selected value: t = the k-th largest of the blocks' maxima is at most the row's k-th
// largest value (k blocks hold a value >= t), so every selected value is >= t; one vectorized
// pass collects the values >= t (typically a few times k) and sorting them finishes. Rows with
// fewer than 2k blocks, or a NaN, go to the heap.
struct TopkFilter {
    static constexpr int64_t kBlock = 16;
    std::vector<float> block_max, order;
    std::vector<std::pair<float, int32_t>> cand;
    TopkHeap heap;
    void select(const float* pre, const float* bias, int64_t n, int64_t k, int32_t* idx, float* val,
                bool relu) {
        const int64_t blocks = n / kBlock;
        if (blocks < 2 * k) return heap.select(pre, bias, n, k, idx, val, relu);
        block_max.resize(static_cast<size_t>(blocks));
        bool nan = false;
        for (int64_t b = 0; b < blocks; ++b) {
            const float* p = pre + b * kBlock;
            const float* q = bias + b * kBlock;
            float m = p[0] + q[0];
            bool bad = false;
            for (int64_t j = 0; j < kBlock; ++j) {
                const float v = p[j] + q[j];
                m = v > m ? v : m;
                bad |= v != v;
            }
            block_max[b] = m;
            nan |= bad;
        }
        if (nan) return heap.select(pre, bias, n, k, idx, val, relu);
        order.assign(block_max.begin(), block_max.end());
        std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<>());
        const float t = order[k - 1];
        cand.clear();
        for (int64_t b = 0; b < blocks; ++b) {
            if (block_max[b] < t) continue;
            for (int64_t j = b * kBlock; j < (b + 1) * kBlock; ++j) {
                const float v = pre[j] + bias[j];
                if (v >= t) cand.emplace_back(v, static_cast<int32_t>(j));
            }
        }
        for (int64_t j = blocks * kBlock; j < n; ++j) {  // the tail after the last whole block
            const float v = pre[j] + bias[j];
            if (v != v) return heap.select(pre, bias, n, k, idx, val, relu);
            if (v >= t) cand.emplace_back(v, static_cast<int32_t>(j));
        }
        auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        };
        std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
        for (int64_t j = 0; j < k; ++j) {
            idx[j] = cand[j].second;
            val[j] = relu ? math::relu(cand[j].first) : cand[j].first;
        }
    }
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int threads) {
        threads_ = threads > 0 ? threads : omp_get_max_threads();
        omp_set_num_threads(threads_);
        openblas_set_num_threads(threads_);
    }
    std::string name() const override { return fmt::format("cpu ({} threads)", threads_); }
    // The count is the calling thread's: the trainer's, which issues every pass. No result
    // depends on it: reductions are summed in fixed blocks and GEMMs in fixed tiles.
    void set_host_threads(int threads) override {
        omp_set_num_threads(std::clamp(threads, 1, threads_));
    }
    bool host_memory() const override { return true; }

    void* alloc_bytes(int64_t bytes) override {
        // 64-byte alignment for vector loads; round the size up as aligned_alloc requires.
        const size_t sz = static_cast<size_t>(std::max<int64_t>(64, ceil_div(bytes, 64) * 64));
        void* p = std::aligned_alloc(64, sz);
        SAE_ENFORCE(p != nullptr, "out of host memory allocating {} bytes", bytes);
        return p;
    }
    void free_bytes(void* p) override { std::free(p); }
    void upload(void* dst, const void* src, int64_t bytes) override {
        std::memcpy(dst, src, static_cast<size_t>(bytes));
    }
    void download(void* dst, const void* src, int64_t bytes) override {
        std::memcpy(dst, src, static_cast<size_t>(bytes));
    }
    // Widened on the host straight into dst (the values are those the reader's widening gave
    // before 16-bit rows were kept: the same function), in pieces on the backend's threads.
    void upload_rows(float* dst, const void* src, DType t, int64_t n) override {
        constexpr int64_t kPiece = 1 << 16;  // values per piece: a multiple of F16C's 8
        const int64_t pieces = ceil_div(n, kPiece);
        const auto* s = static_cast<const char*>(src);
        const int64_t size = dtype_size(t);
#pragma omp parallel for schedule(static) if (pieces > 1)
        for (int64_t p = 0; p < pieces; ++p) {
            const int64_t i = p * kPiece;
            widen_to_f32(t, s + i * size, dst + i, std::min(kPiece, n - i));
        }
    }
    void upload_columns(float* dst, const void* src, DType t, int64_t rows, int64_t cols,
                        int64_t stride) override {
        const auto* s = static_cast<const char*>(src);
        const int64_t size = dtype_size(t);
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
        for (int64_t r = 0; r < rows; ++r)
            widen_to_f32(t, s + r * stride * size, dst + r * cols, cols);
    }
    void fill(float* x, int64_t n, float value) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) x[i] = value;
    }
    void zero_block(float* x, int64_t rows, int64_t cols, int64_t ld) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) std::fill_n(x + r * ld, cols, 0.0f);
    }
    void copy_block(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                    int64_t row_bytes, int64_t rows) override {
        auto* d = static_cast<char*>(dst);
        const auto* s = static_cast<const char*>(src);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(d + r * dst_pitch, s + r * src_pitch, static_cast<size_t>(row_bytes));
    }
    void synchronize() override {}

    // A GEMM in tiles of C that depend on its shape alone, each one OpenBLAS call on one thread,
    // taken by the threads as they come free. OpenBLAS's own threading splits a GEMM by the
    // thread count, and the split changes its last bits (every GEMM shape of a step differed
    // between 1, 2 and 3 threads here); fixed tiles make a GEMM's result, like every pass's,
    // the same at any thread count, so the count may follow the cores other processes leave
    // (set_host_threads). And a thread that was descheduled holds up its tile, not the GEMM.
    void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
        const GemmTiles t = gemm_tiles(m, n, k);
        const int64_t cols = ceil_div(n, t.cols), tiles = ceil_div(m, t.rows) * cols;
        const auto one_tile = [&](int64_t tile) {
            const int64_t i = tile / cols * t.rows, j = tile % cols * t.cols;
            const int64_t mm = std::min(t.rows, m - i), nn = std::min(t.cols, n - j);
            const float* ai = ta ? a + i : a + i * lda;  // op(A)'s rows i.., A [k, m] or [m, k]
            const float* bj = tb ? b + j * ldb : b + j;  // op(B)'s columns j..
            float* cij = c + i * ldc + j;
            if (m == 1) {  // a vector-matrix product: sgemm's packing costs more than the math
                // c[1,nn] = alpha * a[1,k] op(B) + beta * c  ==  op(B)^T a as a GEMV on B.
                cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans,
                            static_cast<blasint>(tb ? nn : k), static_cast<blasint>(tb ? k : nn),
                            alpha, bj, static_cast<blasint>(ldb), a,
                            ta ? static_cast<blasint>(lda) : 1, beta, cij, 1);
                return;
            }
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(mm),
                        static_cast<blasint>(nn), static_cast<blasint>(k), alpha, ai,
                        static_cast<blasint>(lda), bj, static_cast<blasint>(ldb), beta, cij,
                        static_cast<blasint>(ldc));
        };
        // One thread: OpenBLAS called directly takes omp_get_max_threads(), one, and no parallel
        // region is opened. More: an active region (two threads at least) even for one tile,
        // inside which OpenBLAS runs on the calling thread alone; outside one, or in a region of
        // one thread, it would take every thread and split the tile by their count.
        const int threads = omp_get_max_threads();
        if (threads <= 1) {
            for (int64_t tile = 0; tile < tiles; ++tile) one_tile(tile);
            return;
        }
        const int team = static_cast<int>(std::max<int64_t>(2, std::min<int64_t>(tiles, threads)));
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
        for (int64_t tile = 0; tile < tiles; ++tile) one_tile(tile);
    }

    double sum_squares(const float* x, int64_t n) override {
        const int64_t nb = ceil_div(n, 1 << 16);
        std::vector<double> part(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nb; ++b) {
            // Eight independent sums: one chain of dependent double additions would make this
            // latency-bound (a quarter of memory speed over a gradient of 38M values).
            double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            const int64_t lo = b << 16, hi = std::min(n, (b + 1) << 16);
            int64_t i = lo;
            for (; i + 8 <= hi; i += 8)
                for (int j = 0; j < 8; ++j) s[j] += static_cast<double>(x[i + j]) * x[i + j];
            for (; i < hi; ++i) s[0] += static_cast<double>(x[i]) * x[i];
            part[b] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        }
        double s = 0;
        for (double p : part) s += p;
        return s;
    }

    void sub_rows(float* out, const float* x, const float* bias, int64_t rows,
                  int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = x[r * cols + c] - bias[c];
    }
    void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * cols, bias, cols * sizeof(float));
    }

    void residual(float* xh, const float* x, int64_t rows, int64_t d, float grad_scale,
                  float* x_col_sum, float* db_dec, float* stats) override {
        const int64_t nb = ceil_div(d, kColBlock);
        std::vector<double> sse(nb), sx2(nb);
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t c0 = b * kColBlock, c1 = std::min(d, c0 + kColBlock);
            double e2 = 0, q = 0;
            for (int64_t c = c0; c < c1; ++c) x_col_sum[c] = db_dec[c] = 0.0f;
            for (int64_t r = 0; r < rows; ++r) {
                float* e = xh + r * d;
                const float* xr = x + r * d;
                float e2r = 0, qr = 0;
                for (int64_t c = c0; c < c1; ++c) {
                    const float err = e[c] - xr[c];
                    e2r += err * err;
                    qr += xr[c] * xr[c];
                    x_col_sum[c] += xr[c];
                    e[c] = grad_scale * err;
                    db_dec[c] += e[c];
                }
                e2 += e2r;
                q += qr;
            }
            sse[b] = e2, sx2[b] = q;
        }
        for (int64_t b = 0; b < nb; ++b) {
            stats[kStatSse] += static_cast<float>(sse[b]);
            stats[kStatSumSqX] += static_cast<float>(sx2[b]);
        }
    }

    void topk_forward(const float* pre, const float* b_enc, int64_t rows, int64_t n, int64_t k,
                      int32_t* idx, float* val, bool relu) override {
#pragma omp parallel
        {
            TopkFilter sel;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; ++r)
                sel.select(pre + r * n, b_enc, n, k, idx + r * k, val + r * k, relu);
        }
    }

    void sparse_decode(const int32_t* idx, const float* val, const float* w_dec, int64_t rows,
                       int64_t k, int64_t d, float* x_hat) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* out = x_hat + r * d;
            for (int64_t j = 0; j < k; ++j) {
                const float a = val[r * k + j];
                if (a == 0.0f) continue;
                const float* w = w_dec + static_cast<int64_t>(idx[r * k + j]) * d;
                for (int64_t c = 0; c < d; ++c) out[c] += a * w[c];
            }
        }
    }
    // Each row from its layer's block on: the columns before it are the structure's zeros.
    void sparse_decode_layered(const int32_t* idx, const float* val, const float* w_dec,
                               int64_t rows, int64_t k, int64_t d, int64_t n, int64_t layers,
                               float* x_hat) override {
        const int64_t per_layer = n / layers, dl = d / layers;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* out = x_hat + r * d;
            for (int64_t j = 0; j < k; ++j) {
                const float a = val[r * k + j];
                if (a == 0.0f) continue;
                const int64_t i = idx[r * k + j], c0 = (i / per_layer) * dl;
                const float* w = w_dec + i * d;
                for (int64_t c = c0; c < d; ++c) out[c] += a * w[c];
            }
        }
    }

    void topk_backward(const SparseBackward& args) override {
        const auto& [x, derr, idx, val, w_dec, rows, n, k, d, dw_enc, dw_dec, db_enc, fires, stats,
                     accumulate, dval_extra, enc_layers] = args;
        // A layered encoder's rows are d_l = d / enc_layers wide, on their layer's block of x.
        const int64_t de = d / enc_layers, per_layer = n / enc_layers;
        // Counting sort of the active (row, slot) pairs by latent: each latent's gradient rows
        // are then written by one thread, in row order (deterministic, no atomics).
        start_.assign(static_cast<size_t>(n) + 1, 0);
        for (int64_t e = 0; e < rows * k; ++e)
            if (val[e] != 0.0f) ++start_[idx[e] + 1];
        for (int64_t l = 0; l < n; ++l) start_[l + 1] += start_[l];
        entries_.resize(static_cast<size_t>(start_[n]));
        cursor_.assign(start_.begin(), start_.end() - 1);
        for (int64_t e = 0; e < rows * k; ++e)
            if (val[e] != 0.0f) entries_[cursor_[idx[e]]++] = static_cast<int32_t>(e);

#pragma omp parallel for schedule(dynamic, 64)
        for (int64_t l = 0; l < n; ++l) {
            float* gd = dw_dec + l * d;
            float* ge = dw_enc + l * de;
            const float* w = w_dec + l * d;
            // Its block of x, and where its decoder row's live columns start (a layered model's
            // row is zero before its layer's block).
            const int64_t x0 = enc_layers > 1 ? (l / per_layer) * de : 0;
            if (!accumulate) {
                std::memset(gd, 0, d * sizeof(float));
                std::memset(ge, 0, de * sizeof(float));
            }
            float gb = accumulate ? db_enc[l] : 0.0f;
            for (int64_t p = start_[l]; p < start_[l + 1]; ++p) {
                const int64_t e = entries_[p], r = e / k;
                const float* er = derr + r * d;
                const float* xr = x + r * d + x0;
                const float a = val[e];
                float dv = 0.0f;
#pragma omp simd reduction(+ : dv)
                for (int64_t c = x0; c < d; ++c) {
                    dv += er[c] * w[c];
                    gd[c] += a * er[c];
                }
                if (dval_extra) dv += dval_extra[e];
                for (int64_t c = 0; c < de; ++c) ge[c] += dv * xr[c];
                gb += dv;
            }
            db_enc[l] = gb;
            fires[l] = static_cast<int32_t>(start_[l + 1] - start_[l]);
        }
        stats[kStatL0] += static_cast<float>(start_[n]);
    }

    void decorr_grad(const float* z, const int32_t* idx, int64_t width, int64_t rows, int64_t n,
                     float scale, float* dz, float* stats) override {
        // Dense activations U, standardized per column (zero mean, unit norm), C = U^T U, then
        // dR/dU = U (2 C / (P R)) off the diagonal (P = n (n - 1) pairs), and back through the
        // standardization: dz = (dU - mean(dU) - u (u . dU)) / ||z - mean||, per column.
        if (rows < 2 || n < 2) return;
        std::vector<float> u(static_cast<size_t>(rows * n), 0.0f);
        if (idx) {
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t j = 0; j < width; ++j)
                    if (z[r * width + j] != 0.0f) u[r * n + idx[r * width + j]] = z[r * width + j];
        } else {
            std::memcpy(u.data(), z, u.size() * sizeof(float));
        }
        std::vector<float> inv_norm(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < n; ++c) {
            double mean = 0, sq = 0;
            for (int64_t r = 0; r < rows; ++r) mean += u[r * n + c];
            mean /= static_cast<double>(rows);
            for (int64_t r = 0; r < rows; ++r) {
                const double y = u[r * n + c] - mean;
                sq += y * y;
            }
            const double inv = sq > 0 ? 1.0 / std::sqrt(sq) : 0.0;
            inv_norm[c] = static_cast<float>(inv);
            for (int64_t r = 0; r < rows; ++r)
                u[r * n + c] = static_cast<float>((u[r * n + c] - mean) * inv);
        }
        std::vector<float> g(static_cast<size_t>(n * n));
        gemm(true, false, n, n, rows, 1.0f, u.data(), n, u.data(), n, 0.0f, g.data(), n);
        double s = 0;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < n; ++j)
                if (i != j) s += double(g[i * n + j]) * g[i * n + j];
        const double pairs = static_cast<double>(n) * static_cast<double>(n - 1);
        const double rms = std::sqrt(s / pairs);
        stats[kStatDecorr] += static_cast<float>(rms);
        if (!(rms > 0) || scale == 0.0f) return;
        const auto f = static_cast<float>(2.0 / (pairs * rms));
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < n; ++j) g[i * n + j] = i == j ? 0.0f : f * g[i * n + j];
        std::vector<float> du(u.size());
        gemm(false, false, rows, n, n, 1.0f, u.data(), n, g.data(), n, 0.0f, du.data(), n);
        std::vector<float> dmean(static_cast<size_t>(n)), udu(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < n; ++c) {
            double m = 0, p = 0;
            for (int64_t r = 0; r < rows; ++r) {
                m += du[r * n + c];
                p += double(u[r * n + c]) * du[r * n + c];
            }
            dmean[c] = static_cast<float>(m / static_cast<double>(rows));
            udu[c] = static_cast<float>(p);
        }
        auto grad = [&](int64_t r, int64_t c) {
            return scale * inv_norm[c] * (du[r * n + c] - dmean[c] - u[r * n + c] * udu[c]);
        };
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (idx) {
                for (int64_t j = 0; j < width; ++j)
                    if (z[r * width + j] != 0.0f) dz[r * width + j] += grad(r, idx[r * width + j]);
            } else {
                for (int64_t c = 0; c < n; ++c) dz[r * n + c] += grad(r, c);
            }
        }
    }

    void offset_indices(int32_t* idx, int64_t count, int32_t offset) override {
        for (int64_t i = 0; i < count; ++i) idx[i] += offset;
    }
    void axpby(float* y, const float* x, float a, float b, int64_t n) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) y[i] = b == 0.0f ? a * x[i] : a * x[i] + b * y[i];
    }

    void swap(float* a, float* b, int64_t n) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) std::swap(a[i], b[i]);
    }

    void row_norms(const float* w, int64_t rows, int64_t cols, float* norms) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            norms[r] = std::sqrt(dot(w + r * cols, w + r * cols, cols));
    }
    void project_out_parallel(const float* w, float* g, int64_t rows, int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const float* wr = w + r * cols;
            float* gr = g + r * cols;
            const float ww = dot(wr, wr, cols);
            if (ww <= 0.0f) continue;
            const float s = dot(wr, gr, cols) / ww;
            for (int64_t c = 0; c < cols; ++c) gr[c] -= s * wr[c];
        }
    }
    void normalize_rows(float* w, int64_t rows, int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* wr = w + r * cols;
            const float nrm = std::sqrt(dot(wr, wr, cols));
            if (nrm <= 0.0f) continue;
            const float inv = 1.0f / nrm;
            for (int64_t c = 0; c < cols; ++c) wr[c] *= inv;
        }
    }
    void add_norm_grad(const float* w, const float* coeff, float scale, float* g, int64_t rows,
                       int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const float* wr = w + r * cols;
            const float nrm = std::sqrt(dot(wr, wr, cols));
            if (nrm <= 0.0f) continue;
            const float s = scale * coeff[r] / nrm;
            float* gr = g + r * cols;
            for (int64_t c = 0; c < cols; ++c) gr[c] += s * wr[c];
        }
    }

private:
    static float dot(const float* a, const float* b, int64_t n) {
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
        return s;
    }

    int threads_ = 1;
    std::vector<int64_t> start_, cursor_;  // topk_backward scratch, reused across steps
    std::vector<int32_t> entries_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
    return std::make_unique<CpuBackend>(threads);
}

const BackendKind& cpu_backend_kind() {
    static const BackendKind kind{
        "cpu", "CPU", [] { return 1; }, "",
        [](const BackendRequest& r, std::string* note) {
            if (r.gemm != "fp32")
                *note += fmt::format(
                    "{}gpu.gemm: {} does not apply: the CPU backend computes in "
                    "fp32",
                    note->empty() ? "" : "; ", r.gemm);
            return make_cpu_backend(r.threads);
        }};
    return kind;
}

}  // namespace saetrain
