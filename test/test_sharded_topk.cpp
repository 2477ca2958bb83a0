// The sharded top-k (sharded_topk.h) against the unsharded one: the CPU backend's topk_forward
// over all latents is the oracle; the sharded path runs it per contiguous latent shard of latents
// (values not ReLU'd, ids offset) and merges. Inputs are quantized so that ties are common,
// with -0.0s and rows where fewer than k values are positive (there a ReLU before the merge, or
// the wrong tie rule, picks other latents).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/sharded_topk.h"
#include "test_util.h"

using namespace saetrain;
using saetrain::testing::randn;

namespace {

struct Case {
    int64_t rows, n, k, shards;
};

void check(const Case& c, uint32_t seed, Backend& be) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " n " << c.n << " k " << c.k
                                      << " shards " << c.shards << " seed " << seed);
    auto pre = randn(c.rows * c.n, seed);
    for (float& v : pre) v = std::round(v * 2.0f) / 2.0f;  // few distinct values: ties
    for (int64_t i = 0; i < c.rows * c.n; i += 13) pre[i] = -0.0f;
    for (int64_t r = 0; r < c.rows; r += 3)  // rows with fewer than k positive values
        for (int64_t i = 0; i < c.n; ++i) pre[r * c.n + i] = -std::abs(pre[r * c.n + i]);
    const auto bias = seed % 2 ? randn(c.n, seed + 1, 0.25f) : std::vector<float>(c.n, 0.0f);

    std::vector<int32_t> want_idx(c.rows * c.k);
    std::vector<float> want_val(c.rows * c.k);
    be.topk_forward(pre.data(), bias.data(), c.rows, c.n, c.k, want_idx.data(), want_val.data(),
                    true);

    std::vector<float> cand_val(c.shards * c.rows * c.k);
    std::vector<int32_t> cand_idx(c.shards * c.rows * c.k);
    for (int64_t s = 0; s < c.shards; ++s) {
        const int64_t lo = c.n * s / c.shards, hi = c.n * (s + 1) / c.shards, ns = hi - lo;
        std::vector<float> pre_s(c.rows * ns);
        for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t i = 0; i < ns; ++i) pre_s[r * ns + i] = pre[r * c.n + lo + i];
        int32_t* idx_s = cand_idx.data() + s * c.rows * c.k;
        be.topk_forward(pre_s.data(), bias.data() + lo, c.rows, ns, c.k, idx_s,
                        cand_val.data() + s * c.rows * c.k, false);
        for (int64_t j = 0; j < c.rows * c.k; ++j) idx_s[j] += static_cast<int32_t>(lo);
    }
    std::vector<int32_t> got_idx(c.rows * c.k, -1);
    std::vector<float> got_val(c.rows * c.k, -1.0f);
    merge_topk_candidates(cand_val.data(), cand_idx.data(), c.shards, c.rows, c.k, got_idx.data(),
                          got_val.data(), true);
    EXPECT_EQ(got_idx, want_idx);
    EXPECT_EQ(got_val, want_val);
}

}  // namespace

TEST(ShardedTopk, MergedSelectionEqualsTheUnshardedOneWithTies) {
    auto be = make_cpu_backend(1);
    // Even and uneven latent shards, k = 1, k at a latent shard's width, rows wide enough for the
    // CPU's block filter (n / 16 >= 2k) and narrow ones for its heap.
    for (const Case c : {Case{40, 64, 4, 2}, Case{40, 65, 4, 3}, Case{17, 300, 1, 4},
                         Case{9, 96, 24, 4}, Case{33, 1024, 32, 2}, Case{12, 4099, 64, 4}})
        for (uint32_t seed : {1u, 2u}) check(c, seed, *be);
}

TEST(ShardedTopk, OneShardIsTheLocalSelection) {
    auto be = make_cpu_backend(1);
    check(Case{20, 200, 8, 1}, 5, *be);
}

// A latent shard keeps its own entries of the global selection with local ids; the others become
// absent (0, 0.0f), including an entry just outside its range on either side.
TEST(ShardedTopk, KeepOwnEntriesMakesIdsLocalAndDropsTheRest) {
    std::vector<int32_t> idx = {9, 10, 19, 20, 0, 15};
    std::vector<float> val = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -6.0f};
    keep_own_entries(idx.data(), val.data(), 6, 10, 10);  // latents [10, 20)
    EXPECT_EQ(idx, (std::vector<int32_t>{0, 0, 9, 0, 0, 5}));
    EXPECT_EQ(val, (std::vector<float>{0.0f, 2.0f, 3.0f, 0.0f, 0.0f, -6.0f}));
}
