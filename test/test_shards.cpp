// test_shards — listing, validation, reads (the oracle's and read_rows) and element conversion
// of HDF5 shards.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/sae_math.h"
#include "saetrain/shards.h"
#include "saetrain/synth.h"
#include "shard_oracle.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_test_shards") {}
};

float f_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

using saetrain::testing::error_of;
using saetrain::testing::ShardOracle;

SynthOptions small_opts(const std::string& dir, DType t, bool chunked) {
    SynthOptions o;
    o.out_dir = dir;
    o.d_model = 24;
    o.n_features = 40;
    o.rows = 1001;  // 334 + 334 + 333: shard boundaries at 334 and 668
    o.shards = 3;
    o.dtype = t;
    o.chunked = chunked;
    o.chunk_rows = 50;  // does not divide the shard sizes: partial last chunk
    o.seed = 1234;
    return o;
}

// Reads the whole dataset with a cycle of awkward request sizes.
std::vector<float> read_all_odd(const DatasetInfo& info) {
    ShardOracle r(info, RowRange{0, info.total_rows});
    std::vector<float> out(static_cast<size_t>(info.total_rows * info.d_model));
    const int64_t sizes[] = {37, 1, 333, 2, 297, 101, 1000};
    int64_t at = 0;
    for (int i = 0; at < info.total_rows; ++i) {
        int64_t got = r.read(out.data() + at * info.d_model, sizes[i % 7]);
        EXPECT_GT(got, 0);
        at += got;
        EXPECT_EQ(r.position(), at);
    }
    EXPECT_EQ(r.read(out.data(), 10), 0);  // at the end
    EXPECT_EQ(r.bytes_read(), info.total_rows * info.d_model * dtype_size(info.dtype));
    return out;
}

// Reads each shard in one request: a different access pattern than read_all_odd.
std::vector<float> read_per_shard(const DatasetInfo& info) {
    std::vector<float> out(static_cast<size_t>(info.total_rows * info.d_model));
    for (const auto& s : info.shards) {
        ShardOracle r(info, RowRange{s.first_row, s.first_row + s.rows});
        EXPECT_EQ(r.read(out.data() + s.first_row * info.d_model, s.rows + 5), s.rows);
    }
    return out;
}

}  // namespace

// --- element conversion --------------------------------------------------------------------

TEST(Half, KnownBitPatterns) {
    EXPECT_EQ(math::float_to_fp16_bits(1.0f), 0x3c00);
    EXPECT_EQ(math::fp16_bits_to_float(0x3c00), 1.0f);
    EXPECT_EQ(math::float_to_fp16_bits(-2.0f), 0xc000);
    EXPECT_EQ(math::fp16_bits_to_float(0xc000), -2.0f);
    EXPECT_EQ(math::float_to_fp16_bits(65504.0f), 0x7bff);  // largest finite half
    EXPECT_EQ(math::fp16_bits_to_float(0x7bff), 65504.0f);
    EXPECT_EQ(math::float_to_fp16_bits(0.0f), 0x0000);
    EXPECT_EQ(math::float_to_fp16_bits(-0.0f), 0x8000);
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(math::fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(math::fp16_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
    EXPECT_EQ(math::fp16_bits_to_float(0x8001), -std::ldexp(1.0f, -24));
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(math::float_to_fp16_bits(inf), 0x7c00);
    EXPECT_EQ(math::float_to_fp16_bits(-inf), 0xfc00);
    EXPECT_EQ(math::fp16_bits_to_float(0x7c00), inf);
    EXPECT_EQ(math::fp16_bits_to_float(0xfc00), -inf);
    EXPECT_EQ(math::float_to_fp16_bits(1e6f), 0x7c00);  // overflow
    uint16_t n = math::float_to_fp16_bits(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(n & 0x7c00, 0x7c00);
    EXPECT_NE(n & 0x03ff, 0);
    EXPECT_NE(math::float_to_fp16_bits(f_of(0x7f800001u)) & 0x03ff, 0);  // payload only in low bits
    EXPECT_TRUE(std::isnan(math::fp16_bits_to_float(0x7e00)));
    EXPECT_TRUE(std::isnan(math::fp16_bits_to_float(0xfc01)));
}

TEST(Half, RoundsToNearestEven) {
    // 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd): goes down.
    EXPECT_EQ(math::float_to_fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
    // 1 + 3*2^-11 is halfway between 0x3c01 (odd) and 0x3c02 (even): goes up.
    EXPECT_EQ(math::float_to_fp16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
    // Just above the halfway point goes up.
    EXPECT_EQ(math::float_to_fp16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
    // 65520 is halfway between 65504 (odd mantissa) and 2^16 (overflow): rounds to inf.
    EXPECT_EQ(math::float_to_fp16_bits(65520.0f), 0x7c00);
    EXPECT_EQ(math::float_to_fp16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
    // Subnormal ties: 2^-25 -> 0 (even), 3*2^-25 -> 2*2^-24 (even), above 2^-25 -> 1.
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002);
    EXPECT_EQ(math::float_to_fp16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(1.0f, -30)), 0x0000);
    // Rounding up out of the subnormal range lands on the smallest normal.
    EXPECT_EQ(math::float_to_fp16_bits(std::ldexp(1023.75f, -24)), 0x0400);
}

TEST(Half, EveryFiniteHalfRoundTrips) {
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;  // nan
        ASSERT_EQ(math::float_to_fp16_bits(math::fp16_bits_to_float(static_cast<uint16_t>(h))), h)
            << std::hex << h;
    }
}

TEST(Half, MatchesDoubleRoundingReference) {
    // Independent reference: the nearest half by brute distance over all finite halves
    // near the value, ties to the even pattern. Checked on random floats in half's range.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
    std::uniform_int_distribution<int> e(-28, 15);
    for (int i = 0; i < 20000; ++i) {
        float f = i % 2 ? u(rng) : std::ldexp(u(rng) / 70000.0f, e(rng));
        uint16_t got = math::float_to_fp16_bits(f);
        float back = math::fp16_bits_to_float(got);
        if (std::isinf(back)) {
            EXPECT_GE(std::fabs(f), 65520.0f) << f;
            continue;
        }
        // No neighbour of `got` may be strictly closer, and on a tie `got` must be even.
        double err = std::fabs(double(back) - f);
        for (int dlt : {-1, 1}) {
            uint16_t nb = static_cast<uint16_t>(got + dlt);
            if ((got & 0x7fff) == 0 && dlt == -1) nb = static_cast<uint16_t>(got ^ 0x8000) + 1;
            float nf = math::fp16_bits_to_float(nb);
            if (std::isnan(nf) || std::isinf(nf)) continue;
            double nerr = std::fabs(double(nf) - f);
            ASSERT_LE(err, nerr) << f;
            if (err == nerr) {
                ASSERT_EQ(got & 1, 0) << f;
            }
        }
    }
}

TEST(Bf16, KnownBitPatternsAndRounding) {
    EXPECT_EQ(math::float_to_bf16_bits(1.0f), 0x3f80);
    EXPECT_EQ(math::bf16_bits_to_float(0x3f80), 1.0f);
    EXPECT_EQ(math::float_to_bf16_bits(-2.0f), 0xc000);
    EXPECT_EQ(math::bf16_bits_to_float(0xc000), -2.0f);
    EXPECT_EQ(math::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie -> even (down)
    EXPECT_EQ(math::float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)),
              0x3f82);  // tie -> even (up)
    EXPECT_EQ(math::float_to_bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
    EXPECT_EQ(math::float_to_bf16_bits(f_of(0x00010000u)), 0x0001);  // smallest bf16 subnormal
    EXPECT_EQ(math::bf16_bits_to_float(0x0001), f_of(0x00010000u));
    EXPECT_EQ(math::float_to_bf16_bits(f_of(0x00008000u)), 0x0000);  // subnormal tie -> even zero
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(math::float_to_bf16_bits(inf), 0x7f80);
    EXPECT_EQ(math::float_to_bf16_bits(-inf), 0xff80);
    EXPECT_EQ(math::float_to_bf16_bits(std::numeric_limits<float>::max()),
              0x7f80);  // rounds to inf
    EXPECT_TRUE(std::isnan(math::bf16_bits_to_float(
        math::float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_TRUE(std::isnan(
        math::bf16_bits_to_float(math::float_to_bf16_bits(f_of(0x7f800001u)))));  // low payload
    for (uint32_t b = 0; b < 0x10000u; ++b) {
        if ((b & 0x7f80u) == 0x7f80u && (b & 0x7fu)) continue;  // nan
        ASSERT_EQ(math::float_to_bf16_bits(math::bf16_bits_to_float(static_cast<uint16_t>(b))), b)
            << std::hex << b;
    }
}

// --- round trips ----------------------------------------------------------------------------

TEST(Shards, RoundTripAllDtypesAndLayouts) {
    TempDir tmp;
    // Reference: the f32 contiguous version of the same seed, read one shard per request.
    synth_write(small_opts(tmp / "ref", DType::f32, false));
    DatasetInfo ref_info = dataset_open(tmp / "ref");
    std::vector<float> ref = read_per_shard(ref_info);
    ASSERT_EQ(ref_info.total_rows, 1001);
    ASSERT_EQ(ref_info.d_model, 24);

    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
        for (bool chunked : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (chunked ? " chunked" : " contiguous"));
            std::string dir = tmp / (std::string(dtype_name(t)) + (chunked ? "_c" : "_n"));
            synth_write(small_opts(dir, t, chunked));
            DatasetInfo info = dataset_open(dir);
            EXPECT_EQ(info.dtype, t);
            EXPECT_EQ(info.model, "synthetic");
            EXPECT_EQ(info.hook, "synthetic");
            ASSERT_EQ(info.shards.size(), 3u);
            EXPECT_EQ(info.shards[1].first_row, 334);
            EXPECT_EQ(info.shards[2].first_row, 668);
            std::vector<float> got = read_all_odd(info);
            ASSERT_EQ(got.size(), ref.size());
            size_t bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                float want = t == DType::f32 ? ref[i]
                             : t == DType::f16
                                 ? math::fp16_bits_to_float(math::float_to_fp16_bits(ref[i]))
                                 : math::bf16_bits_to_float(math::float_to_bf16_bits(ref[i]));
                if (std::memcmp(&want, &got[i], 4) != 0 && ++bad < 5)
                    ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << want;
            }
            EXPECT_EQ(bad, 0u);
        }
    }
    // The data is not trivially constant (a broken generator could pass the comparisons).
    float lo = ref[0], hi = ref[0];
    for (float v : ref) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_GT(hi - lo, 0.5f);
}

TEST(Shards, RankRangesAndSeek) {
    TempDir tmp;
    synth_write(small_opts(tmp.path.string(), DType::f16, true));
    DatasetInfo info = dataset_open(tmp.path.string());
    std::vector<float> all = read_per_shard(info);
    const int64_t d = info.d_model;
    // Three ranks' ranges (crossing shard boundaries) concatenate to the whole.
    for (int world : {2, 3, 7}) {
        std::vector<float> cat;
        for (int r = 0; r < world; ++r) {
            RowRange rr = partition_rows(info.total_rows, r, world);
            ShardOracle rd(info, rr);
            std::vector<float> buf(static_cast<size_t>(rr.size() * d));
            int64_t at = 0;
            while (int64_t n = rd.read(buf.data() + at * d, 45)) at += n;
            ASSERT_EQ(at, rr.size());
            cat.insert(cat.end(), buf.begin(), buf.end());
        }
        EXPECT_EQ(cat, all) << "world " << world;
    }
    // Seek across a boundary, backwards, and to the end.
    ShardOracle rd(info, RowRange{100, 900});
    std::vector<float> buf(static_cast<size_t>(10 * d));
    rd.seek(330);
    ASSERT_EQ(rd.read(buf.data(), 10), 10);  // rows 330..339 span shards 0 and 1
    EXPECT_EQ(rd.position(), 340);
    EXPECT_TRUE(std::equal(buf.begin(), buf.end(), all.begin() + 330 * d));
    rd.seek(100);
    ASSERT_EQ(rd.read(buf.data(), 3), 3);
    EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + 3 * d, all.begin() + 100 * d));
    rd.seek(895);
    EXPECT_EQ(rd.read(buf.data(), 10), 5);  // clipped to the range end
    EXPECT_EQ(rd.read(buf.data(), 10), 0);
    EXPECT_THROW(rd.seek(99), Error);
    EXPECT_THROW(rd.seek(901), Error);
    EXPECT_THROW(ShardOracle(info, RowRange{0, info.total_rows + 1}), Error);
}

// read_rows (the held-out rows' path: raw_shards and its conversion) against the oracle, on
// every dtype and layout, over ranges that start, end and cross shard boundaries.
TEST(Shards, ReadRowsMatchesTheOracle) {
    TempDir tmp;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
        for (bool chunked : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (chunked ? " chunked" : " contiguous"));
            const std::string dir = tmp / (std::string(dtype_name(t)) + (chunked ? "_c" : "_n"));
            synth_write(small_opts(dir, t, chunked));
            const DatasetInfo info = dataset_open(dir);
            for (RowRange rr : {RowRange{0, info.total_rows}, RowRange{330, 340},
                                RowRange{334, 668}, RowRange{1000, 1001}, RowRange{5, 5}}) {
                const std::vector<float> got = read_rows(info, rr);
                const std::vector<float> want = saetrain::testing::oracle_rows(info, rr);
                ASSERT_EQ(got.size(), want.size());
                EXPECT_TRUE(got.empty() ||
                            std::memcmp(got.data(), want.data(), got.size() * 4) == 0)
                    << "rows [" << rr.begin << ", " << rr.end << ")";
            }
            const std::string msg = error_of([&] { read_rows(info, RowRange{0, 1002}); });
            EXPECT_NE(msg.find("outside the dataset's 1001 rows"), std::string::npos) << msg;
        }
    }
}

TEST(Shards, ListingGlobAndSingleFile) {
    TempDir tmp;
    synth_write(small_opts(tmp.path.string(), DType::f32, false));
    DatasetInfo dir = dataset_open(tmp.path.string());
    ASSERT_EQ(dir.shards.size(), 3u);  // ground_truth.h5 is not a shard
    for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(fs::path(dir.shards[i].path).filename(),
                  "shard_0000" + std::to_string(i) + ".h5");
    DatasetInfo g = dataset_open(tmp / "shard_0000[12].h5");
    ASSERT_EQ(g.shards.size(), 2u);
    EXPECT_EQ(g.total_rows, 334 + 333);
    EXPECT_EQ(g.shards[1].first_row, 334);
    DatasetInfo one = dataset_open(tmp / "shard_00002.h5");
    EXPECT_EQ(one.total_rows, 333);
    // Reading a glob's rows gives those shards' rows, renumbered from 0.
    std::vector<float> all = read_per_shard(dir), sub = read_per_shard(g);
    EXPECT_TRUE(std::equal(sub.begin(), sub.end(), all.begin() + 334 * 24));
}

// --- validation errors ----------------------------------------------------------------------

// Rank 0 validates a dataset and broadcasts it packed; the other ranks read from the unpacked
// description exactly what they would from their own dataset_open.
TEST(Shards, PackedDescriptionRoundTrips) {
    TempDir tmp;
    synth_write(small_opts(tmp.path.string(), DType::f16, true));
    const DatasetInfo info = dataset_open(tmp.path.string());
    const std::string bytes = dataset_info_pack(info);
    const DatasetInfo back = dataset_info_unpack(bytes);
    EXPECT_EQ(back.source, info.source);
    EXPECT_EQ(back.dataset, info.dataset);
    EXPECT_EQ(back.model, info.model);
    EXPECT_EQ(back.hook, info.hook);
    EXPECT_EQ(back.d_model, info.d_model);
    EXPECT_EQ(back.total_rows, info.total_rows);
    EXPECT_EQ(back.dtype, info.dtype);
    ASSERT_EQ(back.shards.size(), info.shards.size());
    for (size_t i = 0; i < info.shards.size(); ++i) {
        EXPECT_EQ(back.shards[i].path, info.shards[i].path);
        EXPECT_EQ(back.shards[i].rows, info.shards[i].rows);
        EXPECT_EQ(back.shards[i].first_row, info.shards[i].first_row);
    }
    EXPECT_EQ(read_all_odd(back), read_all_odd(info));
    // Damaged bytes are an error, never a wrong description.
    EXPECT_NE(
        error_of([&] { dataset_info_unpack(bytes.substr(0, bytes.size() - 3)); }).find("truncated"),
        std::string::npos);
    EXPECT_NE(error_of([&] { dataset_info_unpack(bytes + "x"); }).find("trailing"),
              std::string::npos);
    EXPECT_NE(error_of([&] { dataset_info_unpack("not a description at all"); }).find("packed"),
              std::string::npos);
}

TEST(ShardsValidation, MismatchedDModelNamesTheShard) {
    TempDir tmp;
    SynthOptions a = small_opts(tmp / "a", DType::f32, false);
    synth_write(a);
    SynthOptions b = a;
    b.out_dir = tmp / "b";
    b.d_model = 16;
    synth_write(b);
    fs::copy_file(tmp / "b/shard_00000.h5", tmp / "a/shard_00003.h5");
    std::string msg = error_of([&] { dataset_open(tmp / "a"); });
    EXPECT_NE(msg.find("shard_00003.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("d_model 16 differs from 24"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shard_00000.h5"), std::string::npos) << msg;
}

TEST(ShardsValidation, MismatchedDtypeNamesTheShard) {
    TempDir tmp;
    synth_write(small_opts(tmp / "a", DType::f32, false));
    synth_write(small_opts(tmp / "b", DType::f16, false));
    fs::copy_file(tmp / "b/shard_00001.h5", tmp / "a/shard_00001x.h5");
    std::string msg = error_of([&] { dataset_open(tmp / "a"); });
    EXPECT_NE(msg.find("shard_00001x.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float16"), std::string::npos) << msg;
}

TEST(ShardsValidation, EmptyDirectoryAndNoMatch) {
    TempDir tmp;
    fs::create_directories(tmp / "empty");
    std::string msg = error_of([&] { dataset_open(tmp / "empty"); });
    EXPECT_NE(msg.find(tmp / "empty"), std::string::npos) << msg;
    msg = error_of([&] { dataset_open(tmp / "nothing_*.h5"); });
    EXPECT_NE(msg.find("nothing_*.h5"), std::string::npos) << msg;
    msg = error_of([&] { dataset_open(tmp / "missing_dir"); });
    EXPECT_NE(msg.find("missing_dir"), std::string::npos) << msg;
}

TEST(ShardsValidation, MissingDatasetNamesTheShard) {
    TempDir tmp;
    synth_write(small_opts(tmp.path.string(), DType::f32, false));
    std::string msg = error_of([&] { dataset_open(tmp.path.string(), "resid"); });
    EXPECT_NE(msg.find("shard_00000.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'resid'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;  // lists what is there
    // A non-shard .h5 (no `activations`) among the shards is named too.
    fs::copy_file(tmp / "ground_truth.h5", tmp / "shard_00001b.h5");
    msg = error_of([&] { dataset_open(tmp.path.string()); });
    EXPECT_NE(msg.find("shard_00001b.h5"), std::string::npos) << msg;
}

TEST(ShardsValidation, TruncatedShardNamesTheShard) {
    TempDir tmp;
    synth_write(small_opts(tmp / "d", DType::f32, false));
    fs::path victim = tmp / "d/shard_00001.h5";
    fs::resize_file(victim, fs::file_size(victim) / 2);
    std::string msg = error_of([&] { dataset_open(tmp / "d"); });
    EXPECT_NE(msg.find("shard_00001.h5"), std::string::npos) << msg;
    // Not HDF5 at all.
    { std::ofstream(tmp / "d/shard_00002.h5", std::ios::trunc) << "not hdf5\n"; }
    fs::remove(victim);
    msg = error_of([&] { dataset_open(tmp / "d"); });
    EXPECT_NE(msg.find("shard_00002.h5"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

// --- h5py fixtures --------------------------------------------------------------------------

TEST(H5pyFixtures, PlainCreateDatasetReads) {
    DatasetInfo info = dataset_open(SAETRAIN_TEST_DATA "/h5py_plain.h5");
    EXPECT_EQ(info.dtype, DType::f32);
    EXPECT_EQ(info.total_rows, 37);
    EXPECT_EQ(info.d_model, 16);
    EXPECT_EQ(info.model, "");
    EXPECT_EQ(info.hook, "");
    std::vector<float> v = read_all_odd(info);
    for (int i = 0; i < 37; ++i)
        for (int j = 0; j < 16; ++j)
            ASSERT_EQ(v[i * 16 + j], static_cast<float>(i * 0.5 - j)) << i << "," << j;
}

TEST(H5pyFixtures, Float16ChunkedWithStringAttributes) {
    DatasetInfo info = dataset_open(SAETRAIN_TEST_DATA "/h5py_f16_chunked.h5");
    EXPECT_EQ(info.dtype, DType::f16);
    EXPECT_EQ(info.total_rows, 37);
    EXPECT_EQ(info.d_model, 16);
    EXPECT_EQ(info.model, "gpt2-small");               // file attribute, h5py vlen string
    EXPECT_EQ(info.hook, "blocks.6.hook_resid_post");  // dataset attribute
    std::vector<float> v = read_all_odd(info);
    for (int i = 0; i < 37; ++i)
        for (int j = 0; j < 16; ++j)
            ASSERT_EQ(v[i * 16 + j], static_cast<float>(i * 0.5 - j)) << i << "," << j;
}
