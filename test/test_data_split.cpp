// Which rows each rank reads and holds out (data_split.h), over every rank of many grids: the
// readers' slices tile the training rows in reader order, the other shards read nothing, the
// replicas' held-out parts tile the held-out rows, a max_tokens budget sums to one SAE's tokens,
// and the shuffle seeds are the ones every earlier run used.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "saetrain/data_split.h"
#include "saetrain/error.h"

using namespace saetrain;

namespace {

DatasetInfo rows_of(int64_t n, const std::string& source = "data/") {
    DatasetInfo d;
    d.source = source;
    d.total_rows = n;
    d.d_model = 4;
    return d;
}

std::vector<DataSplit> split_all(const Config& cfg, const RankGrid& grid, const DatasetInfo& data,
                                 const DatasetInfo* eval_data = nullptr) {
    std::vector<DataSplit> out;
    for (int r = 0; r < grid.size(); ++r)
        out.push_back(data_split_for(cfg, grid.at(r), data, eval_data));
    return out;
}

// `parts` in order tile [begin, end): each starts where the last ended.
void expect_tiles(const std::vector<RowRange>& parts, int64_t begin, int64_t end,
                  const std::string& what) {
    int64_t at = begin;
    for (const RowRange& p : parts) {
        EXPECT_EQ(p.begin, at) << what;
        EXPECT_GT(p.size(), 0) << what;
        at = p.end;
    }
    EXPECT_EQ(at, end) << what;
}

TEST(DataSplit, SlicesAndHeldOutRowsTileTheirRowsOnEveryGrid) {
    const int64_t n = 1000, held = 90;
    for (int G : {1, 2, 3})
        for (int R : {1, 2, 3})
            for (int S : {1, 2})
                for (bool shared : {true, false}) {
                    const RankGrid grid(G, R, S, shared);
                    const std::string shape = grid.describe();
                    Config cfg;
                    cfg.run.seed = 7;
                    cfg.data.eval_rows = held;
                    const std::vector<DataSplit> all = split_all(cfg, grid, rows_of(n));
                    std::vector<RowRange> slices(static_cast<size_t>(G * R));
                    std::set<uint64_t> seeds;
                    for (int r = 0; r < grid.size(); ++r) {
                        const RankCoords l = grid.at(r);
                        const DataSplit& d = all[static_cast<size_t>(r)];
                        EXPECT_EQ(d.train_rows, n - held) << shape;
                        EXPECT_EQ(d.reads, l.latent_shard == 0) << shape << " rank " << r;
                        EXPECT_EQ(d.loads_eval, l.latent_shard == 0) << shape << " rank " << r;
                        EXPECT_EQ(d.eval_all.begin, n - held);
                        EXPECT_EQ(d.eval_all.end, n);
                        // Every shard of a replica evaluates the same part (the first loads it).
                        const DataSplit& first =
                            all[static_cast<size_t>(grid.rank_of(l.config, l.replica, 0))];
                        EXPECT_EQ(d.eval_mine.begin, first.eval_mine.begin) << shape;
                        EXPECT_EQ(d.eval_mine.end, first.eval_mine.end) << shape;
                        if (!d.reads) continue;
                        slices[static_cast<size_t>(l.reader())] = d.slice;
                        seeds.insert(d.seed);
                        EXPECT_EQ(d.max_rows, 0);
                    }
                    expect_tiles(slices, 0, n - held, shape + ": readers' slices");
                    EXPECT_EQ(seeds.size(), static_cast<size_t>(G * R)) << shape;
                    for (int c = 0; c < G; ++c) {
                        std::vector<RowRange> parts;
                        for (int q = 0; q < R; ++q)
                            parts.push_back(
                                all[static_cast<size_t>(grid.rank_of(c, q, 0))].eval_mine);
                        expect_tiles(parts, n - held, n, shape + ": held-out parts");
                    }
                }
}

// The shuffle seed of reader i is run.seed * 1000003 + i: changing it changes every run's
// results (and breaks resuming an older run's cursor), so it is pinned here.
TEST(DataSplit, SeedsAreTheReadersIndexOffsetFromTheRunsSeed) {
    Config cfg;
    cfg.run.seed = 5;
    const RankGrid grid(2, 2, 2, true);
    const std::vector<DataSplit> all = split_all(cfg, grid, rows_of(100));
    EXPECT_EQ(all[0].seed, 5u * 1000003u + 0);
    EXPECT_EQ(all[2].seed, 5u * 1000003u + 1);
    EXPECT_EQ(all[6].seed, 5u * 1000003u + 3);
    EXPECT_FALSE(all[7].reads);
}

// max_tokens counts one SAE's tokens: with shared data every reader feeds every SAE, so the
// readers' budgets sum to it; with disjoint data each SAE's replicas' budgets do.
TEST(DataSplit, MaxTokensIsSplitOverTheReadersThatFeedOneSae) {
    for (bool shared : {true, false}) {
        Config cfg;
        cfg.data.max_tokens = 1001;
        const RankGrid grid(3, 2, 2, shared);
        const std::vector<DataSplit> all = split_all(cfg, grid, rows_of(5000));
        int64_t sum_all = 0;
        std::vector<int64_t> per_config(3, 0);
        for (int r = 0; r < grid.size(); ++r) {
            const DataSplit& d = all[static_cast<size_t>(r)];
            if (!d.reads) continue;
            sum_all += d.max_rows;
            per_config[static_cast<size_t>(grid.at(r).config)] += d.max_rows;
        }
        if (shared) {
            EXPECT_EQ(sum_all, 1001);
        } else {
            for (int64_t s : per_config) EXPECT_EQ(s, 1001);
        }
    }
}

TEST(DataSplit, HeldOutShardsOfTheirOwnLeaveTheTrainingRowsWhole) {
    Config cfg;
    cfg.data.eval_path = "eval/";
    const DatasetInfo data = rows_of(600), eval = rows_of(50, "eval/");
    const RankGrid grid(1, 2, 1, false);
    for (int64_t want : {int64_t{0}, int64_t{20}, int64_t{80}}) {
        cfg.data.eval_rows = want;
        const std::vector<DataSplit> all = split_all(cfg, grid, data, &eval);
        const int64_t used = want == 0 ? 50 : std::min<int64_t>(want, 50);
        EXPECT_EQ(all[0].train_rows, 600);
        EXPECT_EQ(all[0].eval_source, "eval/");
        expect_tiles({all[0].eval_mine, all[1].eval_mine}, 0, used, "eval_path parts");
    }
    cfg.data.eval_path.clear();
    cfg.data.eval_rows = 0;
    const DataSplit none = data_split_for(cfg, grid.at(1), data, nullptr);
    EXPECT_EQ(none.eval_all.size(), 0);
    EXPECT_FALSE(none.loads_eval);
}

TEST(DataSplit, TooManyHeldOutRowsIsAnError) {
    Config cfg;
    cfg.data.eval_rows = 98;
    const RankGrid grid(1, 3, 1, false);
    try {
        data_split_for(cfg, grid.at(0), rows_of(100), nullptr);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("data.eval_rows = 98 leaves too few"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
