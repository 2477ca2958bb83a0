// CPU backend ops against references computed another way (dense loops, full sorts), on
// random inputs. These references are also what CUDA parity tests will compare with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "saetrain/arch/relu.h"
#include "saetrain/backend.h"
#include "saetrain/optimizer.h"
#include "saetrain/sae_math.h"
#include "test_util.h"

using namespace saetrain;

namespace {

// The backend's optimizer ops (optimizer.h).
OptimizerOps& optimizer_ops(Backend& be) { return arch_ops<OptimizerOps>(be, optimizer_op_set()); }

using saetrain::testing::randn;

class CpuBackendTest : public ::testing::Test {
protected:
    std::unique_ptr<Backend> be = make_cpu_backend(2);
};

TEST_F(CpuBackendTest, GemmMatchesNaiveForEveryTransposeCombination) {
    const int64_t m = 7, n = 5, k = 9;
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            auto a = randn(m * k, 1), b = randn(k * n, 2);
            std::vector<float> c(m * n, 1.0f);
            be->gemm(ta, tb, m, n, k, 2.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f,
                     c.data(), n);
            for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (int64_t p = 0; p < k; ++p)
                        s += double(ta ? a[p * m + i] : a[i * k + p]) *
                             (tb ? b[j * k + p] : b[p * n + j]);
                    EXPECT_NEAR(c[i * n + j], 2.0 * s + 0.5, 1e-4) << ta << tb << i << j;
                }
            }
        }
    }
}

// Both CPU selections: the heap (rows with fewer than 2k blocks of 16) and the block-maximum
// filter (wider rows; 1537 has a tail after its last block), with ties, -inf values (AuxK's
// mask of live latents) and a row all of one value; the order is best first, ties by index.
TEST_F(CpuBackendTest, TopkSelectsLargestWithLowerIndexWinningTies) {
    const int64_t rows = 33;
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {300, 1}, {300, 7}, {300, 32}, {300, 300}, {1537, 32}, {1537, 48}, {4096, 64}}) {
        auto pre = randn(rows * n, 3);
        // Plant ties and negatives: quantize a third of the values so equal values occur.
        for (int64_t i = 0; i < rows * n; i += 3) pre[i] = std::round(pre[i] * 2.0f) / 2.0f;
        for (int64_t i = n; i < 2 * n; i += 2) pre[i] = -std::numeric_limits<float>::infinity();
        for (int64_t i = 2 * n; i < 3 * n; ++i) pre[i] = 0.5f;
        auto bias = randn(n, 4, 0.1f);
        std::vector<int32_t> idx(rows * k);
        std::vector<float> val(rows * k);
        be->topk_forward(pre.data(), bias.data(), rows, n, k, idx.data(), val.data(), true);
        for (int64_t r = 0; r < rows; ++r) {
            std::vector<int32_t> order(n);
            std::iota(order.begin(), order.end(), 0);
            auto v = [&](int32_t i) { return pre[r * n + i] + bias[i]; };
            std::stable_sort(order.begin(), order.end(),
                             [&](int32_t a, int32_t b) { return v(a) > v(b); });
            std::vector<int32_t> want(order.begin(), order.begin() + k);
            std::vector<int32_t> got(idx.begin() + r * k, idx.begin() + (r + 1) * k);
            ASSERT_EQ(got, want) << "row " << r << " n " << n << " k " << k;
            for (int64_t j = 0; j < k; ++j) EXPECT_EQ(val[r * k + j], std::max(0.0f, v(got[j])));
        }
    }
}

TEST_F(CpuBackendTest, SparseDecodeMatchesDenseProduct) {
    const int64_t rows = 9, n = 40, d = 13, k = 5;
    auto w = randn(n * d, 5);
    std::vector<int32_t> idx(rows * k);
    std::mt19937 rng(6);
    for (auto& i : idx) i = static_cast<int32_t>(rng() % n);  // repeats allowed: they add up
    auto val = randn(rows * k, 7);
    for (int64_t i = 0; i < rows * k; i += 4) val[i] = 0.0f;
    auto xh = randn(rows * d, 8);
    auto want = xh;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t c = 0; c < d; ++c)
                want[r * d + c] += val[r * k + j] * w[idx[r * k + j] * d + c];
    be->sparse_decode(idx.data(), val.data(), w.data(), rows, k, d, xh.data());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(xh[i], want[i], 1e-5);
}

TEST_F(CpuBackendTest, TopkBackwardMatchesDenseDefinition) {
    const int64_t rows = 17, n = 50, d = 11, k = 6;
    auto x = randn(rows * d, 9), derr = randn(rows * d, 10), w = randn(n * d, 11);
    auto pre = randn(rows * n, 12), bias = randn(n, 13, 0.2f);
    std::vector<int32_t> idx(rows * k);
    std::vector<float> val(rows * k);
    be->topk_forward(pre.data(), bias.data(), rows, n, k, idx.data(), val.data(), true);
    // Dense reference: scatter the selection into z [rows, n], then dz = derr W^T masked.
    std::vector<double> gd(n * d, 0), ge(n * d, 0), gb(n, 0);
    std::vector<int32_t> fires_want(n, 0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < k; ++j) {
            const float a = val[r * k + j];
            if (a <= 0) continue;
            const int32_t l = idx[r * k + j];
            ++fires_want[l];
            double dv = 0;
            for (int64_t c = 0; c < d; ++c) dv += double(derr[r * d + c]) * w[l * d + c];
            for (int64_t c = 0; c < d; ++c) {
                gd[l * d + c] += double(a) * derr[r * d + c];
                ge[l * d + c] += dv * x[r * d + c];
            }
            gb[l] += dv;
        }
    }
    std::vector<float> dwe(n * d, 99.0f), dwd(n * d, 99.0f), dbe(n, 99.0f);  // must be overwritten
    std::vector<int32_t> fires(n, -1);
    float stats[kStatCount] = {};
    SparseBackward a;
    a.x = x.data(), a.derr = derr.data(), a.idx = idx.data(), a.val = val.data(),
    a.w_dec = w.data();
    a.rows = rows, a.n = n, a.k = k, a.d = d;
    a.dw_enc = dwe.data(), a.dw_dec = dwd.data(), a.db_enc = dbe.data(), a.fires = fires.data();
    a.stats = stats;
    be->topk_backward(a);
    for (int64_t i = 0; i < n * d; ++i) {
        EXPECT_NEAR(dwd[i], gd[i], 1e-4);
        EXPECT_NEAR(dwe[i], ge[i], 1e-4);
    }
    int64_t l0 = 0;
    for (int64_t l = 0; l < n; ++l) {
        EXPECT_NEAR(dbe[l], gb[l], 1e-4);
        EXPECT_EQ(fires[l], fires_want[l]);
        l0 += fires_want[l];
    }
    EXPECT_EQ(stats[kStatL0], static_cast<float>(l0));
}

TEST_F(CpuBackendTest, ResidualAndReluBackwardMatchReference) {
    const int64_t rows = 21, d = 300, n = 600;  // d, n > one 256-column reduction block
    auto x = randn(rows * d, 14), xh = randn(rows * d, 15);
    std::vector<float> derr = xh, xcol(d), dbd(d);
    float stats[kStatCount] = {0, 0, 0, 0};
    be->residual(derr.data(), x.data(), rows, d, 0.5f, xcol.data(), dbd.data(), stats);
    double sse = 0, sx2 = 0;
    for (int64_t c = 0; c < d; ++c) {
        double cs = 0, db = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const double e = double(xh[r * d + c]) - x[r * d + c];
            sse += e * e, sx2 += double(x[r * d + c]) * x[r * d + c];
            cs += x[r * d + c], db += 0.5 * e;
            EXPECT_NEAR(derr[r * d + c], 0.5 * e, 1e-6);
        }
        EXPECT_NEAR(xcol[c], cs, 1e-4);
        EXPECT_NEAR(dbd[c], db, 1e-4);
    }
    EXPECT_NEAR(stats[kStatSse], sse, 1e-3 * sse);
    EXPECT_NEAR(stats[kStatSumSqX], sx2, 1e-3 * sx2);

    auto z = randn(rows * n, 16);
    for (float& v : z) v = std::max(v, 0.0f);
    auto dz = randn(rows * n, 17), norms = randn(n, 18);
    for (float& v : norms) v = std::abs(v) + 0.5f;
    std::vector<float> dpre = dz, dbe(n), zsum(n);
    std::vector<int32_t> fires(n);
    float st2[kStatCount] = {0, 0, 0, 0};
    // ReLU's own op (arch/relu.h), the CPU reference the CPU backend runs.
    arch_ops<ReluOps>(*be, relu_op_set())
        .relu_backward(z.data(), dpre.data(), norms.data(), 0.3f, rows, n, dbe.data(), zsum.data(),
                       fires.data(), st2);
    double l1 = 0, l0 = 0;
    for (int64_t c = 0; c < n; ++c) {
        double db = 0, zs = 0;
        int32_t f = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const float zz = z[r * n + c];
            const double want = zz > 0 ? dz[r * n + c] + 0.3 * norms[c] : 0.0;
            EXPECT_NEAR(dpre[r * n + c], want, 1e-5);
            db += want, zs += zz, f += zz > 0;
        }
        EXPECT_NEAR(dbe[c], db, 1e-4);
        EXPECT_NEAR(zsum[c], zs, 1e-4);
        EXPECT_EQ(fires[c], f);
        l1 += zs * norms[c], l0 += f;
    }
    EXPECT_NEAR(st2[kStatL1], l1, 1e-3 * l1);
    EXPECT_EQ(st2[kStatL0], static_cast<float>(l0));
}

TEST_F(CpuBackendTest, AdamMatchesTextbookUpdateInDouble) {
    const int64_t n = 1000;
    auto p = randn(n, 19), g = randn(n, 20), m = randn(n, 21, 0.1f), v = randn(n, 22, 0.1f);
    for (float& x : v) x = x * x;
    auto p0 = p, m0 = m, v0 = v;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, gs = 0.5;
    const int t = 3;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const math::AdamScalars s{float(lr),      float(b1),      float(b2), float(eps),
                              float(1 / bc1), float(1 / bc2), float(wd), float(gs)};
    optimizer_ops(*be).update(p.data(), g.data(), m.data(), v.data(), n, s);
    for (int64_t i = 0; i < n; ++i) {
        const double gg = gs * g[i];
        const double mm = b1 * m0[i] + (1 - b1) * gg, vv = b2 * v0[i] + (1 - b2) * gg * gg;
        const double pp = p0[i] - lr * ((mm / bc1) / (std::sqrt(vv / bc2) + eps) + wd * p0[i]);
        EXPECT_NEAR(m[i], mm, 1e-6);
        EXPECT_NEAR(v[i], vv, 1e-6);
        EXPECT_NEAR(p[i], pp, 1e-5);
    }
}

// optimizer_apply: each range at the step's lr times its lr_scale (JumpReLU's thresholds), with
// weight decay where the range decays; equal to adam on each range with those scalars.
TEST_F(CpuBackendTest, OptimizerApplyScalesEachRangesLearningRate) {
    const int64_t n = 300;
    auto p = randn(n, 25), g = randn(n, 26), m = randn(n, 27, 0.1f), v = randn(n, 28, 0.1f);
    for (float& x : v) x = x * x;
    auto pw = p, gw = g, mw = m, vw = v;
    const std::vector<AdamRange> ranges = {
        {0, 100, true}, {100, 150, false, 10.0f}, {250, 50, false, 0.5f}};
    const math::AdamScalars s{1e-2f, 0.9f, 0.999f, 1e-8f, 1 / 0.1f, 1 / 0.001f, 0.0f, 1.0f};
    optimizer_ops(*be).apply(p.data(), g.data(), m.data(), v.data(), ranges, UnitRows{}, s, 0.01f);
    for (const AdamRange& r : ranges) {
        math::AdamScalars rs = s;
        rs.lr = s.lr * r.lr_scale, rs.weight_decay = r.decay ? 0.01f : 0.0f;
        optimizer_ops(*be).update(pw.data() + r.offset, gw.data() + r.offset, mw.data() + r.offset,
                                  vw.data() + r.offset, r.count, rs);
    }
    EXPECT_EQ(p, pw);
    EXPECT_EQ(m, mw);
    // The scale reached the step: a range at 10x moved about 10x as far as at 1x.
    auto p0 = randn(n, 25);
    double moved_1 = 0, moved_10 = 0;
    for (int64_t i = 0; i < 100; ++i) moved_1 += std::abs(p[i] - p0[i]);
    for (int64_t i = 100; i < 200; ++i) moved_10 += std::abs(p[i] - p0[i]);
    EXPECT_GT(moved_10, 5 * moved_1);
}

// train.optimizer: signum against the schedule-free wrapper's own procedure, in double: the
// parameter holds y; each step recovers the average x from y and the iterate z, moves z by
// -lr sign(g), mixes it into x with weight lr_max^2 / (sum of the weights so far), and sets
// y = momentum x + (1 - momentum) z. saetrain keeps x in v instead of recovering it. The lr
// rises for three steps (a warmup) and then falls, so the weights are not uniform.
TEST_F(CpuBackendTest, SignumMatchesTheScheduleFreeWrapper) {
    const int64_t n = 500;
    const double beta = 0.9;
    auto p = randn(n, 40);
    std::vector<float> m = p, v = p;  // at the start all three points are the parameters
    std::vector<double> y(p.begin(), p.end()), z = y;
    double lr_max = 0, weight_sum = 0;
    const double lrs[] = {0.01, 0.02, 0.03, 0.025, 0.01, 0.005};
    for (int step = 0; step < 6; ++step) {
        const std::vector<float> g = randn(n, 41 + step);
        lr_max = std::max(lr_max, lrs[step]);
        weight_sum += lr_max * lr_max;
        const double c = lr_max * lr_max / weight_sum;
        math::AdamScalars s{float(lrs[step]), float(beta), 0.999f, 1e-8f, 1.0f, 1.0f, 0.0f, 0.5f};
        s.signum = true, s.average = static_cast<float>(c);
        optimizer_ops(*be).update(p.data(), g.data(), m.data(), v.data(), n, s);
        for (int64_t i = 0; i < n; ++i) {
            const double x = (y[i] - (1 - beta) * z[i]) / beta;
            z[i] -= lrs[step] * (g[i] > 0 ? 1.0 : g[i] < 0 ? -1.0 : 0.0);
            const double x_new = x + c * (z[i] - x);
            y[i] = beta * x_new + (1 - beta) * z[i];
            EXPECT_NEAR(m[i], z[i], 1e-5) << "step " << step;
            EXPECT_NEAR(v[i], x_new, 1e-5) << "step " << step;
            EXPECT_NEAR(p[i], y[i], 1e-5) << "step " << step;
        }
    }
}

// Decoupled weight decay is taken at y: z moves by -lr (sign(g) + wd y).
TEST_F(CpuBackendTest, SignumWeightDecayIsTakenAtY) {
    std::vector<float> p = {2.0f, -1.0f, 0.5f}, m = {1.0f, -2.0f, 0.25f}, v = {3.0f, 0.0f, 1.0f};
    const std::vector<float> g = {0.3f, 0.0f, -4.0f};
    math::AdamScalars s{0.1f, 0.8f, 0.999f, 1e-8f, 1.0f, 1.0f, 0.5f, 1.0f};
    s.signum = true, s.average = 0.25f;
    const std::vector<float> y = p, z = m, x = v;
    optimizer_ops(*be).update(p.data(), g.data(), m.data(), v.data(), 3, s);
    for (size_t i = 0; i < 3; ++i) {
        const double sign = g[i] > 0 ? 1 : g[i] < 0 ? -1 : 0;
        const double z1 = z[i] - 0.1 * (sign + 0.5 * y[i]);
        const double x1 = x[i] + 0.25 * (z1 - x[i]);
        EXPECT_NEAR(m[i], z1, 1e-6);
        EXPECT_NEAR(v[i], x1, 1e-6);
        EXPECT_NEAR(p[i], 0.8 * x1 + 0.2 * z1, 1e-6);
    }
}

// signum with unit decoder rows: the rows of all three points end at norm 1.
TEST_F(CpuBackendTest, SignumKeepsEveryPointsDecoderRowsUnit) {
    const int64_t rows = 5, cols = 8, n = rows * cols;
    auto p = randn(n, 50), g = randn(n, 51);
    be->normalize_rows(p.data(), rows, cols);
    std::vector<float> m = p, v = p;
    UnitRows unit;
    unit.offset = 0, unit.rows = rows, unit.cols = cols;
    math::AdamScalars s{0.2f, 0.95f, 0.999f, 1e-8f, 1.0f, 1.0f, 0.0f, 1.0f};
    s.signum = true, s.average = 0.5f;
    const std::vector<float> before = p;
    optimizer_ops(*be).apply(p.data(), g.data(), m.data(), v.data(), {{0, n, true}}, unit, s, 0.0f);
    EXPECT_NE(p, before);
    for (const std::vector<float>* w : {&p, &m, &v}) {
        std::vector<float> norms(rows);
        be->row_norms(w->data(), rows, cols, norms.data());
        for (float nr : norms) EXPECT_NEAR(nr, 1.0f, 1e-6);
    }
}

TEST_F(CpuBackendTest, DecoderRowOps) {
    const int64_t rows = 6, cols = 10;
    auto w = randn(rows * cols, 23), g = randn(rows * cols, 24);
    be->project_out_parallel(w.data(), g.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
        double dot = 0;
        for (int64_t c = 0; c < cols; ++c) dot += double(w[r * cols + c]) * g[r * cols + c];
        EXPECT_NEAR(dot, 0.0, 1e-5);
    }
    std::vector<float> norms(rows);
    be->normalize_rows(w.data(), rows, cols);
    be->row_norms(w.data(), rows, cols, norms.data());
    for (float nr : norms) EXPECT_NEAR(nr, 1.0f, 1e-6);
}

}  // namespace
