// test_dtype — element types (dtype.h): the host widening against sae_math.h's reference for
// every 16-bit value, and the non-finite check on stored bits (the same decision as on the
// widened floats, the right row found).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "saetrain/dtype.h"
#include "saetrain/sae_math.h"
#include "test_util.h"

using namespace saetrain;

namespace {

// Every 16-bit word once.
std::vector<uint16_t> all_words() {
    std::vector<uint16_t> w(65536);
    for (uint32_t k = 0; k < 65536; ++k) w[k] = static_cast<uint16_t>(k);
    return w;
}

float reference(DType t, uint16_t w) {
    return t == DType::bf16 ? math::bf16_bits_to_float(w) : math::fp16_bits_to_float(w);
}

// x rounded to a 16-bit type's words (the values then widen back exactly).
std::vector<uint16_t> narrow(DType t, const std::vector<float>& x) {
    std::vector<uint16_t> w(x.size());
    for (size_t i = 0; i < x.size(); ++i)
        w[i] = t == DType::bf16 ? math::float_to_bf16_bits(x[i]) : math::float_to_fp16_bits(x[i]);
    return w;
}

}  // namespace

// --- widening ------------------------------------------------------------------------------

TEST(DType, NamesSizesAndParse) {
    EXPECT_EQ(dtype_size(DType::f32), 4);
    EXPECT_EQ(dtype_size(DType::f16), 2);
    EXPECT_EQ(dtype_size(DType::bf16), 2);
    for (DType t : {DType::f32, DType::f16, DType::bf16}) EXPECT_EQ(dtype_parse(dtype_name(t)), t);
    EXPECT_NE(saetrain::testing::error_of([] { dtype_parse("f8"); }).find("f8"), std::string::npos);
}

TEST(DType, HostWideningMatchesTheReferenceForEveryValue) {
    const std::vector<uint16_t> all = all_words();
    for (DType t : {DType::f16, DType::bf16}) {
        std::vector<float> got(65536);
        widen_to_f32(t, all.data(), got.data(), 65536);
        for (uint32_t k = 0; k < 65536; ++k) {
            const float want = reference(t, static_cast<uint16_t>(k));
            // Bit-identical, except that a signalling NaN may come out quiet (the F16C
            // instruction sets the quiet bit); a NaN stays a NaN with the same sign.
            if (std::isnan(want)) {
                ASSERT_TRUE(std::isnan(got[k]) && std::signbit(got[k]) == std::signbit(want))
                    << dtype_name(t) << " 0x" << std::hex << k;
            } else {
                ASSERT_EQ(std::memcmp(&got[k], &want, 4), 0)
                    << dtype_name(t) << " 0x" << std::hex << k;
            }
        }
    }
    // float32 is a copy.
    const std::vector<float> x = saetrain::testing::randn(1001, 3);
    std::vector<float> y(x.size());
    widen_to_f32(DType::f32, x.data(), y.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
}

// --- the non-finite check ------------------------------------------------------------------

// On 16-bit words, one value per row: the row is flagged exactly when its widened float is
// NaN or Inf, for every word.
TEST(DType, NonFiniteCheckOnStoredBitsDecidesAsTheWidenedFloats) {
    const std::vector<uint16_t> all = all_words();
    for (DType t : {DType::f16, DType::bf16}) {
        int64_t bad = 0;
        for (uint32_t k = 0; k < 65536; ++k) {
            const bool finite = std::isfinite(reference(t, static_cast<uint16_t>(k)));
            bad += finite ? 0 : 1;
            ASSERT_EQ(first_nonfinite_row(t, &all[k], 1, 1), finite ? -1 : 0)
                << dtype_name(t) << " 0x" << std::hex << k;
        }
        // f16: exponent 0x1f with any mantissa, both signs: 2 x 1024; bf16: 0xff: 2 x 128.
        EXPECT_EQ(bad, t == DType::f16 ? 2048 : 256);
    }
}

// A NaN or an Inf planted in row r of a batch of finite rows is found at row r, whatever the
// type, the column, the thread count or the size (past 2^18 values the check runs on threads).
TEST(DType, NonFiniteCheckFindsTheFirstBadRow) {
    const float kNan = std::numeric_limits<float>::quiet_NaN();
    const float kInf = std::numeric_limits<float>::infinity();
    for (int64_t rows : {int64_t{7}, int64_t{5000}}) {
        const int64_t d = 96;
        const std::vector<float> x = saetrain::testing::randn(rows * d, 11);
        for (DType t : {DType::f32, DType::f16, DType::bf16}) {
            for (float v : {kNan, kInf, -kInf}) {
                for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
                    for (int threads : {1, 4}) {
                        SCOPED_TRACE(::testing::Message()
                                     << dtype_name(t) << " rows " << rows << " value " << v
                                     << " row " << r << " threads " << threads);
                        std::vector<float> y = x;
                        y[static_cast<size_t>(r * d + (r * 7) % d)] = v;
                        if (r + 1 < rows) y[static_cast<size_t>((rows - 1) * d + 3)] = kNan;
                        if (t == DType::f32) {
                            EXPECT_EQ(first_nonfinite_row(t, x.data(), rows, d, threads), -1);
                            EXPECT_EQ(first_nonfinite_row(t, y.data(), rows, d, threads), r);
                        } else {
                            const auto wx = narrow(t, x), wy = narrow(t, y);
                            EXPECT_EQ(first_nonfinite_row(t, wx.data(), rows, d, threads), -1);
                            EXPECT_EQ(first_nonfinite_row(t, wy.data(), rows, d, threads), r);
                        }
                    }
                }
            }
        }
    }
    EXPECT_EQ(first_nonfinite_row(DType::bf16, nullptr, 0, 16), -1);  // an empty batch
}
