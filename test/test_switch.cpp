// The Switch SAE (src/core/arch/switch.cpp): its gradients, router and balance loss included,
// against finite differences of an independent double-precision forward pass; its equivalence
// to TopK with one expert; the balance loss keeping the experts in use; planted features.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "fd_check.h"
#include "saetrain/arch.h"
#include "saetrain/arch/switch.h"
#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/loader.h"
#include "saetrain/synth.h"
#include "saetrain/train_loop.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"
#include "test_util.h"

using namespace saetrain;

namespace {

struct Ref {
    int64_t rows = 10, d = 10, n = 24, k = 3, E = 3;
    double balance = 0;
    std::vector<uint8_t> dead;  // AuxK: the dead latents
    int64_t k_aux = 0;
    double aux_weight = 0;
};

// The trainer's Switch loss in double precision on the flat parameters p (W_enc [n, d],
// W_dec [n, d], b_enc [n], b_dec [d], W_router [E, d], b_router [E]), summed over rows and
// divided by them. `frozen` holds the parameters of the terms the trainer treats as constants:
// the routing (which expert, and so the token fractions), the balance term's S, AuxK's target.
double ref_loss(const std::vector<double>& p, const std::vector<double>& frozen,
                const std::vector<float>& x, const Ref& s) {
    const int64_t d = s.d, n = s.n, E = s.E, R = s.rows, ne = n / E;
    struct View {
        const double *w_enc, *w_dec, *b_enc, *b_dec, *w_r, *b_r;
    };
    auto view = [&](const std::vector<double>& q) {
        const double* b = q.data();
        return View{b,
                    b + n * d,
                    b + 2 * n * d,
                    b + 2 * n * d + n,
                    b + 2 * n * d + n + d,
                    b + 2 * n * d + n + d + E * d};
    };
    const View P = view(p), F = view(frozen);
    // Router probabilities and the chosen expert of row t under parameters Q.
    auto route = [&](const View& Q, int64_t t, std::vector<double>& prob) {
        prob.assign(E, 0.0);
        int64_t best = 0;
        for (int64_t e = 0; e < E; ++e) {
            double a = Q.b_r[e];
            for (int64_t c = 0; c < d; ++c) a += Q.w_r[e * d + c] * (x[t * d + c] - Q.b_dec[c]);
            prob[e] = a;
            if (a > prob[best]) best = e;
        }
        const double top = prob[best];
        double z = 0;
        for (double& v : prob) z += (v = std::exp(v - top));
        for (double& v : prob) v /= z;
        return best;
    };
    // The expert's pre-activations + b_enc, and its top k (ReLU'd) as (latent, value).
    auto expert_pre = [&](const View& Q, int64_t t, int64_t e, std::vector<double>& v) {
        v.assign(ne, 0.0);
        for (int64_t j = 0; j < ne; ++j) {
            const int64_t l = e * ne + j;
            double a = Q.b_enc[l];
            for (int64_t c = 0; c < d; ++c) a += Q.w_enc[l * d + c] * (x[t * d + c] - Q.b_dec[c]);
            v[j] = a;
        }
    };
    auto top = [&](const std::vector<double>& v, int64_t k, const std::vector<uint8_t>* only) {
        std::vector<int64_t> order(v.size());
        std::iota(order.begin(), order.end(), 0);
        auto key = [&](int64_t j) {
            return !only || (*only)[j] ? v[j] : -std::numeric_limits<double>::infinity();
        };
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return key(a) > key(b); });
        order.resize(static_cast<size_t>(k));
        return order;
    };
    double loss = 0;
    std::vector<double> prob, prob0, v, v0, xh(d);
    std::vector<double> count(E, 0.0), mean_p(E, 0.0);
    double S = 0;
    for (int64_t t = 0; t < R; ++t) {
        const int64_t e = route(F, t, prob0);  // the routing is a constant of the step
        route(P, t, prob);
        count[e] += 1;
        for (int64_t j = 0; j < E; ++j) mean_p[j] += prob[j] / static_cast<double>(R);
        for (int64_t c = 0; c < d; ++c)
            S += (x[t * d + c] - F.b_dec[c]) * (x[t * d + c] - F.b_dec[c]);
        expert_pre(P, t, e, v);
        for (int64_t c = 0; c < d; ++c) xh[c] = 0;
        for (int64_t j : top(v, s.k, nullptr)) {
            const double z = std::max(v[j], 0.0);
            for (int64_t c = 0; c < d; ++c) xh[c] += z * P.w_dec[(e * ne + j) * d + c];
        }
        for (int64_t c = 0; c < d; ++c) {
            const double r = P.b_dec[c] + prob[e] * xh[c] - x[t * d + c];
            loss += r * r;
        }
        if (s.aux_weight > 0) {
            // The residual of the frozen reconstruction, and the k_aux largest pre-activations
            // among the expert's dead latents (at most as many as it has), not ReLU'd.
            expert_pre(F, t, e, v0);
            std::vector<double> res(d, 0.0);
            for (int64_t j : top(v0, s.k, nullptr)) {
                const double z = std::max(v0[j], 0.0);
                for (int64_t c = 0; c < d; ++c) res[c] += z * F.w_dec[(e * ne + j) * d + c];
            }
            for (int64_t c = 0; c < d; ++c)
                res[c] = x[t * d + c] - (F.b_dec[c] + prob0[e] * res[c]);
            std::vector<uint8_t> dead(s.dead.begin() + e * ne, s.dead.begin() + (e + 1) * ne);
            const int64_t k = std::min<int64_t>(s.k_aux, std::count(dead.begin(), dead.end(), 1));
            if (k == 0) continue;
            std::vector<double> eh(d, 0.0);
            for (int64_t j : top(v, k, &dead))
                for (int64_t c = 0; c < d; ++c) eh[c] += v[j] * P.w_dec[(e * ne + j) * d + c];
            for (int64_t c = 0; c < d; ++c)
                loss += s.aux_weight * (eh[c] - res[c]) * (eh[c] - res[c]);
        }
    }
    double bal = 0;
    for (int64_t e = 0; e < E; ++e) bal += count[e] / static_cast<double>(R) * mean_p[e];
    loss += s.balance * static_cast<double>(E) * bal * S;
    return loss / static_cast<double>(R);
}

SaeConfig switch_config(const Ref& s) {
    SaeConfig cfg;
    cfg.arch = "switch";
    cfg.n_latents = s.n;
    cfg.set("sae.n_experts", s.E);
    cfg.k = s.k;
    cfg.set("train.balance_coeff", s.balance).set("sae.k_aux", s.k_aux > 0 ? s.k_aux : 1);
    cfg.normalize_decoder = false;
    return cfg;
}

std::vector<float> random_params(const SaeTrainer& tr, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(static_cast<size_t>(tr.layout().total()));
    for (float& v : p) v = 0.4f * normal(rng);
    return p;
}

// test/fd_check.h's check on this file's reference loss, and that the router's gradient was
// among the parameters compared.
void check_fd(SaeTrainer& tr, const std::vector<float>& x, const Ref& s) {
    const int64_t router_from = tr.layout().offset("W_router");
    int router = 0;
    saetrain::testing::check_fd(
        tr, x, s.rows,
        [&](const std::vector<double>& p, const std::vector<double>& frozen) {
            return ref_loss(p, frozen, x, s);
        },
        "switch", {},
        [&](size_t i, double fd) {
            router += static_cast<int64_t>(i) >= router_from && std::abs(fd) > 1e-4;
        });
    EXPECT_GT(router, 0) << "no router parameter had a gradient to check";
    std::printf("switch: %d of them of the router\n", router);
}

TEST(SwitchGradients, MatchFiniteDifferencesWithTheBalanceLoss) {
    Ref s;
    s.balance = 0.05;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(switch_config(s), s.d, 10, 0, *be, *self);
    std::mt19937 rng(11);
    const std::vector<float> x = saetrain::testing::randn(s.rows * s.d, 12);
    tr.set_params_host(random_params(tr, rng));
    check_fd(tr, x, s);
    // The balance term is in the loss: without it the same SAE has another loss.
    Ref plain = s;
    plain.balance = 0;
    const std::vector<float> pf = tr.params_host();
    const std::vector<double> pd(pf.begin(), pf.end());
    EXPECT_GT(ref_loss(pd, pd, x, s) - ref_loss(pd, pd, x, plain), 1e-3);
}

TEST(SwitchGradients, MatchFiniteDifferencesWithAuxKPerExpert) {
    Ref s;
    s.k_aux = 3;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeConfig cfg = switch_config(s);
    cfg.set("train.auxk_coeff", 0.5);
    cfg.dead_tokens = 100;
    SaeTrainer tr(cfg, s.d, 10, 0, *be, *self);
    std::mt19937 rng(13);
    const std::vector<float> x = saetrain::testing::randn(s.rows * s.d, 14);
    tr.set_params_host(random_params(tr, rng));
    TrainState st = trainer_state(tr);
    s.dead.assign(static_cast<size_t>(s.n), 0);
    int64_t n_dead = 0;
    // Expert 0: 4 dead (more than k_aux); expert 1: 2 (fewer); expert 2: none.
    for (int64_t l : {0, 2, 3, 6, 9, 12}) st.since_fired[l] = 1000, s.dead[l] = 1, ++n_dead;
    trainer_restore(tr, trainer_weights(tr), st);
    s.aux_weight = 0.5 * std::min(1.0, double(n_dead) / double(s.k_aux));
    check_fd(tr, x, s);
}

// With one expert the router's probability is 1 and its gradient 0: a Switch SAE is a TopK
// SAE (the same initial weights, the same steps) up to the order of float additions.
TEST(SwitchBehaviour, OneExpertTrainsAsTopK) {
    const int64_t d = 16, rows = 256;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeConfig cfg;
    cfg.n_latents = 64;
    cfg.k = 4;
    cfg.arch = "topk";
    SaeTrainer topk(cfg, d, 20, 3, *be, *self);
    cfg.arch = "switch";
    cfg.set("sae.n_experts", 1);
    SaeTrainer sw(cfg, d, 20, 3, *be, *self);
    const std::vector<float> x = saetrain::testing::randn(rows * d, 5);
    topk.init(x.data(), rows);
    sw.init(x.data(), rows);
    StepResult a, b;
    for (int step = 0; step < 10; ++step) {
        const std::vector<float> xb = saetrain::testing::randn(rows * d, 100 + step);
        a = topk.step(xb.data(), rows);
        b = sw.step(xb.data(), rows);
    }
    // (The losses differ by the balance term, a constant balance_coeff * S with one expert.)
    EXPECT_NEAR(a.sse, b.sse, 1e-4 * a.sse);
    const SaeWeights wa = trainer_weights(topk), wb = trainer_weights(sw);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < wa.at("W_dec").size(); ++i)
        diff += std::abs(wa.at("W_dec")[i] - wb.at("W_dec")[i]),
            norm += std::abs(wa.at("W_dec")[i]);
    EXPECT_LT(diff / norm, 1e-4) << "W_dec after 10 steps";
}

// Synthetic data of planted features, shared by the tests below.
saetrain::testing::TempDir& planted_dir() {
    static saetrain::testing::TempDir tmp("saetrain_switch");
    return tmp;
}

const DatasetInfo& planted_data() {
    static const DatasetInfo data = [] {
        saetrain::testing::TempDir& tmp = planted_dir();
        SynthOptions so;
        so.out_dir = tmp.path.string();
        so.d_model = 48;
        so.n_features = 128;
        so.active_per_row = 3.0;
        so.rows = 60000;
        so.shards = 2;
        so.seed = 7;
        synth_write(so);
        return dataset_open(tmp.path.string());
    }();
    return data;
}

struct Trained {
    double fvu = 0, recovery = 0, load_max = 0, load_min = 0, dead = 0;
};

Trained train_switch(double balance, int64_t experts) {
    const DatasetInfo& data = planted_data();
    LoaderOptions lo;
    lo.epochs = 2;
    lo.shuffle_rows = 16384;
    lo.seed = 1;
    ShardBatchSource source(data, {0, data.total_rows}, lo);
    SaeConfig cfg;
    cfg.arch = "switch";
    cfg.expansion = 4;
    cfg.k = 6;
    cfg.set("sae.n_experts", experts).set("train.balance_coeff", balance);
    cfg.lr = 1e-2;
    cfg.warmup_steps = 20;
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    const int64_t batch = 256;
    SaeTrainer tr(cfg, data.d_model, total_steps_for(source.total_rows(), batch), 0, *be, *self);
    LoopOptions opt;
    opt.batch_size = batch;
    opt.sae_id = "switch";
    const LoopResult res = train_loop(tr, source, opt);
    int64_t m = 0, d = 0;
    const auto truth = synth_read_features(planted_dir() / "ground_truth.h5", &m, &d);
    const SaeWeights w = trainer_weights(tr);
    Trained t;
    t.fvu = res.last.fvu;
    t.recovery = feature_recovery(truth.data(), m, w.at("W_dec").data(), w.n_latents, d);
    for (const auto& [name, v] : tr.arch_summary()) {
        if (name == "expert_load_max") t.load_max = v;
        if (name == "expert_load_min") t.load_min = v;
    }
    t.dead = tr.training_quality().dead_fraction;
    std::printf(
        "switch E=%lld balance %g: fvu %.4f recovery %.4f load min %.3f max %.3f (mean "
        "%.3f) dead %.1f%%\n",
        static_cast<long long>(experts), balance, t.fvu, t.recovery, t.load_min, t.load_max,
        1.0 / static_cast<double>(experts), 100 * t.dead);
    return t;
}

// Without the balance loss the router sends most tokens to a few experts and the others' latents
// die; with the default coefficient the largest expert's load stays below twice the mean.
// Measured, from the k-means router (sae.router_init's default, balanced on the first batch):
// without, the load drifted to 0.969 on one expert (32% dead); with, 0.072 to 0.143 of the
// tokens (mean 0.125) and no dead latent. From random directions, without: one expert took
// every token (84% dead). (Planted-feature recovery: test_e2e PlantedRecovery.)
TEST(SwitchBehaviour, BalanceLossKeepsTheExpertsInUse) {
    const int64_t E = 8;
    const Trained off = train_switch(0.0, E), on = train_switch(0.1, E);  // the default
    EXPECT_LT(on.load_max, 2.0 / E) << "with the balance loss: max expert load below 2x the mean";
    EXPECT_GT(on.load_min, 0.5 / E) << "with the balance loss: no expert starved";
    EXPECT_LT(on.dead, 0.10);
    EXPECT_GT(off.load_max, 2.0 / E) << "without it the load collapses onto a few experts";
    EXPECT_GT(off.dead, 0.3) << "and the starved experts' latents die";
}

}  // namespace

// --- the router's start (sae.router_init: kmeans) --------------------------------------------

// Rows in narrow cones about random unit directions: cone j holds share[j] of the rows, each
// row its direction times a norm in [1, 3] plus noise of 0.05 per coordinate.
struct Cones {
    std::vector<float> x;
    std::vector<std::vector<double>> dirs;
};
Cones cone_rows(const std::vector<double>& share, int64_t rows, int64_t d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> norm(1.0, 3.0);
    Cones c;
    for (size_t j = 0; j < share.size(); ++j) {
        std::vector<double> v(static_cast<size_t>(d));
        double s = 0;
        for (double& a : v) a = normal(rng), s += a * a;
        for (double& a : v) a /= std::sqrt(s);
        c.dirs.push_back(v);
    }
    for (size_t j = 0, r = 0; j < share.size(); ++j)
        for (auto i = static_cast<int64_t>(std::llround(share[j] * static_cast<double>(rows)));
             i > 0 && static_cast<int64_t>(r) < rows; --i, ++r) {
            const double a = norm(rng);
            for (int64_t t = 0; t < d; ++t)
                c.x.push_back(static_cast<float>(a * c.dirs[j][t] + 0.05 * normal(rng)));
        }
    return c;
}

std::vector<double> random_unit_rows(int64_t E, int64_t d, uint32_t seed) {
    const std::vector<float> r = saetrain::testing::randn(E * d, seed);
    std::vector<double> u(r.begin(), r.end());
    for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t t = 0; t < d; ++t) s += u[e * d + t] * u[e * d + t];
        for (int64_t t = 0; t < d; ++t) u[e * d + t] /= std::sqrt(s);
    }
    return u;
}

// The cosine of each true direction with the centroid nearest it, and whether no two
// directions share a centroid.
std::pair<double, bool> worst_match(const Cones& c, const std::vector<double>& centroids,
                                    int64_t d) {
    const auto E = static_cast<int64_t>(centroids.size()) / d;
    double worst = 1;
    std::vector<int> used(static_cast<size_t>(E), 0);
    for (const auto& dir : c.dirs) {
        double best = -1;
        int64_t at = 0;
        for (int64_t e = 0; e < E; ++e) {
            double s = 0;
            for (int64_t t = 0; t < d; ++t) s += dir[t] * centroids[e * d + t];
            if (s > best) best = s, at = e;
        }
        worst = std::min(worst, best), ++used[at];
    }
    return {worst, std::all_of(used.begin(), used.end(), [](int u) { return u <= 1; })};
}

// Four cones of equal size, four experts: from random directions (none within 0.9 of a cone),
// the clusters are the cones, one expert each, and every expert gets a quarter of the rows.
TEST(SwitchRouterStart, ClustersAreTheDatasCones) {
    const int64_t d = 16, rows = 2000, E = 4;
    const Cones c = cone_rows({0.25, 0.25, 0.25, 0.25}, rows, d, 3);
    const std::vector<double> start = random_unit_rows(E, d, 11);
    EXPECT_LT(worst_match(c, start, d).first, 0.9) << "the start already had the cones";
    auto self = make_self_comm();
    const RouterClusters rc = balanced_router_clusters(c.x.data(), rows, d, start, *self);
    const auto [cos, one_each] = worst_match(c, rc.centroids, d);
    EXPECT_GT(cos, 0.99) << "every cone has a centroid on it";
    EXPECT_TRUE(one_each) << "and no two cones share one";
    ASSERT_EQ(rc.counts.size(), static_cast<size_t>(E));
    for (int64_t n : rc.counts) EXPECT_NEAR(static_cast<double>(n), 500.0, 10.0);
    EXPECT_GT(rc.iterations, 1);
}

// One cone holds 70% of the rows: plain k-means would give its expert 70% of them; the biases
// balance the experts (each 25% +- 2%), the big cone split between several.
TEST(SwitchRouterStart, BiasesBalanceUnevenData) {
    const int64_t d = 16, rows = 4000, E = 4;
    const Cones c = cone_rows({0.7, 0.1, 0.1, 0.1}, rows, d, 5);
    auto self = make_self_comm();
    const RouterClusters rc =
        balanced_router_clusters(c.x.data(), rows, d, random_unit_rows(E, d, 13), *self);
    for (int64_t n : rc.counts) EXPECT_NEAR(static_cast<double>(n), 1000.0, 80.0);
    // The counts are the router's own: argmax over xc . c_e + b_e.
    std::vector<int64_t> again(static_cast<size_t>(E), 0);
    for (int64_t r = 0; r < rows; ++r) {
        int64_t best = 0;
        double top = -1e300;
        for (int64_t e = 0; e < E; ++e) {
            double s = rc.bias[e];
            for (int64_t t = 0; t < d; ++t) s += double(c.x[r * d + t]) * rc.centroids[e * d + t];
            if (s > top) top = s, best = e;
        }
        ++again[best];
    }
    for (int64_t e = 0; e < E; ++e)
        EXPECT_LE(std::abs(again[e] - rc.counts[e]), 5) << "expert " << e;
}

// Through the trainer: the router's parameters after init route the first batch's rows (about
// b_dec) to the experts in balanced shares, and sae.router_init random keeps the random start.
TEST(SwitchRouterStart, TrainerStartsFromTheClusters) {
    const int64_t d = 16, rows = 2000, E = 4;
    const Cones c = cone_rows({0.4, 0.3, 0.2, 0.1}, rows, d, 9);
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    auto shares = [&](const std::string& init) {
        SaeConfig cfg;
        cfg.arch = "switch";
        cfg.n_latents = 64;
        cfg.k = 4;
        cfg.set("sae.n_experts", E).set("sae.router_init", init);
        SaeTrainer tr(cfg, d, 20, 3, *be, *self);
        tr.init(c.x.data(), rows);
        const SaeWeights w = trainer_weights(tr);
        auto tensor = [&](const char* name) {
            if (const WeightTensor* t = w.find(name)) return t->data;
            ADD_FAILURE() << "no " << name;
            return std::vector<float>(static_cast<size_t>(E * d), 0.0f);
        };
        const std::vector<float> wr = tensor("W_router"), br = tensor("b_router");
        std::vector<double> n(static_cast<size_t>(E), 0);
        for (int64_t r = 0; r < rows; ++r) {
            int64_t best = 0;
            double top = -1e300;
            for (int64_t e = 0; e < E; ++e) {
                double s = br[e];
                for (int64_t t = 0; t < d; ++t)
                    s += (double(c.x[r * d + t]) - w.at("b_dec")[t]) * wr[e * d + t];
                if (s > top) top = s, best = e;
            }
            n[best] += 1.0 / static_cast<double>(rows);
        }
        return n;
    };
    for (double s : shares("kmeans")) EXPECT_NEAR(s, 0.25, 0.03);
    const std::vector<double> random = shares("random");
    EXPECT_GT(*std::max_element(random.begin(), random.end()) -
                  *std::min_element(random.begin(), random.end()),
              0.1)
        << "random directions do not balance these cones";
}

// Planted features in groups, the structure Switch SAEs assume: 8 groups of 16 features (d 48);
// a row is its group's mean direction (unit) plus 3 of the group's features at magnitudes
// 0.5-2. 8 experts of 24 latents each can hold a group each, when the router sends each group
// to its own expert. Every other key at its default (signum at its lr); `init`:
// sae.router_init.
double grouped_recovery(const std::string& arch, const std::string& init) {
    const int64_t d = 48, G = 8, per = 16, m = G * per, rows = 256, steps = 600;
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto unit = [&](float* v) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) v[c] = normal(rng), s += double(v[c]) * v[c];
        for (int64_t c = 0; c < d; ++c) v[c] = static_cast<float>(v[c] / std::sqrt(s));
    };
    std::vector<float> mean(G * d), feat(m * d);
    for (int64_t g = 0; g < G; ++g) unit(mean.data() + g * d);
    for (int64_t f = 0; f < m; ++f) unit(feat.data() + f * d);
    std::uniform_int_distribution<int64_t> group(0, G - 1), member(0, per - 1);
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    auto batch = [&] {
        std::vector<float> x(static_cast<size_t>(rows * d), 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t g = group(rng);
            for (int64_t c = 0; c < d; ++c) x[r * d + c] = mean[g * d + c];
            std::vector<int64_t> picked;  // 3 distinct features of the group
            while (picked.size() < 3) {
                const int64_t f = g * per + member(rng);
                if (std::find(picked.begin(), picked.end(), f) != picked.end()) continue;
                picked.push_back(f);
                const float a = mag(rng);
                for (int64_t c = 0; c < d; ++c) x[r * d + c] += a * feat[f * d + c];
            }
        }
        return x;
    };
    SaeConfig cfg;
    cfg.arch = arch;
    cfg.expansion = 4;
    cfg.k = 4;
    if (arch == "switch") cfg.set("sae.n_experts", int64_t{8}).set("sae.router_init", init);
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, d, steps, 0, *be, *self);
    const std::vector<float> first = batch();
    tr.init(first.data(), rows);
    for (int64_t s = 0; s < steps; ++s) {
        const std::vector<float> x = batch();
        tr.step(x.data(), rows);
    }
    const SaeWeights w = trainer_weights(tr);
    const double rec = feature_recovery(feat.data(), m, w.at("W_dec").data(), w.n_latents, d);
    std::printf("grouped features, %s %s: recovery %.4f\n", arch.c_str(), init.c_str(), rec);
    return rec;
}

// Measured: k-means start 0.919, random start 0.799, TopK (k 4, the same latents) 0.945. With
// the group mean at norm 2, harder for every SAE: 0.840, 0.782 and TopK 0.839.
TEST(SwitchBehaviour, KMeansRouterRecoversGroupedFeatures) {
    const double km = grouped_recovery("switch", "kmeans");
    const double random = grouped_recovery("switch", "random");
    const double topk = grouped_recovery("topk", "");
    EXPECT_GE(km, 0.9) << "8 experts from the k-means start";
    EXPECT_GT(km, random + 0.05) << "the random start mixes the groups in its experts";
    EXPECT_GT(km, topk - 0.05) << "close to TopK over all the latents";
}
