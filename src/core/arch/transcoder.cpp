// transcoder.cpp — transcoders and skip-transcoders (Dunefsky et al. 2024; Paulo et al. 2025):
// the encoder reads an MLP's input x, the decoder writes its output y,
//   y_hat = act(x W_enc^T + b_enc) W_dec + b_dec  (+ x W_skip^T for a skip-transcoder),
// trained on paired rows [x | y] (data.path and data.target_path, read row for row). The
// activation is an SAE architecture's (sae.transcoder_activation: TopK, BatchTopK or JumpReLU),
// whose pass runs unchanged with PassContext::encode_x set by the trainer: its encoder reads x
// as it is and b_dec, the target's bias, has no path through the encoder input. Everything else
// is that architecture's: the (latent-sharded) selection or threshold, the decoder and its
// backward, AuxK on dead latents against the target's residual, its keys, buffers and export
// tensors. W_skip [d, d] starts at zero and belongs to no latent: every latent shard holds it
// whole and computes its same gradient from the same dL/dy_hat and x, and only the first adds
// the skip term to its partial y_hat.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "common.h"
#include "saetrain/error.h"

namespace saetrain::arch {

const std::array<const char*, 3> kTranscoderActivations = {"topk", "batchtopk", "jumprelu"};

const ArchKey<std::string>& transcoder_activation_key() {
    static const ArchKey<std::string> key{
        "sae", "transcoder_activation", "topk",
        "a transcoder's activation: topk | batchtopk | jumprelu (as sae.arch of that name)",
        key_one_of({kTranscoderActivations.begin(), kTranscoderActivations.end()})};
    return key;
}

// The architecture whose activation a transcoder of `cfg` uses.
const Architecture& transcoder_activation_arch(const SaeConfig& cfg) {
    const std::string a = transcoder_activation_key()(cfg);
    if (a == "batchtopk") return batchtopk_arch();
    if (a == "jumprelu") return jumprelu_arch();
    return topk_arch();
}

namespace {

constexpr const char* kWSkip = "W_skip";

// The activation's pass, and the skip path around it.
class TranscoderPass final : public WrappedPass {
public:
    TranscoderPass(std::unique_ptr<ArchPass> inner, bool skip)
        : WrappedPass(std::move(inner)), skip_(skip) {}
    void forward(PassContext& c, bool training) override {
        SAE_ENFORCE(c.encode_x, "a transcoder's pass needs PassContext::encode_x");
        inner_->forward(c, training);
        if (skip_ && !(c.latent_shard && c.latent_shard->index > 0))
            c.be.gemm(false, true, c.B, c.d, c.d, 1.0f, c.x, c.d, c.seg(kWSkip), c.d, 1.0f, c.xhat,
                      c.d);
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        // G.W_skip = (dL/dy_hat)^T x: ctx.xhat holds dL/dy_hat, the same on every latent shard
        // (read before the activation's backward, which may reuse it as scratch).
        if (skip_)
            c.be.gemm(true, false, c.d, c.d, c.B, 1.0f, c.xhat, c.d, c.x, c.d, 0.0f, c.grad(kWSkip),
                      c.d);
        inner_->backward(c, step, total_steps);
    }

private:
    bool skip_;
};

class Transcoder final : public Architecture {
public:
    explicit Transcoder(bool skip) : skip_(skip) {}
    const char* name() const override { return skip_ ? "skip_transcoder" : "transcoder"; }
    const char* describe() const override {
        return skip_ ? "a transcoder with a trained affine skip path x W_skip^T (Paulo et al. "
                       "2025): data.path the MLP's input, data.target_path its output; "
                       "sae.transcoder_activation topk | batchtopk | jumprelu with that "
                       "architecture's keys"
                     : "a transcoder: sparse latents of the MLP's input (data.path) reconstruct "
                       "its output (data.target_path); sae.transcoder_activation topk | "
                       "batchtopk | jumprelu with that architecture's keys";
    }
    std::vector<const ArchKeyDecl*> config_keys() const override {
        std::vector<const ArchKeyDecl*> k = {&transcoder_activation_key()};
        for (const char* a : kTranscoderActivations)
            for (const ArchKeyDecl* key : arch_get(a).config_keys())
                if (std::find(k.begin(), k.end(), key) == k.end()) k.push_back(key);
        return k;
    }
    std::vector<std::string> summary_keys() const override {
        return {"sae.transcoder_activation", "sae.k", "train.l0_coeff"};
    }
    std::vector<const ArchOpSet*> op_sets() const override {
        std::vector<const ArchOpSet*> s;
        for (const char* a : kTranscoderActivations)
            for (const ArchOpSet* o : arch_get(a).op_sets()) s.push_back(o);
        return s;
    }
    void validate(const SaeConfig& cfg, int64_t n, const std::string& where) const override {
        transcoder_activation_arch(cfg).validate(cfg, n, where);
    }
    // "k32" for TopK (the ids of the first transcoders), else the activation's name first:
    // "batchtopk-k32", "jumprelu-l0_1".
    std::string id_suffix(const SaeConfig& cfg) const override {
        const Architecture& a = transcoder_activation_arch(cfg);
        const std::string inner = a.id_suffix(cfg);
        return &a == &topk_arch() ? inner : std::string(a.name()) + "-" + inner;
    }
    std::vector<ParamSegment> tensors(const SaeConfig& cfg, int64_t n, int64_t d) const override {
        std::vector<ParamSegment> s = transcoder_activation_arch(cfg).tensors(cfg, n, d);
        // From zero (the parameters are zero before init_extra).
        if (skip_) s.push_back(whole_tensor(kWSkip, d, d, false));
        return s;
    }
    void init_extra(const SaeConfig& cfg, const ParamLayout& layout, std::vector<float>& p,
                    const InitInputs& in) const override {
        transcoder_activation_arch(cfg).init_extra(cfg, layout, p, in);
    }
    bool inits_from_preactivations(const SaeConfig& cfg) const override {
        return transcoder_activation_arch(cfg).inits_from_preactivations(cfg);
    }
    void init_from_preactivations(const SaeConfig& cfg, const ParamLayout& layout,
                                  std::vector<float>& p, const float* v, int64_t rows, int64_t n,
                                  Communicator& replicas,
                                  const SumOverLatentShards& over_latent_shards) const override {
        transcoder_activation_arch(cfg).init_from_preactivations(cfg, layout, p, v, rows, n,
                                                                 replicas, over_latent_shards);
    }
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        const double skip = skip_ ? 4.0 * static_cast<double>(d) * static_cast<double>(d) : 0.0;
        return transcoder_activation_arch(cfg).flops_per_token(cfg, d, n) + skip;
    }
    // The perf model's kind follows the default activation (TopK): sparse.
    bool sparse() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const override {
        const Architecture& a = transcoder_activation_arch(cfg);
        const ArchExport inner = a.export_fields(w, cfg);
        ArchExport e;
        e.saelens_refusal =
            "saetrain does not write SAELens's transcoder layout yet; export a transcoder with "
            "--format circuit_tracer (BatchTopK or JumpReLU) or --format sparsify (TopK)";
        e.transcode = true;
        if (skip_) e.w_skip = extra_tensor(w, kWSkip);
        if (&a == &topk_arch()) {
            e.sparsify_activation = inner.sparsify_activation;
            e.sparsify_k = inner.sparsify_k;
            e.circuit_tracer_refusal =
                "circuit-tracer's transcoders are ReLU or JumpReLU, which a per-row top-k is "
                "not; train with sae.transcoder_activation: batchtopk or jumprelu, or export "
                "this one with --format sparsify";
        } else {
            e.sparsify_refusal = fmt::format(
                "sparsify's transcoders are TopK, not {}; export this one with --format "
                "circuit_tracer",
                a.name());
            // Both export as SAELens's JumpReLU: its threshold per latent is circuit-tracer's.
            for (const ExportTensor& t : inner.saelens_tensors)
                if (t.name == "threshold") e.circuit_tracer_threshold = t.data;
            SAE_ENFORCE(!e.circuit_tracer_threshold.empty(),
                        "the {} export has no threshold tensor", a.name());
        }
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<TranscoderPass>(
            transcoder_activation_arch(cfg).make_pass(cfg, d, n, be), skip_);
    }
    bool latent_shardable() const override { return true; }  // as TopK, BatchTopK and JumpReLU
    RowSpec rows() const override { return {true, false}; }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return transcoder_activation_arch(cfg).limited_ops(cfg, d, n);
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
