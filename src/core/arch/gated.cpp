// gated.cpp — the Gated SAE (Rajamanoharan et al. 2024). One encoder direction per latent
// serves two paths: the gate g = pre + b_gate decides which latents fire, the magnitude
// m = pre * exp(r_mag) + b_mag how strongly; z = H(g) * relu(m). The sparsity penalty
// l1 * sum_i relu(g_i) ||W_dec_i|| acts on the gate, and an auxiliary reconstruction
// relu(g) W_dec + b_dec (decoder held fixed) against x trains the gate path to reconstruct on
// its own. b_enc is the gate bias (b_gate in exports). Seven dense GEMMs per step.
#include "common.h"
#include "saetrain/schedule.h"

namespace saetrain::arch {
namespace {

class GatedPass final : public ArchPass {
public:
    GatedPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : cfg_(cfg),
          d_(d),
          n_(n),
          be_(be),
          decorr_(cfg),
          dpre_sum_(be, n),
          aux_stats_(be, kStatCount),
          scratch_(be, 2 * d) {}
    void reserve(int64_t rows) override {
        for (auto* a : {&z_, &gate_, &dz_, &dgate_}) ensure(*a, be_, rows * n_);
        ensure(ahat_, be_, rows * d_);
    }
    void forward(PassContext& c, bool) override {
        encode(c);
        c.be.gated_forward(c.pre, c.seg(ParamLayout::kBEnc), c.seg("r_mag"), c.seg("b_mag"), c.B,
                           c.n, z_.data(), gate_.data());
        decode_dense(c, z_.data());
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, n = c.n;
        const float* w_dec = c.seg(ParamLayout::kWDec);
        float* g_w_dec = c.grad(ParamLayout::kWDec);
        l1_ = l1_at(cfg_, step, total_steps);
        // The gate path's reconstruction and its gradient (b_dec and W_dec held fixed).
        start_reconstruction(c, ahat_.data());
        be.gemm(false, false, B, d, n, 1.0f, gate_.data(), n, w_dec, d, 1.0f, ahat_.data(), d);
        sum_over_shards(c, ahat_.data(), B * d);  // the shards' partial gate reconstructions
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
        a.pre = c.pre, a.b_gate = c.seg(ParamLayout::kBEnc), a.r_mag = c.seg("r_mag");
        a.b_mag = c.seg("b_mag"), a.dec_norms = c.dec_norms, a.l1 = l1_eff, a.rows = B, a.n = n;
        a.dz_to_dpre = dz_.data(), a.dgate = dgate_.data();
        a.db_gate = c.grad(ParamLayout::kBEnc), a.dr_mag = c.grad("r_mag");
        a.db_mag = c.grad("b_mag"), a.dpre_col_sum = dpre_sum_.data();
        a.gate_col_sum = c.col_scratch, a.fires = c.fires, a.stats = c.stats;
        be.gated_backward(a);
        encoder_weight_grad(c, dz_.data());
        if (l1_ > 0) be.add_norm_grad(w_dec, c.col_scratch, l1_eff, g_w_dec, n, d);
        encoder_input_grad(c, dpre_sum_.data());
    }
    double penalty(const float* st) const override {
        return l1_ * st[kStatL1] + st[kStatAux] + decorr_.penalty(st);
    }
    Activations activations() const override { return {z_.data(), nullptr, nullptr, 0}; }

private:
    SaeConfig cfg_;
    int64_t d_, n_;
    Backend& be_;
    Decorrelation decorr_;
    DeviceArray<float> z_, gate_, dz_, dgate_, ahat_, dpre_sum_, aux_stats_, scratch_;
    double l1_ = 0;
};

class Gated final : public Architecture {
public:
    const char* name() const override { return "gated"; }
    const char* describe() const override {
        return "gate and magnitude paths sharing W_enc (r_mag), L1 on the gate (sae.l1_coeff), "
               "auxiliary gate reconstruction";
    }
    std::vector<std::string> summary_keys() const override { return {"sae.l1_coeff"}; }
    std::string id_suffix(const SaeConfig& cfg) const override { return l1_suffix(cfg); }
    std::vector<ParamSegment> extra_params(const SaeConfig&, int64_t n, int64_t) const override {
        return {{"r_mag", n, 1, true, false}, {"b_mag", n, 1, true, false}};
    }
    double flops_per_token(const SaeConfig&, int64_t d, int64_t n) const override {
        return 14.0 * static_cast<double>(d) * static_cast<double>(n);
    }
    bool sparse() const override { return false; }
    bool shardable() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "gated";
        const int64_t d = w.d_model, n = w.n_latents;
        e.saelens_tensors = {{"W_enc", {d, n}, w.w_enc},
                             {"b_gate", {n}, w.b_enc},
                             {"r_mag", {n}, extra_tensor(w, "r_mag")},
                             {"b_mag", {n}, extra_tensor(w, "b_mag")},
                             {"W_dec", {n, d}, w.w_dec},
                             {"b_dec", {d}, w.b_dec}};
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
