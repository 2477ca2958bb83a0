// Finite-difference checks of the analytic gradients, for ReLU-L1 and TopK SAEs, transcoders
// with TopK, BatchTopK and JumpReLU activations, and cross-layer transcoders.
//
// The reference loss is an independent forward pass written here in double precision, so the
// central differences are accurate to ~1e-8 and any disagreement is the analytic gradient's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "fd_check.h"
#include "saetrain/arch.h"
#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/trainer.h"

using namespace saetrain;

namespace {

struct Dims {
    int64_t rows, d, n, k;
};

// L = mean_t ||x_hat_t - x_t||^2 + l1 * mean_t sum_i z_ti ||W_dec_i||, flat layout as in trainer.h.
// A transcoder (y given): the encoder reads x without b_dec, x_hat approximates y, and with
// `skip` x_hat adds x W_skip^T (W_skip [d, d] after b_dec in the layout). `act` "batchtopk":
// the k * rows largest positive pre-activations of the batch; "jumprelu": pre where it exceeds
// exp(log_threshold) (log_threshold [n] after b_dec, before W_skip), plus l0 per firing.
double ref_loss(const std::vector<double>& p, const std::vector<float>& x, const Dims& s,
                const std::string& arch, double l1, const std::vector<float>* y = nullptr,
                bool skip = false, const std::string& act = "topk", double l0 = 0) {
    const int64_t d = s.d, n = s.n;
    const double* w_enc = p.data();
    const double* w_dec = p.data() + n * d;
    const double* b_enc = p.data() + 2 * n * d;
    const double* b_dec = b_enc + n;
    const double* log_threshold = b_dec + d;
    const double* w_skip = b_dec + d + (act == "jumprelu" ? n : 0);
    const std::vector<float>& target = y ? *y : x;
    std::vector<double> all_pre(static_cast<size_t>(s.rows * n));
    for (int64_t t = 0; t < s.rows; ++t)
        for (int64_t l = 0; l < n; ++l) {
            double a = b_enc[l];
            for (int64_t c = 0; c < d; ++c)
                a += (x[t * d + c] - (y ? 0.0 : b_dec[c])) * w_enc[l * d + c];
            all_pre[t * n + l] = a;
        }
    double batch_t = 0;  // BatchTopK: the (k * rows)-th largest positive value of the batch
    if (act == "batchtopk") {
        std::vector<double> v = all_pre;
        std::sort(v.begin(), v.end(), std::greater<double>());
        batch_t = std::max(v[static_cast<size_t>(s.k * s.rows - 1)], 1e-300);
    }
    double loss = 0;
    for (int64_t t = 0; t < s.rows; ++t) {
        std::vector<double> pre(all_pre.begin() + t * n, all_pre.begin() + (t + 1) * n), z(n, 0.0);
        if (arch == "relu") {
            for (int64_t l = 0; l < n; ++l) z[l] = std::max(pre[l], 0.0);
        } else if (act == "batchtopk") {
            for (int64_t l = 0; l < n; ++l) z[l] = pre[l] >= batch_t ? pre[l] : 0.0;
        } else if (act == "jumprelu") {
            for (int64_t l = 0; l < n; ++l)
                if (pre[l] > std::exp(log_threshold[l])) z[l] = pre[l], loss += l0;
        } else {
            std::vector<int64_t> order(n);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(),
                             [&](int64_t a, int64_t b) { return pre[a] > pre[b]; });
            for (int64_t j = 0; j < s.k; ++j) z[order[j]] = std::max(pre[order[j]], 0.0);
        }
        for (int64_t c = 0; c < d; ++c) {
            double xh = b_dec[c];
            for (int64_t l = 0; l < n; ++l) xh += z[l] * w_dec[l * d + c];
            if (skip)
                for (int64_t j = 0; j < d; ++j) xh += x[t * d + j] * w_skip[c * d + j];
            loss += (xh - target[t * d + c]) * (xh - target[t * d + c]);
        }
        for (int64_t l = 0; l < n; ++l) {
            double nrm = 0;
            for (int64_t c = 0; c < d; ++c) nrm += w_dec[l * d + c] * w_dec[l * d + c];
            loss += l1 * z[l] * std::sqrt(nrm);
        }
    }
    return loss / static_cast<double>(s.rows);
}

// `act`: a transcoder's sae.transcoder_activation. JumpReLU's threshold gets a straight-through
// pseudo-gradient, not the true one (zero almost everywhere), so its log_threshold is not
// checked; every other parameter's gradient is exact.
void check_gradients(const std::string& arch, const std::string& act = "topk") {
    const Dims s{8, 12, 24, 5};
    const bool transcodes = arch_get(arch).rows().target, skip = arch == "skip_transcoder";
    const bool jumprelu = act == "jumprelu";
    SaeConfig cfg;
    cfg.arch = arch;
    if (transcodes) cfg.set("sae.transcoder_activation", act);
    cfg.l0_coeff = jumprelu ? 0.1 : 0.0;
    cfg.n_latents = s.n;
    cfg.k = s.k;
    cfg.l1_coeff = arch == "relu" ? 0.7 : 0.0;
    cfg.l1_warmup_fraction = 0;     // the full coefficient from step 0, as the reference has it
    cfg.normalize_decoder = false;  // keep the norm-weighted L1 gradient visible
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, s.d, 10, 0, *be, *self);

    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(s.rows * s.d), y(x.size()),
        p(static_cast<size_t>(2 * s.n * s.d + s.n + s.d + (jumprelu ? s.n : 0) +
                              (skip ? s.d * s.d : 0)));
    ASSERT_EQ(p.size(), tr.params_host().size());
    for (float& v : x) v = normal(rng);
    for (float& v : y) v = normal(rng);
    for (float& v : p) v = 0.4f * normal(rng);
    tr.set_params_host(p);
    const std::vector<float>* target = transcodes ? &y : nullptr;
    auto ref = [&](const std::vector<double>& q) {
        return ref_loss(q, x, s, arch, cfg.l1_coeff, target, skip, act, cfg.l0_coeff);
    };
    const auto thresholds_begin = static_cast<size_t>(2 * s.n * s.d + s.n + s.d);
    const auto thresholds_end = thresholds_begin + (jumprelu ? static_cast<size_t>(s.n) : 0);

    // CPU: host memory is fine
    const StepResult r = tr.compute_gradients(x.data(), s.rows, 0, transcodes ? y.data() : nullptr);
    const std::vector<float> g = tr.grads_host();
    std::vector<double> pd(p.begin(), p.end());
    const double l0 = ref(pd);
    EXPECT_NEAR(r.loss, l0, 1e-4 * std::abs(l0)) << "trainer loss differs from the reference";

    const double h = 1e-5;
    int checked = 0, kinks = 0;
    double worst = 0;
    for (size_t i = 0; i < pd.size(); ++i) {
        if (i >= thresholds_begin && i < thresholds_end) continue;  // straight-through
        const double keep = pd[i];
        pd[i] = keep + h;
        const double lp = ref(pd);
        pd[i] = keep - h;
        const double lm = ref(pd);
        pd[i] = keep;
        // At a kink (ReLU at 0, a TopK selection change) the one-sided slopes disagree: skip.
        const double right = (lp - l0) / h, left = (l0 - lm) / h;
        if (std::abs(right - left) > 1e-3 * (1 + std::abs(right))) {
            ++kinks;
            continue;
        }
        const double fd = (lp - lm) / (2 * h);
        // float32 gradients accumulated over 8 rows and 12..24 terms: 1e-3 relative is ample
        // for round-off, while a missing or wrong term (a factor of 2, a dropped bias path) is
        // off by far more.
        const double err = std::abs(g[i] - fd) / (1e-3 + std::abs(fd));
        worst = std::max(worst, err);
        EXPECT_LT(err, 2e-3) << "parameter " << i << ": analytic " << g[i] << " vs fd " << fd;
        ++checked;
    }
    EXPECT_LT(kinks, static_cast<int>(pd.size() / 20)) << "too many kinks to trust the check";
    EXPECT_GT(checked, 0);
    std::printf("%s: %d gradients checked, %d kinks skipped, worst rel err %.2e\n", arch.c_str(),
                checked, kinks, worst);
}

TEST(Gradients, ReluL1MatchesFiniteDifferences) { check_gradients("relu"); }

// A non-finite loss (here from values so large their squares overflow) leaves the parameters
// untouched, and max_bad_steps of them in a row stop training with an error.
TEST(Gradients, NonFiniteStepsAreSkippedThenStop) {
    SaeConfig cfg;
    cfg.arch = "topk";
    cfg.n_latents = 16;
    cfg.k = 2;
    cfg.max_bad_steps = 3;
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, 4, 10, 0, *be, *self);
    std::vector<float> ok(8 * 4, 0.5f), huge(8 * 4, 3e38f);
    tr.init(ok.data(), 8);
    tr.step(ok.data(), 8);
    const std::vector<float> before = tr.params_host();
    EXPECT_TRUE(tr.step(huge.data(), 8).skipped);
    EXPECT_TRUE(tr.step(huge.data(), 8).skipped);
    EXPECT_EQ(tr.params_host(), before);
    EXPECT_EQ(tr.step_count(), 1);
    EXPECT_FALSE(tr.step(ok.data(), 8).skipped);  // a good step resets the count
    EXPECT_TRUE(tr.step(huge.data(), 8).skipped);
    EXPECT_TRUE(tr.step(huge.data(), 8).skipped);
    EXPECT_THROW(tr.step(huge.data(), 8), Error);
}
TEST(Gradients, TopkMatchesFiniteDifferences) { check_gradients("topk"); }

// The transcoders: the encoder reads x as it is (no b_dec term), the loss is against y, and the
// skip-transcoder's W_skip gets (dL/dy_hat)^T x.
TEST(Gradients, TranscoderMatchesFiniteDifferences) { check_gradients("transcoder"); }
TEST(Gradients, SkipTranscoderMatchesFiniteDifferences) { check_gradients("skip_transcoder"); }
// With BatchTopK's batch selection and JumpReLU's thresholds (and its L0 term in the loss).
TEST(Gradients, BatchTopkTranscodersMatchFiniteDifferences) {
    check_gradients("transcoder", "batchtopk");
    check_gradients("skip_transcoder", "batchtopk");
}
TEST(Gradients, JumpReluTranscodersMatchFiniteDifferences) {
    check_gradients("transcoder", "jumprelu");
    check_gradients("skip_transcoder", "jumprelu");
}

// --- cross-layer transcoders ---------------------------------------------------------------
// An independent reference with the layers written out: layer l's latents (n / L of them, in
// layer order) read x_l only, and write to y_m for every m >= l. `act` as above; TopK and
// BatchTopK keep k L per token (k per token and layer on average) over all layers' latents, or
// with `per_layer` (sae.k_scope: layer) each layer's k largest of a token / k B of the batch.
double ref_clt_loss(const std::vector<double>& p, const std::vector<float>& x,
                    const std::vector<float>& y, const Dims& s, int64_t L, const std::string& act,
                    double l0, bool per_layer, double tanh_c = 0, bool skip = false) {
    const int64_t d = s.d, n = s.n, dl = d / L, nl = n / L, k = s.k * L;
    const double* w_enc = p.data();  // [n, d_l]: latent i's weights on its layer's values
    const double* w_dec = p.data() + n * dl;
    const double* b_enc = w_dec + n * d;
    const double* b_dec = b_enc + n;
    const double* log_threshold = b_dec + d;
    // sae.skip's W_skip [L, d_l (out), d_l (in)], after every other parameter.
    const double* w_skip = log_threshold + (act == "jumprelu" ? n : 0);
    std::vector<double> pre(static_cast<size_t>(s.rows * n));
    for (int64_t t = 0; t < s.rows; ++t)
        for (int64_t i = 0; i < n; ++i) {
            const int64_t l = i / nl;
            double a = b_enc[i];
            for (int64_t c = 0; c < dl; ++c) a += double(x[t * d + l * dl + c]) * w_enc[i * dl + c];
            pre[t * n + i] = a;
        }
    // The batch threshold of each group of latents (all of them, or each layer's).
    const int64_t groups = per_layer ? L : 1, width = n / groups, kg = per_layer ? s.k : k;
    std::vector<double> batch_t(static_cast<size_t>(groups), 0.0);
    if (act == "batchtopk")
        for (int64_t g = 0; g < groups; ++g) {
            std::vector<double> v;
            for (int64_t t = 0; t < s.rows; ++t)
                v.insert(v.end(), pre.begin() + t * n + g * width,
                         pre.begin() + t * n + (g + 1) * width);
            std::sort(v.begin(), v.end(), std::greater<double>());
            batch_t[g] = std::max(v[static_cast<size_t>(kg * s.rows - 1)], 1e-300);
        }
    double loss = 0;
    for (int64_t t = 0; t < s.rows; ++t) {
        const double* row = pre.data() + t * n;
        std::vector<double> z(static_cast<size_t>(n), 0.0);
        if (act == "jumprelu") {
            for (int64_t i = 0; i < n; ++i) {
                if (row[i] > std::exp(log_threshold[i])) z[i] = row[i];
                if (tanh_c == 0) {
                    loss += z[i] != 0 ? l0 : 0.0;
                } else {  // l0 tanh(c z ||W_dec_i||), the row's norm over every layer
                    double norm = 0;
                    for (int64_t c = 0; c < d; ++c) norm += w_dec[i * d + c] * w_dec[i * d + c];
                    loss += l0 * std::tanh(tanh_c * z[i] * std::sqrt(norm));
                }
            }
        } else if (act == "batchtopk") {
            for (int64_t i = 0; i < n; ++i) z[i] = row[i] >= batch_t[i / width] ? row[i] : 0.0;
        } else {
            for (int64_t g = 0; g < groups; ++g) {
                std::vector<int64_t> order(static_cast<size_t>(width));
                std::iota(order.begin(), order.end(), g * width);
                std::stable_sort(order.begin(), order.end(),
                                 [&](int64_t a, int64_t b) { return row[a] > row[b]; });
                for (int64_t j = 0; j < kg; ++j) z[order[j]] = std::max(row[order[j]], 0.0);
            }
        }
        for (int64_t m = 0; m < L; ++m)
            for (int64_t c = 0; c < dl; ++c) {
                double yh = b_dec[m * dl + c];
                for (int64_t i = 0; i < (m + 1) * nl; ++i)  // latents of layers 0..m
                    yh += z[i] * w_dec[i * d + m * dl + c];
                for (int64_t j = 0; skip && j < dl; ++j)
                    yh += w_skip[(m * dl + c) * dl + j] * x[t * d + m * dl + j];
                const double e = yh - y[t * d + m * dl + c];
                loss += e * e;
            }
    }
    return loss / static_cast<double>(s.rows);
}

// A CLT of 3 layers of 4 values, 8 latents each: every live parameter's gradient against finite
// differences of the reference, and exactly zero gradient for the blocks outside the structure
// (the decoders to earlier layers; the compact encoder [n, d_l] has none).
void check_clt_gradients(const std::string& act, bool per_layer = false, bool tanh = false,
                         bool skip = false) {
    const int64_t L = 3;
    const Dims s{8, 12, 24, 2};
    const int64_t dl = s.d / L, nl = s.n / L;
    const bool jumprelu = act == "jumprelu";
    SaeConfig cfg;
    cfg.arch = "clt";
    cfg.layers = L;
    cfg.set("sae.transcoder_activation", act);
    if (per_layer) cfg.set("sae.k_scope", "layer");
    if (tanh) cfg.set("sae.jumprelu_sparsity_loss_mode", "tanh");
    if (skip) cfg.set("sae.skip", true);
    cfg.l0_coeff = jumprelu ? 0.1 : 0.0;
    cfg.n_latents = s.n;
    cfg.k = s.k;
    cfg.l1_warmup_fraction = 0;  // JumpReLU's l0 coefficient in full from step 0
    cfg.normalize_decoder = false;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, s.d, 10, 0, *be, *self);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(s.rows * s.d), y(x.size()),
        p(static_cast<size_t>(s.n * dl + s.n * s.d + s.n + s.d + (jumprelu ? s.n : 0) +
                              (skip ? L * dl * dl : 0)));
    ASSERT_EQ(p.size(), tr.params_host().size());
    for (float& v : x) v = normal(rng);
    for (float& v : y) v = normal(rng);
    for (float& v : p) v = 0.4f * normal(rng);
    // Whether parameter index i lies in a block the structure holds at zero.
    auto masked = [&](size_t i) {
        const int64_t j = static_cast<int64_t>(i) - s.n * dl;  // into W_dec [n, d]
        if (j < 0 || j >= s.n * s.d) return false;
        return (j % s.d) / dl < (j / s.d) / nl;  // a block to a layer before the latent's
    };
    for (size_t i = 0; i < p.size(); ++i)
        if (masked(i)) p[i] = 0.0f;
    tr.set_params_host(p);
    const auto thresholds_begin = static_cast<size_t>(s.n * dl + s.n * s.d + s.n + s.d);
    const size_t thresholds_end = thresholds_begin + (jumprelu ? static_cast<size_t>(s.n) : 0);
    int zeros = 0;
    saetrain::testing::check_fd(
        tr, x, s.rows,
        [&](const std::vector<double>& q, const std::vector<double>&) {
            return ref_clt_loss(q, x, y, s, L, act, cfg.l0_coeff, per_layer, tanh ? 4.0 : 0.0,
                                skip);
        },
        "clt/" + act + (per_layer ? "/layer" : "") + (tanh ? "/tanh" : "") + (skip ? "/skip" : ""),
        // Outside the structure (checked for exact zeros below), or straight-through.
        [&](size_t i) { return masked(i) || (i >= thresholds_begin && i < thresholds_end); }, {},
        &y);
    const std::vector<float> g = tr.grads_host();
    for (size_t i = 0; i < g.size(); ++i)
        if (masked(i)) {
            EXPECT_EQ(g[i], 0.0f) << act << ": parameter " << i << " outside the structure";
            ++zeros;
        }
    EXPECT_EQ(zeros, static_cast<int>(s.n * s.d * (L - 1) / (2 * L)));
}

TEST(Gradients, CltMatchesFiniteDifferences) {
    for (const char* act : {"topk", "batchtopk", "jumprelu"}) check_clt_gradients(act);
}
// sae.jumprelu_sparsity_loss_mode: tanh, the penalty l0 * tanh(4 z ||W_dec_i||) in place of the L0
// term (its gradient reaches W_dec through the decoder norms).
TEST(Gradients, CltWithTheTanhPenaltyMatchesFiniteDifferences) {
    check_clt_gradients("jumprelu", false, true);
}
// sae.k_scope: layer, each layer's own k (TopK) or k B (BatchTopK).
TEST(Gradients, PerLayerCltMatchesFiniteDifferences) {
    for (const char* act : {"topk", "batchtopk"}) check_clt_gradients(act, true);
}
// sae.skip: each layer's W_skip_l gets (dL/dy_hat_l)^T x_l, beside every activation's gradients.
TEST(Gradients, SkipCltMatchesFiniteDifferences) {
    for (const char* act : {"topk", "batchtopk", "jumprelu"})
        check_clt_gradients(act, false, false, true);
    check_clt_gradients("topk", true, false, true);
}

}  // namespace
