// sae_math.h on the host: the per-element functions the CUDA kernels share with the CPU backend
// (16-bit widening and rounding, the order keys of the GPU top-k), the exact top-k from bf16
// keys (topk16.h), and the SAE's random start (random_unit_rows). No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "saetrain/sae_math.h"
#include "saetrain/topk16.h"
#include "saetrain/trainer.h"
#include "test_util.h"

using namespace saetrain;

namespace {

using saetrain::testing::randn;

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

}  // namespace

TEST(SaeMath, Fp16WideningIsExact) {
    EXPECT_EQ(math::fp16_bits_to_float(0x3c00), 1.0f);
    EXPECT_EQ(math::fp16_bits_to_float(0xc000), -2.0f);
    EXPECT_EQ(math::fp16_bits_to_float(0x7bff), 65504.0f);
    EXPECT_EQ(math::fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    EXPECT_EQ(math::fp16_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));
    EXPECT_TRUE(std::signbit(math::fp16_bits_to_float(0x8000)));
    EXPECT_TRUE(std::isinf(math::fp16_bits_to_float(0x7c00)));
    EXPECT_TRUE(std::isnan(math::fp16_bits_to_float(0x7e00)));
    EXPECT_EQ(math::bf16_bits_to_float(0x3f80), 1.0f);
}

TEST(SaeMath, OrderKeyPreservesFloatOrderAndRoundTrips) {
    auto v = randn(2000, 7, 10.0f);
    v.insert(v.end(), {0.0f, -0.0f, 1e-40f, -1e-40f, INFINITY, -INFINITY, 3.0f, 3.0f});
    for (size_t i = 0; i < v.size(); ++i) {
        const float back = math::float_from_order_key(math::float_order_key(v[i]));
        EXPECT_EQ(back, v[i]);
        for (size_t j = i; j < std::min(v.size(), i + 40); ++j) {
            const uint32_t a = math::float_order_key(v[i]), b = math::float_order_key(v[j]);
            EXPECT_EQ(v[i] < v[j], a < b) << v[i] << " " << v[j];
            EXPECT_EQ(v[i] == v[j], a == b) << v[i] << " " << v[j];  // -0 ties +0
        }
    }
}

TEST(SaeMath, Bf16RoundingIsNearestEven) {
    // Exactly representable values round-trip.
    for (float x : {1.0f, -2.0f, 0.0f, 0.5f, 3.0f, 65536.0f, -0.0f})
        EXPECT_EQ(math::bf16_bits_to_float(math::float_to_bf16_bits(x)), x) << x;
    EXPECT_TRUE(std::signbit(math::bf16_bits_to_float(math::float_to_bf16_bits(-0.0f))));
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
    EXPECT_EQ(math::float_to_bf16_bits(from_bits(0x3f808000u)), 0x3f80);
    // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
    EXPECT_EQ(math::float_to_bf16_bits(from_bits(0x3f818000u)), 0x3f82);
    // Just above / below a halfway point.
    EXPECT_EQ(math::float_to_bf16_bits(from_bits(0x3f808001u)), 0x3f81);
    EXPECT_EQ(math::float_to_bf16_bits(from_bits(0x3f807fffu)), 0x3f80);
    // Past the largest bf16 (0x7f7f) the value rounds to infinity; NaN stays NaN.
    EXPECT_EQ(math::float_to_bf16_bits(from_bits(0x7f7fffffu)), 0x7f80);
    EXPECT_EQ(math::float_to_bf16_bits(INFINITY), 0x7f80);
    EXPECT_TRUE(std::isnan(math::bf16_bits_to_float(math::float_to_bf16_bits(NAN))));
    EXPECT_TRUE(
        std::isnan(math::bf16_bits_to_float(math::float_to_bf16_bits(from_bits(0x7f800001u)))));
    // Against the definition on random values: the nearest of the two bf16 neighbours.
    for (float x : randn(20000, 3, 100.0f)) {
        const float r = math::bf16_bits_to_float(math::float_to_bf16_bits(x));
        uint32_t u;
        std::memcpy(&u, &x, sizeof(u));
        const float lo = from_bits(u & 0xffff0000u), hi = from_bits((u & 0xffff0000u) + 0x10000u);
        const float dlo = std::abs(x - lo), dhi = std::abs(hi - x);
        EXPECT_EQ(r, dlo < dhi ? lo : dhi < dlo ? hi : ((u >> 16) & 1u ? hi : lo)) << x;
    }
}

// The random start: each row a unit vector from its own stream, so the thread count and the
// latent shard change no value; the components are Gaussian (a uniform or repeated draw fails).
TEST(RandomUnitRows, SameRowsForAnyThreadsOrShard) {
    const int64_t n = 96, d = 768;
    std::vector<float> one(n * d), two(n * d), part(20 * d), other(n * d);
    random_unit_rows(7, 0, n, d, one.data(), 1);
    random_unit_rows(7, 0, n, d, two.data(), 2);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
    random_unit_rows(7, 40, 20, d, part.data(), 2);  // a latent shard's rows 40..59
    EXPECT_EQ(std::memcmp(part.data(), one.data() + 40 * d, part.size() * sizeof(float)), 0);
    random_unit_rows(8, 0, n, d, other.data(), 2);
    EXPECT_NE(one[0], other[0]);
    EXPECT_NE(one[d], other[d]);
}

TEST(RandomUnitRows, UnitRowsOfIndependentGaussians) {
    const int64_t n = 128, d = 768;
    std::vector<float> w(n * d);
    random_unit_rows(1234, 0, n, d, w.data());
    double sum = 0, fourth = 0, tail = 0;
    for (int64_t r = 0; r < n; ++r) {
        double norm = 0;
        for (int64_t c = 0; c < d; ++c) {
            const double z = w[r * d + c] * std::sqrt(double(d));  // ~ N(0, 1)
            norm += double(w[r * d + c]) * w[r * d + c];
            sum += z, fourth += z * z * z * z, tail += std::abs(z) > 2.0;
        }
        EXPECT_NEAR(norm, 1.0, 1e-5) << "row " << r;
    }
    const double count = double(n * d);
    EXPECT_NEAR(sum / count, 0.0, 0.02);
    EXPECT_NEAR(fourth / count, 3.0, 0.15);    // a Gaussian's kurtosis (uniform: 1.8)
    EXPECT_NEAR(tail / count, 0.0455, 0.006);  // P(|z| > 2)
    // Unrelated rows: their dot products ~ N(0, 1/d), sd 0.036.
    double worst = 0;
    for (int64_t a = 0; a < n; ++a)
        for (int64_t b = a + 1; b < n; ++b) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += double(w[a * d + c]) * w[b * d + c];
            worst = std::max(worst, std::abs(dot));
        }
    EXPECT_LT(worst, 0.25);
}

// topk16.h: the bounds of every bf16 key are the floats that round to it, and no others.
TEST(Topk16, RoundingBoundsAreExactForEveryKey) {
    auto same_value = [](float x, uint16_t b) {
        const float r = math::bf16_bits_to_float(math::float_to_bf16_bits(x));
        return r == math::bf16_bits_to_float(b);
    };
    for (uint32_t b = 0; b <= 0xffffu; ++b) {
        const uint16_t key = static_cast<uint16_t>(b);
        if (std::isnan(math::bf16_bits_to_float(key))) continue;
        float lo, hi;
        math::bf16_rounding_bounds(key, lo, hi);
        ASSERT_LE(lo, hi) << std::hex << b;
        ASSERT_TRUE(same_value(lo, key) && same_value(hi, key)) << std::hex << b;
        // Just outside: another key (or past FLT_MAX, which rounds to an infinity of its own).
        const float below = std::nextafter(lo, -INFINITY), above = std::nextafter(hi, INFINITY);
        if (std::isfinite(below)) {
            ASSERT_FALSE(same_value(below, key)) << std::hex << b;
        }
        if (std::isfinite(above)) {
            ASSERT_FALSE(same_value(above, key)) << std::hex << b;
        }
        // Inside: the key's own value and the floats between it and the bounds.
        const float mid = math::bf16_bits_to_float(key);
        if (std::isfinite(mid)) {
            ASSERT_TRUE(lo <= mid && mid <= hi) << std::hex << b;
        }
    }
}

namespace {

// The exact top k of v: largest first, ties to the lower index.
std::vector<int> exact_topk(const std::vector<float>& v, int k) {
    std::vector<int> idx(v.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    idx.resize(static_cast<size_t>(k));
    return idx;
}

std::vector<uint16_t> bf16_keys(const std::vector<float>& v) {
    std::vector<uint16_t> keys(v.size());
    for (size_t i = 0; i < v.size(); ++i) keys[i] = math::float_to_bf16_bits(v[i]);
    return keys;
}

}  // namespace

// Rows crowded around few bf16 values, so that the 16-bit keys tie across the k-th place: the
// refined selection equals the float top k in every row, where the 16-bit selection alone
// (first k by key, ties to the lower index) does not.
TEST(Topk16, RefiningTheKeysTiesGivesTheExactTopK) {
    std::mt19937 rng(11);
    const int n = 2048, k = 32;
    int keys_alone_wrong = 0;
    int64_t candidates = 0;
    for (int row = 0; row < 200; ++row) {
        std::vector<float> v(n);
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::uniform_int_distribution<int> level(0, 3);
        std::uniform_real_distribution<float> jitter(-0.004f, 0.004f);
        for (int i = 0; i < n; ++i) {
            // Most of the row is Gaussian; a quarter sits on four levels near the top (bf16's
            // step at 2.5 is 2^-6, so each level's values share one or two keys).
            v[i] =
                (i % 4 == 0) ? 2.5f + 0.02f * static_cast<float>(level(rng)) + jitter(rng) : g(rng);
        }
        if (row % 50 == 0) v[7] = v[9] = v[11];  // exact float ties: the lower index wins
        const std::vector<uint16_t> keys = bf16_keys(v);
        std::vector<int> ids(k);
        std::vector<float> vals(k);
        const int c = math::topk_from_bf16_keys(
            keys.data(), n, k, 0.0f, [&](int i) { return v[i]; }, ids.data(), vals.data());
        ASSERT_GE(c, k);
        ASSERT_LE(c, n);
        candidates += c;
        const std::vector<int> want = exact_topk(v, k);
        ASSERT_EQ(ids, want) << "row " << row;
        for (int j = 0; j < k; ++j) ASSERT_EQ(vals[j], v[want[j]]);
        std::vector<float> key_values(n);
        for (int i = 0; i < n; ++i) key_values[i] = math::bf16_bits_to_float(keys[i]);
        keys_alone_wrong += exact_topk(key_values, k) != want;
    }
    EXPECT_GT(keys_alone_wrong, 100) << "the rows do not tie across the k-th key";
    EXPECT_LT(candidates, 200 * n / 4) << "the ties should hold a fraction of the row";
}

// Refined values recomputed within err of those the keys were rounded from: with err the
// selection equals the float top k of the refined values; told err = 0 it misses one planted
// case, a value just below a key boundary that its recomputation lifts above the k-th.
TEST(Topk16, AnErrorBoundKeepsTheCandidatesARecomputationCanLift) {
    std::mt19937 rng(5);
    const int n = 1024, k = 16;
    const float err = 1e-3f;
    std::uniform_real_distribution<float> delta(-err, err);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int row = 0; row < 200; ++row) {
        std::vector<float> v(n), refined(n);
        for (int i = 0; i < n; ++i) v[i] = g(rng);
        for (int i = 0; i < n; ++i) refined[i] = v[i] + delta(rng);
        const std::vector<uint16_t> keys = bf16_keys(v);
        std::vector<int> ids(k);
        std::vector<float> vals(k);
        math::topk_from_bf16_keys(
            keys.data(), n, k, err, [&](int i) { return refined[i]; }, ids.data(), vals.data());
        ASSERT_EQ(ids, exact_topk(refined, k)) << "row " << row;
    }
    // The planted row: k values on the key 2.0 (just above its lower bound), one value just
    // below that bound (key 2.0 - 2^-7) whose recomputation is err higher than the others'.
    std::vector<float> v(n, -1.0f);
    float lo, hi;
    math::bf16_rounding_bounds(math::float_to_bf16_bits(2.0f), lo, hi);
    for (int i = 0; i < k; ++i) v[i] = lo;
    v[k] = std::nextafter(lo, 0.0f);
    ASSERT_LT(math::float_to_bf16_bits(v[k]), math::float_to_bf16_bits(v[0]));
    std::vector<float> refined = v;
    for (int i = 0; i < k; ++i) refined[i] = v[i] - 0.5f * err;
    refined[k] = v[k] + 0.5f * err;
    const std::vector<uint16_t> keys = bf16_keys(v);
    std::vector<int> ids(k);
    std::vector<float> vals(k);
    auto with = [&](float e) {
        math::topk_from_bf16_keys(
            keys.data(), n, k, e, [&](int i) { return refined[i]; }, ids.data(), vals.data());
        return ids;
    };
    const std::vector<int> want = exact_topk(refined, k);
    ASSERT_EQ(want[0], k);
    EXPECT_EQ(with(err), want);
    EXPECT_NE(with(0.0f), want);
}
