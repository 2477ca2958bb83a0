// test_loader — the prefetching, shuffling reader: exactly-once delivery over epochs and ranks,
// determinism, restore at a cursor, agreement with the oracle (test/shard_oracle.h) on every
// storage layout, 16-bit rows delivered as stored (equal, widened, to the float32 rows),
// shuffle quality, staging, bounded buffers and errors that name the file.
//
// Rows are identified by content: synthetic rows are random, so a hash of a row's bits maps it
// back to its global row in the oracle's read of the whole dataset, and a match
// also proves the values are bit-identical.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "../src/io/raw_shards.h"
#include "saetrain/error.h"
#include "saetrain/loader.h"
#include "saetrain/sae_math.h"
#include "saetrain/shards.h"
#include "saetrain/stage.h"
#include "saetrain/synth.h"
#include "shard_oracle.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_test_loader") {}
};

using saetrain::testing::error_of;

uint64_t row_hash(const float* r, int64_t d) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t j = 0; j < d; ++j) {
        uint32_t u;
        std::memcpy(&u, r + j, 4);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

// A synthetic dataset and its oracle: every row as the oracle reads it, and a row -> id map.
struct Fixture {
    TempDir dir;
    DatasetInfo info;
    std::vector<float> ref;  // [total_rows, d]
    std::unordered_map<uint64_t, int64_t> id_of;

    explicit Fixture(DType t, bool chunked, int64_t rows = 3001, int64_t shards = 3) {
        SynthOptions o;
        o.out_dir = dir / "data";
        o.d_model = 16;
        o.n_features = 32;
        o.rows = rows;
        o.shards = shards;
        o.dtype = t;
        o.chunked = chunked;
        o.chunk_rows = 50;  // does not divide the shard sizes
        o.noise_std = 0.5;  // rows distinct even in 16-bit types
        o.seed = 7;
        synth_write(o);
        init(dataset_open(o.out_dir));
    }
    explicit Fixture(const std::string& path) { init(dataset_open(path)); }

    void init(const DatasetInfo& i) {
        info = i;
        ref.resize(static_cast<size_t>(info.total_rows * info.d_model));
        saetrain::testing::ShardOracle r(info, RowRange{0, info.total_rows});
        EXPECT_EQ(r.read(ref.data(), info.total_rows), info.total_rows);
        for (int64_t k = 0; k < info.total_rows; ++k)
            id_of[row_hash(ref.data() + k * info.d_model, info.d_model)] = k;
    }

    // Global row ids of a batch; fails the test on a row that is not bit-identical to its match.
    std::vector<int64_t> ids(const std::vector<float>& batch, int64_t rows) const {
        const int64_t d = info.d_model;
        std::vector<int64_t> out;
        for (int64_t k = 0; k < rows; ++k) {
            const float* r = batch.data() + k * d;
            auto it = id_of.find(row_hash(r, d));
            if (it == id_of.end() ||
                std::memcmp(r, ref.data() + it->second * d, static_cast<size_t>(d) * 4) != 0) {
                ADD_FAILURE() << "delivered row " << k << " matches no row of the dataset";
                out.push_back(-1);
            } else {
                out.push_back(it->second);
            }
        }
        return out;
    }

    // Every id the source delivers, in batches of `batch` rows.
    std::vector<int64_t> drain(ShardBatchSource& s, int64_t batch, int64_t limit = -1) const {
        std::vector<float> buf(static_cast<size_t>(batch * info.d_model));
        std::vector<int64_t> all;
        for (;;) {
            int64_t want = batch;
            if (limit >= 0) want = std::min(want, limit - static_cast<int64_t>(all.size()));
            if (want == 0) break;
            const int64_t got = s.next(buf.data(), want);
            if (got == 0) break;
            for (int64_t id : ids(buf, got)) all.push_back(id);
        }
        return all;
    }
};

LoaderOptions opts(int64_t shuffle, int64_t epochs, uint64_t seed = 1) {
    LoaderOptions o;
    o.epochs = epochs;
    o.shuffle_rows = shuffle;
    o.seed = seed;
    o.read_bytes = 16 * 4 * 40;  // 40-row chunks of f32 (80 rows of 16-bit): many windows
    o.ring_bytes = 16 * 4 * 64;  // a small ring: the threads hand over often
    return o;
}

// 16-bit words widened with sae_math.h's reference conversions, one value at a time (not the
// F16C path of widen_to_f32 that the float32 delivery uses).
std::vector<float> widened(DType t, const std::vector<uint16_t>& words, size_t n) {
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i)
        out[i] = t == DType::bf16 ? math::bf16_bits_to_float(words[i])
                                  : math::fp16_bits_to_float(words[i]);
    return out;
}

void expect_exactly_once(const std::vector<int64_t>& ids, RowRange r, int64_t epochs) {
    ASSERT_EQ(static_cast<int64_t>(ids.size()), r.size() * epochs);
    for (int64_t e = 0; e < epochs; ++e) {
        std::vector<int> seen(static_cast<size_t>(r.size()), 0);
        for (int64_t k = 0; k < r.size(); ++k) {
            const int64_t id = ids[static_cast<size_t>(e * r.size() + k)];
            ASSERT_TRUE(id >= r.begin && id < r.end) << "row " << id << " is not in the range";
            ASSERT_EQ(++seen[static_cast<size_t>(id - r.begin)], 1)
                << "row " << id << " delivered twice in epoch " << e;
        }
    }
}

}  // namespace

// --- exactly once, determinism ---------------------------------------------------------------

TEST(Loader, ExactlyOncePerEpochOverRanksLayoutsAndShuffles) {
    struct Case {
        DType t;
        bool chunked;
    };
    for (Case c : {Case{DType::f32, false}, Case{DType::f16, true}, Case{DType::bf16, false},
                   Case{DType::f32, true}}) {
        Fixture fx(c.t, c.chunked);
        for (int world : {1, 3}) {
            for (int64_t shuffle : {int64_t{0}, int64_t{300}, int64_t{100000}}) {
                for (int rank = 0; rank < world; ++rank) {
                    SCOPED_TRACE(::testing::Message()
                                 << dtype_name(c.t) << " chunked " << c.chunked << " world "
                                 << world << " rank " << rank << " shuffle " << shuffle);
                    const RowRange r = partition_rows(fx.info.total_rows, rank, world);
                    ShardBatchSource s(fx.info, r, opts(shuffle, 3));
                    EXPECT_EQ(s.total_rows(), 3 * r.size());
                    const auto ids = fx.drain(s, 97);
                    expect_exactly_once(ids, r, 3);
                    if (shuffle == 0) {
                        for (size_t k = 0; k < ids.size(); ++k)
                            ASSERT_EQ(ids[k], r.begin + static_cast<int64_t>(k) % r.size());
                    }
                    // The stream is exactly what the plan says.
                    for (int64_t e = 0; e < 3; ++e) {
                        const auto order = s.plan().epoch_order(e);
                        for (int64_t k = 0; k < r.size(); ++k)
                            ASSERT_EQ(ids[static_cast<size_t>(e * r.size() + k)],
                                      r.begin + order[static_cast<size_t>(k)]);
                    }
                    EXPECT_EQ(s.bytes_read(), 3 * r.size() * 16 * dtype_size(c.t));
                }
            }
        }
    }
}

TEST(Loader, DeterministicForASeedAndDifferentAcrossSeedsAndEpochs) {
    Fixture fx(DType::f32, false);
    const RowRange r{0, fx.info.total_rows};
    auto run = [&](uint64_t seed) {
        ShardBatchSource s(fx.info, r, opts(500, 2, seed));
        return fx.drain(s, 128);
    };
    const auto a = run(11), b = run(11), c = run(12);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    const std::vector<int64_t> e0(a.begin(), a.begin() + r.size()),
        e1(a.begin() + r.size(), a.end());
    EXPECT_NE(e0, e1);  // each epoch has its own order
}

// next() copies a batch out of the ring on copy_threads threads, in rounds of half the ring
// (here a 97-row batch over 10-row blocks and a 6-block ring: ten rounds per batch), and the
// reader converts blocks on convert_threads threads.
TEST(Loader, ParallelCopyDeliversTheSameStream) {
    Fixture fx(DType::bf16, true);
    const RowRange r{0, fx.info.total_rows};
    auto run = [&](int threads) {
        LoaderOptions o = opts(500, 2, 5);
        o.copy_threads = threads;
        o.convert_threads = threads;
        ShardBatchSource s(fx.info, r, o);
        return fx.drain(s, 97);
    };
    const auto one = run(1), four = run(4);
    expect_exactly_once(four, r, 2);
    EXPECT_EQ(four, one);
    // Blocks of whole windows (one 3001-row window, 1 MB reads): large enough to be converted
    // on several threads.
    auto run_big = [&](int threads) {
        LoaderOptions o = opts(100000, 2, 5);
        o.read_bytes = 1 << 20;
        o.ring_bytes = 4 << 20;
        o.copy_threads = o.convert_threads = threads;
        ShardBatchSource s(fx.info, r, o);
        return fx.drain(s, 1000);
    };
    const auto big_one = run_big(1), big_four = run_big(4);
    expect_exactly_once(big_four, r, 2);
    EXPECT_EQ(big_four, big_one);
}

TEST(Loader, MaxRowsStopsMidEpoch) {
    Fixture fx(DType::f16, false);
    LoaderOptions o = opts(400, 1);
    o.max_rows = fx.info.total_rows + 777;
    ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, o);
    const auto ids = fx.drain(s, 100);
    ASSERT_EQ(static_cast<int64_t>(ids.size()), o.max_rows);
    const auto order1 = s.plan().epoch_order(1);
    for (int64_t k = 0; k < 777; ++k)
        EXPECT_EQ(ids[static_cast<size_t>(fx.info.total_rows + k)], order1[static_cast<size_t>(k)]);
    std::vector<float> buf(16);
    EXPECT_EQ(s.next(buf.data(), 1), 0);
}

// A shard truncated during the run (after the reader checked its size): the error names the
// shard and the row, through the prefetching source as through the reader.
TEST(Loader, ShardTruncatedMidRunIsANamedError) {
    Fixture fx(DType::f32, false);
    const std::string last = fx.info.shards.back().path;
    ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, opts(0, 1));
    std::vector<float> buf(static_cast<size_t>(100 * fx.info.d_model));
    ASSERT_EQ(s.next(buf.data(), 100), 100);  // the first shard reads fine
    std::filesystem::resize_file(last, std::filesystem::file_size(last) / 2);
    std::string error;
    try {
        while (s.next(buf.data(), 100) > 0) {
        }
    } catch (const Error& e) {
        error = e.what();
    }
    EXPECT_NE(error.find("shard " + last + ": reading row "), std::string::npos) << error;
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

// --- resume ----------------------------------------------------------------------------------

TEST(Loader, RestoreAtCursorDeliversExactlyTheRemainingStream) {
    Fixture fx(DType::f16, true);
    const RowRange r = partition_rows(fx.info.total_rows, 1, 2);
    const LoaderOptions o = opts(300, 3, 5);
    ShardBatchSource full(fx.info, r, o);
    const auto stream = fx.drain(full, 64);
    ASSERT_EQ(static_cast<int64_t>(stream.size()), 3 * r.size());
    const auto ep = full.plan().epoch(1);
    const int64_t n = r.size();
    // Start, inside the first window, a window boundary, mid-window, an epoch boundary, the
    // last row of an epoch, deep in the last epoch, and the very end.
    const int64_t w1 = ep.window_begin[1], w2 = ep.window_begin[2];
    for (int64_t at : {int64_t{0}, int64_t{1}, w1, (w1 + w2) / 2, n, n + w1 + 3, 2 * n - 1,
                       2 * n + 5, 3 * n - 1, 3 * n}) {
        SCOPED_TRACE(::testing::Message() << "cursor at row " << at);
        // Reach the cursor by reading (batches of 37), then restore from it in a new source.
        ShardBatchSource first(fx.info, r, o);
        const auto head = fx.drain(first, 37, at);
        ASSERT_EQ(static_cast<int64_t>(head.size()), at);
        const ReaderCursor c = first.cursor();
        EXPECT_EQ(c.epoch * n + c.offset, at);
        ShardBatchSource resumed(fx.info, r, o, c);
        const auto tail = fx.drain(resumed, 50);
        std::vector<int64_t> joined = head;
        joined.insert(joined.end(), tail.begin(), tail.end());
        EXPECT_EQ(joined, stream);
        // restore() on a live source does the same.
        if (at < 3 * n) {
            first.restore(ReaderCursor{0, 0});
            EXPECT_EQ(fx.drain(first, 41), stream);
            first.restore(c);
            EXPECT_EQ(fx.drain(first, 29), tail);
        }
    }
}

TEST(Loader, EveryPlanCoversEveryRowOnceAndFitsItsWindowCapacity) {
    // Disk order with a chunk count that windows of 4 do not divide used to drop chunks (5
    // chunks in 2 windows gave 3 "strata" and chunk 3 was never read); shuffled plans too.
    for (bool shuffle : {false, true}) {
        for (int64_t rows : {int64_t{50}, int64_t{90}, int64_t{95}, int64_t{760}, int64_t{1003}}) {
            for (int64_t wc : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{7}}) {
                SCOPED_TRACE(::testing::Message() << "shuffle " << shuffle << " rows " << rows
                                                  << " window chunks " << wc);
                const ShufflePlan p(rows, 10, wc, shuffle, 3);
                for (int64_t e = 0; e < 2; ++e) {
                    const auto order = p.epoch_order(e);
                    ASSERT_EQ(static_cast<int64_t>(order.size()), rows);
                    std::vector<int> seen(static_cast<size_t>(rows), 0);
                    for (int64_t r : order) ASSERT_EQ(++seen[static_cast<size_t>(r)], 1) << r;
                    const auto ep = p.epoch(e);
                    for (int64_t w = 0; w < p.n_windows(); ++w) {
                        const int64_t n = ep.window_begin[static_cast<size_t>(w + 1)] -
                                          ep.window_begin[static_cast<size_t>(w)];
                        ASSERT_LE(n, p.window_capacity()) << "window " << w;
                    }
                }
                // The capacity is tight: some window of epoch 0 fills it.
                const auto ep = p.epoch(0);
                int64_t most = 0;
                for (int64_t w = 0; w < p.n_windows(); ++w)
                    most = std::max(most, ep.window_begin[static_cast<size_t>(w + 1)] -
                                              ep.window_begin[static_cast<size_t>(w)]);
                EXPECT_GE(most + 10, p.window_capacity());
            }
        }
    }
}

TEST(Loader, RejectsCursorsOutsideTheRun) {
    Fixture fx(DType::f32, false, 500, 1);
    const RowRange r{0, 500};
    EXPECT_NE(error_of([&] {
                  ShardBatchSource s(fx.info, r, opts(0, 1), ReaderCursor{0, 500});
              }).find("invalid"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  ShardBatchSource s(fx.info, r, opts(0, 1), ReaderCursor{2, 0});
              }).find("beyond"),
              std::string::npos);
}

// --- layouts and values ----------------------------------------------------------------------

TEST(Loader, H5pyFixturesMatchTheOracle) {
    for (const char* name : {"/h5py_plain.h5", "/h5py_f16_chunked.h5"}) {
        Fixture fx(std::string(SAETRAIN_TEST_DATA) + name);
        for (int64_t shuffle : {int64_t{0}, int64_t{10}}) {
            LoaderOptions o = opts(shuffle, 2);
            o.read_bytes = 16 * 4 * 5;
            ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, o);
            expect_exactly_once(fx.drain(s, 6), RowRange{0, fx.info.total_rows}, 2);
        }
        // Formula of tools/make_h5py_fixture.py, read through the loader in disk order.
        ShardBatchSource s(fx.info, RowRange{0, 37}, opts(0, 1));
        std::vector<float> all(37 * 16);
        ASSERT_EQ(s.next(all.data(), 37), 37);
        for (int i = 0; i < 37; ++i)
            for (int j = 0; j < 16; ++j)
                ASSERT_EQ(all[static_cast<size_t>(i * 16 + j)],
                          static_cast<float>(i) * 0.5f - static_cast<float>(j));
    }
}

TEST(Loader, PlainLayoutsAreReadWithPread) {
    for (bool chunked : {false, true}) {
        Fixture fx(DType::f16, chunked);
        io::RawRowReader rr(fx.info, RowRange{0, fx.info.total_rows});
        EXPECT_EQ(rr.raw_shards(), 3) << "chunked " << chunked << ": " << rr.layout(0).why;
        EXPECT_EQ(rr.hdf5_shards(), 0);
    }
    Fixture h(std::string(SAETRAIN_TEST_DATA) + "/h5py_f16_chunked.h5");
    io::RawRowReader rr(h.info, RowRange{0, 37});
    EXPECT_EQ(rr.raw_shards(), 1) << rr.layout(0).why;
}

// --- 16-bit rows as stored --------------------------------------------------------------------

// LoaderOptions::widen = false (what saetrain uses): float16/bfloat16 rows come out of next()
// as their stored 16-bit words, and widened they are bit for bit the float32 rows the widening
// reader delivers, in the same order, batch by batch: contiguous and chunked shards, ranges
// that cross shard boundaries, disk order and shuffle windows, over epochs, and after a
// restore at a cursor.
TEST(Loader, SixteenBitRowsAsStoredAreTheWidenedRowsBitForBit) {
    struct Case {
        DType t;
        bool chunked;
    };
    for (Case c : {Case{DType::bf16, false}, Case{DType::bf16, true}, Case{DType::f16, false},
                   Case{DType::f16, true}}) {
        Fixture fx(c.t, c.chunked);
        const int64_t d = fx.info.d_model;
        for (int world : {1, 3}) {
            for (int64_t shuffle : {int64_t{0}, int64_t{300}, int64_t{100000}}) {
                // Rank 1 of 3: [1000, 2001), which crosses the boundary of shards 0 and 1.
                const int rank = world == 1 ? 0 : 1;
                SCOPED_TRACE(::testing::Message() << dtype_name(c.t) << " chunked " << c.chunked
                                                  << " world " << world << " shuffle " << shuffle);
                const RowRange r = partition_rows(fx.info.total_rows, rank, world);
                LoaderOptions wide = opts(shuffle, 2, 9), kept = wide;
                kept.widen = false;
                ShardBatchSource a(fx.info, r, wide), b(fx.info, r, kept);
                EXPECT_EQ(a.dtype(), DType::f32);
                ASSERT_EQ(b.dtype(), c.t);
                const int64_t batch = 97;
                std::vector<float> fa(static_cast<size_t>(batch * d));
                // One row of sentinel words past the batch: next() writes 2 bytes a value.
                std::vector<uint16_t> wb(static_cast<size_t>((batch + 1) * d), 0xABCD);
                std::vector<int64_t> ids;
                int64_t got = 0;
                do {
                    got = a.next(fa.data(), batch);
                    ASSERT_EQ(b.next(wb.data(), batch), got);
                    for (int64_t i = got * d; i < (batch + 1) * d; ++i)
                        ASSERT_EQ(wb[static_cast<size_t>(i)], 0xABCD) << "word " << i;
                    const std::vector<float> fb = widened(c.t, wb, static_cast<size_t>(got * d));
                    ASSERT_EQ(std::memcmp(fb.data(), fa.data(), fb.size() * 4), 0);
                    for (int64_t id : fx.ids(fb, got)) ids.push_back(id);
                    std::fill(wb.begin(), wb.end(), 0xABCD);
                } while (got > 0);
                expect_exactly_once(ids, r, 2);
                EXPECT_EQ(b.bytes_read(), a.bytes_read());
                EXPECT_EQ(b.cursor().epoch, 2);

                // Restore mid-window: the 16-bit stream from there is the one delivered above.
                const int64_t at = r.size() + 123;
                ShardBatchSource from(fx.info, r, kept, ReaderCursor{1, 123});
                std::vector<uint16_t> rest(static_cast<size_t>((2 * r.size() - at) * d));
                ASSERT_EQ(from.next(rest.data(), 2 * r.size()), 2 * r.size() - at);
                const std::vector<float> rest_f = widened(c.t, rest, rest.size());
                const auto rest_ids = fx.ids(rest_f, 2 * r.size() - at);
                EXPECT_EQ(rest_ids, std::vector<int64_t>(ids.begin() + at, ids.end()));
            }
        }
    }
}

// The output ring is ring_bytes of the delivered type: 16-bit rows as stored fit twice the
// rows of float32 in it, and the buffers still do not grow.
TEST(Loader, SixteenBitRingHoldsTwiceTheRowsInTheSameBytes) {
    Fixture fx(DType::bf16, true);
    const RowRange r{0, fx.info.total_rows};
    LoaderOptions wide = opts(500, 2, 3), kept = wide;
    kept.widen = false;
    ShardBatchSource a(fx.info, r, wide), b(fx.info, r, kept);
    std::vector<float> buf(100 * 16);
    ASSERT_EQ(a.next(buf.data(), 100), 100);
    ASSERT_EQ(b.next(buf.data(), 100), 100);
    // Same windows, permutation and ring bytes (a whole number of blocks in both).
    EXPECT_EQ(a.buffer_bytes(), b.buffer_bytes());
    const int64_t at_start = b.buffer_bytes();
    while (b.next(buf.data(), 100) > 0) ASSERT_EQ(b.buffer_bytes(), at_start);
}

// --- errors ----------------------------------------------------------------------------------

TEST(Loader, TruncatedShardIsNamed) {
    Fixture fx(DType::f32, false);
    const std::string victim = fx.info.shards[1].path;
    fs::resize_file(victim, fs::file_size(victim) / 2);
    const std::string msg = error_of([&] {
        ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, opts(0, 1));
    });
    EXPECT_NE(msg.find(victim), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Loader, ReadErrorInTheBackgroundSurfacesInNextNamingTheFile) {
    Fixture fx(DType::f32, false);
    const std::string victim = fx.info.shards[2].path;
    LoaderOptions o = opts(0, 1);
    ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, o);
    fs::resize_file(victim, 4096);  // after the layout check: the pread itself comes up short
    const std::string msg = error_of([&] { fx.drain(s, 100); });
    EXPECT_NE(msg.find(victim), std::string::npos) << msg;
}

// --- shuffle quality -------------------------------------------------------------------------

TEST(Loader, ShuffleQualityFarBetterThanDiskOrder) {
    const int64_t n = 200000, batch = 1024, groups = 8;
    LoaderOptions o;
    o.read_bytes = 1000 * 4;  // 1000-row chunks of 1-float rows
    o.shuffle_rows = 20000;   // windows of 20 chunks: 10% of the range
    const auto shuffled = ShufflePlan::from_options(n, 4, o).epoch_order(0);
    o.shuffle_rows = 0;
    const auto disk = ShufflePlan::from_options(n, 4, o).epoch_order(0);
    const ShuffleQuality qs = shuffle_quality(shuffled, batch, groups);
    const ShuffleQuality qd = shuffle_quality(disk, batch, groups);
    // A uniform permutation scores displacement 1 and batch correlation 0 (+- a few
    // 1/sqrt(#batches)).
    EXPECT_NEAR(qd.displacement, 0.0, 1e-12);
    EXPECT_GT(qd.batch_corr, 0.95);
    EXPECT_GT(qd.batch_spread, 10.0);
    EXPECT_GT(qs.displacement, 0.9);
    // Stratified windows: a window holds one chunk of every 1/20 of the range, so batch means
    // barely depend on the window; what remains comes from strata that straddle two groups.
    EXPECT_LT(std::abs(qs.batch_corr), 0.5);
    EXPECT_LT(qs.batch_spread, 1.5);
    // Within one window the rows really are mixed: neighbours in the stream are far apart.
    int64_t close = 0;
    for (size_t k = 1; k < shuffled.size(); ++k)
        close += std::abs(shuffled[k] - shuffled[k - 1]) < 1000;
    EXPECT_LT(close, n / 10);
}

// --- staging ---------------------------------------------------------------------------------

TEST(Loader, StagingCopiesOnceAndReadsTheCopies) {
    Fixture fx(DType::f16, true);
    TempDir stage;
    const RowRange r = partition_rows(fx.info.total_rows, 0, 2);  // shards 0 and 1 only
    StageStats st;
    DatasetInfo local = stage_shards(fx.info, r, stage.path.string(), false, &st);
    EXPECT_EQ(st.copied, 2);
    EXPECT_EQ(st.skipped, 0);
    EXPECT_NE(local.shards[0].path, fx.info.shards[0].path);
    EXPECT_EQ(local.shards[2].path, fx.info.shards[2].path);  // not in the range: not copied
    EXPECT_EQ(fs::file_size(local.shards[1].path), fs::file_size(fx.info.shards[1].path));
    stage_shards(fx.info, r, stage.path.string(), false, &st);
    EXPECT_EQ(st.copied, 0);
    EXPECT_EQ(st.skipped, 2);
    fs::resize_file(local.shards[1].path, 100);  // a wrong size is copied again
    stage_shards(fx.info, r, stage.path.string(), false, &st);
    EXPECT_EQ(st.copied, 1);
    // The loader stages by itself and delivers the same rows.
    LoaderOptions o = opts(200, 1);
    o.stage_dir = stage.path.string();
    ShardBatchSource s(fx.info, r, o);
    EXPECT_EQ(s.dataset().shards[0].path, local.shards[0].path);
    expect_exactly_once(fx.drain(s, 64), r, 1);
}

TEST(Loader, StageDirExpandsTmpdir) {
    const char* old = std::getenv("TMPDIR");
    const std::string keep = old ? old : "";
    setenv("TMPDIR", "/scratch/job7", 1);
    EXPECT_EQ(stage_dir_resolve("$TMPDIR/sae"), "/scratch/job7/sae");
    EXPECT_EQ(stage_dir_resolve("/local"), "/local");
    if (old)
        setenv("TMPDIR", keep.c_str(), 1);
    else
        unsetenv("TMPDIR");
}

// --- memory ----------------------------------------------------------------------------------

TEST(Loader, BuffersComeFromTheConfiguredAllocatorAndAreFreedOnce) {
    // What the CUDA backend relies on to get pinned buffers: every large buffer comes from
    // LoaderOptions::allocator, is kept across restore() and is freed exactly once.
    Fixture fx(DType::f16, true);
    struct Counts {
        std::map<void*, size_t> live;
        int64_t allocs = 0, frees = 0, bytes = 0, bad_frees = 0;
    };
    auto counts = std::make_shared<Counts>();
    LoaderOptions o = opts(500, 2, 3);
    o.allocator.name = "counting";
    o.allocator.alloc = [counts](size_t bytes) {
        void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
        counts->live[p] = bytes;
        counts->allocs += 1, counts->bytes += static_cast<int64_t>(bytes);
        return p;
    };
    o.allocator.free = [counts](void* p, size_t bytes) {
        auto it = counts->live.find(p);
        if (it == counts->live.end() || it->second != bytes) counts->bad_frees += 1;
        if (it != counts->live.end()) counts->live.erase(it);
        counts->frees += 1;
        std::free(p);
    };
    const RowRange r{0, fx.info.total_rows};
    std::vector<int64_t> want;
    {
        ShardBatchSource plain(fx.info, r, opts(500, 2, 3));
        want = fx.drain(plain, 64);
    }
    {
        ShardBatchSource s(fx.info, r, o);
        EXPECT_EQ(counts->allocs, 3);  // two windows and the output ring
        // Everything buffer_bytes() counts but the permutation came from the allocator.
        const int64_t window = s.plan().window_capacity();
        EXPECT_EQ(counts->bytes + window * 4, s.buffer_bytes());
        EXPECT_EQ(fx.drain(s, 64, 1000), std::vector<int64_t>(want.begin(), want.begin() + 1000));
        s.restore(ReaderCursor{0, 0});  // same buffers, nothing new
        EXPECT_EQ(counts->allocs, 3);
        EXPECT_EQ(fx.drain(s, 64), want);
        EXPECT_EQ(counts->frees, 0);
    }
    EXPECT_EQ(counts->frees, 3);
    EXPECT_EQ(counts->bad_frees, 0);
    EXPECT_TRUE(counts->live.empty());

    // An allocator that cannot provide the memory is named in the error.
    LoaderOptions fail = opts(500, 1);
    fail.allocator.name = "stingy";
    fail.allocator.alloc = [](size_t) -> void* { return nullptr; };
    fail.allocator.free = [](void*, size_t) {};
    const std::string msg = error_of([&] { ShardBatchSource s(fx.info, r, fail); });
    EXPECT_NE(msg.find("stingy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shuffle_buffer_rows"), std::string::npos) << msg;
}

TEST(Loader, BuffersDoNotGrowOverEpochs) {
    Fixture fx(DType::f16, false);
    LoaderOptions o = opts(500, 4);
    ShardBatchSource s(fx.info, RowRange{0, fx.info.total_rows}, o);
    std::vector<float> buf(100 * 16);
    ASSERT_EQ(s.next(buf.data(), 100), 100);
    const int64_t at_start = s.buffer_bytes();
    // Two windows of stored rows, the ring, and one permutation: nothing proportional to the
    // range or to the epochs.
    const int64_t window = s.plan().window_capacity();
    EXPECT_LE(at_start, 2 * (window * 16 * 2 + 4096) + o.ring_bytes + 16 * 4 * 64 + window * 4);
    while (s.next(buf.data(), 100) > 0) {
        ASSERT_EQ(s.buffer_bytes(), at_start);
    }
}

// Paired datasets (a transcoder's input and target) are read row for row by one reader: every
// delivered row is an input row followed by the target row of the same index, in one shuffle
// (each row once per epoch, the same order as the input read alone), and a cursor restores the
// pairs' remaining stream; 16-bit pairs as stored. The alignment check refuses sets that differ
// in shards, rows or token ids, naming the shard.
TEST(Loader, PairedSetsAreReadRowForRowInOneShuffle) {
    TempDir tmp;
    SynthOptions so;
    so.out_dir = tmp / "in";
    so.target_dir = tmp / "out";
    so.d_model = 8, so.n_features = 32, so.rows = 3001, so.shards = 3, so.seed = 4;
    so.dtype = DType::f16;
    synth_write(so);
    const DatasetInfo in = dataset_open(tmp / "in"), out = dataset_open(tmp / "out");
    EXPECT_TRUE(dataset_check_paired(in, out, "data.path", "data.target_path"))
        << "sae-synth's pairs carry token ids: compared";
    const std::vector<float> xs = read_rows(in, {0, in.total_rows});
    const std::vector<float> ys = read_rows(out, {0, out.total_rows});
    const int64_t d = in.d_model;
    std::map<std::vector<float>, int64_t> row_of;  // an input row's values -> its index
    for (int64_t r = 0; r < in.total_rows; ++r)
        row_of[std::vector<float>(xs.begin() + r * d, xs.begin() + (r + 1) * d)] = r;
    ASSERT_EQ(static_cast<int64_t>(row_of.size()), in.total_rows);

    const RowRange range = partition_rows(in.total_rows, 1, 2);
    LoaderOptions o;
    o.epochs = 2, o.shuffle_rows = 400, o.read_bytes = 1024, o.seed = 9, o.widen = true;
    auto drain = [&](ShardBatchSource& src, int64_t limit) {
        std::vector<int64_t> order;
        std::vector<float> buf(static_cast<size_t>(37 * 2 * d));
        while (static_cast<int64_t>(order.size()) < limit) {
            const int64_t got =
                src.next(buf.data(), std::min<int64_t>(37, limit - int64_t(order.size())));
            if (got == 0) break;
            for (int64_t i = 0; i < got; ++i) {
                const float* row = buf.data() + i * 2 * d;
                const auto it = row_of.find(std::vector<float>(row, row + d));
                EXPECT_NE(it, row_of.end()) << "an input half that is no input row";
                if (it == row_of.end()) return order;
                EXPECT_TRUE(std::equal(row + d, row + 2 * d, ys.begin() + it->second * d))
                    << "row " << it->second << ": the target half is another row's";
                order.push_back(it->second);
            }
        }
        return order;
    };
    ShardBatchSource paired(std::vector<DatasetInfo>{in, out}, range, o);
    EXPECT_EQ(paired.row_width(), 2 * d);
    EXPECT_EQ(paired.dtype(), DType::f32);
    const std::vector<int64_t> stream = drain(paired, 1 << 20);
    ASSERT_EQ(static_cast<int64_t>(stream.size()), 2 * range.size());
    for (int e = 0; e < 2; ++e) {
        std::vector<int64_t> epoch(stream.begin() + e * range.size(),
                                   stream.begin() + (e + 1) * range.size());
        std::sort(epoch.begin(), epoch.end());
        for (int64_t i = 0; i < range.size(); ++i) ASSERT_EQ(epoch[i], range.begin + i);
    }
    // The input read alone comes in the same order: one plan for both.
    ShardBatchSource alone(in, range, o);
    std::vector<float> abuf(static_cast<size_t>(range.size() * d));
    ASSERT_EQ(alone.next(abuf.data(), range.size()), range.size());
    for (int64_t i = 0; i < range.size(); ++i)
        ASSERT_TRUE(std::equal(abuf.begin() + i * d, abuf.begin() + (i + 1) * d,
                               xs.begin() + stream[i] * d))
            << "position " << i;
    // A cursor mid-epoch restores the pairs' remaining stream.
    ShardBatchSource first(std::vector<DatasetInfo>{in, out}, range, o);
    const std::vector<int64_t> head = drain(first, 777);
    ShardBatchSource resumed(std::vector<DatasetInfo>{in, out}, range, o, first.cursor());
    std::vector<int64_t> joined = head;
    const std::vector<int64_t> tail = drain(resumed, 1 << 20);
    joined.insert(joined.end(), tail.begin(), tail.end());
    EXPECT_EQ(joined, stream);
    // As stored (16-bit): the same pairs, bit for bit.
    o.widen = false;
    ShardBatchSource raw(std::vector<DatasetInfo>{in, out}, range, o);
    EXPECT_EQ(raw.dtype(), DType::f16);
    std::vector<uint16_t> words(static_cast<size_t>(range.size() * 2 * d));
    ASSERT_EQ(raw.next(words.data(), range.size()), range.size());
    std::vector<float> wide(words.size());
    widen_to_f32(DType::f16, words.data(), wide.data(), static_cast<int64_t>(words.size()));
    for (int64_t i = 0; i < range.size(); ++i) {
        ASSERT_TRUE(std::equal(wide.begin() + i * 2 * d, wide.begin() + i * 2 * d + d,
                               xs.begin() + stream[i] * d));
        ASSERT_TRUE(std::equal(wide.begin() + i * 2 * d + d, wide.begin() + (i + 1) * 2 * d,
                               ys.begin() + stream[i] * d));
    }
    // read_rows of the pair: [rows, 2 d], each row its input and its target.
    const std::vector<float> both = read_rows(std::vector<DatasetInfo>{in, out}, {5, 9});
    for (int64_t r = 0; r < 4; ++r) {
        EXPECT_TRUE(std::equal(both.begin() + r * 2 * d, both.begin() + r * 2 * d + d,
                               xs.begin() + (5 + r) * d));
        EXPECT_TRUE(std::equal(both.begin() + r * 2 * d + d, both.begin() + (r + 1) * 2 * d,
                               ys.begin() + (5 + r) * d));
    }
}

// A multi-layer paired set (a CLT's `inputs` and `targets` [rows, L, d] in one file) is its
// layers' sets side by side: the same rows in the same stream, bit for bit, contiguous, chunked
// by whole rows (pread) and chunked by layer (H5Dread), and through read_rows and the oracle.
TEST(Loader, MultiLayerPairedSetsAreTheirLayersSetsSideBySide) {
    TempDir tmp;
    std::vector<DatasetInfo> ins, outs;
    for (int l = 0; l < 3; ++l) {
        SynthOptions so;
        so.out_dir = tmp / fmt::format("in{}", l);
        so.target_dir = tmp / fmt::format("out{}", l);
        so.d_model = 8, so.n_features = 16, so.rows = 1501, so.shards = 3, so.seed = 20 + l;
        so.dtype = DType::f16;
        synth_write(so);
        ins.push_back(dataset_open(so.out_dir));
        outs.push_back(dataset_open(so.target_dir));
    }
    std::vector<DatasetInfo> sets = ins;
    sets.insert(sets.end(), outs.begin(), outs.end());
    const RowRange all{0, ins[0].total_rows};
    const std::vector<float> want = read_rows(sets, all);
    LoaderOptions o;
    o.epochs = 2, o.shuffle_rows = 300, o.read_bytes = 2048, o.seed = 5, o.widen = false;
    const RowRange range = partition_rows(all.size(), 1, 2);
    // In disk order the two streams are one; shuffled, the reads (and so the windows) are cut
    // by the widest part's row, L times wider here, so each epoch holds the same rows in
    // another order.
    const auto stream = [&](const std::vector<DatasetInfo>& parts) {
        ShardBatchSource src(parts, range, o);
        std::vector<uint16_t> words(static_cast<size_t>(2 * range.size() * src.row_width()));
        EXPECT_EQ(src.next(words.data(), 2 * range.size()), 2 * range.size());
        return words;
    };
    o.shuffle_rows = 0;
    const std::vector<uint16_t> by_layer = stream(sets);
    o.shuffle_rows = 300;
    const std::vector<uint16_t> by_layer_shuffled = stream(sets);
    // Each epoch's rows as a sorted list of rows (48 words each).
    const auto epochs = [&](const std::vector<uint16_t>& w) {
        std::vector<std::vector<std::vector<uint16_t>>> out(2);
        for (int64_t r = 0; r < 2 * range.size(); ++r)
            out[static_cast<size_t>(r / range.size())].emplace_back(w.begin() + r * 48,
                                                                    w.begin() + (r + 1) * 48);
        for (auto& e : out) std::sort(e.begin(), e.end());
        return out;
    };
    for (const int64_t chunk : {int64_t{0}, int64_t{100}, int64_t{-100}}) {
        SCOPED_TRACE(fmt::format("chunk_rows {}", chunk));
        const fs::path dir = tmp / fmt::format("pairs{}", chunk);
        fs::create_directories(dir);
        saetrain::testing::write_layer_pairs(dir, ins, outs, chunk);
        const DatasetInfo in = dataset_open(dir, "inputs"), out = dataset_open(dir, "targets");
        EXPECT_EQ(in.layers, 3);
        EXPECT_EQ(in.d_model, 24);
        EXPECT_EQ(in.total_rows, all.size());
        EXPECT_TRUE(dataset_check_paired(in, out, "inputs", "targets"));
        EXPECT_EQ(dataset_info_unpack(dataset_info_pack(in)).layers, 3);
        io::RawRowReader rr(in, all);
        EXPECT_EQ(rr.raw_shards(), chunk < 0 ? 0 : 3) << rr.layout(0).why;
        EXPECT_EQ(read_rows(std::vector<DatasetInfo>{in, out}, all), want);
        const std::vector<float> oracle = saetrain::testing::oracle_rows(in, all);
        for (int64_t r = 0; r < all.size(); r += 97)
            ASSERT_TRUE(std::equal(oracle.begin() + r * 24, oracle.begin() + (r + 1) * 24,
                                   want.begin() + r * 48));
        const std::vector<uint16_t> shuffled = stream({in, out});
        EXPECT_EQ(epochs(shuffled), epochs(by_layer_shuffled));
        o.shuffle_rows = 0;
        EXPECT_EQ(stream({in, out}), by_layer);
        o.shuffle_rows = 300;
    }
}

TEST(Loader, MisalignedPairsAreRefusedNamingTheShard) {
    TempDir tmp;
    SynthOptions so;
    so.out_dir = tmp / "in";
    so.target_dir = tmp / "out";
    so.d_model = 8, so.n_features = 32, so.rows = 3000, so.shards = 3, so.seed = 4;
    synth_write(so);
    const DatasetInfo in = dataset_open(tmp / "in");
    // The message dataset_check_paired gives `in` and the target set of `variant`'s synthetic
    // pair (written to in<tag>/out<tag>).
    auto refusal = [&](SynthOptions variant, const std::string& tag) {
        variant.out_dir = tmp / ("in" + tag), variant.target_dir = tmp / ("out" + tag);
        synth_write(variant);
        return saetrain::testing::error_of([&] {
            dataset_check_paired(in, dataset_open(variant.target_dir), "data.path",
                                 "data.target_path");
        });
    };
    // Other shard boundaries: the same rows in 2 shards.
    SynthOptions two = so;
    two.shards = 2;
    std::string m = refusal(two, "2");
    EXPECT_NE(m.find("data.target_path " + (tmp / "out2") + " has 2 shard(s), but data.path"),
              std::string::npos)
        << m;
    // Fewer rows in all.
    SynthOptions fewer = so;
    fewer.rows = 2999;
    m = refusal(fewer, "3");
    EXPECT_NE(m.find("holds 2999 rows, but data.path"), std::string::npos) << m;
    // Another width.
    SynthOptions wide = so;
    wide.d_model = 16;
    m = refusal(wide, "4");
    EXPECT_NE(m.find("has d_model 16, but data.path"), std::string::npos) << m;
    // The same shapes but other tokens: one token id changed in the last shard's last rows.
    const std::string last = (fs::path(tmp / "out") / "shard_00002.h5").string();
    {
        hid_t f = H5Fopen(last.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        hid_t ds = H5Dopen2(f, "token_ids", H5P_DEFAULT);
        hid_t space = H5Dget_space(ds);
        const hsize_t at[1] = {999}, one[1] = {1};
        H5Sselect_hyperslab(space, H5S_SELECT_SET, at, nullptr, one, nullptr);
        hid_t mem = H5Screate_simple(1, one, nullptr);
        const int32_t v = -7;
        ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, &v), 0);
        H5Sclose(mem), H5Sclose(space), H5Dclose(ds), H5Fclose(f);
    }
    m = saetrain::testing::error_of([&] {
        dataset_check_paired(in, dataset_open(tmp / "out"), "data.path", "data.target_path");
    });
    EXPECT_NE(m.find("data.target_path shard " + last + ": row 999 is token id -7"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    // Without token ids on one side nothing can be compared row for row: accepted (the counts
    // agree), and the caller told so (saetrain warns).
    for (const auto& e : fs::directory_iterator(tmp / "out")) {
        if (e.path().filename().string().rfind("shard_", 0) != 0) continue;
        hid_t f = H5Fopen(e.path().c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        ASSERT_GE(H5Ldelete(f, "token_ids", H5P_DEFAULT), 0);
        H5Fclose(f);
    }
    EXPECT_FALSE(
        dataset_check_paired(in, dataset_open(tmp / "out"), "data.path", "data.target_path"));
}
