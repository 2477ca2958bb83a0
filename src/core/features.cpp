#include "saetrain/features.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain {

std::vector<float> feature_hist_edges() {
    std::vector<float> e(kHistBins + 1);
    for (int i = 0; i <= kHistBins; ++i)
        e[static_cast<size_t>(i)] = static_cast<float>(
            std::pow(10.0, kHistLowDecade + static_cast<double>(i) / kHistPerDecade));
    return e;
}

int feature_hist_bin(float v) {
    static const std::vector<float> edges = feature_hist_edges();
    // The last edge not above v: the bin [edge_i, edge_i+1) holds it.
    const auto it = std::upper_bound(edges.begin(), edges.end(), v);
    const auto i = static_cast<int>(it - edges.begin()) - 1;
    return std::clamp(i, 0, kHistBins - 1);
}

float SparseRows::value(int64_t row, int64_t latent) const {
    const int64_t r = row - first_row;
    if (r < 0 || r >= rows()) return 0.0f;
    for (int64_t j = start[static_cast<size_t>(r)]; j < start[static_cast<size_t>(r + 1)]; ++j)
        if (idx[static_cast<size_t>(j)] == latent) return val[static_cast<size_t>(j)];
    return 0.0f;
}

SparseRows sparse_rows(const HostActivations& a, int64_t from, int64_t rows, int64_t first_row) {
    SparseRows b;
    b.first_row = first_row;
    b.start.reserve(static_cast<size_t>(rows + 1));
    const int64_t per_row = a.per_row;
    for (int64_t r = from; r < from + rows; ++r) {
        const float* v = a.val.data() + r * per_row;
        for (int64_t j = 0; j < per_row; ++j) {
            if (v[j] == 0.0f) continue;
            b.idx.push_back(a.dense ? static_cast<int32_t>(j)
                                    : a.idx[static_cast<size_t>(r * per_row + j)]);
            b.val.push_back(v[j]);
        }
        b.start.push_back(static_cast<int64_t>(b.idx.size()));
    }
    return b;
}

FeatureStats::FeatureStats(int64_t n, int64_t top, int64_t window)
    : n_(n),
      top_(top),
      window_(window),
      fires_(static_cast<size_t>(n), 0),
      hist_(static_cast<size_t>(n * kHistBins), 0),
      sum_(static_cast<size_t>(n), 0.0),
      max_(static_cast<size_t>(n), -std::numeric_limits<float>::infinity()),
      heaps_(static_cast<size_t>(n * top)),
      heap_len_(static_cast<size_t>(n), 0) {
    SAE_ENFORCE(n >= 1 && top >= 1 && window >= 0,
                "FeatureStats: {} latents, top {}, window {}: need n, top >= 1, window >= 0", n,
                top, window);
    win_.assign(static_cast<size_t>(n * top * (2 * window + 1)), 0.0f);
}

void FeatureStats::offer(int64_t latent, float v, int64_t row, const ActivationAt* at,
                         const float* window, bool count) {
    const auto i = static_cast<size_t>(latent);
    if (count) {
        ++fires_[i];
        sum_[i] += v;
        max_[i] = std::max(max_[i], v);
        ++hist_[i * kHistBins + static_cast<size_t>(feature_hist_bin(v))];
    }
    Entry* h = heaps_.data() + i * static_cast<size_t>(top_);
    int32_t& len = heap_len_[i];
    // A min-heap by `before`: its front is the worst kept entry.
    const auto worse_first = [](const Entry& a, const Entry& b) { return before(a, b); };
    Entry e{v, row, 0};
    if (len < top_) {
        e.slot = len;
    } else if (before(e, h[0])) {
        std::pop_heap(h, h + len, worse_first);
        e.slot = h[--len].slot;
    } else {
        return;
    }
    const int64_t width = 2 * window_ + 1;
    float* w = win_.data() + (static_cast<int64_t>(i) * top_ + e.slot) * width;
    if (window != nullptr)
        std::copy_n(window, width, w);
    else if (window_ > 0)
        for (int64_t o = -window_; o <= window_; ++o)
            w[o + window_] = o == 0 ? v : (*at)(latent, row + o);
    else
        w[0] = v;
    h[len++] = e;
    std::push_heap(h, h + len, worse_first);
}

void FeatureStats::add(const SparseRows& b, int64_t begin, int64_t end, const ActivationAt& at,
                       int threads) {
    begin = std::max(begin, b.first_row);
    end = std::min(end, b.first_row + b.rows());
    if (end <= begin) return;
    rows_ += end - begin;
    const int t = threads > 0 ? threads : omp_get_max_threads();
    // Each thread owns a contiguous block of latents: no two write one latent's figures.
#pragma omp parallel num_threads(t)
    {
        const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t lo = n_ * me / nt, hi = n_ * (me + 1) / nt;
        for (int64_t row = begin; row < end; ++row) {
            const auto r = static_cast<size_t>(row - b.first_row);
            for (int64_t j = b.start[r]; j < b.start[r + 1]; ++j) {
                const int32_t latent = b.idx[static_cast<size_t>(j)];
                if (latent >= lo && latent < hi)
                    offer(latent, b.val[static_cast<size_t>(j)], row, &at);
            }
        }
    }
}

namespace {

// A float as an int64 that orders as the float does (IEEE-754: flip a negative's magnitude).
int64_t ordered_bits(float f) {
    int32_t b;
    std::memcpy(&b, &f, sizeof(b));
    return b >= 0 ? b : static_cast<int32_t>(b ^ 0x7fffffff);
}
float from_ordered_bits(int64_t o) {
    auto b = static_cast<int32_t>(o);
    if (b < 0) b ^= 0x7fffffff;
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
}

}  // namespace

void FeatureStats::merge(Communicator& comm) {
    const int world = comm.size();
    if (world == 1) return;
    // Counts and sums: exact in double while below 2^53.
    std::vector<double> sums(static_cast<size_t>(1 + n_ + n_ + n_ * kHistBins));
    sums[0] = static_cast<double>(rows_);
    for (int64_t i = 0; i < n_; ++i) {
        sums[static_cast<size_t>(1 + i)] = static_cast<double>(fires_[static_cast<size_t>(i)]);
        sums[static_cast<size_t>(1 + n_ + i)] = sum_[static_cast<size_t>(i)];
    }
    for (int64_t i = 0; i < n_ * kHistBins; ++i)
        sums[static_cast<size_t>(1 + 2 * n_ + i)] =
            static_cast<double>(hist_[static_cast<size_t>(i)]);
    comm.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
    rows_ = static_cast<int64_t>(sums[0]);
    for (int64_t i = 0; i < n_; ++i) {
        fires_[static_cast<size_t>(i)] = static_cast<int64_t>(sums[static_cast<size_t>(1 + i)]);
        sum_[static_cast<size_t>(i)] = sums[static_cast<size_t>(1 + n_ + i)];
    }
    for (int64_t i = 0; i < n_ * kHistBins; ++i)
        hist_[static_cast<size_t>(i)] =
            static_cast<int64_t>(sums[static_cast<size_t>(1 + 2 * n_ + i)]);
    std::vector<int64_t> mx(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i)
        mx[static_cast<size_t>(i)] = ordered_bits(max_[static_cast<size_t>(i)]);
    comm.allreduce_max(mx.data(), n_);
    for (int64_t i = 0; i < n_; ++i)
        max_[static_cast<size_t>(i)] = from_ordered_bits(mx[static_cast<size_t>(i)]);
    // The top lists: every rank's, gathered, and each latent's best `top` of them kept.
    std::vector<int64_t> rows;
    std::vector<float> acts, windows;
    sorted_top(&rows, &acts, &windows);
    const size_t count = rows.size(), width = static_cast<size_t>(2 * window_ + 1);
    std::vector<int64_t> all_rows(count * static_cast<size_t>(world));
    std::vector<float> all_acts(count * static_cast<size_t>(world));
    std::vector<float> all_windows(count * width * static_cast<size_t>(world));
    comm.allgather(rows.data(), all_rows.data(), static_cast<int64_t>(count * sizeof(int64_t)));
    comm.allgather(acts.data(), all_acts.data(), static_cast<int64_t>(count * sizeof(float)));
    comm.allgather(windows.data(), all_windows.data(),
                   static_cast<int64_t>(count * width * sizeof(float)));
    std::fill(heap_len_.begin(), heap_len_.end(), 0);
    for (int64_t i = 0; i < n_; ++i)
        for (int r = 0; r < world; ++r)
            for (int64_t j = 0; j < top_; ++j) {
                const size_t at =
                    static_cast<size_t>(r) * count + static_cast<size_t>(i * top_ + j);
                if (all_rows[at] < 0) break;
                offer(i, all_acts[at], all_rows[at], nullptr, all_windows.data() + at * width,
                      false);
            }
}

std::vector<float> FeatureStats::max_act() const {
    std::vector<float> out(max_);
    for (size_t i = 0; i < out.size(); ++i)
        if (fires_[i] == 0) out[i] = 0.0f;
    return out;
}

void FeatureStats::sorted_top(std::vector<int64_t>* rows, std::vector<float>* acts,
                              std::vector<float>* windows) const {
    const int64_t width = 2 * window_ + 1;
    rows->assign(static_cast<size_t>(n_ * top_), -1);
    acts->assign(static_cast<size_t>(n_ * top_), 0.0f);
    if (windows) windows->assign(static_cast<size_t>(n_ * top_ * width), 0.0f);
    std::vector<Entry> e;
    for (int64_t i = 0; i < n_; ++i) {
        const Entry* h = heaps_.data() + i * top_;
        e.assign(h, h + heap_len_[static_cast<size_t>(i)]);
        std::sort(e.begin(), e.end(), before);
        for (size_t j = 0; j < e.size(); ++j) {
            const size_t at = static_cast<size_t>(i * top_) + j;
            (*rows)[at] = e[j].row;
            (*acts)[at] = e[j].act;
            if (windows)
                std::copy_n(win_.data() + (i * top_ + e[j].slot) * width, width,
                            windows->data() + static_cast<int64_t>(at) * width);
        }
    }
}

void decoder_neighbours(Backend& be, const float* w_dec, int64_t n, int64_t d, int64_t m,
                        std::vector<int32_t>* idx, std::vector<float>* cos) {
    idx->assign(static_cast<size_t>(n * m), -1);
    cos->assign(static_cast<size_t>(n * m), 0.0f);
    if (m <= 0 || n <= 1) return;
    // Unit rows (a zero row stays zero), on the backend.
    std::vector<float> unit(w_dec, w_dec + n * d);
    for (int64_t i = 0; i < n; ++i) {
        float* r = unit.data() + i * d;
        double s = 0;
        for (int64_t k = 0; k < d; ++k) s += static_cast<double>(r[k]) * r[k];
        const float inv = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.0f;
        for (int64_t k = 0; k < d; ++k) r[k] *= inv;
    }
    DeviceArray<float> u(be, n * d);
    be.upload(u.data(), unit.data(), n * d * int64_t{sizeof(float)});
    // Blocks of rows whose [block, n] Gram rows take at most about 64 MiB.
    const int64_t block = std::clamp<int64_t>((int64_t{16} << 20) / n, 1, n);
    DeviceArray<float> g(be, block * n);
    std::vector<float> host(static_cast<size_t>(block * n));
    const int64_t keep = std::min(m, n - 1);
    for (int64_t i0 = 0; i0 < n; i0 += block) {
        const int64_t b = std::min(block, n - i0);
        // G[b, n] = U[i0 .. i0 + b) U^T
        be.gemm(false, true, b, n, d, 1.0f, u.data() + i0 * d, d, u.data(), d, 0.0f, g.data(), n);
        be.download(host.data(), g.data(), b * n * int64_t{sizeof(float)});
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < b; ++r) {
            const int64_t self = i0 + r;
            const float* row = host.data() + r * n;
            std::vector<int32_t> order;
            order.reserve(static_cast<size_t>(n - 1));
            for (int64_t j = 0; j < n; ++j)
                if (j != self) order.push_back(static_cast<int32_t>(j));
            const auto better = [&](int32_t a, int32_t c) {
                return row[a] > row[c] || (row[a] == row[c] && a < c);
            };
            std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
            for (int64_t j = 0; j < keep; ++j) {
                (*idx)[static_cast<size_t>(self * m + j)] = order[static_cast<size_t>(j)];
                (*cos)[static_cast<size_t>(self * m + j)] = row[order[static_cast<size_t>(j)]];
            }
        }
    }
}

void fill_context_windows(const std::vector<int64_t>& rows, int64_t w, int64_t own_begin,
                          int64_t own_end, int64_t first, const std::vector<int32_t>& token_ids,
                          const std::vector<int32_t>& positions, std::vector<int32_t>* out) {
    const auto span = static_cast<int64_t>(token_ids.size());
    SAE_ENFORCE(positions.size() == token_ids.size(),
                "fill_context_windows: {} token ids and {} positions", token_ids.size(),
                positions.size());
    const int64_t width = 2 * w + 1;
    out->resize(rows.size() * static_cast<size_t>(width), -1);
    for (size_t e = 0; e < rows.size(); ++e) {
        const int64_t r = rows[e];
        if (r < own_begin || r >= own_end) continue;
        SAE_ENFORCE(r >= first && r < first + span,
                    "fill_context_windows: row {} outside the "
                    "token ids read ([{}, {}))",
                    r, first, first + span);
        int32_t* o = out->data() + e * static_cast<size_t>(width);
        std::fill(o, o + width, -1);
        const int64_t at = r - first;
        o[w] = token_ids[static_cast<size_t>(at)];
        // Before r: while the positions keep increasing towards r.
        for (int64_t k = 1; k <= w && at - k >= 0; ++k) {
            if (positions[static_cast<size_t>(at - k)] >=
                positions[static_cast<size_t>(at - k + 1)])
                break;
            o[w - k] = token_ids[static_cast<size_t>(at - k)];
        }
        for (int64_t k = 1; k <= w && at + k < span; ++k) {
            if (positions[static_cast<size_t>(at + k)] <=
                positions[static_cast<size_t>(at + k - 1)])
                break;
            o[w + k] = token_ids[static_cast<size_t>(at + k)];
        }
    }
}

}  // namespace saetrain
