// switch.cpp — the Switch SAE (Mudide et al. 2024): E experts, each a TopK SAE of n / E
// latents, and a router that sends every token to one of them. Only the chosen expert's
// encoder runs, so the dense encoder GEMM costs 2 d n / E per token instead of TopK's 2 d n.
//
//   xc = x - b_dec                          (b_dec shared by all experts)
//   p = softmax(xc W_router^T + b_router)   [E] per token; e = argmax p (ties: lower index)
//   z = TopK_k(xc W_enc[e]^T + b_enc[e])    (ReLU'd, expert e's n / E latents)
//   x_hat = b_dec + p_e * z W_dec[e]
//
// Scaling the expert's output by p_e is what trains the router. The latents' activations, as
// reported and exported, are p_e * z: x_hat = b_dec + f W_dec like every other SAE.
//
// The router's load-balancing loss (Switch Transformers, Fedus et al. 2022) is
//   balance_coeff * E * sum_e f_e P_e * S,
// f_e the fraction of the batch's tokens routed to e (a constant), P_e the mean router
// probability of e, S = sum ||x - b_dec||^2 over the batch (held fixed): in units of the batch's
// squared norm, so balance_coeff weighs against the reconstruction as it would against the FVU,
// whatever the data's scale. It is E * sum f P = 1 when the load is uniform.
//
// Computation grouped by expert: the router's logits are read back (B x E values), a stable
// counting sort puts each expert's tokens in one block of rows, each block runs one GEMM
// against its expert's slice of W_enc and a top-k over n / E latents, and the sparse decoder
// and backward pass run once over all rows with global latent ids. AuxK selects among the dead
// latents of the token's own expert (its pre-activations are the only ones computed). Its own
// ops (arch/switch.h): the row permutations into expert blocks and back, with their CPU
// reference here.
#include "saetrain/arch/switch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "common.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/perfmodel.h"

namespace saetrain::arch {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
class CpuSwitchOps final : public SwitchOps {
public:
    void gather_rows(float* dst, const float* src, const int32_t* rows_of, const float* scale,
                     float beta, int64_t rows, int64_t cols) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < rows; ++i) {
            const float* in = src + static_cast<int64_t>(rows_of[i]) * cols;
            float* out = dst + i * cols;
            const float a = scale ? scale[i] : 1.0f;
            if (beta == 0.0f) {
                for (int64_t c = 0; c < cols; ++c) out[c] = a * in[c];
            } else {
                for (int64_t c = 0; c < cols; ++c) out[c] = beta * out[c] + a * in[c];
            }
        }
    }
    void gather_index_rows(int32_t* dst, const int32_t* src, const int32_t* rows_of, int64_t rows,
                           int64_t width) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < rows; ++i)
            std::memcpy(dst + i * width, src + static_cast<int64_t>(rows_of[i]) * width,
                        static_cast<size_t>(width) * sizeof(int32_t));
    }
    void row_dots(const float* a, const float* b, int64_t rows, int64_t cols, float* out) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < rows; ++i) {
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t c = 0; c < cols; ++c) s += a[i * cols + c] * b[i * cols + c];
            out[i] = s;
        }
    }
};

// Every op through a ForwardingBackend's hook.
class ForwardedSwitchOps final : public SwitchOps {
public:
    ForwardedSwitchOps(SwitchOps& inner, OpHook hook) : inner_(inner), hook_(std::move(hook)) {}
    void gather_rows(float* dst, const float* src, const int32_t* rows_of, const float* scale,
                     float beta, int64_t rows, int64_t cols) override {
        hook_("gather_rows",
              [&] { inner_.gather_rows(dst, src, rows_of, scale, beta, rows, cols); });
    }
    void gather_index_rows(int32_t* dst, const int32_t* src, const int32_t* rows_of, int64_t rows,
                           int64_t width) override {
        hook_("gather_index_rows",
              [&] { inner_.gather_index_rows(dst, src, rows_of, rows, width); });
    }
    void row_dots(const float* a, const float* b, int64_t rows, int64_t cols, float* out) override {
        hook_("row_dots", [&] { inner_.row_dots(a, b, rows, cols, out); });
    }

private:
    SwitchOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------

struct SwitchKeys {
    ArchKey<int64_t> n_experts{"sae", "n_experts", 8,
                               "experts, each n_latents / n_experts latents; one per token",
                               key_at_least(1)};
    // 0.1, not Switch Transformers' 0.01 (whose routers also drop tokens beyond an expert's
    // capacity): docs/architectures.md.
    ArchKey<double> balance_coeff{"train", "balance_coeff", 0.1,
                                  "the router's load-balancing loss weight, in units of the "
                                  "batch's squared norm about b_dec",
                                  key_at_least(0, " (0: off)")};
    ArchKey<std::string> router_init{
        "sae", "router_init", "kmeans",
        "the router's start: kmeans (balanced clusters of the first batch) | random (random "
        "directions)",
        key_one_of({"kmeans", "random"})};
};
const SwitchKeys& keys() {
    static const SwitchKeys k;
    return k;
}

class SwitchPass final : public ArchPass {
public:
    SwitchPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : E_(keys().n_experts(cfg)),
          ne_(n / E_),
          k_(cfg.k),
          d_(d),
          n_(n),
          k_aux_(resolved_k_aux(cfg, d, ne_)),
          aux_coeff_(auxk_keys().coeff(cfg)),
          balance_(keys().balance_coeff(cfg)),
          be_(be),
          ops_(arch_ops<SwitchOps>(be, switch_op_set())),
          abias_(be, n),
          astats_(be, kStatCount),
          scratch_(be, 2 * d),
          afires_(be, n),
          counts_(static_cast<size_t>(E_), 0) {}

    bool uses_dense_pre() const override { return false; }
    void reserve(int64_t rows) override {
        ensure(logits_, be_, rows * E_);
        ensure(ds_, be_, rows * E_);
        ensure(perm_, be_, rows), ensure(inv_, be_, rows);
        ensure(p_sorted_, be_, rows), ensure(p_token_, be_, rows), ensure(dots_, be_, rows);
        for (auto* a : {&xs_, &ys_, &derr_s_}) ensure(*a, be_, rows * d_);
        ensure(pre_, be_, rows * ne_);
        ensure(idx_, be_, rows * k_), ensure(act_idx_, be_, rows * k_);
        ensure(val_, be_, rows * k_), ensure(act_val_, be_, rows * k_);
    }

    void forward(PassContext& c, bool) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, E = E_, ne = ne_;
        const float* b_dec = c.seg("b_dec");
        be.sub_rows(c.xc, c.x, b_dec, B, d);
        be.broadcast_rows(c.xhat, b_dec, B, d);
        be.gemm(false, true, B, E, d, 1.0f, c.xc, d, c.seg("W_router"), d, 0.0f, logits_.data(), E);
        route(c, B);
        // Each expert's block of rows: one GEMM against its slice of W_enc, a top-k of n / E.
        ops_.gather_rows(xs_.data(), c.xc, perm_.data(), nullptr, 0.0f, B, d);
        for (int64_t e = 0; e < E; ++e) {
            const int64_t o = start_[e], rows = counts_[e];
            if (rows == 0) continue;
            float* pre = pre_.data() + o * ne;
            be.gemm(false, true, rows, ne, d, 1.0f, xs_.data() + o * d, d,
                    c.seg("W_enc") + e * ne * d, d, 0.0f, pre, ne);
            be.topk_forward(pre, c.seg("b_enc") + e * ne, rows, ne, k_, idx_.data() + o * k_,
                            val_.data() + o * k_, true);
            be.offset_indices(idx_.data() + o * k_, rows * k_, static_cast<int32_t>(e * ne));
        }
        // y = z W_dec in expert order; x_hat += p_e * y in token order.
        be.fill(ys_.data(), B * d, 0.0f);
        be.sparse_decode(idx_.data(), val_.data(), c.seg("W_dec"), B, k_, d, ys_.data());
        ops_.gather_rows(c.xhat, ys_.data(), inv_.data(), p_token_.data(), 1.0f, B, d);
        ops_.gather_index_rows(act_idx_.data(), idx_.data(), inv_.data(), B, k_);
        ops_.gather_rows(act_val_.data(), val_.data(), inv_.data(), p_token_.data(), 0.0f, B, k_);
    }

    void backward(PassContext& c, int64_t, int64_t) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d;
        // In expert order: dL/dy = p_e dL/dx_hat, and p_e dL/dp_e = (p_e dL/dx_hat) . y.
        ops_.gather_rows(derr_s_.data(), c.xhat, perm_.data(), p_sorted_.data(), 0.0f, B, d);
        ops_.row_dots(derr_s_.data(), ys_.data(), B, d, dots_.data());
        be.topk_backward(
            arch::sparse_backward(c, xs_.data(), derr_s_.data(), idx_.data(), val_.data(), B, k_));
        auxk(c);
        router_backward(c);
        encoder_input_grad(c, c.grad("b_enc"));
    }

    double penalty(const float* st) const override {
        return aux_weight_ * st[kStatAux] + balance_loss_;
    }
    Activations activations() const override {
        return {nullptr, act_idx_.data(), act_val_.data(), k_};
    }
    std::vector<double> step_sums() const override {
        return std::vector<double>(counts_.begin(), counts_.end());
    }
    std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>& sums, const std::vector<double>& fired) const override {
        if (static_cast<int64_t>(sums.size()) != E_) return {};
        double total = 0;
        for (double s : sums) total += s;
        if (!(total > 0)) return {};
        double lo = 1, hi = 0, dead_most = 0;
        for (int64_t e = 0; e < E_; ++e) {
            lo = std::min(lo, sums[e] / total), hi = std::max(hi, sums[e] / total);
            int64_t dead = 0;
            for (int64_t l = e * ne_; l < (e + 1) * ne_; ++l) dead += fired[l] == 0;
            dead_most = std::max(dead_most, static_cast<double>(dead) / static_cast<double>(ne_));
        }
        return {{"expert_load_min", lo}, {"expert_load_max", hi}, {"expert_dead_max", dead_most}};
    }

private:
    // The router on the host (B x E values): probabilities, the chosen experts, the stable
    // counting sort into expert blocks, and the permutations and scales the kernels use.
    void route(PassContext& c, int64_t B) {
        const int64_t E = E_;
        logits_host_.resize(static_cast<size_t>(B * E));
        probs_.resize(static_cast<size_t>(B * E));
        b_router_.resize(static_cast<size_t>(E));
        expert_.resize(static_cast<size_t>(B));
        c.be.download(logits_host_.data(), logits_.data(), B * E * int64_t{sizeof(float)});
        c.be.download(b_router_.data(), c.seg("b_router"), E * int64_t{sizeof(float)});
        std::fill(counts_.begin(), counts_.end(), 0);
        for (int64_t r = 0; r < B; ++r) {
            const float* s = logits_host_.data() + r * E;
            int64_t best = 0;
            for (int64_t e = 1; e < E; ++e)
                if (s[e] + b_router_[e] > s[best] + b_router_[best]) best = e;
            const double top = double(s[best]) + b_router_[best];
            double z = 0;
            for (int64_t e = 0; e < E; ++e) z += std::exp(double(s[e]) + b_router_[e] - top);
            for (int64_t e = 0; e < E; ++e)
                probs_[r * E + e] =
                    static_cast<float>(std::exp(double(s[e]) + b_router_[e] - top) / z);
            expert_[r] = static_cast<int32_t>(best);
            ++counts_[best];
        }
        start_.assign(static_cast<size_t>(E) + 1, 0);
        for (int64_t e = 0; e < E; ++e) start_[e + 1] = start_[e] + counts_[e];
        perm_host_.resize(static_cast<size_t>(B)), inv_host_.resize(static_cast<size_t>(B));
        p_sorted_host_.resize(static_cast<size_t>(B)), p_token_host_.resize(static_cast<size_t>(B));
        std::vector<int64_t> cursor(start_.begin(), start_.end() - 1);
        for (int64_t r = 0; r < B; ++r) {
            const int64_t i = cursor[expert_[r]]++;
            perm_host_[i] = static_cast<int32_t>(r), inv_host_[r] = static_cast<int32_t>(i);
            p_token_host_[r] = p_sorted_host_[i] = probs_[r * E + expert_[r]];
        }
        const int64_t ib = B * int64_t{sizeof(int32_t)}, fb = B * int64_t{sizeof(float)};
        c.be.upload(perm_.data(), perm_host_.data(), ib);
        c.be.upload(inv_.data(), inv_host_.data(), ib);
        c.be.upload(p_sorted_.data(), p_sorted_host_.data(), fb);
        c.be.upload(p_token_.data(), p_token_host_.data(), fb);
    }

    // AuxK within each expert: the k_aux largest pre-activations among the expert's dead
    // latents (at most as many as it has) reconstruct the residual x - x_hat (held fixed).
    void auxk(PassContext& c) {
        aux_weight_ = 0;
        if (aux_coeff_ <= 0 || c.n_dead == 0 || c.dead == nullptr) return;
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, ne = ne_, ka = k_aux_;
        aux_weight_ = auxk_weight(aux_coeff_, c.n_dead, ka);
        ensure(aidx_, be, B * ka), ensure(aval_, be, B * ka);
        ensure(ehat_, be, B * d), ensure(target_, be, B * d);
        dead_only_bias(c, abias_.data(), mask_);
        // e = x - x_hat = -(dL/dx_hat) / grad_scale, in expert order.
        ops_.gather_rows(target_.data(), c.xhat, perm_.data(), nullptr, 0.0f, B, d);
        be.axpby(target_.data(), target_.data(), -1.0f / c.grad_scale, 0.0f, B * d);
        be.fill(astats_.data(), kStatCount, 0.0f);
        const auto aux_scale = static_cast<float>(aux_weight_ * c.grad_scale);
        for (int64_t e = 0; e < E_; ++e) {
            const int64_t o = start_[e], rows = counts_[e];
            int64_t dead = 0;
            for (int64_t l = e * ne; l < (e + 1) * ne; ++l) dead += (*c.dead)[l];
            const int64_t k = std::min(ka, dead);
            if (rows == 0 || k == 0) continue;
            int32_t* idx = aidx_.data() + o * ka;
            float* val = aval_.data() + o * ka;
            float* ehat = ehat_.data() + o * d;
            be.topk_forward(pre_.data() + o * ne, abias_.data() + e * ne, rows, ne, k, idx, val,
                            false);
            be.offset_indices(idx, rows * k, static_cast<int32_t>(e * ne));
            be.fill(ehat, rows * d, 0.0f);
            be.sparse_decode(idx, val, c.seg("W_dec"), rows, k, d, ehat);
            be.residual(ehat, target_.data() + o * d, rows, d, aux_scale, scratch_.data(),
                        scratch_.data() + d, astats_.data());
            SparseBackward a =
                arch::sparse_backward(c, xs_.data() + o * d, ehat, idx, val, rows, k);
            a.fires = afires_.data(), a.stats = astats_.data(), a.accumulate = true;
            be.topk_backward(a);
        }
        be.axpby(c.stats + kStatAux, astats_.data() + kStatSse, 1.0f, 1.0f, 1);
    }

    // dL/dlogits on the host from dL/dp_e (the reconstruction) and the balance loss, then
    // G.W_router = ds^T xc, G.b_router = column sums of ds, and G.b_dec -= (sum ds) W_router.
    void router_backward(PassContext& c) {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, E = E_;
        dots_host_.resize(static_cast<size_t>(B));
        be.download(dots_host_.data(), dots_.data(), B * int64_t{sizeof(float)});
        std::vector<double> mean_p(static_cast<size_t>(E), 0.0);
        for (int64_t r = 0; r < B; ++r)
            for (int64_t e = 0; e < E; ++e) mean_p[e] += probs_[r * E + e];
        // The balance term's gradient per probability: balance_coeff * E * f_e * S / B.
        std::vector<double> gb(static_cast<size_t>(E), 0.0);
        balance_loss_ = 0;
        if (balance_ > 0) {
            const auto Ed = static_cast<double>(E);
            const double S = be.sum_squares(c.xc, B * d);
            for (int64_t e = 0; e < E; ++e) {
                const double f = static_cast<double>(counts_[e]) / static_cast<double>(B);
                balance_loss_ += balance_ * Ed * f * (mean_p[e] / static_cast<double>(B)) * S;
                // (the gradients are of the loss divided by norm_rows, = grad_scale / 2)
                gb[e] = balance_ * Ed * f * S / static_cast<double>(B) * (c.grad_scale / 2.0);
            }
        }
        ds_host_.resize(static_cast<size_t>(B * E));
        std::vector<double> col(static_cast<size_t>(E), 0.0), g(static_cast<size_t>(E));
        for (int64_t r = 0; r < B; ++r) {
            const float* p = probs_.data() + r * E;
            const int32_t chosen = expert_[r];
            double dot = 0;
            for (int64_t e = 0; e < E; ++e) {
                g[e] = gb[e];
                if (e == chosen) g[e] += double(dots_host_[inv_host_[r]]) / p_token_host_[r];
                dot += g[e] * p[e];
            }
            for (int64_t e = 0; e < E; ++e) {
                const double ds = p[e] * (g[e] - dot);
                ds_host_[r * E + e] = static_cast<float>(ds);
                col[e] += ds;
            }
        }
        col_host_.assign(col.begin(), col.end());
        be.upload(ds_.data(), ds_host_.data(), B * E * int64_t{sizeof(float)});
        be.upload(c.grad("b_router"), col_host_.data(), E * int64_t{sizeof(float)});
        be.gemm(true, false, E, d, B, 1.0f, ds_.data(), E, c.xc, d, 0.0f, c.grad("W_router"), d);
        be.gemm(false, false, 1, d, E, -1.0f, c.grad("b_router"), E, c.seg("W_router"), d, 1.0f,
                c.grad("b_dec"), d);
    }

    int64_t E_, ne_, k_, d_, n_, k_aux_;
    double aux_coeff_, balance_;
    Backend& be_;
    SwitchOps& ops_;
    double aux_weight_ = 0, balance_loss_ = 0;
    DeviceArray<float> logits_, ds_, p_sorted_, p_token_, dots_, xs_, ys_, derr_s_, pre_, val_,
        act_val_;
    DeviceArray<int32_t> perm_, inv_, idx_, act_idx_;
    DeviceArray<float> abias_, astats_, scratch_, aval_, ehat_, target_;
    DeviceArray<int32_t> afires_, aidx_;
    std::vector<int64_t> counts_, start_;
    std::vector<float> mask_, logits_host_, probs_, b_router_, p_sorted_host_, p_token_host_,
        dots_host_, ds_host_, col_host_;
    std::vector<int32_t> expert_, perm_host_, inv_host_;
};

// The rows of one replica's first batch that the router's clusters are fitted on, at most.
constexpr int64_t kRouterInitRows = 8192;

class Switch final : public Architecture {
public:
    const char* name() const override { return "switch"; }
    const char* describe() const override {
        return "sae.n_experts TopK experts of n_latents / n_experts latents, one per token by a "
               "learned router; load-balancing loss (train.balance_coeff); AuxK per expert";
    }
    std::vector<const ArchKeyDecl*> config_keys() const override {
        std::vector<const ArchKeyDecl*> k = {&keys().n_experts, &keys().balance_coeff,
                                             &keys().router_init};
        for (const ArchKeyDecl* a : auxk_config_keys()) k.push_back(a);
        return k;
    }
    std::vector<std::string> summary_keys() const override {
        return {"sae.k", "sae.n_experts", "train.balance_coeff"};
    }
    const char* default_optimizer() const override { return "signum"; }
    void validate(const SaeConfig& cfg, int64_t n, const std::string& where) const override {
        const int64_t E = keys().n_experts(cfg);
        SAE_ENFORCE(E >= 1, "{}sae.n_experts = {} must be >= 1", where, E);
        SAE_ENFORCE(cfg.decorr_coeff == 0,
                    "{}train.decorr_coeff = {}: the decorrelation penalty is not implemented for "
                    "switch SAEs; set it to 0",
                    where, cfg.decorr_coeff);
        if (n == 0) return;
        SAE_ENFORCE(n % E == 0, "{}sae.n_experts = {} does not divide the SAE's {} latents", where,
                    E, n);
        SAE_ENFORCE(cfg.k <= n / E, "{}sae.k = {} exceeds the {} latents of each of the {} experts",
                    where, cfg.k, n / E, E);
    }
    std::string id_suffix(const SaeConfig& cfg) const override {
        return fmt::format("k{}-e{}", cfg.k, keys().n_experts(cfg));
    }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        // each expert selects alone
        return arch::topk_uses(cfg, cfg.k, d, n / keys().n_experts(cfg));
    }
    // The router reads the centred input as W_enc does (its activation-scale fold is W_enc's).
    std::vector<ParamSegment> tensors(const SaeConfig& cfg, int64_t n, int64_t d) const override {
        const int64_t E = keys().n_experts(cfg);
        std::vector<ParamSegment> s = sae_tensors(n, d);
        s.push_back(whole_tensor("W_router", E, d, true));
        s.back().fold = ScaleFold::times_c;
        s.push_back(whole_tensor("b_router", 1, E, false));
        return s;
    }
    // Random unit directions scaled so that a router logit has about unit spread on the first
    // batch (a random direction sees ||x - b_dec|| / sqrt(d) of it); b_router = 0.
    void init_extra(const SaeConfig& cfg, const ParamLayout& layout, std::vector<float>& p,
                    const InitInputs& in) const override {
        const int64_t o = layout.offset("W_router");
        const int64_t E = keys().n_experts(cfg), d = layout.segment("b_dec").cols;
        std::mt19937_64 rng(in.seed ^ 0x5717c4e5ULL);
        std::normal_distribution<double> normal(0.0, 1.0);
        const double scale = std::sqrt(static_cast<double>(d)) / std::max(in.centred_rms, 1e-12);
        for (int64_t e = 0; e < E; ++e) {
            std::vector<double> v(static_cast<size_t>(d));
            double s = 0;
            for (double& x : v) x = normal(rng), s += x * x;
            for (int64_t c = 0; c < d; ++c)
                p[o + e * d + c] = static_cast<float>(v[c] / std::sqrt(s) * scale);
        }
    }
    // sae.router_init kmeans: the router's directions become the centroids of balanced clusters
    // of the first batch's rows about b_dec (balanced_router_clusters, from the random
    // directions above, at their scale), b_router the biases that balance them. Each expert
    // then starts on a region of the data of its own, every expert with about 1 / E of the
    // rows. It trained to a lower held-out FVU than the random router (docs/architectures.md,
    // Switch).
    void init_from_rows(const SaeConfig& cfg, const ParamLayout& layout, std::vector<float>& p,
                        const float* x, int64_t rows, Communicator& replicas) const override {
        const int64_t E = keys().n_experts(cfg);
        if (keys().router_init(cfg) != "kmeans" || E < 2) return;
        const int64_t d = layout.segment("b_dec").cols;
        const float* b_dec = p.data() + layout.segment("b_dec").offset;
        const int64_t o = layout.offset("W_router"), ob = layout.offset("b_router");
        rows = std::min(rows, kRouterInitRows);
        std::vector<float> xc(static_cast<size_t>(rows * d));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d; ++c) xc[r * d + c] = x[r * d + c] - b_dec[c];
        std::vector<double> start(static_cast<size_t>(E * d));
        double scale = 0;
        for (int64_t c = 0; c < d; ++c) scale += double(p[o + c]) * p[o + c];
        scale = std::sqrt(scale);  // init_extra's, the same for every expert
        if (!(scale > 0)) return;
        for (int64_t i = 0; i < E * d; ++i) start[i] = p[o + i] / scale;
        const RouterClusters rc =
            balanced_router_clusters(xc.data(), rows, d, std::move(start), replicas);
        for (int64_t i = 0; i < E * d; ++i) p[o + i] = static_cast<float>(rc.centroids[i] * scale);
        for (int64_t e = 0; e < E; ++e) p[ob + e] = static_cast<float>(rc.bias[e] * scale);
    }
    // The chosen expert's encoder GEMM, the router (forward and its weight gradient), and
    // TopK's sparse decoder and backward terms.
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        const double dd = static_cast<double>(d);
        const int64_t E = keys().n_experts(cfg);
        return 2.0 * dd * static_cast<double>(n / std::max<int64_t>(1, E)) +
               8.0 * static_cast<double>(cfg.k) * dd + 4.0 * dd * static_cast<double>(E);
    }
    bool sparse() const override { return true; }
    std::vector<const ArchOpSet*> op_sets() const override { return {&switch_op_set()}; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const override {
        ArchExport e;
        e.saelens_architecture = "switch";
        e.saelens_tensors = saelens_base(w);
        const std::vector<float>& wr = extra_tensor(w, "W_router");
        const int64_t d = w.d_model, E = static_cast<int64_t>(wr.size()) / d;
        std::vector<float> t(wr.size());  // [E, d] -> [d, E], as W_enc is [d, n]
        for (int64_t x = 0; x < E; ++x)
            for (int64_t c = 0; c < d; ++c) t[c * E + x] = wr[x * d + c];
        e.saelens_tensors.push_back({"W_router", {d, E}, t});
        e.saelens_tensors.push_back({"b_router", {E}, extra_tensor(w, "b_router")});
        e.saelens_cfg = {{"k", std::to_string(cfg.k)}, {"n_experts", std::to_string(E)}};
        e.sparsify_refusal = "sparsify has no Switch SAE";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<SwitchPass>(cfg, d, n, be);
    }
};

}  // namespace

const Architecture& switch_arch() {
    static const Switch a;
    return a;
}

}  // namespace saetrain::arch

namespace {
constexpr int kLloydIterations = 25;  // at most; they stop when no row changes expert
constexpr int kBalanceSteps = 100;    // bias steps after each centroid update, at most
}  // namespace

saetrain::RouterClusters saetrain::balanced_router_clusters(const float* xc, int64_t rows,
                                                            int64_t d,
                                                            std::vector<double> centroids,
                                                            Communicator& replicas) {
    const int64_t E = static_cast<int64_t>(centroids.size()) / d;
    RouterClusters out;
    out.bias.assign(static_cast<size_t>(E), 0.0);
    std::vector<float> cen(centroids.begin(), centroids.end());  // the dot products' operand
    std::vector<double> inv_norm(static_cast<size_t>(rows), 0.0), L(static_cast<size_t>(rows * E));
    double total = 0;  // rows with a direction, over all replicas
    for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += double(xc[r * d + c]) * xc[r * d + c];
        if (s > 0) inv_norm[r] = 1.0 / std::sqrt(s), total += 1;
    }
    replicas.allreduce_sum(&total, 1);
    if (!(total > 0) || E < 1) {
        out.centroids = std::move(centroids);
        out.counts.assign(static_cast<size_t>(E), 0);
        return out;
    }
    const double fair = total / static_cast<double>(E);
    std::vector<int32_t> assign(static_cast<size_t>(rows), -1);
    std::vector<double> counts(static_cast<size_t>(E));
    auto logits = [&] {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t e = 0; e < E; ++e) {
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t c = 0; c < d; ++c) s += xc[r * d + c] * cen[e * d + c];
                L[r * E + e] = s;
            }
    };
    // Routes every row by argmax L + bias (rows without a direction stay at -1).
    auto route = [&] {
        std::fill(counts.begin(), counts.end(), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
            if (inv_norm[r] == 0) continue;
            const double* l = L.data() + r * E;
            int32_t best = 0;
            for (int64_t e = 1; e < E; ++e)
                if (l[e] + out.bias[e] > l[best] + out.bias[best]) best = static_cast<int32_t>(e);
            assign[r] = best, counts[best] += 1;
        }
        replicas.allreduce_sum(counts.data(), E);
    };
    // Moves the biases until every expert's count is within 1% of the fair one (or for
    // kBalanceSteps): each bias against the sign of its expert's excess, by a step per expert
    // that grows by a fifth while the sign holds and halves when it flips (Rprop). Whole
    // clusters change expert at once, so a fixed step would oscillate between two
    // assignments. The steps start at a fiftieth of the logits' RMS.
    std::vector<double> step(static_cast<size_t>(E)), last(static_cast<size_t>(E));
    auto balance = [&] {
        double ss[2] = {0, 0};
        for (int64_t r = 0; r < rows; ++r)
            if (inv_norm[r] > 0)
                for (int64_t e = 0; e < E; ++e) ss[0] += L[r * E + e] * L[r * E + e], ss[1] += 1;
        replicas.allreduce_sum(ss, 2);
        std::fill(step.begin(), step.end(), 0.02 * std::sqrt(ss[0] / std::max(ss[1], 1.0)));
        std::fill(last.begin(), last.end(), 0.0);
        for (int t = 0; t < kBalanceSteps; ++t) {
            route();
            bool fair_now = true;
            for (int64_t e = 0; e < E; ++e) {
                const double excess = counts[e] - fair;
                if (std::abs(excess) <= std::max(1.0, 0.01 * fair)) {
                    last[e] = 0;
                    continue;
                }
                fair_now = false;
                const double sign = excess > 0 ? 1.0 : -1.0;
                if (last[e] != 0) step[e] *= last[e] == sign ? 1.2 : 0.5;
                out.bias[e] -= sign * step[e], last[e] = sign;
            }
            if (fair_now) break;
        }
    };
    std::vector<double> sums(static_cast<size_t>(E * d));
    std::vector<int32_t> before;
    for (out.iterations = 1; out.iterations <= kLloydIterations; ++out.iterations) {
        logits();
        balance();
        route();
        double moved = 0;  // rows whose expert changed since the last iteration, all replicas
        for (int64_t r = 0; r < rows && !before.empty(); ++r) moved += assign[r] != before[r];
        replicas.allreduce_sum(&moved, 1);
        if (!before.empty() && moved == 0) break;
        before = assign;
        // Each centroid: the normalized sum of its rows' directions (kept where it has none).
        std::fill(sums.begin(), sums.end(), 0.0);
        for (int64_t r = 0; r < rows; ++r)
            if (inv_norm[r] > 0)
                for (int64_t c = 0; c < d; ++c)
                    sums[assign[r] * d + c] += xc[r * d + c] * inv_norm[r];
        replicas.allreduce_sum(sums.data(), E * d);
        for (int64_t e = 0; e < E; ++e) {
            double s = 0;
            for (int64_t c = 0; c < d; ++c) s += sums[e * d + c] * sums[e * d + c];
            if (!(s > 0)) continue;
            for (int64_t c = 0; c < d; ++c) {
                centroids[e * d + c] = sums[e * d + c] / std::sqrt(s);
                cen[e * d + c] = static_cast<float>(centroids[e * d + c]);
            }
        }
    }
    out.iterations = std::min(out.iterations, kLloydIterations);
    // The biases that balance the final centroids.
    logits();
    balance();
    route();
    out.centroids = std::move(centroids);
    out.counts.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) out.counts[e] = static_cast<int64_t>(counts[e]);
    return out;
}

const saetrain::ArchOpSet& saetrain::switch_op_set() {
    static const ArchOpSet set{
        "switch",
        {"gather_rows", "gather_index_rows", "row_dots"},
        [](Backend&) -> std::unique_ptr<ArchOps> { return std::make_unique<arch::CpuSwitchOps>(); },
        [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
            return std::make_unique<arch::ForwardedSwitchOps>(static_cast<SwitchOps&>(inner),
                                                              std::move(hook));
        }};
    return set;
}
