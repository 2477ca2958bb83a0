// transcoder.cpp — TopK transcoders and skip-transcoders (Dunefsky et al. 2024; Paulo et al.
// 2025): the encoder reads an MLP's input x, the decoder writes its output y,
//   y_hat = TopK(x W_enc^T + b_enc) W_dec + b_dec  (+ x W_skip^T for a skip-transcoder),
// trained on paired rows [x | y] (data.path and data.target_path, read row for row). Everything
// else is TopK's: the exact (latent-sharded) selection, the sparse decoder and its backward,
// AuxK on dead latents against the target's residual. b_dec is the target's bias, so it does not
// enter the encoder (no b_dec term through the encoder input). W_skip [d, d] starts at zero and
// belongs to no latent: every latent shard holds it whole and computes its same gradient from
// the same dL/dy_hat and x, and only the first adds the skip term to its partial y_hat.
#include "common.h"
#include "saetrain/perfmodel.h"

namespace saetrain::arch {
namespace {

constexpr const char* kWSkip = "W_skip";

class TranscoderPass final : public SelectionPass {
public:
    TranscoderPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be, bool skip)
        : SelectionPass(cfg, d, n, be), skip_(skip) {}
    void reserve(int64_t rows) override { reserve_selection(rows); }
    void forward(PassContext& c, bool) override {
        // The encoder's input is x as it is; ctx.xc holds it for AuxK and the backward pass.
        c.be.axpby(c.xc, c.x, 1.0f, 0.0f, c.B * c.d);
        c.be.gemm(false, true, c.B, c.n, c.d, 1.0f, c.xc, c.d, c.seg(ParamLayout::kWEnc), c.d, 0.0f,
                  c.pre, c.n);
        start_reconstruction(c, c.xhat);
        if (skip_ && !(c.latent_shard && c.latent_shard->index > 0))
            c.be.gemm(false, true, c.B, c.d, c.d, 1.0f, c.x, c.d, c.seg(kWSkip), c.d, 1.0f, c.xhat,
                      c.d);
        select_topk(c, c.seg(ParamLayout::kBEnc), width_, idx_.data(), val_.data(), true, scratch_);
        decode_selection(c);
    }
    void backward(PassContext& c, int64_t, int64_t) override {
        backward_selection(c);
        // G.W_skip = (dL/dy_hat)^T x: ctx.xhat holds dL/dy_hat, the same on every latent shard.
        if (skip_)
            c.be.gemm(true, false, c.d, c.d, c.B, 1.0f, c.xhat, c.d, c.x, c.d, 0.0f, c.grad(kWSkip),
                      c.d);
    }

private:
    bool skip_;
};

class Transcoder final : public KSelection {
public:
    explicit Transcoder(bool skip) : skip_(skip) {}
    const char* name() const override { return skip_ ? "skip_transcoder" : "transcoder"; }
    const char* describe() const override {
        return skip_ ? "a TopK transcoder with a trained affine skip path x W_skip^T (Paulo et al. "
                       "2025): data.path the MLP's input, data.target_path its output; sae.k, "
                       "AuxK as TopK"
                     : "a TopK transcoder: the sae.k largest activations of the MLP's input "
                       "(data.path) reconstruct its output (data.target_path); AuxK as TopK";
    }
    bool transcodes() const override { return true; }
    std::vector<ParamSegment> extra_params(const SaeConfig&, int64_t, int64_t d) const override {
        if (!skip_) return {};
        ParamSegment s;
        s.name = kWSkip, s.rows = d, s.cols = d, s.per_latent = false, s.decay = false;
        return {s};
    }
    // W_skip starts at zero (the parameters are zero before init_extra).
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        const double skip = skip_ ? 4.0 * static_cast<double>(d) * static_cast<double>(d) : 0.0;
        return sae_flops_per_token(SaeKind::topk, d, n, cfg.k) + skip;
    }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const override {
        ArchExport e;
        e.saelens_refusal =
            "SAELens's transcoders apply a ReLU or JumpReLU to every latent, not a top-k; "
            "export this TopK transcoder with --format sparsify";
        e.sparsify_activation = "topk";
        e.sparsify_k = cfg.k;
        e.sparsify_transcode = true;
        if (skip_) e.sparsify_w_skip = extra_tensor(w, kWSkip);
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<TranscoderPass>(cfg, d, n, be, skip_);
    }
    bool latent_shardable() const override { return true; }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, cfg.k, d, n);
    }

private:
    bool skip_;
};

}  // namespace

const Architecture& transcoder_arch() {
    static const Transcoder a(false);
    return a;
}

const Architecture& skip_transcoder_arch() {
    static const Transcoder a(true);
    return a;
}

}  // namespace saetrain::arch
