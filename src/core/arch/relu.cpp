// relu.cpp — the standard SAE: z = relu(pre + b_enc), with the decoder-norm weighted L1
// penalty l1 * sum_i z_i ||W_dec_i|| (the coefficient ramps in, schedule.h). Dense kernels:
// five GEMMs per step.
#include "common.h"
#include "saetrain/perfmodel.h"
#include "saetrain/schedule.h"

namespace saetrain::arch {
namespace {

class ReluPass final : public ArchPass {
public:
    ReluPass(const SaeConfig& cfg, int64_t n, Backend& be)
        : cfg_(cfg), n_(n), be_(be), decorr_(cfg) {}
    void reserve(int64_t rows) override { ensure(dz_, be_, rows * n_); }
    void forward(PassContext& c, bool) override {
        encode(c);
        z_ = c.pre;
        c.be.relu_forward(c.pre, c.seg(ParamLayout::kBEnc), c.B, c.n);
        decode_dense(c, c.pre);
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, n = c.n;
        const float* w_dec = c.seg(ParamLayout::kWDec);
        float* g_w_dec = c.grad(ParamLayout::kWDec);
        l1_ = l1_at(cfg_, step, total_steps);
        // Five dense GEMMs in all: encoder, decoder, and these three.
        decoder_backward_dense(c, c.pre, dz_.data());
        decorr_.dense(c, c.pre, dz_.data());
        be.row_norms(w_dec, n, d, c.dec_norms);
        const float l1_eff = static_cast<float>(l1_ / static_cast<double>(c.norm_rows));
        be.relu_backward(c.pre, dz_.data(), c.dec_norms, l1_eff, B, n, c.grad(ParamLayout::kBEnc),
                         c.col_scratch, c.fires, c.stats);
        encoder_weight_grad(c, dz_.data());
        if (l1_ > 0) be.add_norm_grad(w_dec, c.col_scratch, l1_eff, g_w_dec, n, d);
        encoder_input_grad(c, c.grad(ParamLayout::kBEnc));
    }
    double penalty(const float* st) const override {
        return l1_ * st[kStatL1] + decorr_.penalty(st);
    }
    Activations activations() const override { return {z_, nullptr, nullptr, 0}; }

private:
    SaeConfig cfg_;
    int64_t n_;
    Backend& be_;
    Decorrelation decorr_;
    DeviceArray<float> dz_;
    const float* z_ = nullptr;
    double l1_ = 0;
};

class Relu final : public Architecture {
public:
    const char* name() const override { return "relu"; }
    const char* describe() const override {
        return "ReLU with a decoder-norm weighted L1 penalty (sae.l1_coeff)";
    }
    std::vector<std::string> summary_keys() const override { return {"sae.l1_coeff"}; }
    std::string id_suffix(const SaeConfig& cfg) const override { return l1_suffix(cfg); }
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return sae_flops_per_token(SaeKind::dense, d, n, cfg.k);
    }
    bool sparse() const override { return false; }
    bool shardable() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "standard";
        e.saelens_tensors = saelens_base(w);
        e.sparsify_refusal = "sparsify has no ReLU-L1 SAE (its activations are topk and groupmax)";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<ReluPass>(cfg, n, be);
    }
};

}  // namespace

const Architecture& relu_arch() {
    static const Relu a;
    return a;
}

}  // namespace saetrain::arch
