// relu.cpp — the standard SAE: z = relu(pre + b_enc), with the decoder-norm weighted L1
// penalty l1 * sum_i z_i ||W_dec_i|| (the coefficient ramps in, or sae.target_l0 adapts it:
// SparsityCoefficient, common.h). Dense kernels:
// five GEMMs per step. Its own ops (arch/relu.h): the activation and its backward, with their
// CPU reference here.
#include "saetrain/arch/relu.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common.h"
#include "reference.h"
#include "saetrain/perfmodel.h"
#include "saetrain/sae_math.h"

namespace saetrain::arch {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
class CpuReluOps final : public ReluOps {
public:
    void relu_forward(float* pre, const float* b_enc, int64_t rows, int64_t n) override {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* p = pre + r * n;
            for (int64_t i = 0; i < n; ++i) p[i] = math::relu(p[i] + b_enc[i]);
        }
    }

    void relu_backward(const float* z, float* dz, const float* norms, float l1, int64_t rows,
                       int64_t n, float* db_enc, float* z_col_sum, int32_t* fires,
                       float* stats) override {
        BlockL1L0 sums(n);
        const int64_t nb = sums.blocks();
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t c0 = b * kColBlock, w = std::min(n, c0 + kColBlock) - c0;
            // Column sums in local arrays: no aliasing with the row data, so the loop vectorizes.
            float gsum[kColBlock] = {}, zsum[kColBlock] = {}, fsum[kColBlock] = {}, l1n[kColBlock];
            for (int64_t c = 0; c < w; ++c) l1n[c] = l1 * norms[c0 + c];
            for (int64_t r = 0; r < rows; ++r) {
                const float* __restrict zr = z + r * n + c0;
                float* __restrict g = dz + r * n + c0;
#pragma omp simd
                for (int64_t c = 0; c < w; ++c) {
                    const float gv = math::relu_l1_grad(zr[c], g[c], l1n[c]);
                    g[c] = gv;
                    gsum[c] += gv;
                    zsum[c] += zr[c];
                    fsum[c] += zr[c] > 0.0f ? 1.0f : 0.0f;
                }
            }
            for (int64_t c = 0; c < w; ++c) {
                db_enc[c0 + c] = gsum[c];
                z_col_sum[c0 + c] = zsum[c];
                fires[c0 + c] = static_cast<int32_t>(fsum[c]);  // exact: counts < 2^24 rows
            }
            sums.set(b, w, zsum, norms + c0, fsum);
        }
        sums.add_to(stats);
    }
};

// Every op through a ForwardingBackend's hook.
class ForwardedReluOps final : public ReluOps {
public:
    ForwardedReluOps(ReluOps& inner, OpHook hook) : inner_(inner), hook_(std::move(hook)) {}
    void relu_forward(float* pre, const float* b_enc, int64_t rows, int64_t n) override {
        hook_("relu_forward", [&] { inner_.relu_forward(pre, b_enc, rows, n); });
    }
    void relu_backward(const float* z, float* dz, const float* norms, float l1, int64_t rows,
                       int64_t n, float* db_enc, float* z_col_sum, int32_t* fires,
                       float* stats) override {
        hook_("relu_backward", [&] {
            inner_.relu_backward(z, dz, norms, l1, rows, n, db_enc, z_col_sum, fires, stats);
        });
    }

private:
    ReluOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------
class ReluPass final : public PenalizedPass {
public:
    ReluPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : PenalizedPass(cfg, cfg.l1_coeff, "l1_coeff"),
          cfg_(cfg),
          n_(n),
          be_(be),
          ops_(arch_ops<ReluOps>(be, relu_op_set())),
          decorr_(cfg),
          auxk_(cfg, d, n, be) {}
    void reserve(int64_t rows) override {
        ensure(dz_, be_, rows * n_);
        if (auxk_.enabled()) ensure(pre_copy_, be_, rows * n_);
    }
    void forward(PassContext& c, bool training) override {
        encode(c);
        // AuxK selects among the dead latents' pre-activations, which the ReLU below
        // overwrites: kept aside on the training steps that have dead latents.
        aux_pre_ = nullptr;
        if (training && auxk_.active(c)) {
            be_.axpby(pre_copy_.data(), c.pre, 1.0f, 0.0f, c.B * n_);
            aux_pre_ = pre_copy_.data();
        }
        z_ = c.pre;
        ops_.relu_forward(c.pre, c.seg("b_enc"), c.B, c.n);
        decode_dense(c, c.pre);
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        Backend& be = c.be;
        const int64_t B = c.B, d = c.d, n = c.n;
        const float* w_dec = c.seg("W_dec");
        float* g_w_dec = c.grad("W_dec");
        l1_ = coeff_.at(step, total_steps);
        // Five dense GEMMs in all: encoder, decoder, and these three.
        decoder_backward_dense(c, c.pre, dz_.data());
        decorr_.dense(c, c.pre, dz_.data());
        be.row_norms(w_dec, n, d, c.dec_norms);
        const float l1_eff = static_cast<float>(l1_ / static_cast<double>(c.norm_rows));
        ops_.relu_backward(c.pre, dz_.data(), c.dec_norms, l1_eff, B, n, c.grad("b_enc"),
                           c.col_scratch, c.fires, c.stats);
        encoder_weight_grad(c, dz_.data());
        if (l1_ > 0) be.add_norm_grad(w_dec, c.col_scratch, l1_eff, g_w_dec, n, d);
        if (aux_pre_) auxk_.backward(c, aux_pre_);  // adds to the gradients above
        encoder_input_grad(c, c.grad("b_enc"));
    }
    double penalty(const float* st) const override {
        return l1_ * st[kStatL1] + decorr_.penalty(st) + auxk_.penalty(st);
    }
    Activations activations() const override { return {z_, nullptr, nullptr, 0}; }

private:
    SaeConfig cfg_;
    int64_t n_;
    Backend& be_;
    ReluOps& ops_;
    Decorrelation decorr_;
    AuxK auxk_;
    DeviceArray<float> dz_, pre_copy_;
    const float* z_ = nullptr;
    const float* aux_pre_ = nullptr;  // this step's pre-activations kept for AuxK, or null
    double l1_ = 0;
};

// Its defaults (L1Penalized: signum at twice the rule's lr, AuxK) were chosen on the frontier's
// MiniLM rows at sae.target_l0 32, against AdamW (docs/architectures.md, "The optimizer").
class Relu final : public L1Penalized {
public:
    const char* name() const override { return "relu"; }
    const char* describe() const override {
        return "ReLU with a decoder-norm weighted L1 penalty (sae.l1_coeff)";
    }
    std::vector<const ArchOpSet*> op_sets() const override { return {&relu_op_set()}; }
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return sae_flops_per_token(SaeKind::dense, d, n, cfg.k);
    }
    bool sparse() const override { return false; }
    bool latent_shardable() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "standard";
        e.saelens_tensors = saelens_base(w);
        e.sparsify_refusal = "sparsify has no ReLU-L1 SAE (its activations are topk and groupmax)";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<ReluPass>(cfg, d, n, be);
    }
};

}  // namespace

const Architecture& relu_arch() {
    static const Relu a;
    return a;
}

}  // namespace saetrain::arch

const saetrain::ArchOpSet& saetrain::relu_op_set() {
    static const ArchOpSet set{
        "relu",
        {"relu_forward", "relu_backward"},
        [](Backend&) -> std::unique_ptr<ArchOps> { return std::make_unique<arch::CpuReluOps>(); },
        [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
            return std::make_unique<arch::ForwardedReluOps>(static_cast<ReluOps&>(inner),
                                                            std::move(hook));
        }};
    return set;
}
