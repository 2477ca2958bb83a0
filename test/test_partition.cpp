// test_partition — partition_rows splits the global row space into disjoint, ordered,
// contiguous, balanced ranges that cover every row exactly once.
#include <gtest/gtest.h>

#include <string>

#include "saetrain/error.h"
#include "saetrain/shards.h"

using saetrain::partition_rows;
using saetrain::RowRange;

namespace {

void check_partition(int64_t total, int world) {
    SCOPED_TRACE("total=" + std::to_string(total) + " world=" + std::to_string(world));
    int64_t expect_begin = 0, min_size = total, max_size = 0;
    for (int r = 0; r < world; ++r) {
        RowRange rr = partition_rows(total, r, world);
        // Contiguous and ordered: each range starts where the previous ended (so disjoint).
        ASSERT_EQ(rr.begin, expect_begin) << "rank " << r;
        ASSERT_GE(rr.size(), 1) << "rank " << r;
        // The documented rule: the first total % world ranks get the extra row.
        ASSERT_EQ(rr.size(), total / world + (r < total % world ? 1 : 0)) << "rank " << r;
        min_size = std::min(min_size, rr.size());
        max_size = std::max(max_size, rr.size());
        expect_begin = rr.end;
    }
    EXPECT_EQ(expect_begin, total);  // covers [0, total) exactly
    EXPECT_LE(max_size - min_size, 1);
}

}  // namespace

TEST(Partition, PropertiesOverManyWorldsAndTotals) {
    for (int world = 1; world <= 64; ++world) {
        for (int64_t total :
             {int64_t{world}, int64_t{world} + 1, int64_t{2} * world - 1, int64_t{97}, int64_t{100},
              int64_t{1000}, int64_t{4096}, int64_t{1000003}, int64_t{123456789012}}) {
            if (total < world) continue;
            check_partition(total, world);
        }
    }
}

TEST(Partition, TotalEqualsWorldGivesOneRowEach) {
    for (int world : {1, 2, 7, 64}) {
        for (int r = 0; r < world; ++r) {
            RowRange rr = partition_rows(world, r, world);
            EXPECT_EQ(rr.begin, r);
            EXPECT_EQ(rr.end, r + 1);
        }
    }
}

TEST(Partition, ExampleValues) {
    // 10 rows over 4 ranks: 3, 3, 2, 2.
    EXPECT_EQ(partition_rows(10, 0, 4).begin, 0);
    EXPECT_EQ(partition_rows(10, 0, 4).end, 3);
    EXPECT_EQ(partition_rows(10, 1, 4).end, 6);
    EXPECT_EQ(partition_rows(10, 2, 4).end, 8);
    EXPECT_EQ(partition_rows(10, 3, 4).begin, 8);
    EXPECT_EQ(partition_rows(10, 3, 4).end, 10);
}

TEST(Partition, TooFewRowsThrowsWithCounts) {
    try {
        partition_rows(3, 0, 8);
        FAIL() << "expected saetrain::Error";
    } catch (const saetrain::Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find("3 rows"), std::string::npos) << msg;
        EXPECT_NE(msg.find("8 ranks"), std::string::npos) << msg;
    }
    EXPECT_THROW(partition_rows(0, 0, 1), saetrain::Error);
}

TEST(Partition, BadRankOrWorldThrows) {
    EXPECT_THROW(partition_rows(100, 0, 0), saetrain::Error);
    EXPECT_THROW(partition_rows(100, -1, 4), saetrain::Error);
    EXPECT_THROW(partition_rows(100, 4, 4), saetrain::Error);
}
