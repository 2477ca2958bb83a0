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

RowKeeper::RowKeeper(int64_t groups, int64_t cap, int64_t window)
    : groups_(groups),
      cap_(cap),
      window_(window),
      heaps_(static_cast<size_t>(groups * cap)),
      len_(static_cast<size_t>(groups), 0),
      win_(static_cast<size_t>(groups * cap * (2 * window + 1)), 0.0f) {}

bool RowKeeper::wants(int64_t g, uint64_t key, int64_t row) const {
    if (cap_ == 0) return false;
    const int32_t len = len_[static_cast<size_t>(g)];
    return len < cap_ || before(Entry{key, row, 0.0f, 0}, heaps_[static_cast<size_t>(g * cap_)]);
}

void RowKeeper::keep(int64_t g, uint64_t key, int64_t row, float act, const float* window) {
    Entry* h = heaps_.data() + g * cap_;
    int32_t& len = len_[static_cast<size_t>(g)];
    // A max-heap by `before`: its front is the worst entry kept.
    Entry e{key, row, act, len};
    if (len == cap_) {
        std::pop_heap(h, h + len, before);
        e.slot = h[--len].slot;
    }
    std::copy_n(window, width(), win_.data() + (g * cap_ + e.slot) * width());
    h[len++] = e;
    std::push_heap(h, h + len, before);
}

void RowKeeper::sorted(std::vector<uint64_t>* keys, std::vector<int64_t>* rows,
                       std::vector<float>* acts, std::vector<float>* windows) const {
    const int64_t w = width();
    keys->assign(static_cast<size_t>(groups_ * cap_), 0);
    rows->assign(static_cast<size_t>(groups_ * cap_), -1);
    acts->assign(static_cast<size_t>(groups_ * cap_), 0.0f);
    windows->assign(static_cast<size_t>(groups_ * cap_ * w), 0.0f);
    std::vector<Entry> e;
    for (int64_t g = 0; g < groups_; ++g) {
        const Entry* h = heaps_.data() + g * cap_;
        e.assign(h, h + len_[static_cast<size_t>(g)]);
        std::sort(e.begin(), e.end(), before);
        for (size_t j = 0; j < e.size(); ++j) {
            const auto at = static_cast<size_t>(g * cap_) + j;
            (*keys)[at] = e[j].key, (*rows)[at] = e[j].row, (*acts)[at] = e[j].act;
            std::copy_n(win_.data() + (g * cap_ + e[j].slot) * w, w,
                        windows->data() + static_cast<int64_t>(at) * w);
        }
    }
}

void RowKeeper::by_activation(std::vector<int64_t>* rows, std::vector<float>* acts,
                              std::vector<float>* windows) const {
    std::vector<uint64_t> keys;
    std::vector<int64_t> r;
    std::vector<float> a, w;
    sorted(&keys, &r, &a, &w);
    const int64_t width = this->width();
    rows->assign(r.size(), -1), acts->assign(a.size(), 0.0f), windows->assign(w.size(), 0.0f);
    std::vector<int64_t> order;
    for (int64_t g = 0; g < groups_; ++g) {
        order.clear();
        for (int64_t j = 0; j < cap_ && r[static_cast<size_t>(g * cap_ + j)] >= 0; ++j)
            order.push_back(g * cap_ + j);
        std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
            const float ax = a[static_cast<size_t>(x)], ay = a[static_cast<size_t>(y)];
            return ax > ay || (ax == ay && r[static_cast<size_t>(x)] < r[static_cast<size_t>(y)]);
        });
        for (size_t j = 0; j < order.size(); ++j) {
            const auto to = static_cast<size_t>(g * cap_) + j;
            const auto from = static_cast<size_t>(order[j]);
            (*rows)[to] = r[from], (*acts)[to] = a[from];
            std::copy_n(w.data() + static_cast<int64_t>(from) * width, width,
                        windows->data() + static_cast<int64_t>(to) * width);
        }
    }
}

void RowKeeper::offer_all(const std::vector<uint64_t>& keys, const std::vector<int64_t>& rows,
                          const std::vector<float>& acts, const std::vector<float>& windows) {
    const size_t per = static_cast<size_t>(groups_ * cap_);
    for (size_t part = 0; part * per < rows.size(); ++part)
        for (int64_t g = 0; g < groups_; ++g)
            for (int64_t j = 0; j < cap_; ++j) {
                const size_t at = part * per + static_cast<size_t>(g * cap_ + j);
                if (rows[at] < 0) break;
                if (wants(g, keys[at], rows[at]))
                    keep(g, keys[at], rows[at], acts[at],
                         windows.data() + static_cast<int64_t>(at) * width());
            }
}

uint64_t feature_sample_key(int64_t latent, int64_t row) {
    // splitmix64 of the pair: uniform over rows for each latent, independent across latents.
    uint64_t z = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull +
                 static_cast<uint64_t>(latent) * 0xD1B54A32D192ED03ull + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

namespace {

// The top rows' key: the larger the activation, the smaller the key (IEEE-754's order as
// unsigned bits, inverted).
uint64_t top_key(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof(b));
    const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return static_cast<uint64_t>(0xFFFFFFFFu - ordered);
}

}  // namespace

FeatureStats::FeatureStats(int64_t n, int64_t top, int64_t window, int64_t samples)
    : n_(n),
      window_(window),
      top_(n, top, window),
      sample_(n, samples, window),
      fires_(static_cast<size_t>(n), 0),
      hist_(static_cast<size_t>(n * kHistBins), 0),
      sum_(static_cast<size_t>(n), 0.0),
      max_(static_cast<size_t>(n), -std::numeric_limits<float>::infinity()) {
    SAE_ENFORCE(n >= 1 && top >= 1 && window >= 0 && samples >= 0,
                "FeatureStats: {} latents, top {}, window {}, samples {}: need n, top >= 1", n, top,
                window, samples);
}

void FeatureStats::add(const SparseRows& b, int64_t begin, int64_t end, const ActivationAt& at,
                       int threads) {
    begin = std::max(begin, b.first_row);
    end = std::min(end, b.first_row + b.rows());
    if (end <= begin) return;
    rows_ += end - begin;
    const int t = threads > 0 ? threads : omp_get_max_threads();
    const int64_t width = 2 * window_ + 1;
    // Each thread owns a contiguous block of latents: no two write one latent's figures.
#pragma omp parallel num_threads(t)
    {
        const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t lo = n_ * me / nt, hi = n_ * (me + 1) / nt;
        std::vector<float> w(static_cast<size_t>(width));
        const auto window_of = [&](int64_t latent, int64_t row, float v) {
            for (int64_t o = -window_; o <= window_; ++o)
                w[static_cast<size_t>(o + window_)] = o == 0 ? v : at(latent, row + o);
            return w.data();
        };
        for (int64_t row = begin; row < end; ++row) {
            const auto r = static_cast<size_t>(row - b.first_row);
            for (int64_t j = b.start[r]; j < b.start[r + 1]; ++j) {
                const int32_t latent = b.idx[static_cast<size_t>(j)];
                if (latent < lo || latent >= hi) continue;
                const float v = b.val[static_cast<size_t>(j)];
                const auto i = static_cast<size_t>(latent);
                ++fires_[i];
                sum_[i] += v;
                max_[i] = std::max(max_[i], v);
                ++hist_[i * kHistBins + static_cast<size_t>(feature_hist_bin(v))];
                const uint64_t kt = top_key(v), ks = feature_sample_key(latent, row);
                const bool to_top = top_.wants(latent, kt, row);
                const bool to_sample = sample_.wants(latent, ks, row);
                if (!to_top && !to_sample) continue;
                const float* win = window_of(latent, row, v);  // read once for both lists
                if (to_top) top_.keep(latent, kt, row, v, win);
                if (to_sample) sample_.keep(latent, ks, row, v, win);
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
    // The kept rows: every rank's, gathered, and each latent's best of them kept.
    for (RowKeeper* k : {&top_, &sample_}) {
        if (k->cap() == 0) continue;
        std::vector<uint64_t> keys;
        std::vector<int64_t> rows;
        std::vector<float> acts, windows;
        k->sorted(&keys, &rows, &acts, &windows);
        const auto r = static_cast<size_t>(world);
        std::vector<uint64_t> all_keys(keys.size() * r);
        std::vector<int64_t> all_rows(rows.size() * r);
        std::vector<float> all_acts(acts.size() * r), all_windows(windows.size() * r);
        comm.allgather(keys.data(), all_keys.data(), static_cast<int64_t>(keys.size() * 8));
        comm.allgather(rows.data(), all_rows.data(), static_cast<int64_t>(rows.size() * 8));
        comm.allgather(acts.data(), all_acts.data(), static_cast<int64_t>(acts.size() * 4));
        comm.allgather(windows.data(), all_windows.data(),
                       static_cast<int64_t>(windows.size() * 4));
        *k = RowKeeper(n_, k->cap(), window_);
        k->offer_all(all_keys, all_rows, all_acts, all_windows);
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
    std::vector<float> w;
    top_.by_activation(rows, acts, windows ? windows : &w);
}

void FeatureStats::sorted_sample(std::vector<int64_t>* rows, std::vector<float>* acts,
                                 std::vector<float>* windows) const {
    sample_.by_activation(rows, acts, windows);
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

void decoder_logits(Backend& be, const float* w_dec, int64_t n, int64_t d, const float* w_u,
                    int64_t vocab, int64_t m, int64_t first, int64_t count,
                    std::vector<int32_t>* pos_idx, std::vector<float>* pos_val,
                    std::vector<int32_t>* neg_idx, std::vector<float>* neg_val) {
    SAE_ENFORCE(first >= 0 && count >= 0 && first + count <= n && m <= vocab,
                "decoder_logits: latents [{}, {}) of {}, {} of {} tokens", first, first + count, n,
                m, vocab);
    for (auto* v : {pos_idx, neg_idx})
        SAE_ENFORCE(static_cast<int64_t>(v->size()) == n * m, "decoder_logits: {} ids for {} x {}",
                    v->size(), n, m);
    if (m <= 0 || count <= 0) return;
    DeviceArray<float> u(be, vocab * d);
    be.upload(u.data(), w_u, vocab * d * int64_t{sizeof(float)});
    // Blocks of latents whose [block, vocab] logits take at most about 64 MiB.
    const int64_t block = std::clamp<int64_t>((int64_t{16} << 20) / vocab, 1, count);
    DeviceArray<float> rows(be, block * d), g(be, block * vocab);
    std::vector<float> host(static_cast<size_t>(block * vocab));
    for (int64_t i0 = first; i0 < first + count; i0 += block) {
        const int64_t b = std::min(block, first + count - i0);
        be.upload(rows.data(), w_dec + i0 * d, b * d * int64_t{sizeof(float)});
        // G[b, vocab] = W_dec[i0 .. i0 + b) W_U^T
        be.gemm(false, true, b, vocab, d, 1.0f, rows.data(), d, u.data(), d, 0.0f, g.data(), vocab);
        be.download(host.data(), g.data(), b * vocab * int64_t{sizeof(float)});
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < b; ++r) {
            const float* row = host.data() + r * vocab;
            std::vector<int32_t> order(static_cast<size_t>(vocab));
            for (int64_t t = 0; t < vocab; ++t)
                order[static_cast<size_t>(t)] = static_cast<int32_t>(t);
            const auto at = static_cast<size_t>((i0 + r) * m);
            std::partial_sort(order.begin(), order.begin() + m, order.end(),
                              [&](int32_t a, int32_t c) {
                                  return row[a] > row[c] || (row[a] == row[c] && a < c);
                              });
            for (int64_t j = 0; j < m; ++j) {
                (*pos_idx)[at + j] = order[static_cast<size_t>(j)];
                (*pos_val)[at + j] = row[order[static_cast<size_t>(j)]];
            }
            std::partial_sort(order.begin(), order.begin() + m, order.end(),
                              [&](int32_t a, int32_t c) {
                                  return row[a] < row[c] || (row[a] == row[c] && a < c);
                              });
            for (int64_t j = 0; j < m; ++j) {
                (*neg_idx)[at + j] = order[static_cast<size_t>(j)];
                (*neg_val)[at + j] = row[order[static_cast<size_t>(j)]];
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
