// clt.cpp — cross-layer transcoders (Ameisen et al. 2025, "Circuit tracing"): one encoder per
// layer reads that layer's MLP input, and each latent of layer l writes to the MLP outputs of
// layer l and of every later layer,
//   y_hat_m = sum_{l <= m} act(x_l W_enc_l^T + b_enc_l) W_dec_{l->m} + b_dec_m.
// Rows are [x_1 .. x_L | y_1 .. y_L] (data.path and data.target_path list one set per layer), so
// the trainer sees a transcoder of d = L d_l values in and out with n = L F latents, layer-major
// (latent i belongs to layer i / F). Its encoder is compact: W_enc [n, d_l], latent i's row
// reads only its layer's d_l values (files: [n, d_l], layer l's F rows circuit-tracer's W_enc_l),
// and the encoder runs one GEMM per layer (PassContext::layers). W_dec [n, d] is still the
// transcoder's, block upper-triangular (no latent writes to an earlier layer): its lower blocks
// start at zero and stay there (their gradient is zeroed every step, so Adam and weight decay
// never move them). Checkpoints, replicas and the evaluation read the declaration; the
// activation is sae.transcoder_activation's: JumpReLU per latent, or TopK / BatchTopK with
// sae.k per token and layer: with sae.k_scope token, on average (k L per token, or k L B per
// batch, over every layer's latents together); with layer, exactly per layer (each layer's k
// largest a token, or its k B largest a batch). JumpReLU with sae.target_l0 holds the L0 over
// every layer at L times the target, or with sae.k_scope layer each layer's at the target (a
// threshold shift a layer). With sae.skip each layer also has a linear skip path,
// y_hat_l += x_l W_skip_l^T with W_skip [L, d_l, d_l] (from zero; a skip-transcoder's a layer).
// Not yet: latent shards and a compact decoder.
#include <fmt/format.h>

#include <cmath>

#include "batchtopk_pass.h"
#include "common.h"
#include "saetrain/error.h"

namespace saetrain::arch {
namespace {

const ArchKey<std::string>& k_scope_key() {
    static const ArchKey<std::string> key{
        "sae", "k_scope", "token",
        "a CLT's sparsity per token or per layer: token (TopK: the k L largest of a token over "
        "every layer's latents; BatchTopK k L B a batch; JumpReLU: sae.target_l0 L times over "
        "all layers) | layer (each layer's k largest a token; BatchTopK k B a batch per layer; "
        "JumpReLU: each layer's L0 held at sae.target_l0, which it needs)",
        key_one_of({"token", "layer"})};
    return key;
}

constexpr const char* kWSkip = "W_skip";

const ArchKey<bool>& skip_key() {
    static const ArchKey<bool> key{
        "sae", "skip", false,
        "a CLT's linear skip path a layer: y_hat_l += x_l W_skip_l^T, W_skip [L, d_l, d_l] from "
        "zero (as a skip-transcoder's; circuit-tracer's CLT format has none)"};
    return key;
}

// Whether `cfg` selects per layer: sae.k_scope layer with a TopK or BatchTopK activation
// (JumpReLU has no k, and ignores the key as it ignores sae.k).
bool per_layer_selection(const SaeConfig& cfg) {
    return k_scope_key()(cfg) == "layer" && &transcoder_activation_arch(cfg) != &jumprelu_arch();
}

// Whether `cfg` holds each layer's L0 at sae.target_l0: a JumpReLU CLT with sae.k_scope layer.
bool per_layer_l0(const SaeConfig& cfg) {
    return k_scope_key()(cfg) == "layer" && &transcoder_activation_arch(cfg) == &jumprelu_arch();
}

// A per-layer selection's pieces: one layer's block of the pre-activations [B, n] copied out
// to a [B, F] block (the shared selection ops read rows of consecutive latents), and one
// layer's selection [B, w] (its own latent ids) placed into the CLT's [B, L w] with the layer's
// first latent added, so the sparse decoder, backward and AuxK see one selection of global ids.
class LayerBlocks {
public:
    LayerBlocks(Backend& be, int64_t layers) : be_(be), layers_(layers) {}
    void reserve(int64_t rows, int64_t latents_per_layer, int64_t width) {
        ensure(block_, be_, rows * latents_per_layer);
        ensure(idx_, be_, rows * width);
        ensure(val_, be_, rows * width);
    }
    // Layer l's pre-activations [B, F] from pre [B, L F].
    const float* block(const float* pre, int64_t rows, int64_t latents_per_layer, int64_t l) {
        const int64_t F = latents_per_layer, f = sizeof(float);
        be_.copy_block(block_.data(), F * f, pre + l * F, layers_ * F * f, F * f, rows);
        return block_.data();
    }
    int32_t* idx() { return idx_.data(); }
    float* val() { return val_.data(); }
    // The layer's selection (idx(), val(): [rows, width], its own ids) into columns
    // [l width, (l + 1) width) of the CLT's (idx, val) [rows, L width], ids + l F.
    void place(int64_t rows, int64_t width, int64_t latents_per_layer, int64_t l, int32_t* idx,
               float* val) {
        const int64_t w = width * int64_t{sizeof(float)}, all = layers_ * w;
        be_.offset_indices(idx_.data(), rows * width, static_cast<int32_t>(l * latents_per_layer));
        be_.copy_block(idx + l * width, all, idx_.data(), w, w, rows);
        be_.copy_block(val + l * width, all, val_.data(), w, w, rows);
    }

private:
    Backend& be_;
    int64_t layers_;
    DeviceArray<float> block_;
    DeviceArray<int32_t> idx_;
    DeviceArray<float> val_;
};

// Each layer's inference threshold: the running mean (over steps and replicas, as BatchTopK's)
// of the batch threshold at which the layer's k B largest pre-activations of the batch lie
// above it. Per-layer BatchTopK selects with it at inference; per-layer TopK trains and infers
// with its top-k and keeps it for the circuit-tracer export, whose CLTs are JumpReLU: each
// feature gets its layer's threshold, which holds the layer's L0 near k.
class LayerThresholds {
public:
    explicit LayerThresholds(int64_t layers)
        : layers_(layers),
          threshold_(static_cast<size_t>(layers), 0.0f),
          batch_t_(static_cast<size_t>(layers), 0.0) {}
    float operator[](int64_t l) const { return threshold_[static_cast<size_t>(l)]; }
    void set_batch(int64_t l, double t) { batch_t_[static_cast<size_t>(l)] = t; }
    std::vector<double> step_sums() const {
        std::vector<double> s(batch_t_);
        s.push_back(1.0);
        return s;
    }
    void after_step(const std::vector<double>& sums) {
        if (static_cast<int64_t>(sums.size()) != layers_ + 1 || !(sums.back() > 0)) return;
        for (int64_t l = 0; l < layers_; ++l) {
            const double t = sums[l] / sums.back();
            float& th = threshold_[static_cast<size_t>(l)];
            th = static_cast<float>(th > 0 ? (1 - kThresholdRate) * th + kThresholdRate * t : t);
        }
    }
    std::vector<NamedTensor> buffers() const { return {{"threshold", threshold_}}; }
    void set_buffer(const std::string& name, const std::vector<float>& v, const char* activation) {
        SAE_ENFORCE(name == "threshold" && static_cast<int64_t>(v.size()) == layers_,
                    "a CLT with per-layer {} keeps a 'threshold' of {} values (one a layer), not "
                    "'{}' of {} values",
                    activation, layers_, name, v.size());
        threshold_ = v;
    }

private:
    int64_t layers_;
    std::vector<float> threshold_;  // each layer's inference threshold (0: not estimated yet)
    std::vector<double> batch_t_;   // this step's batch thresholds
};

// TopK per layer: each layer's k largest of a token (ReLU'd), k L a token in all, and each
// layer's threshold for the export (LayerThresholds).
class LayerTopkPass final : public SelectionPass {
public:
    // `act`: the activation's config (k L a token, the selection's width).
    LayerTopkPass(const SaeConfig& act, int64_t d, int64_t n, Backend& be, int64_t layers)
        : SelectionPass(act, d, n, be),
          ops_(arch_ops<BatchTopkOps>(be, batchtopk_op_set())),
          layers_(layers),
          k_(act.k / layers),
          latents_per_layer_(n / layers),
          blocks_(be, layers),
          thresholds_(layers) {}
    void reserve(int64_t rows) override {
        reserve_selection(rows);
        blocks_.reserve(rows, latents_per_layer_, k_);
    }
    void forward(PassContext& c, bool training) override {
        encode(c);
        const int64_t F = c.n / layers_;
        blocks_.reserve(c.B, F, k_);
        for (int64_t l = 0; l < layers_; ++l) {
            const float* pre = blocks_.block(c.pre, c.B, F, l);
            const float* b_enc = c.seg("b_enc") + l * F;
            if (training)
                thresholds_.set_batch(l, ops_.batch_threshold(pre, b_enc, c.B, F, k_ * c.B));
            c.be.topk_forward(pre, b_enc, c.B, F, k_, blocks_.idx(), blocks_.val(), true);
            blocks_.place(c.B, k_, F, l, idx_.data(), val_.data());
        }
        decode_selection(c);
    }
    std::vector<double> step_sums() const override { return thresholds_.step_sums(); }
    void after_step(const std::vector<double>& sums) override { thresholds_.after_step(sums); }
    std::vector<NamedTensor> buffers() const override { return thresholds_.buffers(); }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        thresholds_.set_buffer(name, v, "TopK");
    }
    // A checkpoint or SAE file from before the thresholds has none: estimated from there on.
    bool buffer_optional(const std::string& name) const override { return name == "threshold"; }

private:
    BatchTopkOps& ops_;
    int64_t layers_, k_, latents_per_layer_;
    LayerBlocks blocks_;
    LayerThresholds thresholds_;
};

// BatchTopK per layer: each layer's k B largest of the batch in training, and at inference
// each layer's own running threshold ("threshold" holds L values).
class LayerBatchTopkPass final : public SelectionPass {
public:
    LayerBatchTopkPass(const SaeConfig& act, int64_t d, int64_t n, Backend& be, int64_t layers)
        : SelectionPass(act, d, n, be),
          ops_(arch_ops<BatchTopkOps>(be, batchtopk_op_set())),
          layers_(layers),
          k_(act.k / layers),
          lw_(act.k / layers),
          blocks_(be, layers),
          thresholds_(layers),
          t_(static_cast<size_t>(layers), 0.0f) {}
    void reserve(int64_t rows) override {
        rows_cap_ = std::max(rows_cap_, rows);
        width_ = layers_ * lw_;
        reserve_selection(rows_cap_);
    }
    void forward(PassContext& c, bool training) override {
        encode(c);
        const int64_t F = c.n / layers_;
        const float* b_enc = c.seg("b_enc");
        // Each layer's block copied out once: its batch threshold (training; else its running
        // one), then its selection at one width per layer (the widest row of any layer; padding
        // (0, 0)). A wider row than the buffers hold widens them and selects every layer again,
        // the thresholds kept.
        int64_t thresholds = 0;  // layers whose threshold this pass has
        for (bool again = true; again;) {
            again = false;
            reserve(c.B);
            blocks_.reserve(c.B, F, lw_);
            for (int64_t l = 0; l < layers_ && !again; ++l) {
                const float* pre = blocks_.block(c.pre, c.B, F, l);
                if (l == thresholds) {
                    t_[l] = training ? ops_.batch_threshold(pre, b_enc + l * F, c.B, F, k_ * c.B)
                                     : thresholds_[l];
                    if (training) thresholds_.set_batch(l, t_[l]);
                    ++thresholds;
                }
                const int64_t widest = ops_.select_above(pre, b_enc + l * F, t_[l], c.B, F, lw_,
                                                         blocks_.idx(), blocks_.val());
                if (widest > lw_) {
                    lw_ = widest;
                    again = true;
                } else {
                    blocks_.place(c.B, lw_, F, l, idx_.data(), val_.data());
                }
            }
        }
        decode_selection(c);
    }
    std::vector<double> step_sums() const override { return thresholds_.step_sums(); }
    void after_step(const std::vector<double>& sums) override { thresholds_.after_step(sums); }
    std::vector<NamedTensor> buffers() const override { return thresholds_.buffers(); }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        thresholds_.set_buffer(name, v, "BatchTopK");
    }

private:
    BatchTopkOps& ops_;
    int64_t layers_, k_, lw_;
    int64_t rows_cap_ = 0;
    LayerBlocks blocks_;
    LayerThresholds thresholds_;
    std::vector<float> t_;  // the thresholds of the forward pass
};

// The activation's config: a CLT's k is per token and layer, its activation's per token.
SaeConfig activation_config(const SaeConfig& cfg) {
    SaeConfig a = cfg;
    a.k = cfg.k * std::max<int64_t>(1, cfg.layers);
    // sae.target_l0 is per layer too (a JumpReLU CLT's controller sees the L0 over all layers).
    const double t = target_l0_key()(cfg);
    if (t > 0) a.set("sae.target_l0", t * static_cast<double>(std::max<int64_t>(1, cfg.layers)));
    return a;
}

class CltPass final : public WrappedPass {
public:
    CltPass(std::unique_ptr<ArchPass> inner, int64_t layers, bool skip)
        : WrappedPass(std::move(inner)), layers_(layers), skip_(skip) {}
    void forward(PassContext& c, bool training) override {
        SAE_ENFORCE(c.encode_x, "a CLT's pass needs PassContext::encode_x");
        c.layers = layers_;
        inner_->forward(c, training);
        // y_hat_l += x_l W_skip_l^T, layer by layer.
        const int64_t dl = c.d / layers_;
        if (skip_)
            for (int64_t l = 0; l < layers_; ++l)
                c.be.gemm(false, true, c.B, dl, dl, 1.0f, c.x + l * dl, c.d,
                          c.seg(kWSkip) + l * dl * dl, dl, 1.0f, c.xhat + l * dl, c.d);
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        c.layers = layers_;
        // G.W_skip_l = (dL/dy_hat_l)^T x_l, read before the activation's backward (which may
        // reuse ctx.xhat, dL/dy_hat, as scratch).
        const int64_t dl = c.d / layers_;
        if (skip_)
            for (int64_t l = 0; l < layers_; ++l)
                c.be.gemm(true, false, dl, dl, c.B, 1.0f, c.xhat + l * dl, c.d, c.x + l * dl, c.d,
                          0.0f, c.grad(kWSkip) + l * dl * dl, dl);
        inner_->backward(c, step, total_steps);
        // The decoder's blocks to earlier layers get no gradient (the encoder has none).
        const int64_t nl = c.n / layers_;
        float* g_dec = c.grad("W_dec");
        for (int64_t l = 1; l < layers_; ++l)
            c.be.zero_block(g_dec + l * nl * c.d, nl, l * dl, c.d);
    }

private:
    int64_t layers_;
    bool skip_;
};

class Clt final : public Architecture {
public:
    const char* name() const override { return "clt"; }
    const char* describe() const override {
        return "a cross-layer transcoder: data.path and data.target_path list each layer's MLP "
               "input and output; layer l's latents write to layers l..L; "
               "sae.transcoder_activation topk | batchtopk (sae.k per token and layer: on "
               "average over every layer's latents, or each layer's with sae.k_scope layer) | "
               "jumprelu; sae.skip adds a linear skip path a layer";
    }
    std::vector<const ArchKeyDecl*> config_keys() const override {
        std::vector<const ArchKeyDecl*> k = transcoder_arch().config_keys();
        k.push_back(&k_scope_key());
        k.push_back(&skip_key());
        return k;
    }
    std::vector<std::string> summary_keys() const override {
        std::vector<std::string> k = transcoder_arch().summary_keys();
        k.push_back("sae.k_scope");
        return k;
    }
    std::vector<const ArchOpSet*> op_sets() const override { return transcoder_arch().op_sets(); }
    void validate(const SaeConfig& cfg, int64_t n, const std::string& where) const override {
        SAE_ENFORCE(cfg.layers >= 1, "{}a CLT needs at least one layer", where);
        const int64_t latents = n > 0 ? n : cfg.n_latents;  // 0: expansion x d, a multiple
        SAE_ENFORCE(latents % cfg.layers == 0,
                    "{}sae.n_latents = {} is not a multiple of the CLT's {} layers (each layer has "
                    "n_latents / layers latents)",
                    where, latents, cfg.layers);
        SAE_ENFORCE(!per_layer_l0(cfg) || target_l0_key()(cfg) > 0,
                    "{}sae.k_scope: layer with a JumpReLU CLT holds each layer's L0 at "
                    "sae.target_l0, which is not set (set it, or sae.k_scope: token)",
                    where);
        transcoder_activation_arch(cfg).validate(activation_config(cfg), n, where);
    }
    // The transcoder's ("k4", "batchtopk-k4", "jumprelu-l0_0.01"), "-layer" added for a
    // per-layer selection or L0.
    std::string id_suffix(const SaeConfig& cfg) const override {
        const bool layer = per_layer_selection(cfg) || per_layer_l0(cfg);
        return transcoder_arch().id_suffix(cfg) + (layer ? "-layer" : "") +
               (skip_key()(cfg) ? "-skip" : "");
    }
    std::vector<ParamSegment> tensors(const SaeConfig& cfg, int64_t n, int64_t d) const override {
        std::vector<ParamSegment> s =
            transcoder_activation_arch(cfg).tensors(activation_config(cfg), n, d);
        const int64_t L = std::max<int64_t>(1, cfg.layers), dl = d / L;
        for (ParamSegment& t : s)
            if (t.name == "W_enc") {  // [n, d_l]: each latent reads its own layer's values
                SAE_ENFORCE(t.rows == n && t.cols == d && t.transposed,
                            "the CLT's activation declares W_enc [{}, {}], not the transcoder's",
                            t.rows, t.cols);
                t.cols = dl, t.transposed = false;
            }
        if (skip_key()(cfg)) {  // from zero (the parameters are zero before init_extra)
            ParamSegment w = whole_tensor(kWSkip, L * dl, dl, false);
            w.dims = {L, dl, dl};
            s.push_back(w);
        }
        return s;
    }
    // The trainer drew unit decoder rows over all d values (and leaves the encoder, of another
    // shape than the decoder, to the architecture). Here: each decoder row keeps its blocks from
    // its layer on (unit norm again), each encoder row is its decoder row's own layer's block
    // (unit norm), and b_enc = -W_enc mean(x_l).
    void init_extra(const SaeConfig& cfg, const ParamLayout& layout, std::vector<float>& p,
                    const InitInputs& in) const override {
        const int64_t L = cfg.layers;
        const ParamSegment& dec_seg = layout.segment("W_dec");
        const int64_t n = dec_seg.rows, d = dec_seg.cols, dl = d / L, nl = n / L;
        const ParamSegment& enc = layout.segment("W_enc");
        SAE_ENFORCE(enc.rows == n && enc.cols == dl, "a CLT's W_enc is [{}, {}], expected [{}, {}]",
                    enc.rows, enc.cols, n, dl);
        float* w_enc = p.data() + enc.offset;
        float* w_dec = p.data() + dec_seg.offset;
        float* b_enc = p.data() + layout.offset("b_enc");
        for (int64_t i = 0; i < n; ++i) {
            const int64_t l = i / nl;
            float* dec = w_dec + i * d;
            float* e = w_enc + i * dl;
            std::fill(dec, dec + l * dl, 0.0f);
            double s = 0, se = 0;
            for (int64_t c = l * dl; c < d; ++c) s += double(dec[c]) * dec[c];
            for (int64_t c = l * dl; c < (l + 1) * dl; ++c) se += double(dec[c]) * dec[c];
            const double inv = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
            for (int64_t c = l * dl; c < d; ++c) dec[c] = static_cast<float>(dec[c] * inv);
            const double inv_e = se > 0 ? 1.0 / std::sqrt(se * inv * inv) : 0.0;
            double a = 0;
            for (int64_t c = 0; c < dl; ++c) {
                e[c] = static_cast<float>(dec[l * dl + c] * inv_e);
                if (!in.input_mean.empty()) a += double(e[c]) * in.input_mean[l * dl + c];
            }
            b_enc[i] = static_cast<float>(-a);
        }
        transcoder_activation_arch(cfg).init_extra(activation_config(cfg), layout, p, in);
    }
    bool inits_from_preactivations(const SaeConfig& cfg) const override {
        return transcoder_activation_arch(cfg).inits_from_preactivations(activation_config(cfg));
    }
    void init_from_preactivations(const SaeConfig& cfg, const ParamLayout& layout,
                                  std::vector<float>& p, const float* v, int64_t rows, int64_t n,
                                  Communicator& replicas,
                                  const SumOverLatentShards& over_latent_shards) const override {
        transcoder_activation_arch(cfg).init_from_preactivations(
            activation_config(cfg), layout, p, v, rows, n, replicas, over_latent_shards);
    }
    // Model FLOPs: the encoder (n d_l each way), and decoders that reach
    // (L + 1) / 2 layers on average.
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        const double L = static_cast<double>(cfg.layers);
        const double dl = static_cast<double>(d) / L, nn = static_cast<double>(n);
        const double reach = dl * (L + 1) / 2;
        const Architecture& a = transcoder_activation_arch(cfg);
        const double skip = skip_key()(cfg) ? 4.0 * L * dl * dl : 0.0;  // forward and G.W_skip
        if (&a == &jumprelu_arch()) return 4.0 * dl * nn + 6.0 * nn * reach + skip;
        return 2.0 * dl * nn + 8.0 * static_cast<double>(cfg.k) * L * reach + skip;
    }
    bool sparse() const override { return true; }
    // circuit-tracer's CLT layout (ArchExport::clt_layers): each layer's rows of the encoder,
    // its decoder blocks to itself and every later layer, and the activation's threshold
    // per feature (BatchTopK's one inference threshold for every feature, JumpReLU's own, and
    // with sae.k_scope layer each layer's threshold for its features, BatchTopK's or TopK's); a
    // TopK over every layer's latents has none and is refused.
    ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const override {
        ArchExport e;
        e.transcode = true;
        e.saelens_refusal = "SAELens has no cross-layer transcoder";
        e.sparsify_refusal =
            "saetrain does not write sparsify's cross-layer transcoder layout; export it with "
            "--format circuit_tracer";
        const Architecture& a = transcoder_activation_arch(cfg);
        if (skip_key()(cfg)) {
            e.circuit_tracer_refusal =
                "circuit-tracer's cross-layer transcoders have no skip path, which this CLT "
                "(sae.skip) needs; train one without sae.skip to export it";
            return e;
        }
        if (&a == &topk_arch() && !per_layer_selection(cfg)) {
            e.circuit_tracer_refusal =
                "circuit-tracer's CLTs are ReLU or JumpReLU, which a per-token top-k over every "
                "layer is not; train with sae.k_scope: layer (exported through each layer's "
                "threshold) or sae.transcoder_activation: batchtopk or jumprelu";
            return e;
        }
        std::vector<float> threshold;  // [n], as SAELens's JumpReLU export holds it
        const int64_t L = cfg.layers, d = w.d_model, n = w.n_latents, F = n / L, dl = d / L;
        if (per_layer_selection(cfg)) {  // each layer's threshold for its features
            SAE_ENFORCE(w.has("threshold"),
                        "this per-layer TopK CLT was trained before saetrain kept each layer's "
                        "threshold, which circuit-tracer's JumpReLU needs; train it again");
            const std::vector<float>& t = extra_tensor(w, "threshold");
            SAE_ENFORCE(static_cast<int64_t>(t.size()) == L,
                        "a CLT with per-layer {} has a threshold of {} values, expected {}",
                        a.name(), t.size(), L);
            for (int64_t l = 0; l < L; ++l)
                SAE_ENFORCE(t[l] > 0,
                            "layer {}'s threshold is {}: the CLT has not trained long enough to "
                            "estimate it",
                            l, t[l]);
            for (int64_t l = 0; l < L; ++l) threshold.insert(threshold.end(), F, t[l]);
        } else {
            for (const ExportTensor& t : a.export_fields(w, activation_config(cfg)).saelens_tensors)
                if (t.name == "threshold") threshold = t.data;
        }
        SAE_ENFORCE(threshold.size() == static_cast<size_t>(w.n_latents),
                    "the {} export has no threshold per latent", a.name());
        const std::vector<float>&w_enc = w.at("W_enc"), &w_dec = w.at("W_dec");  // [n, dl], [n, d]
        SAE_ENFORCE(static_cast<int64_t>(w_enc.size()) == n * dl,
                    "the CLT's W_enc holds {} values, not [{}, {}]", w_enc.size(), n, dl);
        const std::vector<float>&b_enc = w.at("b_enc"), &b_dec = w.at("b_dec");
        e.clt_features = F, e.clt_width = dl;
        for (int64_t l = 0; l < L; ++l) {
            ArchExport::CltLayer c;
            c.w_enc.resize(static_cast<size_t>(F * dl));
            c.w_dec.resize(static_cast<size_t>(F * (L - l) * dl));
            for (int64_t f = 0; f < F; ++f) {
                const int64_t i = l * F + f;  // the latent
                std::copy_n(w_enc.begin() + i * dl, dl, c.w_enc.begin() + f * dl);
                std::copy_n(w_dec.begin() + i * d + l * dl, (L - l) * dl,
                            c.w_dec.begin() + f * (L - l) * dl);
            }
            c.b_enc.assign(b_enc.begin() + l * F, b_enc.begin() + (l + 1) * F);
            c.b_dec.assign(b_dec.begin() + l * dl, b_dec.begin() + (l + 1) * dl);
            c.threshold.assign(threshold.begin() + l * F, threshold.begin() + (l + 1) * F);
            e.clt_layers.push_back(std::move(c));
        }
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        const SaeConfig act = activation_config(cfg);
        const Architecture& a = transcoder_activation_arch(cfg);
        std::unique_ptr<ArchPass> inner;
        if (per_layer_l0(cfg))
            inner = make_layered_jumprelu_pass(act, d, n, be, cfg.layers);
        else if (!per_layer_selection(cfg))
            inner = a.make_pass(act, d, n, be);
        else if (&a == &batchtopk_arch())
            inner = std::make_unique<LayerBatchTopkPass>(act, d, n, be, cfg.layers);
        else
            inner = std::make_unique<LayerTopkPass>(act, d, n, be, cfg.layers);
        return std::make_unique<CltPass>(std::move(inner), cfg.layers, skip_key()(cfg));
    }
    RowSpec rows() const override { return {true, true}; }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return transcoder_activation_arch(cfg).limited_ops(activation_config(cfg), d, n);
    }
};

}  // namespace

const Architecture& clt_arch() {
    static const Clt a;
    return a;
}

}  // namespace saetrain::arch
