// test_dtype — element types (dtype.h): the host widening against sae_math.h's reference for
// every 16-bit value, the non-finite check on stored bits (the same decision as on the widened
// floats, the right row found), and the training loop on 16-bit batches: a NaN/Inf batch
// skipped or stopped at the right row, and training bit-identical to float32 batches of the
// same values. The GPU's widening is test_backend_parity's (UploadRowsWidensExactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/batch_source.h"
#include "saetrain/comm.h"
#include "saetrain/dtype.h"
#include "saetrain/sae_math.h"
#include "saetrain/train_loop.h"
#include "saetrain/trainer.h"
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

std::vector<float> widen(DType t, const std::vector<uint16_t>& w) {
    std::vector<float> x(w.size());
    for (size_t i = 0; i < w.size(); ++i) x[i] = reference(t, w[i]);
    return x;
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

// --- the loop on 16-bit batches ------------------------------------------------------------

namespace {

SaeConfig small_topk() {
    SaeConfig cfg;
    cfg.arch = "topk";
    cfg.expansion = 2;
    cfg.k = 4;
    cfg.lr = 3e-3;
    return cfg;
}

// Trains a TopK SAE with the loop on `source` in batches of `batch`; the result and params.
LoopResult train_on(BatchSource& source, int64_t batch, const SaeConfig& cfg,
                    std::vector<float>* params, bool stop_on_nonfinite = false) {
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, source.row_width(), total_steps_for(source.total_rows(), batch), 0, *be,
                  *self);
    LoopOptions opt;
    opt.batch_size = batch;
    opt.log_every = 4;
    opt.stop_on_nonfinite = stop_on_nonfinite;
    const LoopResult res = train_loop(tr, source, opt);
    if (params) *params = tr.params_host();
    return res;
}

}  // namespace

// A NaN or Inf in bf16 and in f16 rows: the loop skips exactly the batch that holds it (the
// rows before and after are trained), or stops naming the row within that batch.
TEST(DType, LoopSkipsOrStopsAtTheSixteenBitBatchWithTheBadRow) {
    const int64_t d = 16, rows = 1000, batch = 100;
    const std::vector<float> x = saetrain::testing::randn(rows * d, 5);
    for (DType t : {DType::f16, DType::bf16}) {
        for (float v :
             {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << " value " << v);
            std::vector<float> y = x;
            const int64_t bad_row = 437;  // batch 4, its row 37
            y[static_cast<size_t>(bad_row * d + 5)] = v;
            MemoryBatchSource skip(narrow(t, y), t, d);
            const LoopResult res = train_on(skip, batch, small_topk(), nullptr);
            EXPECT_EQ(res.nonfinite_batches, 1);
            EXPECT_EQ(res.tokens, rows - batch);
            MemoryBatchSource stop(narrow(t, y), t, d);
            const std::string msg = saetrain::testing::error_of(
                [&] { train_on(stop, batch, small_topk(), nullptr, true); });
            EXPECT_NE(msg.find("iteration 4 holds NaN or Inf values, first in its row 37 of 100"),
                      std::string::npos)
                << msg;
        }
    }
}

// 16-bit batches (widened on upload) train the SAE bit for bit as float32 batches of the
// widened values, with the options that read the batch on the host (data.normalize, b_dec
// from the geometric median, a fitted encoder scale) and in chunks (train.accum_steps);
// held-out evaluation and reconstruction too.
TEST(DType, SixteenBitBatchesTrainBitwiseAsTheirWidenedFloats) {
    const int64_t d = 16, rows = 1200, batch = 120;
    const std::vector<float> x = saetrain::testing::randn(rows * d, 9);
    SaeConfig cfg = small_topk();
    cfg.normalize = "expected_average_only_in";
    cfg.b_dec_init = "geometric_median";
    cfg.encoder_init = "fitted";
    for (int64_t accum : {int64_t{1}, int64_t{3}}) {
        cfg.accum_steps = accum;
        for (DType t : {DType::f16, DType::bf16}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << " accum_steps " << accum);
            const std::vector<uint16_t> w = narrow(t, x);
            const std::vector<float> wide = widen(t, w);
            MemoryBatchSource s16(w, t, d, 2), s32(wide, d, 2);
            EXPECT_EQ(s16.dtype(), t);
            std::vector<float> p16, p32;
            const LoopResult a = train_on(s16, batch, cfg, &p16);
            const LoopResult b = train_on(s32, batch, cfg, &p32);
            ASSERT_EQ(p16.size(), p32.size());
            EXPECT_EQ(std::memcmp(p16.data(), p32.data(), p16.size() * 4), 0);
            EXPECT_EQ(a.last.loss, b.last.loss);
            EXPECT_EQ(a.tokens, 2 * rows);

            // evaluate and reconstruct on a trained SAE: the same from 16-bit rows.
            auto be = make_cpu_backend(1);
            auto self = make_self_comm();
            SaeTrainer tr(cfg, d, 10, 0, *be, *self);
            tr.init(BatchView{w.data(), t}, rows);
            for (int64_t s = 0; s < 3; ++s) tr.step(BatchView{w.data(), t}, batch);
            const EvalResult e16 = tr.evaluate(BatchView{w.data(), t}, rows, 256);
            const EvalResult e32 = tr.evaluate(wide.data(), rows, 256);
            EXPECT_EQ(e16.fvu, e32.fvu);
            EXPECT_EQ(e16.l0, e32.l0);
            std::vector<float> r16(wide.size()), r32(wide.size());
            tr.reconstruct(BatchView{w.data(), t}, rows, 256, r16.data());
            tr.reconstruct(wide.data(), rows, 256, r32.data());
            EXPECT_EQ(std::memcmp(r16.data(), r32.data(), r16.size() * 4), 0);
        }
    }
}
