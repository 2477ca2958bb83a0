// topk.cpp — TopK (Gao et al. 2024): each token keeps its k largest pre-activations (ReLU'd),
// with AuxK on the latents that died. Sparse kernels: one dense GEMM (the encoder) and O(k d)
// per token for the decoder and the backward pass.
#include "common.h"

namespace saetrain::arch {
namespace {

class TopkPass final : public SelectionPass {
public:
    TopkPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : SelectionPass(cfg, d, n, be) {}
    void reserve(int64_t rows) override { reserve_selection(rows); }
    void forward(PassContext& c, bool) override {
        encode(c);
        select_topk(c, c.seg("b_enc"), width_, idx_.data(), val_.data(), true, scratch_);
        decode_selection(c);
    }
};

class Topk final : public KSelection {
public:
    const char* name() const override { return "topk"; }
    const char* describe() const override {
        return "the sae.k largest activations per token, AuxK on dead latents (sae.k_aux, "
               "train.auxk_coeff)";
    }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const override {
        ArchExport e;
        e.saelens_architecture = "topk";
        e.saelens_tensors = saelens_base(w);
        e.saelens_cfg = {{"k", std::to_string(cfg.k)}, {"rescale_acts_by_decoder_norm", "false"}};
        e.sparsify_activation = name();
        e.sparsify_k = cfg.k;
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<TopkPass>(cfg, d, n, be);
    }
    const char* default_optimizer() const override { return "signum"; }
    bool latent_shardable() const override { return true; }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, cfg.k, d, n);
    }
};

}  // namespace

const Architecture& topk_arch() {
    static const Topk a;
    return a;
}

}  // namespace saetrain::arch
