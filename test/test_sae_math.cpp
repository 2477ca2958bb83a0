// sae_math.h on the host: the per-element functions the CUDA kernels share with the CPU backend
// (16-bit widening and rounding, the order keys of the GPU top-k), and the SAE's random start
// (random_unit_rows). No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "saetrain/sae_math.h"
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
