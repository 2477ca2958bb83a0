// The rank grid (rank_grid.h): every rank's coordinates and groups for many shapes, against a
// brute-force enumeration written without the grid's formula; the shapes the three parallel
// modes ask for; and the errors that say which world sizes fit. (test_mpi's GridBuildsTheGroups
// checks the communicators themselves under mpirun.)
#include <gtest/gtest.h>

#include <vector>

#include "saetrain/error.h"
#include "saetrain/rank_grid.h"

using namespace saetrain;

namespace {

Config sweep_of(int g, const std::string& mode, int64_t replicas = 1) {
    Config c;
    c.source = "cfg.yaml";
    c.sweep.resize(static_cast<size_t>(g));
    c.parallel.mode = mode;
    c.parallel.replicas = replicas;
    return c;
}

std::string error_of(const Config& c, int world) {
    try {
        RankGrid::from_config(c, world);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// --- the brute force ----------------------------------------------------------------------------
// The ranks in order, counting through configs, then replicas, then shards (the last the
// fastest): what "config-major, shards neighbours" means, with no arithmetic.
struct Coord {
    int config, replica, latent_shard;
};

std::vector<Coord> enumerate(int configs, int replicas, int shards) {
    std::vector<Coord> out;
    for (int c = 0; c < configs; ++c)
        for (int q = 0; q < replicas; ++q)
            for (int s = 0; s < shards; ++s) out.push_back({c, q, s});
    return out;
}

// The ranks that satisfy `same`, ascending.
template <typename Same>
std::vector<int> members(const std::vector<Coord>& all, Same same) {
    std::vector<int> out;
    for (size_t r = 0; r < all.size(); ++r)
        if (same(all[r])) out.push_back(static_cast<int>(r));
    return out;
}

void expect_matches_enumeration(const RankGrid& grid, int G, int R, int S, bool shared) {
    const std::string shape = grid.describe();
    const std::vector<Coord> all = enumerate(G, R, S);
    ASSERT_EQ(grid.size(), static_cast<int>(all.size())) << shape;
    int next_reader = 0;
    for (int r = 0; r < grid.size(); ++r) {
        const Coord& want = all[static_cast<size_t>(r)];
        const RankCoords l = grid.at(r);
        EXPECT_EQ(l.config, want.config) << shape << " rank " << r;
        EXPECT_EQ(l.replica, want.replica) << shape << " rank " << r;
        EXPECT_EQ(l.latent_shard, want.latent_shard) << shape << " rank " << r;
        EXPECT_EQ(l.configs, G);
        EXPECT_EQ(l.replicas, R);
        EXPECT_EQ(l.latent_shards, S);
        EXPECT_EQ(l.shared_data, shared && G > 1) << shape;
        EXPECT_EQ(grid.rank_of(want.config, want.replica, want.latent_shard), r) << shape;
        // Readers: the first shard of each replica, numbered in rank order.
        EXPECT_EQ(l.reader(), want.latent_shard == 0 ? next_reader : -1) << shape << " rank " << r;
        if (want.latent_shard == 0) ++next_reader;
        // A group's members ascend with the coordinate that tells them apart, so its rank i is
        // the i-th member (the split's key).
        EXPECT_EQ(grid.replica_group(r), members(all,
                                                 [&](const Coord& o) {
                                                     return o.config == want.config &&
                                                            o.latent_shard == want.latent_shard;
                                                 }))
            << shape << " rank " << r;
        EXPECT_EQ(grid.latent_shard_group(r), members(all,
                                                      [&](const Coord& o) {
                                                          return o.config == want.config &&
                                                                 o.replica == want.replica;
                                                      }))
            << shape << " rank " << r;
        const std::vector<int> stream =
            shared && G > 1 ? members(all,
                                      [&](const Coord& o) {
                                          return o.replica == want.replica &&
                                                 o.latent_shard == want.latent_shard;
                                      })
                            : std::vector<int>{};
        EXPECT_EQ(grid.shared_data_group(r), stream) << shape << " rank " << r;
    }
    EXPECT_EQ(grid.at(0).readers(), next_reader) << shape;
}

TEST(RankGrid, CoordinatesAndGroupsMatchABruteForceEnumeration) {
    for (int G : {1, 2, 3})
        for (int R : {1, 2, 3})
            for (int S : {1, 2, 4})
                for (bool shared : {true, false})
                    expect_matches_enumeration(RankGrid(G, R, S, shared), G, R, S, shared);
}

// Each mode's config gives the shape it promises, and that shape numbers its ranks as the
// enumeration does.
TEST(RankGrid, ModesGiveTheirShapes) {
    struct Case {
        const char* mode;
        int configs, replicas_key, latent_shards, world;  // the config and the job
        int want_replicas;
    };
    for (const Case& k :
         {Case{"sweep", 3, 1, 1, 3, 1}, Case{"sweep", 2, 1, 2, 4, 1},
          Case{"data_parallel", 1, 1, 1, 4, 4}, Case{"data_parallel", 1, 2, 2, 4, 2},
          Case{"data_parallel", 1, 1, 4, 8, 2}, Case{"hybrid", 2, 2, 1, 4, 2},
          Case{"hybrid", 3, 2, 2, 12, 2}, Case{"hybrid", 2, 3, 1, 6, 3}})
        for (const char* data : {"shared", "disjoint"}) {
            Config c = sweep_of(k.configs, k.mode, k.replicas_key);
            c.parallel.latent_shards = k.latent_shards;
            c.parallel.sweep_data = data;
            const RankGrid grid = RankGrid::from_config(c, k.world);
            const bool shared = std::string(data) == "shared";
            EXPECT_EQ(grid.configs(), k.configs) << k.mode;
            EXPECT_EQ(grid.replicas(), k.want_replicas) << k.mode << " " << k.world;
            EXPECT_EQ(grid.latent_shards(), k.latent_shards) << k.mode;
            EXPECT_EQ(grid.shared_data(), shared && k.configs > 1) << k.mode;
            expect_matches_enumeration(grid, k.configs, k.want_replicas, k.latent_shards, shared);
        }
}

TEST(RankGrid, SweepIsOneSaePerRank) {
    const Config c = sweep_of(3, "sweep");
    const RankGrid grid = RankGrid::from_config(c, 3);
    for (int r = 0; r < 3; ++r) {
        const RankCoords l = grid.at(r);
        EXPECT_EQ(l.config, r);
        EXPECT_EQ(l.replica, 0);
        EXPECT_EQ(l.replicas, 1);
        EXPECT_TRUE(l.shared_data);
    }
    // The whole line: issue 34's had nine arguments for eight fields ("per rank3: mpirun -np ").
    EXPECT_EQ(error_of(c, 4),
              "cfg.yaml: the sweep has 3 SAE config(s) but the job has 4 rank(s); run with 3 "
              "rank(s) (one SAE per rank: mpirun -np 3 / srun -n 3)");
    Config disjoint = c;
    disjoint.parallel.sweep_data = "disjoint";
    EXPECT_FALSE(RankGrid::from_config(disjoint, 3).at(1).shared_data);
    EXPECT_TRUE(RankGrid::from_config(disjoint, 3).shared_data_group(1).empty());
}

TEST(RankGrid, DataParallelUsesEveryRankAsAReplica) {
    const RankGrid grid = RankGrid::from_config(sweep_of(1, "data_parallel"), 4);
    for (int r = 0; r < 4; ++r) {
        const RankCoords l = grid.at(r);
        EXPECT_EQ(l.config, 0);
        EXPECT_EQ(l.replica, r);
        EXPECT_EQ(l.replicas, 4);
        EXPECT_FALSE(l.shared_data);
    }
    EXPECT_EQ(grid.replica_group(2), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_NE(error_of(sweep_of(2, "data_parallel"), 2).find("hybrid"), std::string::npos);
    EXPECT_NE(error_of(sweep_of(1, "data_parallel", 3), 4).find("replicas"), std::string::npos);
}

TEST(RankGrid, HybridIsConfigMajor) {
    const Config c = sweep_of(2, "hybrid", 3);
    const RankGrid grid = RankGrid::from_config(c, 6);
    for (int r = 0; r < 6; ++r) {
        const RankCoords l = grid.at(r);
        EXPECT_EQ(l.config, r / 3);
        EXPECT_EQ(l.replica, r % 3);
    }
    EXPECT_EQ(grid.replica_group(4), (std::vector<int>{3, 4, 5}));
    EXPECT_EQ(grid.shared_data_group(4), (std::vector<int>{1, 4}));
    const std::string e = error_of(c, 4);
    EXPECT_NE(e.find("needs 6 ranks"), std::string::npos) << e;
    EXPECT_NE(error_of(sweep_of(2, "sweep", 2), 4).find("hybrid"), std::string::npos);
}

// parallel.latent_shards = S: configs x replicas x shards, shards of one replica neighbouring
// ranks; each replica's first shard is its reader.
TEST(RankGrid, LatentShardsAreNeighboursWithinAReplica) {
    Config c = sweep_of(2, "hybrid", 3);
    c.parallel.latent_shards = 2;
    const RankGrid grid = RankGrid::from_config(c, 12);
    for (int r = 0; r < 12; ++r) {
        const RankCoords l = grid.at(r);
        EXPECT_EQ(l.latent_shards, 2);
        EXPECT_EQ(l.latent_shard, r % 2) << r;
        EXPECT_EQ(l.replica, r / 2 % 3) << r;
        EXPECT_EQ(l.config, r / 6) << r;
        EXPECT_EQ(l.reader(), l.latent_shard == 0 ? r / 2 : -1) << r;
        EXPECT_EQ(l.readers(), 6);
    }
    EXPECT_EQ(grid.latent_shard_group(9), (std::vector<int>{8, 9}));
    EXPECT_EQ(grid.replica_group(9), (std::vector<int>{7, 9, 11}));
    EXPECT_NE(grid.at(3).describe().find("x 2 latent shards"), std::string::npos);
    Config dp = sweep_of(1, "data_parallel");
    dp.parallel.latent_shards = 4;
    const RankCoords l = RankGrid::from_config(dp, 8).at(5);
    EXPECT_EQ(l.replicas, 2);
    EXPECT_EQ(l.replica, 1);
    EXPECT_EQ(l.latent_shard, 1);
    Config sw = sweep_of(3, "sweep");
    sw.parallel.latent_shards = 2;
    EXPECT_EQ(RankGrid::from_config(sw, 6).at(5).config, 2);
}

TEST(RankGrid, ErrorsNameTheRankCounts) {
    Config c = sweep_of(1, "data_parallel");
    c.parallel.latent_shards = 4;
    EXPECT_NE(error_of(c, 6).find("parallel.latent_shards = 4 does not divide the job's 6 rank"),
              std::string::npos)
        << error_of(c, 6);
    Config h = sweep_of(2, "hybrid", 2);
    h.parallel.latent_shards = 2;
    EXPECT_NE(error_of(h, 4).find("x 2 latent shards needs 8 ranks, but the job has 4"),
              std::string::npos)
        << error_of(h, 4);
    Config sw = sweep_of(2, "sweep");
    sw.parallel.latent_shards = 2;
    EXPECT_EQ(error_of(sw, 2),
              "cfg.yaml: the sweep has 2 SAE config(s) x 2 latent shards but the job has 2 "
              "rank(s); run with 4 rank(s) (2 ranks per SAE: mpirun -np 4 / srun -n 4)");
    const RankGrid grid(2, 2, 2, true);
    EXPECT_THROW(grid.at(8), Error);
    EXPECT_THROW(grid.rank_of(0, 2, 0), Error);
    EXPECT_THROW(RankGrid(1, 0, 1, false), Error);
}

}  // namespace
