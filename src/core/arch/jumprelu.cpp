// jumprelu.cpp — JumpReLU (Rajamanoharan et al. 2024): z = v * H(v - theta) with a learned
// per-latent threshold theta = exp(log_threshold), trained through straight-through
// pseudo-derivatives (rectangle kernel of bandwidth sae.jumprelu_bandwidth; sae_math.h) with
// an L0 penalty train.l0_coeff * sum_i H(v_i - theta_i) that ramps in like the L1 term (or that
// sae.target_l0 adapts: SparsityCoefficient, common.h, with one shift of every log(threshold)
// that holds the L0 at the target). Its own ops (arch/jumprelu.h): the activation and its
// backward, with their CPU reference here.
#include "saetrain/arch/jumprelu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common.h"
#include "reference.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/perfmodel.h"
#include "saetrain/sae_math.h"

namespace saetrain::arch {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
class CpuJumpReluOps final : public JumpReluOps {
public:
    void jumprelu_forward(float* pre, const float* b_enc, const float* log_threshold, int64_t rows,
                          int64_t n, float* z) override {
        std::vector<float> theta(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) theta[i] = std::exp(log_threshold[i]);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* p = pre + r * n;
            float* zr = z + r * n;
            for (int64_t i = 0; i < n; ++i) {
                p[i] += b_enc[i];
                zr[i] = math::jumprelu(p[i], theta[i]);
            }
        }
    }

    void jumprelu_backward(const JumpReluBackward& args) override {
        const auto& [v, log_threshold, bandwidth, l0, rows, n, dz, db_enc, dlog_threshold, fires,
                     stats, norms, tanh_scale, norm_grad, dead_mask, pre_act] = args;
        const int64_t nb = ceil_div(n, kColBlock);
        std::vector<double> l0s(nb), tanhs(nb), pres(nb);
        const bool tanh = norms && tanh_scale > 0;
        const float l0_term = tanh ? 0.0f : l0;  // the tanh penalty replaces the L0 term
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t c0 = b * kColBlock, w = std::min(n, c0 + kColBlock) - c0;
            float gsum[kColBlock] = {}, tsum[kColBlock] = {}, fsum[kColBlock] = {},
                  nsum[kColBlock] = {}, hsum[kColBlock] = {}, psum[kColBlock] = {},
                  theta[kColBlock], width[kColBlock];
            for (int64_t c = 0; c < w; ++c) {
                theta[c] = std::exp(log_threshold[c0 + c]);
                width[c] = math::jumprelu_width(bandwidth, theta[c]);
            }
            for (int64_t r = 0; r < rows; ++r) {
                const float* vr = v + r * n + c0;
                float* g = dz + r * n + c0;
                if (!norms) {  // the L0 term alone: this loop as it was before the penalties
                    for (int64_t c = 0; c < w; ++c) {
                        float dv, dt;
                        math::jumprelu_grad(vr[c], theta[c], width[c], g[c], l0, dv, dt);
                        g[c] = dv;
                        gsum[c] += dv;
                        tsum[c] += dt;
                        fsum[c] += vr[c] > theta[c] ? 1.0f : 0.0f;
                    }
                    continue;
                }
                for (int64_t c = 0; c < w; ++c) {
                    float dv, dt, gz = g[c];
                    if (tanh) {
                        float dn;
                        hsum[c] += math::tanh_penalty_grad(math::jumprelu(vr[c], theta[c]),
                                                           norms[c0 + c], tanh_scale, l0, gz, dn);
                        nsum[c] += dn;
                    }
                    math::jumprelu_grad(vr[c], theta[c], width[c], gz, l0_term, dv, dt);
                    if (dead_mask && dead_mask[c0 + c] != 0.0f) {
                        float dn;
                        psum[c] +=
                            math::pre_act_grad(vr[c], theta[c], norms[c0 + c], pre_act, dv, dt, dn);
                        nsum[c] += dn;
                    }
                    g[c] = dv;
                    gsum[c] += dv;
                    tsum[c] += dt;
                    fsum[c] += vr[c] > theta[c] ? 1.0f : 0.0f;
                }
            }
            double f = 0, h = 0, pa = 0;
            for (int64_t c = 0; c < w; ++c) {
                db_enc[c0 + c] = gsum[c];
                dlog_threshold[c0 + c] = tsum[c] * theta[c];  // d/dlog(theta) = theta d/dtheta
                fires[c0 + c] = static_cast<int32_t>(fsum[c]);
                if (norms) norm_grad[c0 + c] = nsum[c];
                f += fsum[c];
                h += hsum[c];
                pa += psum[c];
            }
            l0s[b] = f;
            tanhs[b] = h;
            pres[b] = pa;
        }
        for (int64_t b = 0; b < nb; ++b) {
            stats[kStatL0] += static_cast<float>(l0s[b]);
            if (tanh) stats[kStatL1] += static_cast<float>(tanhs[b]);
            if (dead_mask) stats[kStatAux] += static_cast<float>(pres[b]);
        }
    }
};

// Every op through a ForwardingBackend's hook.
class ForwardedJumpReluOps final : public JumpReluOps {
public:
    ForwardedJumpReluOps(JumpReluOps& inner, OpHook hook) : inner_(inner), hook_(std::move(hook)) {}
    void jumprelu_forward(float* pre, const float* b_enc, const float* log_threshold, int64_t rows,
                          int64_t n, float* z) override {
        hook_("jumprelu_forward",
              [&] { inner_.jumprelu_forward(pre, b_enc, log_threshold, rows, n, z); });
    }
    void jumprelu_backward(const JumpReluBackward& a) override {
        hook_("jumprelu_backward", [&] { inner_.jumprelu_backward(a); });
    }

private:
    JumpReluOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------

// The threshold of sae.jumprelu_init_threshold 0 until the first batch sets them, and the L0 they
// are set to when there is no sae.target_l0.
constexpr double kPlaceholderThreshold = 0.001;
constexpr double kDefaultInitL0 = 32;
// Adam moves each log(threshold) by about the learning rate a step, whatever the L0
// coefficient: too slow to follow the encoder's pre-activations as they grow, and once a faster
// threshold lr lets them catch up, a coefficient grown meanwhile collapses the SAE
// (docs/architectures.md, "JumpReLU's threshold shift", has the runs). So with sae.target_l0 every
// threshold is exp(log_threshold + shift), one shift for the SAE that a controller moves after
// every step to hold the L0 at its target (JumpReluPass::after_update): the L0 follows the shift at
// once and the coefficient's error stays small. The shift is a buffer (checkpointed, in final.h5);
// the exports fold it into the thresholds.
constexpr const char* kShiftBuffer = "log_threshold_shift";
constexpr double kDefaultThresholdLrScale = 1;

struct JumpReluKeys {
    ArchKey<double> bandwidth{
        "sae",
        "jumprelu_bandwidth",
        0.001,
        "the straight-through estimator's kernel width (0: twice each latent's threshold, a "
        "width on the data's own scale)",
        {[](const ConfigValue& v) { return std::get<double>(v) >= 0; },
         "must be >= 0 (0: twice each threshold)"}};
    ArchKey<double> init_threshold{
        "sae",
        "jumprelu_init_threshold",
        0.0,
        "every latent's threshold at init (0: from the first batch, where sae.target_l0 (else "
        "32) latents per token fire)",
        {[](const ConfigValue& v) { return std::get<double>(v) >= 0; },
         "must be >= 0 (0: from the first batch)"}};
    // SAELens's names (JumpReLUTrainingSAEConfig: jumprelu_sparsity_loss_mode, step | tanh;
    // jumprelu_tanh_scale; pre_act_loss_coefficient).
    ArchKey<std::string> penalty{
        "sae", "jumprelu_sparsity_loss_mode", "step",
        "the sparsity penalty train.l0_coeff weighs: step (the number of active latents, "
        "straight-through) | tanh (sum_i tanh(c z_i ||W_dec_i||), c = sae.jumprelu_tanh_scale: "
        "the penalty of Anthropic's cross-layer transcoders)",
        key_one_of({"step", "tanh"})};
    ArchKey<double> pre_act_coeff{
        "train", "pre_act_loss_coeff", 0.0,
        "Anthropic's pre-activation loss on dead latents, coeff * sum_i relu(theta_i - v_i) "
        "||W_dec_i|| over the latents dead by train.dead_tokens (SAELens's "
        "pre_act_loss_coefficient; Anthropic used 3e-6)",
        key_at_least(0, " (0: off)")};
    ArchKey<double> tanh_scale{
        "sae",
        "jumprelu_tanh_scale",
        4.0,
        "c of the tanh penalty (sae.jumprelu_sparsity_loss_mode: tanh)",
        {[](const ConfigValue& v) { return std::get<double>(v) > 0; }, "must be > 0"}};
    ArchKey<double> threshold_lr_scale{
        "sae",
        "jumprelu_threshold_lr_scale",
        kDefaultThresholdLrScale,
        "the thresholds' learning rate over train.lr (Adam moves log(threshold) about lr times "
        "this a step)",
        {[](const ConfigValue& v) { return std::get<double>(v) > 0; }, "must be > 0"}};
};
const JumpReluKeys& keys() {
    static const JumpReluKeys k;
    return k;
}

class JumpReluPass final : public PenalizedPass {
public:
    // `layers` > 1 (make_layered_jumprelu_pass): the latents are `layers` blocks of n / layers,
    // and with sae.target_l0 each block's threshold shift follows that block's own L0.
    JumpReluPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be, int64_t layers = 1)
        : PenalizedPass(cfg, cfg.l0_coeff, "l0_coeff"),
          cfg_(cfg),
          n_(n),
          layers_(layers),
          be_(be),
          ops_(arch_ops<JumpReluOps>(be, jumprelu_op_set())),
          decorr_(cfg),
          auxk_(cfg, d, n, be),
          shift_(static_cast<size_t>(layers), 0.0f) {
        SAE_ENFORCE(layers >= 1 && n % layers == 0,
                    "a JumpReLU of {} latents cannot hold {} equal blocks", n, layers);
    }
    void reserve(int64_t rows) override {
        ensure(z_, be_, rows * n_);
        ensure(dz_, be_, rows * n_);
    }
    void forward(PassContext& c, bool) override {
        encode(c);
        ops_.jumprelu_forward(c.pre, c.seg("b_enc"), log_thresholds(c), c.B, c.n, z_.data());
        decode_dense(c, z_.data());
    }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        const int64_t B = c.B, n = c.n;
        l0_ = coeff_.at(step, total_steps);
        decoder_backward_dense(c, z_.data(), dz_.data());
        decorr_.dense(c, z_.data(), dz_.data());
        const float l0_eff = static_cast<float>(l0_ / static_cast<double>(c.norm_rows));
        JumpReluBackward a;
        a.v = c.pre, a.log_threshold = shifts_ ? shifted_.data() : c.seg("log_threshold");
        a.bandwidth = static_cast<float>(keys().bandwidth(cfg_)), a.l0 = l0_eff, a.rows = B,
        a.n = n;
        a.dz_to_dpre = dz_.data(), a.db_enc = c.grad("b_enc");
        a.dlog_threshold = c.grad("log_threshold"), a.fires = c.fires, a.stats = c.stats;
        // The penalties on the decoder norms: the tanh penalty, the pre-activation loss on the
        // latents dead before this step.
        const bool pre_act = pre_act_ > 0 && c.dead && c.n_dead > 0;
        if (tanh_ || pre_act) {
            ensure(norms_, be_, n), ensure(norm_grad_, be_, n);
            be_.row_norms(c.seg("W_dec"), n, c.d, norms_.data());
            a.norms = norms_.data(), a.norm_grad = norm_grad_.data();
            if (tanh_) a.tanh_scale = static_cast<float>(keys().tanh_scale(cfg_));
        }
        if (pre_act) {
            ensure(dead_mask_, be_, n);
            mask_host_.resize(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) mask_host_[i] = (*c.dead)[i] ? 1.0f : 0.0f;
            be_.upload(dead_mask_.data(), mask_host_.data(), n * int64_t{sizeof(float)});
            a.dead_mask = dead_mask_.data();
            a.pre_act = static_cast<float>(pre_act_ / static_cast<double>(c.norm_rows));
        }
        pre_act_on_ = pre_act;
        ops_.jumprelu_backward(a);
        if (tanh_ || pre_act)
            be_.add_norm_grad(c.seg("W_dec"), norm_grad_.data(), 1.0f, c.grad("W_dec"), n, c.d);
        encoder_weight_grad(c, dz_.data());
        // AuxK among the dead latents' pre-activations (ctx.pre holds them, b_enc added).
        auxk_.backward(c, c.pre, true);
        encoder_input_grad(c, c.grad("b_enc"));
    }
    double penalty(const float* st) const override {
        return l0_ * st[tanh_ ? kStatL1 : kStatL0] + (pre_act_on_ ? pre_act_ * st[kStatAux] : 0) +
               decorr_.penalty(st) + auxk_.penalty(st);
    }
    Activations activations() const override { return {z_.data(), nullptr, nullptr, 0}; }

    // sae.target_l0: the L0 coefficient adapts as for ReLU and Gated, and the shift follows the
    // L0 at once (after every step, by kShiftGain * log(L0 / target_t), frozen with the
    // coefficient for the last steps). With blocks, the coefficient follows the L0 over all of
    // them and each block's shift its own L0 against target_t / blocks.
    void after_update(const StepTotals& t) override {
        const double err = coeff_.after_update(t);
        if (!shifts_ || err == 0.0) return;  // 0: the coefficient did not move (frozen, no rows)
        if (layers_ == 1) {
            shift_[0] = static_cast<float>(shift_[0] + kShiftGain * err);
            return;
        }
        SAE_ENFORCE(t.fires && static_cast<int64_t>(t.fires->size()) == n_,
                    "a JumpReLU with an L0 target a layer needs the step's firing counts of its {} "
                    "latents",
                    n_);
        const int64_t F = n_ / layers_;
        const double target = coeff_.target_at(t.step, t.total_steps) / double(layers_);
        for (int64_t l = 0; l < layers_; ++l) {
            double fired = 0;
            for (int64_t i = l * F; i < (l + 1) * F; ++i) fired += (*t.fires)[i];
            const double l0 = fired / static_cast<double>(t.rows);
            const double e = std::log(std::max(l0, 0.01 * target)) - std::log(target);
            shift_[l] = static_cast<float>(shift_[l] + kShiftGain * e);
        }
    }
    std::vector<NamedTensor> buffers() const override {
        std::vector<NamedTensor> b = PenalizedPass::buffers();
        if (shifts_) b.emplace_back(kShiftBuffer, shift_);
        return b;
    }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        if (!(shifts_ && name == kShiftBuffer)) return PenalizedPass::set_buffer(name, v);
        SAE_ENFORCE(v.size() == shift_.size(), "the SAE's '{}' buffer holds {} value(s), not {}",
                    name, shift_.size(), v.size());
        shift_ = v;
    }
    std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>& a, const std::vector<double>& b) const override {
        auto s = PenalizedPass::summarize(a, b);
        if (shifts_ && layers_ == 1)
            s.emplace_back(std::string(kShiftBuffer) + "_final", shift_[0]);
        if (shifts_ && layers_ > 1)
            for (int64_t l = 0; l < layers_; ++l)
                s.emplace_back(fmt::format("{}_layer{}_final", kShiftBuffer, l), shift_[l]);
        return s;
    }

private:
    static constexpr double kShiftGain = 0.1;
    // log(theta) = log_threshold + shift_ with sae.target_l0 (the parameters alone without).
    const float* log_thresholds(PassContext& c) {
        if (!shifts_) return c.seg("log_threshold");
        ensure(shifted_, be_, c.n);
        const int64_t F = c.n / layers_;
        for (int64_t l = 0; l < layers_; ++l) be_.fill(shifted_.data() + l * F, F, shift_[l]);
        be_.axpby(shifted_.data(), c.seg("log_threshold"), 1.0f, 1.0f, c.n);
        return shifted_.data();
    }

    SaeConfig cfg_;
    int64_t n_, layers_;
    Backend& be_;
    JumpReluOps& ops_;
    Decorrelation decorr_;
    AuxK auxk_;
    DeviceArray<float> z_, dz_, shifted_, norms_, norm_grad_, dead_mask_;
    std::vector<float> mask_host_;
    bool tanh_ = keys().penalty(cfg_) == "tanh";
    double pre_act_ = keys().pre_act_coeff(cfg_);
    bool pre_act_on_ = false;  // this step's backward applied the pre-activation loss
    double l0_ = 0;
    bool shifts_ = target_l0_key()(cfg_) > 0;
    std::vector<float> shift_;  // a block's (floats: a checkpoint holds them exactly)
};

class JumpRelu final : public Architecture {
public:
    const char* name() const override { return "jumprelu"; }
    const char* describe() const override {
        return "a learned threshold per latent, L0 penalty (train.l0_coeff), straight-through "
               "with sae.jumprelu_bandwidth";
    }
    std::vector<const ArchKeyDecl*> config_keys() const override {
        std::vector<const ArchKeyDecl*> k = {&keys().bandwidth,          &keys().init_threshold,
                                             &keys().threshold_lr_scale, &keys().penalty,
                                             &keys().tanh_scale,         &keys().pre_act_coeff,
                                             &target_l0_key(),           &target_l0_rate_key()};
        for (const ArchKeyDecl* a : auxk_config_keys()) k.push_back(a);
        return k;
    }
    // AuxK's top-k among the dead latents (none of its own).
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, 0, d, n);
    }
    std::vector<std::string> summary_keys() const override {
        return {"train.l0_coeff", "sae.target_l0", "sae.jumprelu_sparsity_loss_mode"};
    }
    std::vector<const ArchOpSet*> op_sets() const override { return {&jumprelu_op_set()}; }
    // Signum at the rule's lr, with AuxK: a lower held-out FVU than AdamW's at the same L0, and
    // than twice the lr (docs/architectures.md, "The optimizer").
    const char* default_optimizer() const override { return "signum"; }
    void validate(const SaeConfig& cfg, int64_t, const std::string& where) const override {
        SAE_ENFORCE(keys().bandwidth(cfg) >= 0, "{}sae.jumprelu_bandwidth must be >= 0 (got {})",
                    where, keys().bandwidth(cfg));
        SAE_ENFORCE(keys().init_threshold(cfg) >= 0,
                    "{}sae.jumprelu_init_threshold must be >= 0 (got {})", where,
                    keys().init_threshold(cfg));
    }
    // "l0_0.01", "target_l0_32"; with the tanh penalty "tanh_0.01", "target_l0_32-tanh".
    std::string id_suffix(const SaeConfig& cfg) const override {
        const double t = target_l0_key()(cfg);
        const bool tanh = keys().penalty(cfg) == "tanh";
        if (t > 0) return fmt::format("target_l0_{}{}", t, tanh ? "-tanh" : "");
        return fmt::format("{}_{}", tanh ? "tanh" : "l0", cfg.l0_coeff);
    }
    std::vector<ParamSegment> tensors(const SaeConfig& cfg, int64_t n, int64_t d) const override {
        std::vector<ParamSegment> s = sae_tensors(n, d);
        s.push_back(latent_vector("log_threshold", n));
        s.back().lr_scale = static_cast<float>(keys().threshold_lr_scale(cfg));
        return s;
    }
    void init_extra(const SaeConfig& cfg, const ParamLayout& layout, std::vector<float>& p,
                    const InitInputs&) const override {
        // 0 (from the first batch): a placeholder until init_from_preactivations.
        const double t = keys().init_threshold(cfg);
        const int64_t off = layout.offset("log_threshold");
        const auto v = static_cast<float>(std::log(t > 0 ? t : kPlaceholderThreshold));
        const int64_t n = layout.segment("b_enc").rows;
        std::fill(p.begin() + off, p.begin() + off + n, v);
    }
    bool inits_from_preactivations(const SaeConfig& cfg) const override {
        return keys().init_threshold(cfg) == 0;
    }
    // The thresholds at which sae.target_l0 (else kDefaultInitL0) latents a row fire on the
    // first batch's pre-activations (thresholds_at_l0): the SAE starts at the L0 it is to have.
    void init_from_preactivations(const SaeConfig& cfg, const ParamLayout& layout,
                                  std::vector<float>& p, const float* v, int64_t rows, int64_t n,
                                  Communicator& replicas,
                                  const SumOverLatentShards& over_latent_shards) const override {
        const double target = target_l0_key()(cfg);
        const std::vector<double> theta = thresholds_at_l0(
            v, rows, n, target > 0 ? target : kDefaultInitL0, replicas, over_latent_shards);
        if (theta.empty()) return;
        // A latent that never moved off zero keeps the placeholder (it has no scale to go by).
        const int64_t off = layout.offset("log_threshold");
        for (int64_t i = 0; i < n; ++i)
            p[off + i] =
                static_cast<float>(std::log(theta[i] > 0 ? theta[i] : kPlaceholderThreshold));
    }
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return sae_flops_per_token(SaeKind::dense, d, n, cfg.k);
    }
    bool sparse() const override { return false; }
    bool latent_shardable() const override { return true; }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "jumprelu";
        e.saelens_tensors = saelens_base(w);
        // The shift buffer holds one value, or one a block of latents (a CLT's layers).
        std::vector<float> t = extra_tensor(w, "log_threshold");
        std::vector<float> shift{0.0f};
        if (const WeightTensor* s = w.find(kShiftBuffer); s && !s->data.empty()) shift = s->data;
        const auto blocks = static_cast<int64_t>(shift.size());
        SAE_ENFORCE(w.n_latents % blocks == 0,
                    "the SAE's '{}' holds {} values, which do not split its {} latents evenly",
                    kShiftBuffer, blocks, w.n_latents);
        for (int64_t i = 0; i < w.n_latents; ++i)
            t[i] = std::exp(t[i] + shift[static_cast<size_t>(i / (w.n_latents / blocks))]);
        e.saelens_tensors.push_back({"threshold", {w.n_latents}, std::move(t)});
        e.sparsify_refusal = "sparsify has no JumpReLU activation";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<JumpReluPass>(cfg, d, n, be);
    }
};

}  // namespace

const Architecture& jumprelu_arch() {
    static const JumpRelu a;
    return a;
}

std::unique_ptr<ArchPass> make_layered_jumprelu_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                                     Backend& be, int64_t layers) {
    return std::make_unique<JumpReluPass>(cfg, d, n, be, layers);
}

}  // namespace saetrain::arch

const saetrain::ArchOpSet& saetrain::jumprelu_op_set() {
    static const ArchOpSet set{"jumprelu",
                               {"jumprelu_forward", "jumprelu_backward"},
                               [](Backend&) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::CpuJumpReluOps>();
                               },
                               [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::ForwardedJumpReluOps>(
                                       static_cast<JumpReluOps&>(inner), std::move(hook));
                               }};
    return set;
}
