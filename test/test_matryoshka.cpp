// Matryoshka BatchTopK (src/core/arch/matryoshka.cpp): its gradients against finite differences
// of an independent double-precision loss (BatchTopK's selection, the whole dictionary's squared
// error plus each inner prefix's), its prefix_mask op against a plain loop, BatchTopK bitwise
// when the only prefix is the whole dictionary, and its per-prefix FVUs (training window and
// held-out) against the same reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fd_check.h"
#include "saetrain/arch.h"
#include "saetrain/arch/matryoshka.h"
#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"

using namespace saetrain;

namespace {

constexpr int64_t kRows = 8, kD = 12, kN = 24, kK = 4;
const IntList kPrefixes = {6, 12};  // inner prefixes of the 24 latents

SaeConfig matryoshka_config(const IntList& prefixes = kPrefixes) {
    SaeConfig cfg;
    cfg.arch = "matryoshka_batchtopk";
    cfg.n_latents = kN;
    cfg.k = kK;
    cfg.normalize_decoder = false;
    cfg.set("sae.matryoshka_prefixes", prefixes);
    return cfg;
}

std::vector<float> normal_values(size_t count, float scale, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(count);
    for (float& f : v) f = scale * normal(rng);
    return v;
}

// The SAE's activations of rows x, in double precision: BatchTopK's selection over the rows
// (training: the (k R)-th largest positive pre-activation is the threshold) or above the
// inference threshold `t`.
std::vector<double> ref_activations(const std::vector<double>& p, const std::vector<float>& x,
                                    int64_t rows, bool training, double t = 0) {
    const double *w_enc = p.data(), *b_enc = p.data() + 2 * kN * kD,
                 *b_dec = p.data() + 2 * kN * kD + kN;
    std::vector<double> v(static_cast<size_t>(rows * kN));
    std::vector<double> positive;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t l = 0; l < kN; ++l) {
            double a = b_enc[l];
            for (int64_t c = 0; c < kD; ++c) a += (x[r * kD + c] - b_dec[c]) * w_enc[l * kD + c];
            v[r * kN + l] = a;
            if (a > 0) positive.push_back(a);
        }
    if (training) {
        std::sort(positive.rbegin(), positive.rend());
        t = positive.empty() ? 0.0 : positive[std::min<size_t>(kK * rows, positive.size()) - 1];
    }
    for (double& a : v) a = a > 0 && a >= t ? a : 0.0;
    return v;
}

// Sum over the rows of ||b_dec + sum_{l < m} z_l W_dec[l] - x||^2.
double ref_sse(const std::vector<double>& p, const std::vector<double>& z,
               const std::vector<float>& x, int64_t rows, int64_t m) {
    const double *w_dec = p.data() + kN * kD, *b_dec = p.data() + 2 * kN * kD + kN;
    double sse = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < kD; ++c) {
            double a = b_dec[c];
            for (int64_t l = 0; l < m; ++l) a += z[r * kN + l] * w_dec[l * kD + c];
            sse += (a - x[r * kD + c]) * (a - x[r * kD + c]);
        }
    return sse;
}

// Sum over the rows of ||x - mean(x)||^2.
double ref_sst(const std::vector<float>& x, int64_t rows) {
    double sst = 0;
    for (int64_t c = 0; c < kD; ++c) {
        double mean = 0;
        for (int64_t r = 0; r < rows; ++r) mean += x[r * kD + c];
        mean /= static_cast<double>(rows);
        for (int64_t r = 0; r < rows; ++r) sst += (x[r * kD + c] - mean) * (x[r * kD + c] - mean);
    }
    return sst;
}

// The one value of the SAE's `name` buffer (BatchTopK's threshold).
double buffer_value(const SaeWeights& w, const std::string& name) {
    if (const WeightTensor* t = w.find(name); t && t->data.size() == 1) return t->data[0];
    ADD_FAILURE() << "no one-value buffer " << name;
    return 0;
}

double figure(const std::vector<std::pair<std::string, double>>& figs, const std::string& name) {
    for (const auto& [n, v] : figs)
        if (n == name) return v;
    ADD_FAILURE() << "no figure " << name;
    return -1;
}

TEST(MatryoshkaGradients, MatchFiniteDifferencesOfTheSummedPrefixLosses) {
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(matryoshka_config(), kD, 10, 0, *be, *self);
    std::mt19937 rng(11);
    const std::vector<float> x = normal_values(kRows * kD, 1.0f, rng);
    tr.set_params_host(normal_values(static_cast<size_t>(tr.layout().total()), 0.4f, rng));
    saetrain::testing::check_fd(
        tr, x, kRows,
        [&](const std::vector<double>& p, const std::vector<double>&) {
            const std::vector<double> z = ref_activations(p, x, kRows, true);
            double loss = ref_sse(p, z, x, kRows, kN);
            for (int64_t m : kPrefixes) loss += ref_sse(p, z, x, kRows, m);
            return loss / static_cast<double>(kRows);
        },
        "matryoshka_batchtopk");
}

// The op against a plain loop, at prefixes that keep nothing, some and everything.
TEST(MatryoshkaOps, PrefixMaskMatchesAPlainLoop) {
    auto be = make_cpu_backend(2);
    MatryoshkaOps& ops = arch_ops<MatryoshkaOps>(*be, matryoshka_op_set());
    std::mt19937 rng(5);
    const int64_t count = 1000, n = 64;
    std::vector<int32_t> idx(count);
    std::uniform_int_distribution<int32_t> latent(0, n - 1);
    for (int32_t& i : idx) i = latent(rng);
    std::vector<float> val = normal_values(count, 1.0f, rng);
    for (int64_t i = 0; i < count; i += 7) val[i] = 0.0f;  // padding entries
    for (int64_t prefix : {int64_t{0}, int64_t{1}, int64_t{17}, n - 1, n}) {
        std::vector<float> out(count, -1.0f);
        ops.prefix_mask(idx.data(), val.data(), count, prefix, out.data());
        int64_t kept = 0;
        for (int64_t i = 0; i < count; ++i) {
            const float want = idx[i] < prefix ? val[i] : 0.0f;
            EXPECT_EQ(out[i], want) << "prefix " << prefix << " entry " << i;
            kept += out[i] != 0.0f;
        }
        if (prefix == 0) {
            EXPECT_EQ(kept, 0);
        }
        if (prefix == n) {
            EXPECT_GT(kept, count / 2);
        }
    }
}

// A trainer stepped `steps` times on fresh rows (AuxK on: latents die after one step).
std::vector<float> train(const SaeConfig& cfg, int steps, std::vector<double>* losses) {
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, kD, steps, 7, *be, *self);
    std::mt19937 rng(21);
    std::vector<float> x = normal_values(64 * kD, 1.0f, rng);
    tr.init(x.data(), 64);
    for (int s = 0; s < steps; ++s) {
        x = normal_values(64 * kD, 1.0f, rng);
        losses->push_back(tr.step(x.data(), 64).loss);
    }
    std::vector<float> p = tr.params_host();
    const SaeWeights w = trainer_weights(tr);
    const std::vector<float>& threshold = w.at("threshold");
    p.insert(p.end(), threshold.begin(), threshold.end());
    return p;
}

TEST(MatryoshkaTraining, TheWholeDictionaryAloneIsBatchTopkBitwise) {
    SaeConfig batchtopk = matryoshka_config();
    batchtopk.arch = "batchtopk";
    // train.optimizer: auto picks signum at the same lr for both (docs/architectures.md, "The
    // optimizer").
    batchtopk.dead_tokens = 1;
    batchtopk.set("sae.k_aux", 3);
    SaeConfig whole = matryoshka_config({kN});
    whole.dead_tokens = 1;
    whole.set("sae.k_aux", 3);
    SaeConfig nested = matryoshka_config();
    nested.dead_tokens = 1;
    nested.set("sae.k_aux", 3);
    std::vector<double> la, lb, lc;
    const std::vector<float> a = train(batchtopk, 8, &la);
    const std::vector<float> b = train(whole, 8, &lb);
    const std::vector<float> c = train(nested, 8, &lc);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(a == b) << "matryoshka_prefixes [n] must train BatchTopK exactly";
    EXPECT_TRUE(la == lb);
    // Inner prefixes change the training (and add their squared errors to the loss).
    EXPECT_FALSE(a == c);
    EXPECT_GT(lc[0], la[0]);
}

// The summary's prefix FVUs: over the training window (here its one step: the last tenth of 3
// steps) from the parameters that step saw, and over held-out rows at the inference threshold.
TEST(MatryoshkaTraining, ReportsEachPrefixsFvuOnTheWindowAndTheHeldOutRows) {
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(matryoshka_config(), kD, 3, 7, *be, *self);
    std::mt19937 rng(31);
    const int64_t rows = 48;
    std::vector<float> x = normal_values(rows * kD, 1.0f, rng);
    tr.init(x.data(), rows);
    std::vector<double> before;
    for (int s = 0; s < 3; ++s) {
        x = normal_values(rows * kD, 1.0f, rng);
        const std::vector<float> p = tr.params_host();
        before.assign(p.begin(), p.end());
        tr.step(x.data(), rows);
    }
    const std::vector<double> z = ref_activations(before, x, rows, true);
    const std::vector<float> held = normal_values(40 * kD, 1.0f, rng);
    tr.evaluate(held.data(), 40, 16);  // three batches: the sums run over all of them
    const std::vector<float> pf = tr.params_host();
    const std::vector<double> p(pf.begin(), pf.end());
    const double t = buffer_value(trainer_weights(tr), "threshold");
    const std::vector<double> zh = ref_activations(p, held, 40, false, t);
    const auto figs = tr.arch_summary();
    EXPECT_EQ(figs.size(), 2 * kPrefixes.size());
    for (int64_t m : kPrefixes) {
        const double window = ref_sse(before, z, x, rows, m) / ref_sst(x, rows);
        EXPECT_NEAR(figure(figs, "fvu_prefix" + std::to_string(m)), window, 1e-4 * window) << m;
        const double eval = ref_sse(p, zh, held, 40, m) / ref_sst(held, 40);
        EXPECT_NEAR(figure(figs, "eval_fvu_prefix" + std::to_string(m)), eval, 1e-4 * eval) << m;
    }
    // The held-out figures belong to an evaluation after the last training step only.
    SaeTrainer again(matryoshka_config(), kD, 3, 7, *be, *self);
    again.init(x.data(), rows);
    again.step(x.data(), rows);
    again.evaluate(held.data(), 40, 16);
    auto has_eval = [](const std::vector<std::pair<std::string, double>>& f) {
        return std::any_of(f.begin(), f.end(),
                           [](const auto& fig) { return fig.first.rfind("eval_", 0) == 0; });
    };
    EXPECT_TRUE(has_eval(again.arch_summary()));
    again.step(x.data(), rows);
    EXPECT_FALSE(has_eval(again.arch_summary()));
}

}  // namespace
