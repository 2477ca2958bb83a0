// How a rank shares its cores with other processes (cores.h): /proc/stat's CPU seconds over the
// rank's CPUs, and the threads the cores others leave make.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "saetrain/cores.h"

namespace saetrain {
namespace {

// Two CPUs and the machine's sum, in the kernel's order: user nice system idle iowait irq
// softirq steal guest guest_nice (guest is already counted in user).
constexpr const char* kStat =
    "cpu  300 10 200 900 40 5 5 20 50 0\n"
    "cpu0 100 0 100 500 20 0 5 10 50 0\n"
    "cpu1 200 10 100 400 20 5 0 10 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n"
    "cpufreq 7 7 7\n";

// OpenBLAS's kernels by the instructions a CPU has: AVX-512's five subsets, else AVX2 with FMA,
// else OpenBLAS's own detection; and on this machine, what /proc/cpuinfo's flags say.
TEST(BlasCore, FromTheCpusInstructions) {
    auto with = [](std::set<std::string> flags) {
        return [flags](const char* f) { return flags.count(f) > 0; };
    };
    const std::set<std::string> avx2 = {"sse4_2", "avx", "avx2", "fma"};
    std::set<std::string> avx512 = avx2;
    avx512.insert({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"});
    EXPECT_STREQ(blas_core_for(with(avx512)), "SKYLAKEX");
    EXPECT_STREQ(blas_core_for(with(avx2)), "HASWELL");
    std::set<std::string> knl = avx2;  // Knights Landing's AVX-512 lacks BW, DQ and VL
    knl.insert({"avx512f", "avx512cd"});
    EXPECT_STREQ(blas_core_for(with(knl)), "HASWELL");
    EXPECT_EQ(blas_core_for(with({"sse4_2", "avx", "avx2"})), nullptr);  // no FMA
    EXPECT_EQ(blas_core_for(with({})), nullptr);

    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    std::set<std::string> flags;
    while (flags.empty() && std::getline(cpuinfo, line)) {
        if (line.rfind("flags", 0) != 0) continue;
        std::istringstream words(line.substr(line.find(':') + 1));
        for (std::string w; words >> w;) flags.insert(w);
    }
    if (flags.empty()) {
        GTEST_SKIP() << "no flags line in /proc/cpuinfo";
    }
    const char* mine = blas_core_for_this_cpu();
    const char* expected = blas_core_for(with(flags));
    EXPECT_EQ(mine == nullptr, expected == nullptr);
    if (mine && expected) {
        EXPECT_STREQ(mine, expected);
    }
}

// MPI's waits yield when the node's ranks outnumber their cores: the node's, or those of a
// cpuset the ranks share (taskset, a container's, Slurm's cgroup); a rank bound to cores of its
// own is crowded only by its own threads.
TEST(YieldWhenCrowded, RanksAgainstTheCoresTheyShare) {
    // ranks, threads, node cores, allowed cores, bound each
    EXPECT_FALSE(ranks_crowd_cores(1, 8, 2, 2, false));  // one rank never waits on a peer
    EXPECT_TRUE(ranks_crowd_cores(4, 1, 2, 2, false));   // 4 ranks on a 2-core node
    EXPECT_FALSE(ranks_crowd_cores(2, 1, 2, 2, false));
    EXPECT_TRUE(ranks_crowd_cores(2, 2, 2, 2, false));   // 2 x 2 threads on 2 cores
    EXPECT_TRUE(ranks_crowd_cores(2, 1, 16, 1, false));  // a 1-CPU cpuset on a 16-core node
    EXPECT_FALSE(ranks_crowd_cores(2, 1, 16, 2, false));
    EXPECT_FALSE(ranks_crowd_cores(2, 1, 16, 1, true));  // each bound to a core of its own
    EXPECT_TRUE(ranks_crowd_cores(2, 2, 16, 1, true));   // ... with 2 threads on it
    EXPECT_TRUE(ranks_crowd_cores(4, 1, 2, 2, true));    // the node's count decides first
    EXPECT_FALSE(ranks_crowd_cores(2, 1, 0, 0, false));  // nothing known: no change
}

TEST(CpuSeconds, BusyIsEverythingButIdleAndIowait) {
    // cpu0: busy 100 + 0 + 100 + 0 + 5 + 10 = 215 ticks, all 215 + 500 + 20 = 735.
    const CpuSeconds one = cpu_seconds_of(kStat, {0}, 100);
    EXPECT_DOUBLE_EQ(one.busy, 2.15);
    EXPECT_DOUBLE_EQ(one.total, 7.35);
    // cpu1: busy 200 + 10 + 100 + 5 + 0 + 10 = 325, all 325 + 420 = 745; a CPU the text lacks
    // (7) adds nothing, the machine's sum and "cpufreq" are no CPU's.
    const CpuSeconds both = cpu_seconds_of(kStat, {1, 0, 7}, 100);
    EXPECT_DOUBLE_EQ(both.busy, 5.40);
    EXPECT_DOUBLE_EQ(both.total, 14.80);
    EXPECT_DOUBLE_EQ(cpu_seconds_of(kStat, {1}, 250).busy, 1.30);  // the unit is the caller's
}

TEST(CpuSeconds, ShortLinesCountWhatTheyHold) {
    // An older kernel's four fields: no iowait, irq or steal.
    const CpuSeconds c = cpu_seconds_of("cpu3 10 0 30 60\n", {3}, 10);
    EXPECT_DOUBLE_EQ(c.busy, 4.0);
    EXPECT_DOUBLE_EQ(c.total, 10.0);
    EXPECT_DOUBLE_EQ(cpu_seconds_of("", {0}, 100).total, 0.0);
}

TEST(CoreShare, ThreadsAreTheCoresOthersLeave) {
    // One rank on 2 cores: alone (a daemon's hundredths) it keeps both threads.
    EXPECT_EQ(threads_for_share(2, 2, 1, 0.05), 2);
    // Beside two busy loops its two threads get half of each core: others 1.0, one thread left.
    EXPECT_EQ(threads_for_share(2, 2, 1, 1.0), 1);
    // Beside one busy loop (half of one core while both threads run): one thread would wait
    // for the other on every loop.
    EXPECT_EQ(threads_for_share(2, 2, 1, 0.5), 1);
    EXPECT_EQ(threads_for_share(2, 2, 1, 1.9), 1);  // never fewer than one
    EXPECT_EQ(threads_for_share(8, 8, 1, 2.2), 6);
    // A quarter of a core's slack: up to 1.25 cores taken cost one thread, more cost two.
    EXPECT_EQ(threads_for_share(8, 8, 1, 1.2), 7);
    EXPECT_EQ(threads_for_share(8, 8, 1, 1.3), 6);
    EXPECT_EQ(threads_for_share(4, 8, 1, 0.0), 4);  // never more than asked
}

TEST(CoreShare, TheJobsOtherRanksAreNotAnotherJob) {
    // 2 ranks of 4 threads on 8 shared cores: the other rank's 4 busy cores leave this one its 4.
    EXPECT_EQ(threads_for_share(4, 8, 2, 4.0), 4);
    EXPECT_EQ(threads_for_share(4, 8, 2, 3.0), 4);  // a peer waiting on MPI leaves more
    // Beyond the peer's share another job took 2 cores: each rank leaves one of them.
    EXPECT_EQ(threads_for_share(4, 8, 2, 6.0), 3);
    // 4 ranks of 1 thread: nothing to give back.
    EXPECT_EQ(threads_for_share(1, 2, 4, 2.0), 1);
}

TEST(CoreShare, FixedOrOneThreadNeverChanges) {
    CoreShare fixed(3, 1, /*adapt=*/false);
    EXPECT_FALSE(fixed.adapts());
    EXPECT_EQ(fixed.threads(), 3);
    CoreShare one(1, 1, /*adapt=*/true);
    EXPECT_FALSE(one.adapts());
    EXPECT_EQ(one.threads(), 1);
}

}  // namespace
}  // namespace saetrain
