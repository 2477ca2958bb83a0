// test_reader_memory — the reader's memory over a long run: the process's resident memory
// stays within the reader's configured buffers (buffer_bytes()) plus a small constant, and does
// not grow after the first epoch, over 40 epochs (400 windows) of a small synthetic dataset.
//
// Measured from /proc/self/status: VmHWM (peak resident set, reset before the reader is made
// by writing 5 to /proc/self/clear_refs) and VmRSS after every epoch. A leak of as little as
// one permutation per window (16 KB here) adds 6 MB over the run and fails the growth check;
// a window buffer per window would add 800 MB.
#include <gtest/gtest.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "saetrain/loader.h"
#include "saetrain/shards.h"
#include "saetrain/synth.h"
#include "test_util.h"

using namespace saetrain;

namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); -1 when absent.
int64_t status_bytes(const std::string& key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, key.size() + 1, key + ":") == 0)
            return std::stoll(line.substr(key.size() + 1)) * 1024;  // "  123456 kB"
    }
    return -1;
}

// Resets VmHWM to the current resident set (Linux >= 4.0); false when not possible.
bool reset_peak() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

}  // namespace

TEST(ReaderMemory, ResidentMemoryIsTheBuffersPlusAConstantAndDoesNotGrowOverEpochs) {
    if (status_bytes("VmRSS") < 0) GTEST_SKIP() << "no /proc/self/status on this system";
    saetrain::testing::TempDir dir("saetrain_test_reader_memory");
    SynthOptions so;
    so.out_dir = (dir.path / "data").string();
    so.d_model = 128;
    so.n_features = 64;
    so.rows = 40000;  // 20 MB of float32 in 4 shards
    so.shards = 4;
    so.seed = 3;
    synth_write(so);
    const DatasetInfo info = dataset_open(so.out_dir);

    LoaderOptions o;
    o.epochs = 40;
    o.shuffle_rows = 4000;         // windows of 16 chunks: 10 windows per epoch
    o.read_bytes = 128 * 4 * 250;  // 250-row chunks
    o.ring_bytes = 1 << 20;
    o.seed = 9;
    const int64_t batch = 1024;
    std::vector<float> out(static_cast<size_t>(batch * info.d_model));
    for (float& v : out) v = 0;  // resident before the baseline

    // Slack for what is not a configured buffer: two thread stacks, the threads' malloc arenas,
    // each epoch's plan (a few KB), file descriptors, and the rounding of the allocator.
    constexpr int64_t slack = 16 << 20;
    // What may appear after the first epoch: page-granular noise, not a per-window leak.
    constexpr int64_t growth_slack = 2 << 20;

    // Hand back the heap pages freed by the set-up (writing the dataset), so that the reader's
    // buffers cannot hide in memory that was already resident at the baseline.
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    const bool peak_ok = reset_peak();
    const int64_t base = status_bytes("VmRSS");
    ShardBatchSource s(info, RowRange{0, info.total_rows}, o);
    const int64_t buffers = s.buffer_bytes();
    int64_t rows = 0, after_first = -1, most = 0;
    for (int64_t got; (got = s.next(out.data(), batch)) > 0;) {
        rows += got;
        if (rows % info.total_rows < got) {  // an epoch just ended
            const int64_t rss = status_bytes("VmRSS");
            if (after_first < 0) after_first = peak_ok ? status_bytes("VmHWM") : rss;
            most = std::max(most, rss);
        }
    }
    ASSERT_EQ(rows, 40 * info.total_rows);
    const int64_t peak = peak_ok ? status_bytes("VmHWM") : most;
    SCOPED_TRACE(::testing::Message()
                 << "baseline " << (base >> 10) << " KB, buffers " << (buffers >> 10)
                 << " KB, after epoch 1 " << (after_first >> 10) << " KB, peak " << (peak >> 10)
                 << " KB (" << (peak_ok ? "VmHWM" : "VmRSS sampled per epoch") << ")");
    std::printf(
        "reader memory over 40 epochs: buffers %lld KB; resident +%lld KB after epoch 1, "
        "peak +%lld KB (bound: buffers + %lld KB; growth after epoch 1 <= %lld KB)\n",
        static_cast<long long>(buffers >> 10), static_cast<long long>((after_first - base) >> 10),
        static_cast<long long>((peak - base) >> 10), static_cast<long long>(slack >> 10),
        static_cast<long long>(growth_slack >> 10));
    EXPECT_LE(peak - base, buffers + slack);
    EXPECT_LE(peak - after_first, growth_slack);
    EXPECT_LE(most - after_first, growth_slack);
    // The buffers are really resident (the bound above is not vacuous).
    EXPECT_GE(after_first - base, buffers / 2);
}
