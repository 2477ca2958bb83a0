// Rank layouts of the three parallel modes, and the errors that say which world sizes fit.
#include <gtest/gtest.h>

#include "saetrain/error.h"
#include "saetrain/layout.h"

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
        layout_for(c, world, 0);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Layout, SweepIsOneSaePerRank) {
    const Config c = sweep_of(3, "sweep");
    for (int r = 0; r < 3; ++r) {
        const RankLayout l = layout_for(c, 3, r);
        EXPECT_EQ(l.config, r);
        EXPECT_EQ(l.replica, 0);
        EXPECT_EQ(l.replicas, 1);
        EXPECT_TRUE(l.shared);
    }
    EXPECT_NE(error_of(c, 4).find("run with 3 rank(s)"), std::string::npos) << error_of(c, 4);
    Config disjoint = c;
    disjoint.parallel.sweep_data = "disjoint";
    EXPECT_FALSE(layout_for(disjoint, 3, 1).shared);
}

TEST(Layout, DataParallelUsesEveryRankAsAReplica) {
    const Config c = sweep_of(1, "data_parallel");
    for (int r = 0; r < 4; ++r) {
        const RankLayout l = layout_for(c, 4, r);
        EXPECT_EQ(l.config, 0);
        EXPECT_EQ(l.replica, r);
        EXPECT_EQ(l.replicas, 4);
        EXPECT_FALSE(l.shared);
    }
    EXPECT_NE(error_of(sweep_of(2, "data_parallel"), 2).find("hybrid"), std::string::npos);
    EXPECT_NE(error_of(sweep_of(1, "data_parallel", 3), 4).find("replicas"), std::string::npos);
}

TEST(Layout, HybridIsConfigMajor) {
    const Config c = sweep_of(2, "hybrid", 3);
    for (int r = 0; r < 6; ++r) {
        const RankLayout l = layout_for(c, 6, r);
        EXPECT_EQ(l.config, r / 3);
        EXPECT_EQ(l.replica, r % 3);
    }
    const std::string e = error_of(c, 4);
    EXPECT_NE(e.find("needs 6 ranks"), std::string::npos) << e;
    EXPECT_NE(error_of(sweep_of(2, "sweep", 2), 4).find("hybrid"), std::string::npos);
}

// parallel.latent_shards = S: configs x replicas x shards, shards of one replica neighbouring
// ranks; each replica's first shard is its reader.
TEST(Layout, LatentShardsAreNeighboursWithinAReplica) {
    Config c = sweep_of(2, "hybrid", 3);
    c.parallel.latent_shards = 2;
    for (int r = 0; r < 12; ++r) {
        const RankLayout l = layout_for(c, 12, r);
        EXPECT_EQ(l.shards, 2);
        EXPECT_EQ(l.shard, r % 2) << r;
        EXPECT_EQ(l.replica, r / 2 % 3) << r;
        EXPECT_EQ(l.config, r / 6) << r;
        EXPECT_EQ(l.reader(), l.shard == 0 ? r / 2 : -1) << r;
        EXPECT_EQ(l.readers(), 6);
    }
    EXPECT_NE(layout_for(c, 12, 3).describe().find("x 2 latent shards"), std::string::npos);
    Config dp = sweep_of(1, "data_parallel");
    dp.parallel.latent_shards = 4;
    EXPECT_EQ(layout_for(dp, 8, 5).replicas, 2);
    EXPECT_EQ(layout_for(dp, 8, 5).replica, 1);
    EXPECT_EQ(layout_for(dp, 8, 5).shard, 1);
    Config sw = sweep_of(3, "sweep");
    sw.parallel.latent_shards = 2;
    EXPECT_EQ(layout_for(sw, 6, 5).config, 2);
}

TEST(Layout, LatentShardErrorsNameTheRankCounts) {
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
    EXPECT_NE(error_of(sw, 2).find("run with 4 rank(s)"), std::string::npos) << error_of(sw, 2);
}

}  // namespace
