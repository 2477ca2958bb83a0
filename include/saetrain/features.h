// features.h — what each latent of a trained SAE responds to, over a whole dataset in one pass
// (sae-features): firing counts, mean and largest activation, a log-spaced histogram, the rows
// of its largest activations, and its nearest latents by decoder direction.
//
// FeatureStats takes the inference pass's activations batch by batch (SaeTrainer::activations)
// and keeps, per latent, a bounded heap of its `top` largest activations: memory is
// O(latents x top) whatever the dataset's size, never the activation matrix. Each rank adds its
// own rows (global row indices: the dataset's rows in shard order); merge() combines the ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "saetrain/evaluation.h"  // defines: HostActivations

namespace saetrain {

class Backend;
class Communicator;

// The histogram's bins: kHistPerDecade per power of ten from 10^kHistLowDecade up to
// 10^kHistHighDecade. A non-zero activation below the first edge (and any negative one) counts in
// the first bin, one at or above the last edge in the last bin.
constexpr int kHistLowDecade = -4, kHistHighDecade = 4, kHistPerDecade = 10;
constexpr int kHistBins = (kHistHighDecade - kHistLowDecade) * kHistPerDecade;
// The kHistBins + 1 edges, increasing.
std::vector<float> feature_hist_edges();
// The bin of a non-zero activation v.
int feature_hist_bin(float v);

// A batch's non-zero activations row by row (compressed rows): row r's are idx/val
// [start[r], start[r + 1]); its first row is global row first_row.
struct SparseRows {
    int64_t first_row = 0;
    std::vector<int64_t> start = {0};
    std::vector<int32_t> idx;
    std::vector<float> val;
    int64_t rows() const { return static_cast<int64_t>(start.size()) - 1; }
    // Latent `latent`'s activation at global row `row` of this batch (0: it did not fire).
    float value(int64_t row, int64_t latent) const;
};
// Rows [from, from + rows) of an inference pass's activations, the first global row first_row.
SparseRows sparse_rows(const HostActivations& a, int64_t from, int64_t rows, int64_t first_row);

// Latent `latent`'s activation at global row `row` (0 outside the data): what a top row's
// window of activations is read from.
using ActivationAt = std::function<float(int64_t latent, int64_t row)>;

// Per group (a latent), the `cap` rows of smallest key (ties: the lower row), each with its
// activation and a window of 2 w + 1 values: FeatureStats' top rows (key: the activation,
// largest first) and its sample (key: a hash of latent and row, so a uniform sample of the
// latent's firings that any split of the rows over ranks keeps alike).
class RowKeeper {
public:
    RowKeeper(int64_t groups, int64_t cap, int64_t window);
    // Whether (key, row) would be kept now; then keep() it.
    bool wants(int64_t g, uint64_t key, int64_t row) const;
    void keep(int64_t g, uint64_t key, int64_t row, float act, const float* window);
    // Another keeper's rows (every rank's, on merge) offered again.
    void offer_all(const std::vector<uint64_t>& keys, const std::vector<int64_t>& rows,
                   const std::vector<float>& acts, const std::vector<float>& windows);
    // [groups, cap] each group's rows sorted by key (then -1 rows, 0 values), their keys,
    // activations and windows [groups, cap, 2 w + 1].
    void sorted(std::vector<uint64_t>* keys, std::vector<int64_t>* rows, std::vector<float>* acts,
                std::vector<float>* windows) const;
    // The same rows, reordered by decreasing activation (ties: the lower row first).
    void by_activation(std::vector<int64_t>* rows, std::vector<float>* acts,
                       std::vector<float>* windows) const;
    int64_t cap() const { return cap_; }
    int64_t width() const { return 2 * window_ + 1; }

private:
    struct Entry {
        uint64_t key;
        int64_t row;
        float act;
        int32_t slot;  // where its window is in win_ (the group's slots 0 .. cap - 1)
    };
    static bool before(const Entry& a, const Entry& b) {
        return a.key < b.key || (a.key == b.key && a.row < b.row);
    }
    int64_t groups_, cap_, window_;
    std::vector<Entry> heaps_;  // [groups, cap]: a max-heap (by before) of each group's
    std::vector<int32_t> len_;  // [groups]
    std::vector<float> win_;    // [groups, cap, 2 w + 1] by slot
};

// The sample's key of latent i at row r: splitmix64's finalizer of a mix of both, the same on
// every rank (test/python/test_sae_features.py computes it too).
uint64_t feature_sample_key(int64_t latent, int64_t row);

class FeatureStats {
public:
    // n latents; the `top` largest activations kept for each (>= 1) and a uniform sample of
    // `samples` of its firings (>= 0), each with its activations on the `window` rows before
    // and after it.
    FeatureStats(int64_t n, int64_t top, int64_t window = 0, int64_t samples = 0);

    // Global rows [begin, end) of batch `b`: every non-zero activation counts as a firing.
    // With a window, at(latent, row) must answer for every row within `window` rows of them.
    // `threads`: OpenMP threads over latents (<= 0: OpenMP's default); `at` is called from them.
    void add(const SparseRows& b, int64_t begin, int64_t end, const ActivationAt& at,
             int threads = 0);
    // Combines every rank's figures (collective over `comm`; every rank passes its own and
    // holds the totals afterwards).
    void merge(Communicator& comm);

    int64_t n() const { return n_; }
    int64_t top() const { return top_.cap(); }
    int64_t samples() const { return sample_.cap(); }
    int64_t rows() const { return rows_; }  // rows added (after merge: every rank's)
    const std::vector<int64_t>& fire_count() const { return fires_; }
    const std::vector<double>& sum_act() const { return sum_; }
    // The largest activation of each latent (0 for a latent that never fired).
    std::vector<float> max_act() const;
    const std::vector<int64_t>& hist() const { return hist_; }  // [n, kHistBins]
    int64_t window() const { return window_; }
    // [n, top]: each latent's rows in decreasing activation (ties: the lower row first), then
    // -1 rows and 0 activations where it fired on fewer than `top` rows; `windows` (may be
    // null) [n, top, 2 window + 1]: the latent's activations on rows row - window .. row +
    // window of each, 0 past its firings.
    void sorted_top(std::vector<int64_t>* rows, std::vector<float>* acts,
                    std::vector<float>* windows = nullptr) const;
    // The same of the sample [n, samples]: the sampled rows in decreasing activation.
    void sorted_sample(std::vector<int64_t>* rows, std::vector<float>* acts,
                       std::vector<float>* windows) const;

private:
    int64_t n_, window_, rows_ = 0;
    RowKeeper top_, sample_;
    std::vector<int64_t> fires_, hist_;
    std::vector<double> sum_;
    std::vector<float> max_;
};

// For each of the n latents, the `m` others whose decoder rows (W_dec [n, d], row-major, host
// memory) have the largest cosine with its own, in decreasing cosine (ties: the lower latent
// first): idx [n, m] and cos [n, m] (-1 and 0 beyond n - 1 others). A zero row has cosine 0 with
// every row. The Gram matrix is computed on `be` in blocks of rows.
void decoder_neighbours(Backend& be, const float* w_dec, int64_t n, int64_t d, int64_t m,
                        std::vector<int32_t>* idx, std::vector<float>* cos);

// The logit tables of latents [first, first + count): each decoder row (W_dec [n, d], host
// memory) against every token's row of the unembedding W_U [vocab, d] (host memory), the
// direct effect of the latent on the logits (no final norm, as SAEDashboard computes it). For
// each latent its `m` largest dot products (the tokens it promotes, decreasing) and `m`
// smallest (those it suppresses, increasing; ties: the lower token id first) into rows
// [first, first + count) of pos_idx, pos_val, neg_idx, neg_val [n, m], which must hold n * m
// entries; other rows are left as they are. Computed on `be` in blocks of latents.
void decoder_logits(Backend& be, const float* w_dec, int64_t n, int64_t d, const float* w_u,
                    int64_t vocab, int64_t m, int64_t first, int64_t count,
                    std::vector<int32_t>* pos_idx, std::vector<float>* pos_val,
                    std::vector<int32_t>* neg_idx, std::vector<float>* neg_val);

// Token windows around rows: for each row r of `rows` in [own_begin, own_end) (this rank's
// rows), the token ids of rows r - w .. r + w that lie in r's context, -1 elsewhere, written to
// out [rows.size(), 2 w + 1]; the entries of other rows (another rank's, or -1: none) are left
// as they are. token_ids and positions hold the rows [first, first + token_ids.size()), which
// must cover [own_begin - w, own_end + w) within the dataset; a row lies in another context
// when positions do not increase somewhere between it and r.
void fill_context_windows(const std::vector<int64_t>& rows, int64_t w, int64_t own_begin,
                          int64_t own_end, int64_t first, const std::vector<int32_t>& token_ids,
                          const std::vector<int32_t>& positions, std::vector<int32_t>* out);

}  // namespace saetrain
