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

}  // namespace
