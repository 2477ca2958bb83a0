// gated.cpp — the Gated SAE (Rajamanoharan et al. 2024). One encoder direction per latent
// serves two paths: the gate g = pre + b_gate decides which latents fire, the magnitude
// m = pre * exp(r_mag) + b_mag how strongly; z = H(g) * relu(m). The sparsity penalty
// l1 * sum_i relu(g_i) ||W_dec_i|| acts on the gate, and an auxiliary reconstruction
// relu(g) W_dec + b_dec (decoder held fixed) against x trains the gate path to reconstruct on
// its own. b_enc is the gate bias (b_gate in exports). Seven dense GEMMs per step. Its own ops
// (arch/gated.h): the two paths forward and backward, with their CPU reference here.
#include "saetrain/arch/gated.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common.h"
#include "reference.h"
#include "saetrain/sae_math.h"

namespace saetrain::arch {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
class CpuGatedOps final : public GatedOps {
public:
    void gated_forward(const float* pre, const float* b_gate, const float* r_mag,
                       const float* b_mag, int64_t rows, int64_t n, float* z,
                       float* gate) override {
        std::vector<float> scale(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) scale[i] = std::exp(r_mag[i]);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const float* p = pre + r * n;
            for (int64_t i = 0; i < n; ++i) {
                const float g = p[i] + b_gate[i], m = p[i] * scale[i] + b_mag[i];
                z[r * n + i] = math::gated(g, m);
                gate[r * n + i] = math::relu(g);
            }
        }
    }

    void gated_backward(const GatedBackward& args) override {
        const auto& [pre, b_gate, r_mag, b_mag, norms, l1, rows, n, dz, dgate, db_gate, dr_mag,
                     db_mag, dpre_col_sum, gate_col_sum, fires, stats] = args;
        BlockL1L0 sums(n);
        const int64_t nb = sums.blocks();
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t c0 = b * kColBlock, w = std::min(n, c0 + kColBlock) - c0;
            float sg[kColBlock] = {}, sm[kColBlock] = {}, sr[kColBlock] = {}, sp[kColBlock] = {},
                  sa[kColBlock] = {}, sf[kColBlock] = {}, scale[kColBlock], l1n[kColBlock];
            for (int64_t c = 0; c < w; ++c)
                scale[c] = std::exp(r_mag[c0 + c]), l1n[c] = l1 * norms[c0 + c];
            for (int64_t r = 0; r < rows; ++r) {
                const float* pr = pre + r * n + c0;
                const float* ga = dgate + r * n + c0;
                float* g = dz + r * n + c0;
                for (int64_t c = 0; c < w; ++c) {
                    const float gv = pr[c] + b_gate[c0 + c], mv = pr[c] * scale[c] + b_mag[c0 + c];
                    float dg, dm;
                    math::gated_grad(gv, mv, g[c], ga[c], l1n[c], dg, dm);
                    const float dp = dg + dm * scale[c];
                    g[c] = dp;
                    sg[c] += dg, sm[c] += dm, sr[c] += dm * pr[c] * scale[c], sp[c] += dp;
                    sa[c] += math::relu(gv);
                    sf[c] += math::gated(gv, mv) > 0.0f ? 1.0f : 0.0f;
                }
            }
            for (int64_t c = 0; c < w; ++c) {
                db_gate[c0 + c] = sg[c], db_mag[c0 + c] = sm[c], dr_mag[c0 + c] = sr[c];
                dpre_col_sum[c0 + c] = sp[c], gate_col_sum[c0 + c] = sa[c];
                fires[c0 + c] = static_cast<int32_t>(sf[c]);
            }
            sums.set(b, w, sa, norms + c0, sf);
        }
        sums.add_to(stats);
    }
};

// Every op through a ForwardingBackend's hook.
class ForwardedGatedOps final : public GatedOps {
public:
    ForwardedGatedOps(GatedOps& inner, OpHook hook) : inner_(inner), hook_(std::move(hook)) {}
    void gated_forward(const float* pre, const float* b_gate, const float* r_mag,
                       const float* b_mag, int64_t rows, int64_t n, float* z,
                       float* gate) override {
        hook_("gated_forward",
              [&] { inner_.gated_forward(pre, b_gate, r_mag, b_mag, rows, n, z, gate); });
    }
    void gated_backward(const GatedBackward& a) override {
        hook_("gated_backward", [&] { inner_.gated_backward(a); });
    }

private:
    GatedOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------

class GatedPass final : public PenalizedPass {
public:
    GatedPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : PenalizedPass(cfg, cfg.l1_coeff, "l1_coeff"),
          cfg_(cfg),
          d_(d),
          n_(n),
          be_(be),
          ops_(arch_ops<GatedOps>(be, gated_op_set())),
          decorr_(cfg),
          auxk_(cfg, d, n, be),
          dpre_sum_(be, n),
          aux_stats_(be, kStatCount),
          scratch_(be, 2 * d),
          aux_db_(be, n) {}
    void reserve(int64_t rows) override {
        for (auto* a : {&z_, &gate_, &dz_, &dgate_}) ensure(*a, be_, rows * n_);
        ensure(ahat_, be_, rows * d_);
    }
    void forward(PassContext& c, bool) override {
        encode(c);
        ops_.gated_forward(c.pre, c.seg("b_enc"), c.seg("r_mag"), c.seg("b_mag"), c.B, c.n,
                           z_.data(), gate_.data());
        decode_dense(c, z_.data());
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, n = c.n;
        const float* w_dec = c.seg("W_dec");
        float* g_w_dec = c.grad("W_dec");
        l1_ = coeff_.at(step, total_steps);
        // The gate path's reconstruction and its gradient (b_dec and W_dec held fixed).
        start_reconstruction(c, ahat_.data());
        be.gemm(false, false, B, d, n, 1.0f, gate_.data(), n, w_dec, d, 1.0f, ahat_.data(), d);
        sum_over_latent_shards(c, ahat_.data(),
                               B * d);  // the latent shards' partial gate reconstructions
        be.fill(aux_stats_.data(), kStatCount, 0.0f);
        be.residual(ahat_.data(), c.x, B, d, c.grad_scale, scratch_.data(), scratch_.data() + d,
                    aux_stats_.data());
        be.axpby(c.stats + kStatAux, aux_stats_.data() + kStatSse, 1.0f, 1.0f, 1);

        decoder_backward_dense(c, z_.data(), dz_.data());
        decorr_.dense(c, z_.data(), dz_.data());
        be.gemm(false, true, B, n, d, 1.0f, ahat_.data(), d, w_dec, d, 0.0f, dgate_.data(), n);
        be.row_norms(w_dec, n, d, c.dec_norms);
        const float l1_eff = static_cast<float>(l1_ / static_cast<double>(c.norm_rows));
        GatedBackward a;
        a.pre = c.pre, a.b_gate = c.seg("b_enc"), a.r_mag = c.seg("r_mag");
        a.b_mag = c.seg("b_mag"), a.dec_norms = c.dec_norms, a.l1 = l1_eff, a.rows = B, a.n = n;
        a.dz_to_dpre = dz_.data(), a.dgate = dgate_.data();
        a.db_gate = c.grad("b_enc"), a.dr_mag = c.grad("r_mag");
        a.db_mag = c.grad("b_mag"), a.dpre_col_sum = dpre_sum_.data();
        a.gate_col_sum = c.col_scratch, a.fires = c.fires, a.stats = c.stats;
        ops_.gated_backward(a);
        encoder_weight_grad(c, dz_.data());
        if (l1_ > 0) be.add_norm_grad(w_dec, c.col_scratch, l1_eff, g_w_dec, n, d);
        if (auxk_.active(c)) {
            // AuxK on the dead latents' gate pre-activations g = pre + b_gate (c.pre is kept).
            // What it adds to G.b_gate also enters b_dec's gradient through dpre_sum, and
            // G.b_mag: a gate it opens then opens on a positive magnitude.
            float* g_b_gate = c.grad("b_enc");
            be.axpby(aux_db_.data(), g_b_gate, 1.0f, 0.0f, n);
            auxk_.backward(c, c.pre);
            be.axpby(aux_db_.data(), g_b_gate, 1.0f, -1.0f, n);
            be.axpby(dpre_sum_.data(), aux_db_.data(), 1.0f, 1.0f, n);
            be.axpby(c.grad("b_mag"), aux_db_.data(), 1.0f, 1.0f, n);
        }
        encoder_input_grad(c, dpre_sum_.data());
    }
    double penalty(const float* st) const override {
        return l1_ * st[kStatL1] + st[kStatAux] + decorr_.penalty(st) + auxk_.penalty(st);
    }
    Activations activations() const override { return {z_.data(), nullptr, nullptr, 0}; }

private:
    SaeConfig cfg_;
    int64_t d_, n_;
    Backend& be_;
    GatedOps& ops_;
    Decorrelation decorr_;
    AuxK auxk_;
    DeviceArray<float> z_, gate_, dz_, dgate_, ahat_, dpre_sum_, aux_stats_, scratch_, aux_db_;
    double l1_ = 0;
};

// Its defaults (L1Penalized: signum at 1.5 times the rule's lr, AuxK at 1/16, started at its
// target) were chosen on the frontier's MiniLM rows at sae.target_l0 32, against AdamW
// (docs/architectures.md, "The optimizer" and AuxK).
class Gated final : public L1Penalized {
public:
    const char* name() const override { return "gated"; }
    const char* describe() const override {
        return "gate and magnitude paths sharing W_enc (r_mag), L1 on the gate (sae.l1_coeff), "
               "auxiliary gate reconstruction";
    }
    std::vector<const ArchOpSet*> op_sets() const override { return {&gated_op_set()}; }
    std::vector<ParamSegment> tensors(const SaeConfig&, int64_t n, int64_t d) const override {
        std::vector<ParamSegment> s = sae_tensors(n, d);
        s.push_back(latent_vector("r_mag", n));
        s.push_back(latent_vector("b_mag", n));
        return s;
    }
    // AuxK at twice the others' weight (1/16): fewer dead latents for a little FVU at target L0
    // 32, both lower at 64 and 128 (docs/architectures.md, AuxK).
    std::vector<std::pair<std::string, ConfigValue>> key_defaults() const override {
        return {{"train.auxk_coeff", 0.0625}};
    }
    // Signum at 1.5 times the rule's lr (ReLU: twice): better over three seeds than twice the
    // rule's, and than three times or the rule's own (docs/architectures.md, "The optimizer").
    double signum_lr(double rule_lr) const override { return penalized_signum_lr(rule_lr, 1.5); }
    // With sae.target_l0 the SAE starts at it: each gate bias is lowered by the latent's
    // threshold at the target on the first batch (thresholds_at_l0; the gate is pre + b_gate,
    // b_gate 0 until here), and the encoder's scale is fitted again with b_gate scaled alongside,
    // which leaves the gates where they are. Started dense (half the latents open), the first
    // signum steps move every open latent's decoder row the same way at once: on MiniLM x16 the
    // training FVU went from 0.11 to 418 in the first step and the SAE restarted from nothing.
    bool inits_from_preactivations(const SaeConfig& cfg) const override {
        return target_l0_key()(cfg) > 0;
    }
    void init_from_preactivations(const SaeConfig& cfg, const ParamLayout& layout,
                                  std::vector<float>& p, const float* v, int64_t rows, int64_t n,
                                  Communicator& replicas,
                                  const SumOverLatentShards& over_latent_shards) const override {
        const std::vector<double> theta =
            thresholds_at_l0(v, rows, n, target_l0_key()(cfg), replicas, over_latent_shards);
        if (theta.empty()) return;
        const int64_t off = layout.offset(layout.segment("b_enc").name);
        for (int64_t i = 0; i < n; ++i) p[off + i] -= static_cast<float>(theta[i]);
    }
    bool refits_encoder_scale() const override { return true; }
    double flops_per_token(const SaeConfig&, int64_t d, int64_t n) const override {
        return 14.0 * static_cast<double>(d) * static_cast<double>(n);
    }
    bool sparse() const override { return false; }
    bool latent_shardable() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "gated";
        const int64_t d = w.d_model, n = w.n_latents;
        e.saelens_tensors = {
            {"W_enc", {d, n}, w.at("W_enc")},         {"b_gate", {n}, w.at("b_enc")},
            {"r_mag", {n}, extra_tensor(w, "r_mag")}, {"b_mag", {n}, extra_tensor(w, "b_mag")},
            {"W_dec", {n, d}, w.at("W_dec")},         {"b_dec", {d}, w.at("b_dec")}};
        e.sparsify_refusal = "sparsify has no gated activation";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<GatedPass>(cfg, d, n, be);
    }
};

}  // namespace

const Architecture& gated_arch() {
    static const Gated a;
    return a;
}

}  // namespace saetrain::arch

const saetrain::ArchOpSet& saetrain::gated_op_set() {
    static const ArchOpSet set{
        "gated",
        {"gated_forward", "gated_backward"},
        [](Backend&) -> std::unique_ptr<ArchOps> { return std::make_unique<arch::CpuGatedOps>(); },
        [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
            return std::make_unique<arch::ForwardedGatedOps>(static_cast<GatedOps&>(inner),
                                                             std::move(hook));
        }};
    return set;
}
