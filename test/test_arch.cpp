// The architectures behind the seam (arch.h): their gradients against finite differences of
// an independent double-precision forward pass, their straight-through terms against the
// surrogate they define, BatchTopK's inference threshold, AuxK, and bitwise resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fd_check.h"
#include "saetrain/arch.h"
#include "saetrain/arch/batchtopk.h"
#include "saetrain/arch/jumprelu.h"
#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/forwarding_backend.h"
#include "saetrain/param_store.h"
#include "saetrain/quality.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"

using namespace saetrain;

namespace {

struct Ref {
    std::string arch;
    int64_t rows = 8, d = 12, n = 24, k = 4;
    double l1 = 0, l0 = 0, bandwidth = 0.001;
    std::vector<uint8_t> dead;  // AuxK (TopK): the dead latents
    int64_t k_aux = 0;
    double aux_weight = 0;
    double decorr = 0;  // train.decorr_coeff
};

// The RMS of the Pearson correlations between distinct columns of z [rows, n] (columns with
// no variance left out of nothing: they correlate 0).
double correlation_rms(const std::vector<double>& z, int64_t rows, int64_t n) {
    std::vector<double> u(z);
    for (int64_t c = 0; c < n; ++c) {
        double m = 0, sq = 0;
        for (int64_t r = 0; r < rows; ++r) m += u[r * n + c];
        m /= static_cast<double>(rows);
        for (int64_t r = 0; r < rows; ++r) u[r * n + c] -= m, sq += u[r * n + c] * u[r * n + c];
        for (int64_t r = 0; r < rows; ++r) u[r * n + c] = sq > 0 ? u[r * n + c] / std::sqrt(sq) : 0;
    }
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
            if (i == j) continue;
            double c = 0;
            for (int64_t r = 0; r < rows; ++r) c += u[r * n + i] * u[r * n + j];
            s += c * c;
        }
    return std::sqrt(s / (static_cast<double>(n) * static_cast<double>(n - 1)));
}

// The trainer's loss in double precision, summed over rows and divided by them, on the flat
// parameters p (trainer.h layout, the architecture's segments after b_dec). `frozen` holds the
// values of the terms the trainer treats as constants (Gated's auxiliary decoder, AuxK's
// target): finite differences move p only, so they see exactly those stop-gradients.
double ref_loss(const std::vector<double>& p, const std::vector<double>& frozen,
                const std::vector<float>& x, const Ref& s) {
    const int64_t d = s.d, n = s.n, R = s.rows;
    auto parts = [&](const std::vector<double>& q) {
        struct {
            const double *w_enc, *w_dec, *b_enc, *b_dec, *extra;
        } v{q.data(), q.data() + n * d, q.data() + 2 * n * d, q.data() + 2 * n * d + n,
            q.data() + 2 * n * d + n + d};
        return v;
    };
    const auto P = parts(p), F = parts(frozen);
    auto encode = [&](const decltype(P)& Q, int64_t t, std::vector<double>& pre) {
        pre.assign(n, 0.0);
        for (int64_t l = 0; l < n; ++l)
            for (int64_t c = 0; c < d; ++c)
                pre[l] += (x[t * d + c] - Q.b_dec[c]) * Q.w_enc[l * d + c];
    };
    auto decode = [&](const decltype(P)& Q, const std::vector<double>& z, bool bias,
                      std::vector<double>& xh) {
        xh.assign(d, 0.0);
        for (int64_t c = 0; c < d; ++c) {
            double a = bias ? Q.b_dec[c] : 0.0;
            for (int64_t l = 0; l < n; ++l) a += z[l] * Q.w_dec[l * d + c];
            xh[c] = a;
        }
    };
    auto norm = [&](const decltype(P)& Q, int64_t l) {
        double s2 = 0;
        for (int64_t c = 0; c < d; ++c) s2 += Q.w_dec[l * d + c] * Q.w_dec[l * d + c];
        return std::sqrt(s2);
    };
    // BatchTopK: the batch's threshold over every row's positive pre + b_enc.
    double t_batch = 0;
    if (s.arch == "batchtopk") {
        std::vector<double> pos, pre;
        for (int64_t t = 0; t < R; ++t) {
            encode(P, t, pre);
            for (int64_t l = 0; l < n; ++l)
                if (pre[l] + P.b_enc[l] > 0) pos.push_back(pre[l] + P.b_enc[l]);
        }
        std::sort(pos.rbegin(), pos.rend());
        if (!pos.empty()) t_batch = pos[std::min<size_t>(s.k * R, pos.size()) - 1];
    }
    double loss = 0;
    std::vector<double> pre, z(n), xh, pre0, xh0, z0(n), e(d), zh(n), all_z;
    for (int64_t t = 0; t < R; ++t) {
        encode(P, t, pre);
        std::fill(z.begin(), z.end(), 0.0);
        if (s.arch == "relu") {
            for (int64_t l = 0; l < n; ++l) z[l] = std::max(pre[l] + P.b_enc[l], 0.0);
            for (int64_t l = 0; l < n; ++l) loss += s.l1 * z[l] * norm(P, l);
        } else if (s.arch == "topk") {
            std::vector<int64_t> order(n);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
                return pre[a] + P.b_enc[a] > pre[b] + P.b_enc[b];
            });
            for (int64_t j = 0; j < s.k; ++j)
                z[order[j]] = std::max(pre[order[j]] + P.b_enc[order[j]], 0.0);
        } else if (s.arch == "batchtopk") {
            for (int64_t l = 0; l < n; ++l) {
                const double v = pre[l] + P.b_enc[l];
                z[l] = v > 0 && v >= t_batch ? v : 0.0;
            }
        } else if (s.arch == "jumprelu") {
            for (int64_t l = 0; l < n; ++l) {
                const double v = pre[l] + P.b_enc[l], theta = std::exp(P.extra[l]);
                z[l] = v > theta ? v : 0.0;
                loss += s.l0 * (v > theta ? 1.0 : 0.0);
            }
        } else if (s.arch == "gated") {
            std::vector<double> gate(n);
            for (int64_t l = 0; l < n; ++l) {
                const double g = pre[l] + P.b_enc[l];
                const double m = pre[l] * std::exp(P.extra[l]) + P.extra[n + l];
                z[l] = g > 0 ? std::max(m, 0.0) : 0.0;
                gate[l] = std::max(g, 0.0);
                loss += s.l1 * gate[l] * norm(P, l);
            }
            // The gate path's reconstruction through the frozen decoder (W_dec, b_dec).
            decode(F, gate, true, xh0);
            for (int64_t c = 0; c < d; ++c)
                loss += (xh0[c] - x[t * d + c]) * (xh0[c] - x[t * d + c]);
        }
        decode(P, z, true, xh);
        all_z.insert(all_z.end(), z.begin(), z.end());
        for (int64_t c = 0; c < d; ++c) loss += (xh[c] - x[t * d + c]) * (xh[c] - x[t * d + c]);
        if (s.aux_weight > 0) {
            // AuxK: the residual of the frozen parameters' reconstruction is the target.
            std::vector<int64_t> order(n);
            encode(F, t, pre0);
            std::vector<int64_t> top0(n);
            std::iota(top0.begin(), top0.end(), 0);
            std::stable_sort(top0.begin(), top0.end(), [&](int64_t a, int64_t b) {
                return pre0[a] + F.b_enc[a] > pre0[b] + F.b_enc[b];
            });
            std::fill(z0.begin(), z0.end(), 0.0);
            for (int64_t j = 0; j < s.k; ++j)
                z0[top0[j]] = std::max(pre0[top0[j]] + F.b_enc[top0[j]], 0.0);
            decode(F, z0, true, xh0);
            for (int64_t c = 0; c < d; ++c) e[c] = x[t * d + c] - xh0[c];
            // The k_aux largest among the dead latents, with the live parameters.
            std::iota(order.begin(), order.end(), 0);
            auto key = [&](int64_t l) {
                return s.dead[l] ? pre[l] + P.b_enc[l] : -std::numeric_limits<double>::infinity();
            };
            std::stable_sort(order.begin(), order.end(),
                             [&](int64_t a, int64_t b) { return key(a) > key(b); });
            std::fill(zh.begin(), zh.end(), 0.0);
            for (int64_t j = 0; j < s.k_aux; ++j)
                if (s.dead[order[j]]) zh[order[j]] = key(order[j]);
            decode(P, zh, false, xh);
            for (int64_t c = 0; c < d; ++c) loss += s.aux_weight * (xh[c] - e[c]) * (xh[c] - e[c]);
        }
    }
    if (s.decorr > 0) loss += s.decorr * correlation_rms(all_z, R, n) * static_cast<double>(R);
    return loss / static_cast<double>(R);
}

// Random parameters in the trainer's layout (extras: log thresholds near the activations'
// scale for JumpReLU; small r_mag and b_mag for Gated).
std::vector<float> random_params(const SaeTrainer& tr, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(static_cast<size_t>(tr.layout().total()));
    for (float& v : p) v = 0.4f * normal(rng);
    if (tr.layout().has("log_threshold")) {
        const int64_t o = tr.layout().offset("log_threshold");
        for (int64_t l = 0; l < tr.n_latents(); ++l) p[o + l] = std::log(0.3f) + 0.3f * normal(rng);
    }
    return p;
}

// test/fd_check.h's check on this file's reference loss.
void check_fd(SaeTrainer& tr, const std::vector<float>& x, const Ref& s,
              const std::function<bool(size_t)>& skip = {}) {
    saetrain::testing::check_fd(
        tr, x, s.rows,
        [&](const std::vector<double>& p, const std::vector<double>& frozen) {
            return ref_loss(p, frozen, x, s);
        },
        s.arch, skip);
}

SaeConfig base_config(const Ref& s) {
    SaeConfig cfg;
    cfg.arch = s.arch;
    cfg.n_latents = s.n;
    cfg.k = s.k;
    cfg.l1_coeff = s.l1;
    cfg.l0_coeff = s.l0;
    cfg.set("sae.jumprelu_bandwidth", s.bandwidth);
    cfg.decorr_coeff = s.decorr;
    cfg.l1_warmup_fraction = 0;     // the full coefficients from step 0, as the reference
    cfg.normalize_decoder = false;  // keep the norm-weighted L1 gradient visible
    return cfg;
}

std::vector<float> random_rows(const Ref& s, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(s.rows * s.d));
    for (float& v : x) v = normal(rng);
    return x;
}

TEST(ArchGradients, BatchTopkMatchesFiniteDifferences) {
    Ref s;
    s.arch = "batchtopk";
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(base_config(s), s.d, 10, 0, *be, *self);
    std::mt19937 rng(3);
    const std::vector<float> x = random_rows(s, rng);
    tr.set_params_host(random_params(tr, rng));
    check_fd(tr, x, s);
}

TEST(ArchGradients, GatedMatchesFiniteDifferencesWithItsStopGradients) {
    Ref s;
    s.arch = "gated";
    s.l1 = 0.3;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(base_config(s), s.d, 10, 0, *be, *self);
    std::mt19937 rng(4);
    const std::vector<float> x = random_rows(s, rng);
    std::vector<float> p = random_params(tr, rng);
    std::normal_distribution<float> normal(0.0f, 0.2f);
    for (const char* seg : {"r_mag", "b_mag"})
        for (int64_t l = 0; l < s.n; ++l) p[tr.layout().offset(seg) + l] = normal(rng);
    tr.set_params_host(p);
    check_fd(tr, x, s);
}

// JumpReLU: every gradient but the threshold's is a true derivative (checked by finite
// differences); the threshold's is the straight-through surrogate of sae_math.h, checked
// against that definition computed here in double precision: a fixed width, and (bandwidth 0,
// the default) a width of twice each latent's threshold.
class JumpReluSurrogate : public ::testing::TestWithParam<double> {};

TEST_P(JumpReluSurrogate, MatchesFiniteDifferencesAndItsSurrogate) {
    Ref s;
    s.arch = "jumprelu";
    s.l0 = 0.05;
    s.bandwidth = GetParam();  // wide enough that many (row, latent) pairs fall inside the window
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(base_config(s), s.d, 10, 0, *be, *self);
    std::mt19937 rng(5);
    const std::vector<float> x = random_rows(s, rng);
    tr.set_params_host(random_params(tr, rng));
    const int64_t lt = tr.layout().offset("log_threshold");
    check_fd(tr, x, s, [&](size_t i) {
        return static_cast<int64_t>(i) >= lt && static_cast<int64_t>(i) < lt + s.n;
    });

    const std::vector<float> g = tr.grads_host(), p = tr.params_host();
    const int64_t d = s.d, n = s.n;
    int in_window = 0;
    for (int64_t l = 0; l < n; ++l) {
        const double theta = std::exp(double(p[lt + l]));
        double want = 0;
        for (int64_t t = 0; t < s.rows; ++t) {
            // v and dL/dz for this row and latent.
            double v = p[2 * n * d + l];
            for (int64_t c = 0; c < d; ++c)
                v += (x[t * d + c] - p[2 * n * d + n + c]) * p[l * d + c];
            std::vector<double> xh(d);
            for (int64_t c = 0; c < d; ++c) xh[c] = p[2 * n * d + n + c];
            for (int64_t m = 0; m < n; ++m) {
                double vm = p[2 * n * d + m];
                for (int64_t c = 0; c < d; ++c)
                    vm += (x[t * d + c] - p[2 * n * d + n + c]) * p[m * d + c];
                if (vm > std::exp(double(p[lt + m])))
                    for (int64_t c = 0; c < d; ++c) xh[c] += vm * p[n * d + m * d + c];
            }
            double dz = 0;
            for (int64_t c = 0; c < d; ++c)
                dz += 2.0 / double(s.rows) * (xh[c] - x[t * d + c]) * p[n * d + l * d + c];
            const double width = s.bandwidth > 0 ? s.bandwidth : 2.0 * double(float(theta));
            const double u = (v - theta) / width;
            const double kernel = (u > -0.5 && u < 0.5) ? 1.0 / width : 0.0;
            in_window += kernel > 0;
            want += -kernel * (theta * dz + s.l0 / double(s.rows));
        }
        want *= theta;  // d/dlog(theta)
        EXPECT_NEAR(g[lt + l], want, 1e-4 + 1e-3 * std::abs(want)) << "latent " << l;
    }
    EXPECT_GT(in_window, 10) << "too few pairs in the window to test the surrogate";
}

INSTANTIATE_TEST_SUITE_P(Widths, JumpReluSurrogate, ::testing::Values(0.4, 0.0),
                         [](const ::testing::TestParamInfo<double>& p) {
                             return p.param > 0 ? std::string("Fixed") : std::string("Relative");
                         });

// AuxK: latents marked dead (restored counters) get the auxiliary gradient; finite
// differences of the loss with the residual target held fixed.
TEST(ArchGradients, AuxKMatchesFiniteDifferences) {
    Ref s;
    s.arch = "topk";
    s.k_aux = 5;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeConfig cfg = base_config(s);
    cfg.set("sae.k_aux", s.k_aux).set("train.auxk_coeff", 0.5);
    cfg.dead_tokens = 100;
    SaeTrainer tr(cfg, s.d, 10, 0, *be, *self);
    std::mt19937 rng(6);
    const std::vector<float> x = random_rows(s, rng);
    tr.set_params_host(random_params(tr, rng));
    TrainState st = trainer_state(tr);
    s.dead.assign(static_cast<size_t>(s.n), 0);
    int64_t n_dead = 0;
    for (int64_t l = 0; l < s.n; l += 2) st.since_fired[l] = 1000, s.dead[l] = 1, ++n_dead;
    trainer_restore(tr, trainer_weights(tr), st);
    s.aux_weight = 0.5 * std::min(1.0, double(n_dead) / double(s.k_aux));
    check_fd(tr, x, s);
    // The auxiliary term is there: the same SAE without it has another loss.
    const double with_aux = tr.compute_gradients(x.data(), s.rows).loss;
    Ref plain = s;
    plain.aux_weight = 0;
    const std::vector<float> pf = tr.params_host();
    const std::vector<double> pd(pf.begin(), pf.end());
    EXPECT_GT(with_aux - ref_loss(pd, pd, x, plain), 1e-3);
}

// BatchTopK's inference threshold: after training, evaluating on held-out rows of the same
// distribution gives the training L0 within 10%.
TEST(ArchBehaviour, BatchTopkThresholdGivesTheTrainingL0) {
    const int64_t d = 16, n = 64, rows = 256;
    SaeConfig cfg;
    cfg.arch = "batchtopk";
    cfg.n_latents = n;
    cfg.k = 6;
    cfg.lr = 5e-3;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, d, 300, 0, *be, *self);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows * d));
    auto fill = [&] {
        for (float& v : x) v = normal(rng);
    };
    fill();
    tr.init(x.data(), rows);
    double l0 = 0;
    for (int s = 0; s < 300; ++s) {
        fill();
        l0 = tr.step(x.data(), rows).l0 / rows;
    }
    EXPECT_NEAR(l0, double(cfg.k), 1e-9) << "training selects k per row on average";
    fill();
    const EvalResult e = tr.evaluate(x.data(), rows, rows);
    EXPECT_NEAR(e.l0, l0, 0.1 * l0) << "inference L0 " << e.l0 << " vs training " << l0;
    // The threshold travels with the weights.
    const SaeWeights w = trainer_weights(tr);
    ASSERT_EQ(w.tensors.size(), 5u);  // the four, then the threshold
    EXPECT_EQ(w.tensors[4].name, "threshold");
    EXPECT_GT(w.tensors[4].data[0], 0.0f);
}

// sae.target_l0's controller, through the pass's hooks: with err = log(L0 / target_t),
// log(coefficient) moves by kGain * err + kDamping * (err - the last step's err) after each step,
// target_t falling geometrically from the first step's L0 to the target over the L1 ramp; frozen
// for the last tenth of the run; the coefficient, the first L0 and the last error are the pass's
// buffers (restored by set_buffer; the last error may be missing from an older checkpoint).
TEST(TargetL0, CoefficientFollowsTheL0OnTheRampAndFreezesAtTheEnd) {
    auto be = make_cpu_backend(1);
    const double ki = 0.1, kp = 1.5;  // SparsityCoefficient::kGain, kDamping
    for (const std::string arch : {"relu", "gated", "jumprelu"}) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.l1_coeff = 5.0, cfg.l0_coeff = 2.0;
        cfg.l1_warmup_fraction = 0.2;  // a ramp of 20 of the 100 steps
        const std::string name = arch == "jumprelu" ? "l0_coeff" : "l1_coeff";
        const double c0 = arch == "jumprelu" ? 2.0 : 5.0;
        // Without a target: no buffers, and the configured coefficient is used.
        EXPECT_TRUE(arch_get(arch).make_pass(cfg, 8, 32, *be)->buffers().empty()) << arch;
        EXPECT_FALSE(arch_get(arch).make_pass(cfg, 8, 32, *be)->buffer_optional(name + "_prev_err"))
            << arch;
        cfg.set("sae.target_l0", 10.0);
        auto pass = arch_get(arch).make_pass(cfg, 8, 32, *be);
        const bool shifts = arch == "jumprelu";  // and a threshold shift (below)
        struct State {
            double coeff, start_l0, prev_err;
        };
        auto state = [&] {
            const auto b = pass->buffers();
            EXPECT_EQ(b.size(), shifts ? 4u : 3u) << arch;
            EXPECT_EQ(b.at(0).first, name) << arch;
            EXPECT_EQ(b.at(1).first, name + "_start_l0") << arch;
            EXPECT_EQ(b.at(2).first, name + "_prev_err") << arch;
            return State{b.at(0).second.at(0), b.at(1).second.at(0), b.at(2).second.at(0)};
        };
        auto coeff = [&] { return state().coeff; };
        EXPECT_EQ(coeff(), static_cast<float>(c0)) << arch;
        EXPECT_EQ(state().prev_err, 0.0) << arch;
        // Step 0 at L0 100 (1000 activations over 10 rows): target_0 = 100^(1 - 1/20) 10^(1/20)
        // (the descent at sae.target_l0_rate 0.1 would take 23 steps, longer than the ramp).
        pass->after_update({0, 100, 10, 1000.0});
        const double e0 =
            std::log(100.0) - (std::log(100.0) + (std::log(10.0) - std::log(100.0)) / 20.0);
        double want = std::exp(std::log(c0) + ki * e0 + kp * e0);
        EXPECT_NEAR(coeff(), want, 1e-6 * want) << arch;
        EXPECT_EQ(state().start_l0, 100.0f) << arch;
        EXPECT_NEAR(state().prev_err, e0, 1e-6) << arch;
        // Past the ramp at the target: err 0, so only the damping moves it (the error fell by e0).
        double before = coeff();
        pass->after_update({30, 100, 10, 100.0});
        want = std::exp(std::log(before) - kp * e0);
        EXPECT_NEAR(coeff(), want, 1e-5 * want) << arch;
        // At the target twice: no change.
        pass->after_update({31, 100, 10, 100.0});
        before = coeff();
        pass->after_update({32, 100, 10, 100.0});
        EXPECT_EQ(coeff(), before) << arch;
        // Above it: up by both terms; held there: up by the integral alone; back: down by the
        // damping of the whole step and nothing from the integral.
        pass->after_update({33, 100, 10, 200.0});
        want = std::exp(std::log(before) + (ki + kp) * std::log(2.0));
        EXPECT_NEAR(coeff(), want, 1e-5 * want) << arch;
        const double up = coeff();
        pass->after_update({34, 100, 10, 200.0});
        want = std::exp(std::log(up) + ki * std::log(2.0));
        EXPECT_NEAR(coeff(), want, 1e-5 * want) << arch;
        const double held = coeff();
        pass->after_update({35, 100, 10, 100.0});
        want = std::exp(std::log(held) - kp * std::log(2.0));
        EXPECT_NEAR(coeff(), want, 1e-5 * want) << arch;
        // Nothing firing counts as a hundredth of the target: err -log(100).
        const double low = coeff();
        pass->after_update({36, 100, 10, 0.0});
        want = low * std::exp(-(ki + kp) * std::log(100.0));
        EXPECT_NEAR(coeff(), want, 1e-5 * want) << arch;
        EXPECT_NEAR(state().prev_err, -std::log(100.0), 1e-5) << arch;
        // The last tenth of the run: frozen.
        const double frozen = coeff();
        pass->after_update({90, 100, 10, 1000.0});
        pass->after_update({99, 100, 10, 1.0});
        EXPECT_EQ(coeff(), frozen) << arch;
        // The buffers restore the state; other names are refused.
        auto other = arch_get(arch).make_pass(cfg, 8, 32, *be);
        for (const auto& [bname, v] : pass->buffers()) other->set_buffer(bname, v);
        EXPECT_EQ(other->buffers(), pass->buffers()) << arch;
        EXPECT_THROW(other->set_buffer("threshold", {1.0f}), Error) << arch;
        EXPECT_THROW(other->set_buffer(name, {1.0f, 2.0f}), Error) << arch;
        // Only the last error may be missing from a checkpoint.
        EXPECT_TRUE(other->buffer_optional(name + "_prev_err")) << arch;
        EXPECT_FALSE(other->buffer_optional(name)) << arch;
        EXPECT_FALSE(other->buffer_optional(name + "_start_l0")) << arch;
        // summary.csv's column.
        const auto fig = pass->summarize({}, {});
        ASSERT_EQ(fig.size(), shifts ? 2u : 1u) << arch;
        EXPECT_EQ(fig[0].first, name + "_final") << arch;
        EXPECT_EQ(fig[0].second, frozen) << arch;
    }
    // Architectures without a penalty do not declare the key.
    for (const ArchKeyDecl* k : arch_get("topk").config_keys())
        EXPECT_NE(k->full(), "sae.target_l0");
}

// JumpReLU with sae.target_l0: every threshold is exp(log_threshold + shift), the shift moved by
// 0.1 * log(L0 / target_t) after each step (the coefficient's error; its frozen tail), a buffer
// that the forward pass, a resumed pass and the SAELens export all apply.
TEST(TargetL0, JumpReluThresholdShiftFollowsTheL0) {
    auto be = make_cpu_backend(1);
    SaeConfig cfg;
    cfg.arch = "jumprelu";
    cfg.l1_warmup_fraction = 0.2;
    cfg.set("sae.target_l0", 10.0);
    auto pass = arch_get("jumprelu").make_pass(cfg, 8, 32, *be);
    auto shift = [&] {
        for (const auto& [name, v] : pass->buffers())
            if (name == "log_threshold_shift") return double(v.at(0));
        ADD_FAILURE() << "no log_threshold_shift buffer";
        return 0.0;
    };
    EXPECT_EQ(shift(), 0.0);
    pass->after_update({0, 100, 10, 1000.0});  // L0 100, target_0 = 100^(19/20) 10^(1/20)
    double want = 0.1 * (std::log(100.0) - (std::log(100.0) + (std::log(0.1)) / 20.0));
    EXPECT_NEAR(shift(), want, 1e-6);
    pass->after_update({30, 100, 10, 400.0});  // past the ramp, L0 40: up by 0.1 log 4
    want += 0.1 * std::log(4.0);
    EXPECT_NEAR(shift(), want, 1e-6);
    pass->after_update({31, 100, 10, 25.0});  // L0 2.5: down by 0.1 log 4
    want -= 0.1 * std::log(4.0);
    EXPECT_NEAR(shift(), want, 1e-6);
    const double held = shift();
    pass->after_update({95, 100, 10, 1000.0});  // frozen
    EXPECT_EQ(shift(), held);
    EXPECT_EQ(pass->summarize({}, {}).at(1).first, "log_threshold_shift_final");
    auto other = arch_get("jumprelu").make_pass(cfg, 8, 32, *be);
    for (const auto& [bname, v] : pass->buffers()) other->set_buffer(bname, v);
    EXPECT_EQ(other->buffers(), pass->buffers());
    EXPECT_THROW(other->set_buffer("log_threshold_shift", {1.0f, 2.0f}), Error);
    // The export folds the shift into SAELens's thresholds.
    SaeWeights w = SaeWeights::zeros(2, 2);
    w.set("log_threshold", {2}, {0.0f, std::log(2.0f)});
    w.set("log_threshold_shift", {1}, {0.5f});
    const ArchExport e = arch_get("jumprelu").export_fields(w, cfg);
    const auto t = std::find_if(e.saelens_tensors.begin(), e.saelens_tensors.end(),
                                [](const ExportTensor& x) { return x.name == "threshold"; });
    ASSERT_NE(t, e.saelens_tensors.end());
    EXPECT_NEAR(t->data.at(0), std::exp(0.5f), 1e-6);
    EXPECT_NEAR(t->data.at(1), 2.0f * std::exp(0.5f), 1e-6);
}

// The pre-activation loss (train.pre_act_loss_coeff) on the CPU reference, element by element:
// a dead latent below its threshold gets dL/dv = -coeff ||W_dec_i|| and dL/dtheta = +coeff
// ||W_dec_i||, its decoder norm coeff (theta - v); a live latent or one above its threshold
// nothing; the loss's sum (without coeff) goes to stats[kStatAux]. With dz 0 and no L0 term
// these are the only gradients.
TEST(JumpRelu, PreActivationLossPullsDeadLatentsToTheirThresholds) {
    auto be = make_cpu_backend(1);
    JumpReluOps& ops = arch_ops<JumpReluOps>(*be, jumprelu_op_set());
    const int64_t rows = 3, n = 4;
    const float coeff = 0.5f;
    // v per row; thresholds 1 (log 0); latents 0 and 1 dead, 2 and 3 live.
    std::vector<float> v = {0.25f, 2.0f, 0.5f, 0.0f, -1.0f, 0.75f,
                            3.0f,  0.5f, 1.5f, 0.5f, 0.0f,  2.0f};
    const std::vector<float> log_threshold(n, 0.0f), norms = {2.0f, 3.0f, 5.0f, 7.0f},
                                                     dead = {1.0f, 1.0f, 0.0f, 0.0f};
    std::vector<float> dz(rows * n, 0.0f), db(n, 9.0f), dlt(n, 9.0f), ng(n, 9.0f),
        st(kStatCount, 0.0f);
    std::vector<int32_t> fires(n, 9);
    JumpReluBackward a;
    a.v = v.data(), a.log_threshold = log_threshold.data(), a.bandwidth = 0.001f, a.l0 = 0.0f;
    a.rows = rows, a.n = n, a.dz_to_dpre = dz.data(), a.db_enc = db.data();
    a.dlog_threshold = dlt.data(), a.fires = fires.data(), a.stats = st.data();
    a.norms = norms.data(), a.norm_grad = ng.data(), a.dead_mask = dead.data(), a.pre_act = coeff;
    ops.jumprelu_backward(a);
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
        double g_norm = 0, g_theta = 0, g_b = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const float vr = v[r * n + i];
            const bool below = dead[i] != 0 && vr < 1.0f;
            const double want = below ? -coeff * norms[i] : 0.0;
            EXPECT_FLOAT_EQ(dz[r * n + i], static_cast<float>(want)) << r << " " << i;
            g_b += want;
            if (below) {
                g_theta += coeff * norms[i], g_norm += coeff * (1.0 - vr);
                loss += (1.0 - vr) * norms[i];
            }
        }
        EXPECT_FLOAT_EQ(db[i], static_cast<float>(g_b)) << i;
        EXPECT_FLOAT_EQ(dlt[i], static_cast<float>(g_theta)) << i;  // theta 1: d/dlog = d/dtheta
        EXPECT_FLOAT_EQ(ng[i], static_cast<float>(g_norm)) << i;
    }
    EXPECT_GT(loss, 0.0);
    EXPECT_FLOAT_EQ(st[kStatAux], static_cast<float>(loss));
    EXPECT_EQ(st[kStatL1], 0.0f);  // no tanh penalty
}

// Gated with sae.target_l0 starts at it: its gate biases are lowered to each latent's threshold
// at the target on the first batch, and the encoder's scale (b_gate with it) is fitted again, so
// the start reconstructs at its best scale: <x_hat - b_dec, x - b_dec> = ||x_hat - b_dec||^2.
// Without the target it starts dense (about half the latents open).
TEST(TargetL0, GatedStartsAtItsTarget) {
    const int64_t d = 16, n = 128, rows = 2000;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows * d));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < d; ++c) x[r * d + c] = 3.0f * normal(rng) + (c == 0 ? 5.0f : 0.0f);
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    auto start = [&](double target, std::vector<float>* x_hat, SaeWeights* w) {
        SaeConfig cfg;
        cfg.arch = "gated";
        cfg.n_latents = n;
        if (target > 0) cfg.set("sae.target_l0", target);
        SaeTrainer tr(cfg, d, 100, 3, *be, *self);
        tr.init(x.data(), rows);
        if (x_hat) tr.reconstruct(x.data(), rows, rows, x_hat->data());
        if (w) *w = trainer_weights(tr);
        return tr.evaluate(x.data(), rows, rows);
    };
    const EvalResult dense = start(0, nullptr, nullptr);
    EXPECT_GT(dense.l0, 0.3 * n);
    std::vector<float> x_hat(x.size());
    SaeWeights w;
    const EvalResult sparse = start(8, &x_hat, &w);
    EXPECT_NEAR(sparse.l0, 8.0, 0.8);
    EXPECT_LT(sparse.fvu, 1.0);
    for (float b : w.at("b_enc")) EXPECT_LT(b, 0.0f);
    double ux = 0, uu = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < d; ++c) {
            const double u = double(x_hat[r * d + c]) - w.at("b_dec")[c];
            ux += u * (double(x[r * d + c]) - w.at("b_dec")[c]), uu += u * u;
        }
    ASSERT_GT(uu, 0.0);
    EXPECT_NEAR(ux / uu, 1.0, 1e-3);
}

// Every architecture resumes bitwise: 6 steps straight equal 3 steps, a checkpoint's weights
// and state restored into a fresh trainer, and 3 more. The penalized ones also with
// sae.target_l0, whose adapted coefficient must resume too; a 3-layer CLT with per-layer
// BatchTopK (a threshold a layer) and with JumpReLU's tanh penalty.
TEST(ArchBehaviour, EveryArchitectureResumesBitwise) {
    const int64_t d = 12, n = 48, rows = 64;
    struct Run {
        std::string arch;
        double target;
        std::function<void(SaeConfig&)> more;
        std::string label;
    };
    std::vector<Run> runs;
    for (const std::string& arch : arch_names()) runs.push_back({arch, 0.0, nullptr, arch});
    for (const char* arch : {"relu", "jumprelu", "gated"})
        runs.push_back({arch, 6.0, nullptr, std::string(arch) + " at a target L0"});
    runs.push_back({"clt", 0.0,
                    [](SaeConfig& c) {
                        c.layers = 3;
                        c.set("sae.transcoder_activation", "batchtopk");
                        c.set("sae.k_scope", "layer");
                    },
                    "clt, per-layer batchtopk"});
    runs.push_back({"clt", 0.0,
                    [](SaeConfig& c) {
                        c.layers = 3;
                        c.set("sae.transcoder_activation", "jumprelu");
                        c.set("sae.jumprelu_sparsity_loss_mode", "tanh");
                        c.set("train.pre_act_loss_coeff", 0.01);
                    },
                    "clt, jumprelu with the tanh penalty and the pre-activation loss"});
    runs.push_back({"clt", 2.0,
                    [](SaeConfig& c) {
                        c.layers = 3;
                        c.set("sae.transcoder_activation", "jumprelu");
                        c.set("sae.k_scope", "layer");
                    },
                    "clt, jumprelu with each layer's L0 at the target (a shift a layer)"});
    runs.push_back({"clt", 0.0,
                    [](SaeConfig& c) {
                        c.layers = 3;
                        c.set("sae.skip", true);
                    },
                    "clt with a skip path a layer"});
    for (const auto& [arch, target, more, label] : runs) {
        SCOPED_TRACE(label);
        SaeConfig cfg;
        cfg.arch = arch;
        if (target > 0) cfg.set("sae.target_l0", target);
        if (more) more(cfg);
        cfg.n_latents = n;
        cfg.k = 4;
        cfg.l1_coeff = 0.1;
        cfg.l0_coeff = 0.01;
        cfg.dead_tokens = 64;  // latents die within the run: AuxK is part of what resumes
        cfg.lr = 1e-2;
        cfg.set("sae.matryoshka_prefixes", IntList{12, 24});
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        std::mt19937 rng(11);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        // A transcoder's rows are [x | y]: twice as wide.
        const int64_t width = arch_get(arch).rows().target ? 2 * d : d;
        std::vector<std::vector<float>> batches(7, std::vector<float>(rows * width));
        for (auto& b : batches)
            for (float& v : b) v = normal(rng);
        SaeTrainer a(cfg, d, 6, 1, *be, *self);
        a.init(batches[0].data(), rows);
        for (int s = 1; s <= 3; ++s) a.step(batches[s].data(), rows);
        const SaeWeights w = trainer_weights(a);
        const TrainState st = trainer_state(a);
        for (int s = 4; s <= 6; ++s) a.step(batches[s].data(), rows);

        SaeTrainer b(cfg, d, 6, 1, *be, *self);
        trainer_restore(b, w, st);
        for (int s = 4; s <= 6; ++s) b.step(batches[s].data(), rows);
        EXPECT_EQ(a.params_host(), b.params_host()) << arch;
        EXPECT_EQ(trainer_state(a).opt_m, trainer_state(b).opt_m) << arch;
        const SaeWeights wa = trainer_weights(a), wb = trainer_weights(b);
        EXPECT_TRUE(wa == wb) << arch;
    }
}

// sae.target_l0_rate: target_t falls from the first step's L0 by `rate` in log L0 a step, so
// the descent takes ceil(log(first L0 / target) / rate) steps, but at least half the L1 ramp and
// at most all of it (all of it at rate 0). Fed target_t itself two steps running, the controller
// sees no error and no change of error, so the coefficient holds: a wrong target_t moves it.
// The SAE's files hold exactly the tensors its architecture declares, in its order and file
// shapes (then its pass's state), and its buffer is exactly their values: nothing outside
// Architecture::tensors places a parameter.
TEST(Tensors, EveryArchitecturesFilesHoldWhatItDeclares) {
    const int64_t d = 12, n = 48, rows = 64;
    for (const std::string& arch : arch_names()) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.n_latents = n;
        cfg.k = 4;
        cfg.set("sae.matryoshka_prefixes", IntList{12, 24});
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        const ParamLayout declared(arch_get(arch).tensors(cfg, n, d));
        SaeTrainer tr(cfg, d, 4, 1, *be, *self);
        std::mt19937 rng(5);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(rows * tr.row_width()));
        for (float& v : x) v = normal(rng);
        tr.init(x.data(), rows);
        tr.step(x.data(), rows);
        EXPECT_EQ(tr.store().size(), declared.total()) << arch;
        const SaeWeights w = trainer_weights(tr);
        const std::vector<float> p = tr.params_host();
        const auto buffers = tr.arch_buffers();
        ASSERT_EQ(w.tensors.size(), declared.segments().size() + buffers.size()) << arch;
        for (size_t i = 0; i < declared.segments().size(); ++i) {
            const ParamSegment& s = declared.segments()[i];
            const WeightTensor& t = w.tensors[i];
            EXPECT_EQ(t.name, s.name) << arch;
            EXPECT_EQ(t.shape, s.file_shape()) << arch << " " << s.name;
            ASSERT_EQ(static_cast<int64_t>(t.data.size()), s.size()) << arch << " " << s.name;
            // The file's values are the buffer's, W_enc's transposed ([d, n] of latent rows).
            for (int64_t r = 0; r < s.rows; ++r)
                for (int64_t c = 0; c < s.cols; ++c) {
                    const float file =
                        s.transposed ? t.data[c * s.rows + r] : t.data[r * s.cols + c];
                    ASSERT_EQ(file, p[s.offset + r * s.cols + c]) << arch << " " << s.name;
                }
        }
        for (size_t i = 0; i < buffers.size(); ++i)
            EXPECT_EQ(w.tensors[declared.segments().size() + i].name, buffers[i].first) << arch;
    }
}

// A layered model declares compact per-layer tensors: a 6-layer cross-layer transcoder of F
// features a layer holds L F d encoder values and L (L + 1) / 2 F d decoder values, with no
// zero blocks, in circuit-tracer's shapes (W_dec[l] [F, L - l, d], b_enc [L, F]).
TEST(Tensors, ALayeredModelDeclaresNoZeroBlocks) {
    const int64_t L = 6, F = 16, d = 8;
    std::vector<ParamSegment> t;
    for (int64_t l = 0; l < L; ++l) {
        ParamSegment enc{"W_enc_" + std::to_string(l), F, d, true, true};
        enc.layer = static_cast<int>(l);
        ParamSegment dec{"W_dec_" + std::to_string(l), F, (L - l) * d, true, true};
        dec.layer = static_cast<int>(l), dec.dims = {F, L - l, d};
        t.push_back(enc), t.push_back(dec);
    }
    ParamSegment b_enc = latent_vector("b_enc", L * F);
    b_enc.dims = {L, F};
    ParamSegment b_dec{"b_dec", 1, L * d, false, false};
    b_dec.dims = {L, d};
    t.push_back(b_enc), t.push_back(b_dec);
    const ParamLayout layout(t);
    EXPECT_EQ(layout.total(), L * F * d + L * (L + 1) / 2 * F * d + L * F + L * d);
    EXPECT_EQ(layout.segment("W_dec_2").file_shape(), (std::vector<int64_t>{F, L - 2, d}));
    EXPECT_EQ(layout.segment("b_enc").file_shape(), (std::vector<int64_t>{L, F}));
    EXPECT_EQ(layout.segment("W_enc_5").layer, 5);
    // Today's dense form (one transcoder of width L d) holds 2 (L F)(L d) weights: 2.6 times.
    const ParamLayout dense(sae_tensors(L * F, L * d));
    EXPECT_EQ(dense.total(), 2 * (L * F) * (L * d) + L * F + L * d);
    EXPECT_GT(double(dense.total()) / double(layout.total()), 2.5);
    // A declaration the layout cannot hold is one line naming the tensor.
    ParamSegment bad = b_dec;
    bad.name = "b_bad", bad.dims = {L, d + 1};
    t.push_back(bad);
    try {
        ParamLayout{t};
        ADD_FAILURE() << "a file shape of another size was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'b_bad'"), std::string::npos) << e.what();
    }
    t.back() = b_dec;
    EXPECT_THROW(ParamLayout{t}, Error) << "a name declared twice";
    // The parameter stores place one row a latent: per-layer tensors (F rows of L F latents)
    // are refused by name until a placement splits them (the CLT's issue).
    t.pop_back();
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    LatentShard whole;
    whole.n_total = L * F;
    try {
        make_param_store(SaeConfig{}, ParamLayout(t), ParamLayout(t), whole, *be, *self);
        ADD_FAILURE() << "a per-layer tensor was placed as one row a latent";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'W_enc_0'"), std::string::npos) << e.what();
    }
}

TEST(TargetL0, TheTargetFallsAtTheRateWithinTheL1Ramp) {
    auto be = make_cpu_backend(1);
    const int64_t total = 500, rows = 10;  // the L1 ramp: 100 steps
    const double start = 1000.0, target = 10.0, distance = std::log(start / target);
    // log(100) = 4.61: 47 steps at 0.1 (half the ramp: 50), 66 at 0.07, 93 at 0.05, 461 at 0.01.
    const std::vector<std::pair<double, int64_t>> cases = {
        {0.1, 50}, {0.07, 66}, {0.05, 93}, {0.01, 100}, {0.0, 100}};
    for (const std::string arch : {"relu", "gated", "jumprelu"})
        for (const auto& [rate, descent] : cases) {
            SaeConfig cfg;
            cfg.arch = arch;
            cfg.l1_warmup_fraction = 0.2;
            cfg.set("sae.target_l0", target);
            cfg.set("sae.target_l0_rate", rate);
            auto pass = arch_get(arch).make_pass(cfg, 8, 32, *be);
            auto target_at = [&](int64_t s) {
                if (s + 1 >= descent) return target;
                return start * std::exp(-distance * static_cast<double>(s + 1) /
                                        static_cast<double>(descent));
            };
            auto coeff = [&] { return static_cast<double>(pass->buffers().at(0).second.at(0)); };
            pass->after_update({0, total, rows, start * rows});  // the first L0
            for (const int64_t s :
                 {int64_t{5}, descent / 2, descent - 3, descent - 2, descent + 7}) {
                pass->after_update({s, total, rows, target_at(s) * rows});
                const double held = coeff();
                pass->after_update({s + 1, total, rows, target_at(s + 1) * rows});
                EXPECT_NEAR(coeff(), held, 1e-5 * held)
                    << arch << " rate " << rate << " step " << s + 1;
            }
        }
}

// A checkpoint written before sae.target_l0's controller had its damping lacks the last error:
// it resumes with that error at 0 and everything else restored. Any other missing buffer is
// still refused, naming it.
TEST(TargetL0, ACheckpointWithoutTheLastErrorResumesFromZero) {
    const int64_t d = 12, n = 48, rows = 64;
    SaeConfig cfg;
    cfg.arch = "gated";
    cfg.set("sae.target_l0", 6.0);
    cfg.n_latents = n;
    cfg.l1_coeff = 0.1;
    cfg.lr = 1e-2;
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(rows * d);
    for (float& v : x) v = normal(rng);
    SaeTrainer a(cfg, d, 4, 1, *be, *self);
    a.init(x.data(), rows);
    for (int s = 1; s <= 3; ++s) a.step(x.data(), rows);
    const TrainState st = trainer_state(a);
    auto without = [&](const std::string& name) {
        SaeWeights w = trainer_weights(a);
        EXPECT_TRUE(w.erase(name)) << name;
        return w;
    };
    auto buffer = [](const SaeTrainer& t, const std::string& name) {
        for (const auto& [b, v] : t.arch_buffers())
            if (b == name) return v.at(0);
        ADD_FAILURE() << "no buffer " << name;
        return -1.0f;
    };
    ASSERT_NE(buffer(a, "l1_coeff_prev_err"), 0.0f);
    SaeTrainer b(cfg, d, 4, 1, *be, *self);
    trainer_restore(b, without("l1_coeff_prev_err"), st);
    EXPECT_EQ(buffer(b, "l1_coeff_prev_err"), 0.0f);
    EXPECT_EQ(buffer(b, "l1_coeff"), buffer(a, "l1_coeff"));
    EXPECT_EQ(buffer(b, "l1_coeff_start_l0"), buffer(a, "l1_coeff_start_l0"));
    EXPECT_EQ(b.params_host(), a.params_host());
    SaeTrainer c(cfg, d, 4, 1, *be, *self);
    try {
        trainer_restore(c, without("l1_coeff_start_l0"), st);
        ADD_FAILURE() << "a checkpoint without l1_coeff_start_l0 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'l1_coeff_start_l0'"), std::string::npos) << e.what();
    }
}

}  // namespace

namespace {

// Rows of `active` (on average) of m planted unit features that span only the first `sub`
// of d dimensions, as real activations occupy a low-dimensional part of their space: most
// random initial latent directions see little of the data.
struct SubspaceData {
    int64_t d, m, sub;
    std::vector<float> features;  // [m, d]
    std::mt19937 rng;
    SubspaceData(int64_t d_, int64_t m_, int64_t sub_, uint32_t seed)
        : d(d_), m(m_), sub(sub_), features(static_cast<size_t>(m_ * d_), 0.0f), rng(seed) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (int64_t f = 0; f < m; ++f) {
            double s = 0;
            for (int64_t c = 0; c < sub; ++c) {
                const float v = normal(rng);
                features[f * d + c] = v, s += double(v) * v;
            }
            for (int64_t c = 0; c < sub; ++c)
                features[f * d + c] /= static_cast<float>(std::sqrt(s));
        }
    }
    void fill(std::vector<float>& x, int64_t rows) {
        std::uniform_real_distribution<float> mag(0.5f, 2.0f);
        std::bernoulli_distribution on(3.0 / static_cast<double>(m));
        std::normal_distribution<float> noise(0.0f, 0.01f);
        x.assign(static_cast<size_t>(rows * d), 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < d; ++c) x[r * d + c] = noise(rng);
            for (int64_t f = 0; f < m; ++f)
                if (on(rng)) {
                    const float a = mag(rng);
                    for (int64_t c = 0; c < d; ++c) x[r * d + c] += a * features[f * d + c];
                }
        }
    }
};

// The dead fraction after 3000 steps of `arch` (TopK at k 4; a penalized one at target L0 4).
double dead_after(double auxk_coeff, uint64_t seed, const std::string& arch = "topk") {
    const int64_t d = 64, rows = 256;
    SubspaceData data(d, 256, 16, 21);
    SaeConfig cfg;
    cfg.arch = arch;
    cfg.n_latents = 256;
    if (arch == "topk")
        cfg.k = 4;
    else
        cfg.set("sae.target_l0", 4.0);
    cfg.lr = 2e-2;  // high: latents die quickly without AuxK
    // JumpReLU under its default signum: under AdamW AuxK revives none of its latents (86.7%
    // dead without, 86.3% with), as on MiniLM.
    if (arch == "jumprelu") cfg.optimizer = "signum";
    cfg.set("train.auxk_coeff", auxk_coeff);
    cfg.dead_tokens = 20 * rows;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    const int64_t steps = 3000;
    SaeTrainer tr(cfg, d, steps, seed, *be, *self);
    std::vector<float> x;
    data.fill(x, rows);
    tr.init(x.data(), rows);
    for (int64_t s = 0; s < steps; ++s) {
        data.fill(x, rows);
        tr.step(x.data(), rows);
    }
    return tr.dead_fraction();
}

// AuxK at its default weight (1/32, k_aux = d_model / 2) on data where plain TopK leaves many
// latents dead. One run at this learning rate is chaotic: the compiler's vectorization
// (-march=native) changes its last bits and with them which latents die; on an AVX-512 EPYC
// (2026-11-23) init seeds 0, 1, 2 left 10.5%, 1.2%, 2.0% dead with AuxK and 54-59% without it.
// So the median over three seeds is the figure.
TEST(ArchBehaviour, AuxKRevivesDeadLatents) {
    std::vector<double> aux;
    for (uint64_t seed = 0; seed < 3; ++seed) aux.push_back(dead_after(1.0 / 32, seed));
    std::sort(aux.begin(), aux.end());
    const double plain = dead_after(0.0, 0);
    std::printf(
        "dead latents: TopK %.1f%%, TopK + AuxK %.1f%% (median of %.1f%%, %.1f%%, %.1f%%)\n",
        100 * plain, 100 * aux[1], 100 * aux[0], 100 * aux[1], 100 * aux[2]);
    EXPECT_GT(plain, 0.2);
    EXPECT_LT(aux[1], 0.05);
}

// The same for ReLU and Gated at target L0 4, whose AuxK selects among the dead latents'
// pre-activations before the ReLU (ReLU keeps a copy) or of the gate (Gated; its step on
// b_gate is also taken on b_mag). Init seeds 0, 1, 2 (2026-11-27): ReLU 75.0, 72.3, 75.4% dead
// without AuxK and 10.9, 16.4, 13.3% with it; Gated 86.3, 86.7, 83.2% and 12.5, 12.5, 12.9%
// (AuxK on the gate alone: 78.5% at seed 0, its revived gates opening on negative magnitudes).
// JumpReLU (under signum, its default) revives fewer: 82.4% dead without AuxK, 57.4% with it.
// Its AuxK selects among the pre-activations v, which must then also pass the latent's
// threshold to fire; on MiniLM it left 1.7% dead in training (20.8% without).
TEST(ArchBehaviour, AuxKRevivesDeadPenalizedLatents) {
    for (const char* arch : {"relu", "gated", "jumprelu"}) {
        const double plain = dead_after(0.0, 0, arch), aux = dead_after(1.0 / 32, 0, arch);
        std::printf("dead latents: %s %.1f%%, with AuxK %.1f%%\n", arch, 100 * plain, 100 * aux);
        EXPECT_GT(plain, 0.5) << arch;
        if (std::string(arch) == "jumprelu")
            EXPECT_LT(aux, plain - 0.15) << arch;
        else
            EXPECT_LT(aux, 0.25) << arch;
    }
}

}  // namespace

namespace {

// decorr_rms: latent pairs with a known correlation, dense and sparse alike.
TEST(Quality, DecorrelationRmsOfKnownCorrelations) {
    const int64_t rows = 2000, n = 3;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Latent 1 copies latent 0 (correlation 1); latent 2 is independent of both (~0).
    std::vector<float> dense(static_cast<size_t>(rows * n), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const float a = std::abs(normal(rng)), b = std::abs(normal(rng));
        dense[r * n + 0] = a, dense[r * n + 1] = 2 * a, dense[r * n + 2] = b;
    }
    const double rms = decorrelation_rms(dense.data(), nullptr, nullptr, 0, rows, n);
    // Pairs (0,1) = 1, (0,2) ~ 0, (1,2) ~ 0: RMS = sqrt(1/3) up to the sampling noise.
    EXPECT_NEAR(rms, std::sqrt(1.0 / 3.0), 0.02);
    // The same activations as (latent, value) pairs give the same figure.
    std::vector<int32_t> idx(static_cast<size_t>(rows * n));
    std::vector<float> val(dense);
    for (int64_t r = 0; r < rows; ++r)
        for (int32_t l = 0; l < n; ++l) idx[r * n + l] = l;
    EXPECT_NEAR(decorrelation_rms(nullptr, idx.data(), val.data(), n, rows, n), rms, 1e-12);
    // Nothing fires: no pair to correlate.
    std::vector<float> zeros(dense.size(), 0.0f);
    EXPECT_EQ(decorrelation_rms(zeros.data(), nullptr, nullptr, 0, rows, n), 0.0);
}

TEST(Quality, GatesFromSumsAndTheirVerdicts) {
    QualityGates q;
    // 100 rows of 8 values, 4 latents: latent 0 fires on 50 rows (dense), 1 on 5, 2 on 1, 3
    // never (dead).
    quality_from_sums(q, 100, 800.0, 5.0, 60.0, 100.0, 56.0, {50, 5, 1, 0});
    EXPECT_TRUE(q.measured);
    EXPECT_DOUBLE_EQ(q.rel_recon_err, 0.05);
    EXPECT_DOUBLE_EQ(q.zeros_frac, 1.0 - 56.0 / 400.0);
    EXPECT_DOUBLE_EQ(q.dead_fraction, 0.25);
    EXPECT_DOUBLE_EQ(q.dense_fraction, 0.25);
    EXPECT_EQ(q.density, (std::vector<double>{0.5, 0.05, 0.01, 0.0}));
    q.decorr_rms = 0.1;
    EXPECT_FALSE(q.pass());
    EXPECT_NE(q.failures().find("dead 25.0%"), std::string::npos) << q.failures();
    EXPECT_NE(q.failures().find("dense 25.0%"), std::string::npos) << q.failures();
    EXPECT_EQ(q.failures().find("rel_recon_err"), std::string::npos) << q.failures();
    q.dead_fraction = q.dense_fraction = 0.0;
    EXPECT_TRUE(q.pass()) << q.failures();
    q.decorr_rms = 0.5;
    EXPECT_FALSE(q.pass());
    QualityGates none;
    EXPECT_FALSE(none.pass());
    // Rows of no variance (the same sums, sst at the floor): FVU is undefined and the gates fail
    // though each of the five passes (all-zero rows reconstruct with rel_recon_err 0).
    QualityGates flat;
    quality_from_sums(flat, 100, 800.0, 0.0, 100.0 * kFvuRelativeFloor, 100.0, 56.0, {5, 5, 5, 5});
    flat.decorr_rms = 0.1;
    EXPECT_TRUE(flat.no_variance);
    EXPECT_FALSE(flat.pass());
    EXPECT_EQ(flat.failures(), "no variance in the rows (FVU undefined)");
}

// FVU is sse / sst while the rows have variance, and undefined (NaN) below the floor: all-zero
// rows, identical rows (sst is then the rounding residue of float32 sums) and denormal rows.
TEST(Quality, FvuIsUndefinedOnRowsOfNoVariance) {
    const double elements = 1000 * 16;
    EXPECT_DOUBLE_EQ(fvu_from_sums(1.0, 4.0, 10.0, elements), 0.25);
    // Data of any scale with real variance keeps its FVU: 1e-15-sized values with unit-relative
    // spread.
    EXPECT_DOUBLE_EQ(fvu_from_sums(1e-31, 4e-30, 8e-30, elements), 0.025);
    EXPECT_TRUE(std::isnan(fvu_from_sums(0.0, 0.0, 0.0, elements)));  // all zeros
    // Identical rows of a value around 3: sum ||x||^2 = 9 per value, and the float32 sums leave
    // an sst of a few parts in 1e7 of it.
    EXPECT_TRUE(std::isnan(fvu_from_sums(1e-3, 9.0 * elements * 3e-7, 9.0 * elements, elements)));
    // Denormal rows (about 1e-41): their squares flush to zero in float32, or are at most 1e-82.
    EXPECT_TRUE(std::isnan(fvu_from_sums(0.0, 1e-82 * elements, 2e-82 * elements, elements)));
    EXPECT_TRUE(std::isnan(fvu_from_sums(1.0, -1e-9, 1.0, elements)));  // a rounding below zero
    // Just above the relative floor, FVU is defined again.
    EXPECT_FALSE(std::isnan(fvu_from_sums(1.0, 2e-5, 1.0, elements)));
}

}  // namespace

namespace {

// data.normalize: the SAE trains on c x with mean ||c x||^2 = d_model, so the same data at
// another scale trains the same SAE; final weights (folded) then differ by exactly that scale.
TEST(Recipes, NormalizeMakesTrainingScaleFree) {
    const int64_t d = 16, n = 32, rows = 128;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(2.0f, 1.0f);
    std::vector<std::vector<float>> batches(6, std::vector<float>(rows * d));
    for (auto& b : batches)
        for (float& v : b) v = normal(rng);
    auto train = [&](float scale) {
        SaeConfig cfg;
        cfg.arch = "topk";
        cfg.n_latents = n;
        cfg.k = 4;
        cfg.normalize = "expected_average_only_in";
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, d, 5, 0, *be, *self);
        std::vector<float> x;
        for (size_t i = 0; i < batches.size(); ++i) {
            x = batches[i];
            for (float& v : x) v *= scale;
            if (i == 0)
                tr.init(x.data(), rows);
            else
                tr.step(x.data(), rows);
        }
        return std::make_pair(tr.input_scale(), trainer_weights(tr));
    };
    const auto [c1, w1] = train(1.0f);
    const auto [c100, w100] = train(100.0f);
    // c = sqrt(d / mean ||x||^2): the scaled data's c is 100 times smaller.
    double sq = 0;
    for (float v : batches[0]) sq += double(v) * v;
    EXPECT_NEAR(c1, std::sqrt(double(d) * rows / sq), 1e-5 * c1);
    EXPECT_NEAR(c100 * 100.0f, c1, 1e-5 * c1);
    // The SAE inside is the same (float round-off of c x apart).
    for (size_t i = 0; i < w1.at("W_dec").size(); ++i)
        ASSERT_NEAR(w1.at("W_dec")[i], w100.at("W_dec")[i], 1e-3);
    // Folded, each works on its own raw activations: decoder and b_dec scale with the data.
    const std::vector<ParamSegment> declared = sae_tensors(n, d);  // TopK's: an SAE's four
    const SaeWeights f1 = fold_activation_scale(w1, declared);
    const SaeWeights f100 = fold_activation_scale(w100, declared);
    EXPECT_EQ(f1.tensors.size(), 4u) << "activation_scale folded in";
    for (size_t i = 0; i < f1.at("b_dec").size(); ++i)
        EXPECT_NEAR(f100.at("b_dec")[i], 100.0f * f1.at("b_dec")[i],
                    1e-2 * std::abs(100.0f * f1.at("b_dec")[i]) + 1e-2);
    // A folded SAE reconstructs raw x as the unfolded one reconstructs c x, divided by c.
    const std::vector<float>& x = batches[5];
    auto reconstruct = [&](const SaeWeights& w, float in_scale, int64_t r) {
        std::vector<double> pre(n), xh(d);
        for (int64_t l = 0; l < n; ++l) {
            double a = w.at("b_enc")[l];
            for (int64_t c = 0; c < d; ++c)
                a += (in_scale * x[r * d + c] - w.at("b_dec")[c]) * w.at("W_enc")[c * n + l];
            pre[l] = a;
        }
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return pre[a] > pre[b]; });
        for (int64_t c = 0; c < d; ++c) xh[c] = w.at("b_dec")[c];
        for (int64_t j = 0; j < 4; ++j)
            for (int64_t c = 0; c < d; ++c)
                xh[c] += std::max(pre[order[j]], 0.0) * w.at("W_dec")[order[j] * d + c];
        return xh;
    };
    for (int64_t r = 0; r < 4; ++r) {
        const auto inside = reconstruct(w1, c1, r), raw = reconstruct(f1, 1.0f, r);
        for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(raw[c], inside[c] / c1, 1e-4);
    }
}

// b_dec_init: zeros; the mean; the geometric median, which an outlier row barely moves.
TEST(Recipes, DecoderBiasInitializations) {
    const int64_t d = 4, rows = 101;
    std::vector<float> x(static_cast<size_t>(rows * d), 1.0f);
    std::mt19937 rng(2);
    std::normal_distribution<float> noise(0.0f, 0.01f);
    for (float& v : x) v += noise(rng);
    for (int64_t c = 0; c < d; ++c) x[100 * d + c] = 1000.0f;  // one far outlier
    auto b_dec_of = [&](const char* init) {
        SaeConfig cfg;
        cfg.arch = "relu";
        cfg.n_latents = 8;
        cfg.b_dec_init = init;
        cfg.encoder_init = "transpose";
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, d, 1, 0, *be, *self);
        tr.init(x.data(), rows);
        return trainer_weights(tr).at("b_dec");
    };
    for (float v : b_dec_of("zeros")) EXPECT_EQ(v, 0.0f);
    for (float v : b_dec_of("mean")) EXPECT_NEAR(v, (100 * 1.0 + 1000.0) / 101, 1e-2);
    for (float v : b_dec_of("geometric_median")) EXPECT_NEAR(v, 1.0, 0.02);
}

}  // namespace

namespace {

// train.accum_steps: a batch in chunks gives the step the whole batch gives (the same summed
// gradient, float round-off apart) for every architecture whose selection is per row.
TEST(Recipes, GradientAccumulationEqualsTheWholeBatch) {
    const int64_t d = 12, n = 32, rows = 96;
    for (const char* arch : {"topk", "relu", "jumprelu", "gated"}) {
        std::mt19937 rng(9);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<std::vector<float>> batches(4, std::vector<float>(rows * d));
        for (auto& b : batches)
            for (float& v : b) v = normal(rng);
        auto train = [&](int64_t accum) {
            SaeConfig cfg;
            cfg.arch = arch;
            cfg.n_latents = n;
            cfg.k = 4;
            cfg.l1_coeff = 0.1;
            cfg.l0_coeff = 0.01;
            cfg.lr = 1e-2;
            cfg.accum_steps = accum;
            auto be = make_cpu_backend(1);
            auto self = make_self_comm();
            SaeTrainer tr(cfg, d, 3, 0, *be, *self);
            tr.init(batches[0].data(), rows);
            std::vector<StepResult> res;
            for (int s = 1; s <= 3; ++s) res.push_back(tr.step(batches[s].data(), rows));
            return std::make_pair(tr.params_host(), res);
        };
        const auto [p1, r1] = train(1);
        const auto [p3, r3] = train(3);
        for (size_t s = 0; s < r1.size(); ++s) {
            EXPECT_EQ(r3[s].rows, r1[s].rows) << arch;
            EXPECT_NEAR(r3[s].loss, r1[s].loss, 1e-5 * std::abs(r1[s].loss)) << arch;
            EXPECT_NEAR(r3[s].sst, r1[s].sst, 1e-4 * std::abs(r1[s].sst)) << arch;
            EXPECT_NEAR(r3[s].grad_norm, r1[s].grad_norm, 1e-4 * r1[s].grad_norm) << arch;
            EXPECT_EQ(r3[s].l0, r1[s].l0) << arch;
        }
        double worst = 0;
        for (size_t i = 0; i < p1.size(); ++i)
            worst = std::max(worst, double(std::abs(p1[i] - p3[i])));
        EXPECT_LT(worst, 1e-4) << arch << ": parameters after 3 steps";
    }
}

}  // namespace

namespace {

// The CPU batch selection against a sort: the count-th largest positive value exactly, with
// ties, for counts the sampled guess covers and counts that force its fallback (more than
// half the positives, all of them, more than all); select_above keeps exactly the values at or
// above it, in latent order.
TEST(BatchSelection, ThresholdIsTheExactOrderStatistic) {
    const int64_t rows = 2048, n = 96;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> pre(static_cast<size_t>(rows * n)), bias(static_cast<size_t>(n));
    for (float& v : pre) v = std::round(normal(rng) * 64.0f) / 64.0f;  // many ties
    for (float& v : bias) v = std::round(normal(rng) * 8.0f) / 64.0f;
    std::vector<float> pos;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i)
            if (pre[r * n + i] + bias[i] > 0) pos.push_back(pre[r * n + i] + bias[i]);
    std::sort(pos.rbegin(), pos.rend());
    auto cpu = make_cpu_backend(2);
    BatchTopkOps* be = &arch_ops<BatchTopkOps>(*cpu, batchtopk_op_set());  // its CPU reference
    const auto npos = static_cast<int64_t>(pos.size());
    for (int64_t count : {int64_t{1}, int64_t{100}, rows * 4, npos / 2 + 7, npos, npos + 50}) {
        const float t = be->batch_threshold(pre.data(), bias.data(), rows, n, count);
        EXPECT_EQ(t, pos[static_cast<size_t>(std::min(count, npos) - 1)]) << "count " << count;
        const int64_t width = n;
        std::vector<int32_t> idx(static_cast<size_t>(rows * width));
        std::vector<float> val(idx.size());
        be->select_above(pre.data(), bias.data(), t, rows, n, width, idx.data(), val.data());
        int64_t kept = 0;
        for (int64_t r = 0; r < rows; ++r) {
            int64_t j = 0;
            for (int64_t i = 0; i < n; ++i) {
                const float v = pre[r * n + i] + bias[i];
                if (!(v > 0 && v >= t)) continue;
                ASSERT_EQ(idx[r * width + j], i);
                ASSERT_EQ(val[r * width + j], v);
                ++j, ++kept;
            }
            for (; j < width; ++j) ASSERT_EQ(val[r * width + j], 0.0f);
        }
        EXPECT_GE(kept, std::min(count, npos));  // ties at the threshold are all kept
    }
    std::vector<float> negative(pre.size(), -1.0f);
    EXPECT_EQ(be->batch_threshold(negative.data(), bias.data(), rows, n, 10), 0.0f);
}

}  // namespace

namespace {

// train.decorr_coeff: the penalty's gradient through every architecture's activations
// (dense ones, and the (latent, value) pairs of TopK and BatchTopK).
TEST(ArchGradients, DecorrelationPenaltyMatchesFiniteDifferences) {
    for (const char* arch : {"relu", "topk", "batchtopk", "jumprelu", "gated"}) {
        Ref s;
        s.arch = arch;
        s.rows = 16;
        s.decorr = 0.7;
        s.l1 = std::string(arch) == "gated" ? 0.1 : 0.0;
        s.l0 = 0.0;
        s.bandwidth = 0.4;
        auto be = make_cpu_backend(2);
        auto self = make_self_comm();
        SaeTrainer tr(base_config(s), s.d, 10, 0, *be, *self);
        std::mt19937 rng(13);
        const std::vector<float> x = random_rows(s, rng);
        tr.set_params_host(random_params(tr, rng));
        const int64_t lt =
            tr.layout().has("log_threshold") ? tr.layout().offset("log_threshold") : -1;
        SCOPED_TRACE(arch);
        check_fd(tr, x, s, [&](size_t i) {  // JumpReLU's threshold: a surrogate, tested above
            return lt >= 0 && static_cast<int64_t>(i) >= lt && static_cast<int64_t>(i) < lt + s.n;
        });
        // The penalty is there: without it the loss is lower by decorr * R.
        const std::vector<float> pf = tr.params_host();
        const std::vector<double> pd(pf.begin(), pf.end());
        Ref plain = s;
        plain.decorr = 0;
        EXPECT_GT(ref_loss(pd, pd, x, s) - ref_loss(pd, pd, x, plain), 1e-3);
    }
}

}  // namespace

// parallel.latent_shards: what cannot be sharded is refused at start-up, naming the key.
TEST(LatentSharding, UnshardableConfigsAreRefusedNamingTheKey) {
    auto error_of = [](const SaeConfig& c, int64_t n, int64_t shards) -> std::string {
        try {
            check_latent_sharding(c, 64, n, shards, "cfg.yaml: ");
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    SaeConfig c;
    c.arch = "topk";
    c.k = 32;
    EXPECT_EQ(error_of(c, 256, 4), "");
    EXPECT_EQ(error_of(c, 250, 1), "");  // one shard: nothing to check
    EXPECT_NE(error_of(c, 250, 4).find("cfg.yaml: parallel.latent_shards = 4 does not divide the "
                                       "SAE's 250 latents"),
              std::string::npos);
    EXPECT_NE(error_of(c, 64, 4).find("sae.k = 32 exceeds the 16 latents of one of the 4"),
              std::string::npos);
    c.k = 4;
    c.set("train.auxk_coeff", 0.03);  // the default k_aux: d_model / 2 = 32 > 16
    EXPECT_NE(error_of(c, 64, 4).find("sae.k_aux = 32 exceeds"), std::string::npos);
    c.decorr_coeff = 0.1;
    EXPECT_NE(error_of(c, 256, 4).find("train.decorr_coeff"), std::string::npos);
    for (const char* arch : {"switch"}) {
        SaeConfig a;
        a.arch = arch;
        EXPECT_NE(error_of(a, 256, 2).find(std::string("a ") + arch + " SAE cannot be"),
                  std::string::npos)
            << arch;
    }
    // The refusal lists the architectures that can be sharded, every one of them, from the
    // registry (a hand-kept list went stale).
    SaeConfig sw;
    sw.arch = "switch";
    const std::string refusal = error_of(sw, 256, 2);
    const size_t at = refusal.find("(these can:");
    ASSERT_NE(at, std::string::npos) << refusal;
    const std::string listed = refusal.substr(at + 11);
    for (const std::string& name : arch_names())
        EXPECT_EQ(listed.find(" " + name + ",") != std::string::npos ||
                      listed.find(" " + name + ")") != std::string::npos,
                  arch_get(name).latent_shardable())
            << name << ": " << refusal;
    for (const char* arch : {"relu", "jumprelu", "batchtopk", "gated"}) {
        SaeConfig a;
        a.arch = arch;
        a.k = 200;  // more than a shard's 128 latents: BatchTopK's selection is over the batch
        a.set("train.auxk_coeff", 0);
        EXPECT_EQ(error_of(a, 256, 2), "") << arch;
    }
}

// --- the architectures' own ops (arch_ops.h) ----------------------------------------------------
namespace {

// A backend with none of one op set's ops, as a build whose backend lacks an architecture's
// kernels.
class WithoutOps final : public ForwardingBackend {
public:
    WithoutOps(Backend& be, const ArchOpSet& missing) : ForwardingBackend(be), missing_(&missing) {}
    ArchOps* arch_ops(const ArchOpSet& set) override {
        return &set == missing_ ? nullptr : ForwardingBackend::arch_ops(set);
    }

private:
    const ArchOpSet* missing_;
};

// Records the name of every op that passes through it.
class Recorder final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void around(const std::string& op, const std::function<void()>& f) override {
        seen.insert(op);
        f();
    }
    std::set<std::string> seen;
};

SaeConfig small_config(const char* arch) {
    SaeConfig cfg;
    cfg.arch = arch;
    cfg.expansion = 4;
    cfg.k = 4;
    cfg.set("sae.n_experts", 2);
    cfg.set("sae.matryoshka_prefixes", IntList{8, 32});
    return cfg;
}

// Refused where the run is configured (saetrain's start-up and the trainer both ask), in one
// line naming the backend, the architecture and the ops it lacks; the other architectures
// still train on it.
TEST(ArchOps, ABackendWithoutAnArchitecturesOpsRefusesIt) {
    auto cpu = make_cpu_backend(1);
    auto self = make_self_comm();
    int sets = 0;
    for (const Architecture* a : architectures()) {
        for (const ArchOpSet* set : a->op_sets()) {
            ++sets;
            WithoutOps be(*cpu, *set);
            const SaeConfig cfg = small_config(a->name());
            try {
                arch_check_backend(cfg, 16, 64, be);
                ADD_FAILURE() << a->name() << " was not refused";
            } catch (const Error& e) {
                const std::string m = e.what();
                EXPECT_EQ(m.find('\n'), std::string::npos) << m;
                EXPECT_EQ(m.rfind("sae.arch = " + std::string(a->name()) + ": the " + be.name() +
                                      " backend has no implementation of the " + set->name +
                                      " SAE's ops (",
                                  0),
                          0u)
                    << m;
                for (const std::string& op : set->ops)
                    EXPECT_NE(m.find(op), std::string::npos) << m;
            }
            EXPECT_THROW(SaeTrainer(cfg, 16, 10, 0, be, *self), Error) << a->name();
            for (const Architecture* other : architectures()) {
                if (!other->op_sets().empty()) continue;
                EXPECT_NO_THROW(arch_check_backend(small_config(other->name()), 16, 64, be));
            }
        }
    }
    EXPECT_GE(sets, 7);  // relu, batchtopk, jumprelu, gated, switch, matryoshka's two
}

// A ForwardingBackend (bench_step's per-op timing, the tests' recorders) sees every op of the
// architectures' own sets in a training step, by the names the sets give them. A transcoder's
// sets are its activations' (sae.transcoder_activation): each is seen with one of them.
TEST(ArchOps, AForwardingBackendSeesEveryArchitectureOp) {
    auto cpu = make_cpu_backend(1);
    auto self = make_self_comm();
    const int64_t d = 16, rows = 64;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows * 2 * d));  // wide enough for [x | y] rows
    for (float& v : x) v = normal(rng);
    for (const Architecture* a : architectures()) {
        std::set<std::string> seen;
        for (const char* act : {"topk", "batchtopk", "jumprelu"}) {
            SaeConfig cfg = small_config(a->name());
            if (a->rows().target)
                cfg.set("sae.transcoder_activation", act);
            else if (std::string(act) != "topk")
                continue;
            Recorder rec(*cpu);
            SaeTrainer tr(cfg, d, 10, 0, rec, *self);
            tr.init(x.data(), rows);
            tr.step(x.data(), rows);
            seen.insert(rec.seen.begin(), rec.seen.end());
        }
        for (const ArchOpSet* set : a->op_sets())
            for (const std::string& op : set->ops)
                EXPECT_EQ(seen.count(op), 1u) << a->name() << ": " << op;
    }
}

}  // namespace
