// shuffle.cpp — the reader's delivery order (ShufflePlan) and how well it mixes.
//
// Everything is a pure function of (seed, epoch, window) through a portable generator
// (splitmix64 with unbiased bounded draws), so the order is the same on every platform and
// standard library: a cursor saved on one machine restores the same stream on another.
#include "saetrain/shuffle.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "saetrain/error.h"
#include "saetrain/loader.h"  // LoaderOptions, for ShufflePlan::from_options

namespace saetrain {

namespace {

class SplitMix64 {
public:
    explicit SplitMix64(uint64_t seed) : s_(seed) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, n) without modulo bias.
    uint64_t below(uint64_t n) {
        const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
        for (;;) {
            const uint64_t r = next();
            if (r >= threshold) return r % n;
        }
    }

private:
    uint64_t s_;
};

// Mixes the words into one well-spread 64-bit seed (a different stream per (seed, epoch, w)).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
    SplitMix64 g(a ^ 0x5ae7a1d5eedull);
    uint64_t h = g.next();
    SplitMix64 g2(h ^ (b * 0xd1b54a32d192ed03ull));
    h = g2.next();
    SplitMix64 g3(h ^ (c * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
    return g3.next();
}

template <class T>
void fisher_yates(std::vector<T>* v, uint64_t seed) {
    SplitMix64 g(seed);
    for (size_t i = v->size(); i > 1; --i) {
        const size_t j = static_cast<size_t>(g.below(i));
        std::swap((*v)[i - 1], (*v)[j]);
    }
}

}  // namespace

ShufflePlan::ShufflePlan(int64_t rows, int64_t chunk_rows, int64_t window_chunks, bool shuffle,
                         uint64_t seed)
    : rows_(rows),
      chunk_rows_(chunk_rows),
      window_chunks_(window_chunks),
      n_chunks_(0),
      shuffle_(shuffle),
      seed_(seed) {
    SAE_ENFORCE(rows > 0 && chunk_rows > 0 && window_chunks > 0,
                "shuffle plan: rows {}, chunk_rows {}, window_chunks {} must all be > 0", rows,
                chunk_rows, window_chunks);
    SAE_ENFORCE(!shuffle || chunk_rows * window_chunks <= (int64_t{1} << 32),
                "shuffle window of {} rows is too large (limit 2^32 rows)",
                chunk_rows * window_chunks);
    n_chunks_ = (rows + chunk_rows - 1) / chunk_rows;
}

ShufflePlan ShufflePlan::from_options(int64_t rows, int64_t row_bytes, const LoaderOptions& opt) {
    SAE_ENFORCE(opt.read_bytes > 0, "loader: read_bytes is {}, must be > 0", opt.read_bytes);
    SAE_ENFORCE(opt.shuffle_rows >= 0, "loader: shuffle_rows is {}, must be >= 0 (0: no shuffle)",
                opt.shuffle_rows);
    int64_t chunk = std::max<int64_t>(1, opt.read_bytes / row_bytes);
    if (opt.shuffle_rows == 0) {
        // Disk order: a window of 4 chunks lets the reader run that far ahead of the consumer.
        return ShufflePlan(rows, chunk, 4, false, opt.seed);
    }
    // A buffer smaller than one read chunk makes the chunk smaller, not the buffer larger.
    chunk = std::min(chunk, opt.shuffle_rows);
    const int64_t window = std::max<int64_t>(1, opt.shuffle_rows / chunk);
    return ShufflePlan(rows, chunk, window, true, opt.seed);
}

int64_t ShufflePlan::strata_count() const {
    // Disk order: window w is chunks [w * window_chunks, (w + 1) * window_chunks), one "stratum"
    // per position in the window (ceil(n_chunks / n_windows) would drop chunks: 5 chunks in
    // windows of 4 gave 3 strata, and chunk 3 was never delivered).
    if (!shuffle_) return window_chunks_;
    const int64_t nw = n_windows();
    return (n_chunks_ + nw - 1) / nw;
}

int64_t ShufflePlan::window_capacity() const {
    return std::min(rows_, std::min(window_chunks_, strata_count()) * chunk_rows_);
}

int64_t ShufflePlan::chunk_size(int64_t c) const {
    return std::min(chunk_rows_, rows_ - c * chunk_rows_);
}

ShufflePlan::Epoch ShufflePlan::epoch(int64_t e) const {
    // Stratified windows: the range's chunks are cut into window_chunks strata of n_windows
    // consecutive chunks each, and each window takes one chunk from every stratum (which one:
    // a random permutation per stratum and epoch). Every window is then a sample spread evenly
    // over the whole range: shards with different statistics are represented in every window
    // in proportion, so batch statistics do not drift from window to window as they would with
    // windows of randomly chosen chunks. Each chunk goes to exactly one window.
    Epoch ep;
    ep.epoch = e;
    const int64_t nw = n_windows();
    const int64_t strata = strata_count();
    std::vector<std::vector<int64_t>> pick(static_cast<size_t>(strata));
    for (int64_t st = 0; st < strata; ++st) {
        auto& p = pick[static_cast<size_t>(st)];
        if (!shuffle_) {  // disk order: window w is chunks [w * width, (w + 1) * width)
            for (int64_t w = 0; w < nw; ++w)
                if (w * window_chunks_ + st < n_chunks_) p.push_back(w * window_chunks_ + st);
            continue;
        }
        for (int64_t c = st * nw; c < std::min(n_chunks_, (st + 1) * nw); ++c) p.push_back(c);
        fisher_yates(&p, mix_seed(seed_, static_cast<uint64_t>(e), ~static_cast<uint64_t>(st)));
    }
    ep.chunk_order.reserve(static_cast<size_t>(n_chunks_));
    ep.window_first_chunk.push_back(0);
    ep.window_begin.push_back(0);
    for (int64_t w = 0; w < nw; ++w) {
        int64_t rows = 0;
        for (const auto& p : pick) {
            if (w < static_cast<int64_t>(p.size())) {
                ep.chunk_order.push_back(p[static_cast<size_t>(w)]);
                rows += chunk_size(p[static_cast<size_t>(w)]);
            }
        }
        ep.window_first_chunk.push_back(static_cast<int64_t>(ep.chunk_order.size()));
        ep.window_begin.push_back(ep.window_begin.back() + rows);
    }
    return ep;
}

std::vector<int64_t> ShufflePlan::Epoch::window_chunks(int64_t w) const {
    std::vector<int64_t> c(chunk_order.begin() + window_first_chunk[static_cast<size_t>(w)],
                           chunk_order.begin() + window_first_chunk[static_cast<size_t>(w + 1)]);
    std::sort(c.begin(), c.end());  // read, and lay out, in disk order
    return c;
}

int64_t ShufflePlan::Epoch::window_of(int64_t offset) const {
    auto it = std::upper_bound(window_begin.begin(), window_begin.end(), offset);
    return static_cast<int64_t>(std::distance(window_begin.begin(), it)) - 1;
}

void ShufflePlan::row_permutation(int64_t e, int64_t w, int64_t rows,
                                  std::vector<uint32_t>* perm) const {
    perm->resize(static_cast<size_t>(rows));
    std::iota(perm->begin(), perm->end(), 0u);
    if (shuffle_)
        fisher_yates(perm, mix_seed(seed_, static_cast<uint64_t>(e), static_cast<uint64_t>(w)));
}

std::vector<int64_t> ShufflePlan::epoch_order(int64_t e) const {
    const Epoch ep = epoch(e);
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(rows_));
    std::vector<int64_t> laid_out;
    std::vector<uint32_t> perm;
    for (int64_t w = 0; w < n_windows(); ++w) {
        laid_out.clear();
        for (int64_t c : ep.window_chunks(w))
            for (int64_t r = 0; r < chunk_size(c); ++r) laid_out.push_back(c * chunk_rows_ + r);
        row_permutation(e, w, static_cast<int64_t>(laid_out.size()), &perm);
        for (uint32_t p : perm) order.push_back(laid_out[p]);
    }
    return order;
}

// --- quality -------------------------------------------------------------------------------

ShuffleQuality shuffle_quality(const std::vector<int64_t>& order, int64_t batch_rows,
                               int64_t groups) {
    ShuffleQuality q;
    const int64_t n = static_cast<int64_t>(order.size());
    if (n < 2) return q;
    double disp = 0;
    for (int64_t i = 0; i < n; ++i)
        disp += std::fabs(static_cast<double>(i - order[static_cast<size_t>(i)]));
    // E|i - pi(i)| over uniform permutations of n is (n^2 - 1) / (3n).
    const double dn = static_cast<double>(n);
    q.displacement = disp / dn / ((dn * dn - 1) / (3 * dn));

    // Batch means of the group index (the "shard mean"), then lag-1 correlation.
    std::vector<double> means;
    for (int64_t b = 0; b + batch_rows <= n; b += batch_rows) {
        double s = 0;
        for (int64_t i = b; i < b + batch_rows; ++i)
            s += static_cast<double>(order[static_cast<size_t>(i)] * groups / n);
        means.push_back(s / static_cast<double>(batch_rows));
    }
    if (means.size() < 3) return q;
    double mu = 0;
    for (double m : means) mu += m;
    mu /= static_cast<double>(means.size());
    // Spread of the batch means against a perfect shuffle's: the group index g(r) = r*G/n of a
    // uniformly drawn row has variance about (G^2 - 1) / 12, so a batch mean has that / batch.
    double var = 0;
    for (double m : means) var += (m - mu) * (m - mu);
    var /= static_cast<double>(means.size());
    const double g = static_cast<double>(groups);
    q.batch_spread = std::sqrt(var / ((g * g - 1) / 12 / static_cast<double>(batch_rows)));
    double num = 0, den = 0;
    for (size_t i = 0; i < means.size(); ++i) {
        den += (means[i] - mu) * (means[i] - mu);
        if (i + 1 < means.size()) num += (means[i] - mu) * (means[i + 1] - mu);
    }
    q.batch_corr = den > 0 ? num / den : 0.0;
    return q;
}

}  // namespace saetrain
