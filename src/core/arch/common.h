// common.h — pieces the architectures share: the encoder, the decoder-bias term through the
// encoder input, AuxK, and the registry's entries.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/schedule.h"
#include "saetrain/sharded_topk.h"

namespace saetrain::arch {

// ctx.xc = x - b_dec (x itself when ctx.encode_x); ctx.pre = xc W_enc^T (b_enc is the activation's
// to add); ctx.xhat = b_dec in every row (the decoder adds z W_dec); on a latent shard other than
// the first, xhat = 0, so that the latent shards' partial reconstructions sum to one x_hat.
void encode(PassContext& ctx);
// out [B, d] = b_dec in every row, where a reconstruction starts (0 on a latent shard after the
// first: the latent shards' partial reconstructions then sum to one with b_dec once).
void start_reconstruction(PassContext& ctx, float* out);
// The top k of ctx.pre + bias per row into (idx, val) [B, k] (ReLU'd when `relu`): topk_forward,
// or on a latent shard the exact global selection with this latent shard's own entries kept (local
// ids, the others absent; sharded_topk_own).
void select_topk(PassContext& ctx, const float* bias, int64_t k, int32_t* idx, float* val,
                 bool relu, ShardedTopkScratch& scratch);
// The same over the pre-activations `pre` (ctx.pre by default).
void select_topk(PassContext& ctx, const float* pre, const float* bias, int64_t k, int32_t* idx,
                 float* val, bool relu, ShardedTopkScratch& scratch);
// On a latent shard: data [count] (backend memory) summed over the latent shards, in place.
void sum_over_latent_shards(PassContext& ctx, float* data, int64_t count);
// b_dec also enters through the encoder input x - b_dec: G.b_dec -= dpre_col_sum^T W_enc,
// with dpre_col_sum [n] the column sums of dL/dpre. Nothing when ctx.encode_x.
void encoder_input_grad(PassContext& ctx, const float* dpre_col_sum);

// The sparse decoder: out [rows, d] += each row's (idx, val) [rows, width] rows of W_dec; a
// layered model's (ctx.layers > 1) through sparse_decode_layered.
void decode_sparse(PassContext& ctx, const int32_t* idx, const float* val, int64_t rows,
                   int64_t width, float* out);
// The dense decoder: ctx.xhat += z W_dec (z [B, n]).
void decode_dense(PassContext& ctx, const float* z);
// Its backward, with ctx.xhat holding dL/dx_hat: G.W_dec = z^T dL/dx_hat, dz = dL/dx_hat W_dec^T.
void decoder_backward_dense(PassContext& ctx, const float* z, float* dz);
// G.W_enc = dpre^T (x - b_dec), dpre [B, n] the gradient of the pre-activations.
void encoder_weight_grad(PassContext& ctx, const float* dpre);

// AuxK's keys (below), declared once for the architectures that use AuxK (TopK, BatchTopK,
// Switch: each lists them in its config_keys).
struct AuxKKeys {
    ArchKey<int64_t> k_aux{"sae", "k_aux", 0,
                           "AuxK's latents per token among the dead (0: d_model / 2, at most 512)",
                           key_at_least(0, " (0: d_model / 2)")};
    ArchKey<double> coeff{"train", "auxk_coeff", 0.03125,
                          "the AuxK loss's weight, reviving dead latents (0: off)",
                          key_at_least(0, " (0: no AuxK)")};
};
const AuxKKeys& auxk_keys();
std::vector<const ArchKeyDecl*> auxk_config_keys();

// What TopK and BatchTopK share: sae.k, its check, its id, AuxK's keys, sparse kernels and
// their FLOPs.
class KSelection : public Architecture {
public:
    std::vector<const ArchKeyDecl*> config_keys() const override { return auxk_config_keys(); }
    std::vector<std::string> summary_keys() const override { return {"sae.k"}; }
    void validate(const SaeConfig& cfg, int64_t n, const std::string& where) const override;
    std::string id_suffix(const SaeConfig& cfg) const override;
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override;
    bool sparse() const override { return true; }
};

// Grows `a` to at least `size` elements (contents are not kept).
template <class T>
void ensure(DeviceArray<T>& a, Backend& be, int64_t size) {
    if (a.size() < size) a = DeviceArray<T>(be, size);
}

// AuxK (Gao et al. 2024): the k_aux largest pre-activations (not ReLU'd) among the latents dead
// before this step reconstruct the main reconstruction's residual e = x - x_hat (held fixed); the
// loss auxk_coeff * min(n_dead / k_aux, 1) * sum ||e_hat - e||^2 (in the main loss's units) sends
// gradient only into dead latents' encoder and decoder rows (and b_dec through the encoder
// input). Runs after the main backward, adding to its gradients.
// The default k_aux is d_model / 2, at most this: the CUDA top-k selects up to 512 per row.
inline constexpr int64_t kDefaultKAuxMax = 512;

// sae.k_aux, or d_model / 2 (at most kDefaultKAuxMax) when it is 0; never more than `latents`
// (the latents one selection sees: the SAE's, or a Switch expert's).
int64_t resolved_k_aux(const SaeConfig& cfg, int64_t d, int64_t latents);
// The auxiliary loss's weight this step: auxk_coeff * min(n_dead / k_aux, 1).
double auxk_weight(double coeff, int64_t n_dead, int64_t k_aux);
// bias = b_enc + (0 for the latents dead before this step, -inf for live ones): a top-k over
// pre + bias then selects among the dead latents only (without `with_b_enc`: the mask alone,
// for pre-activations that hold b_enc already). `host`: scratch of n floats.
void dead_only_bias(PassContext& c, float* bias, std::vector<float>& host, bool with_b_enc = true);

// topk_backward's arguments for the selection (idx, val) [rows, k] of the rows x (the encoder's
// input) with dL/dx_hat derr: into the SAE's gradients, c.fires and c.stats, overwriting.
SparseBackward sparse_backward(const PassContext& c, const float* x, const float* derr,
                               const int32_t* idx, const float* val, int64_t rows, int64_t k);

// The top-k selections of `k` (key sae.k; 0: none) and of AuxK (sae.k_aux, when auxk_coeff > 0)
// over `latents` latents, for Architecture::limited_ops.
std::vector<Architecture::OpUse> topk_uses(const SaeConfig& cfg, int64_t k, int64_t d,
                                           int64_t latents);

class AuxK {
public:
    AuxK(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be);
    // Queues the auxiliary pass when any latent is dead and the coefficient is positive;
    // adds its squared error to ctx.stats[kStatAuxK] and remembers its weight for penalty().
    // `pre`: the step's pre-activations (x - b_dec) W_enc^T, without b_enc (ctx.pre before an
    // activation overwrote it), or with it where `pre_has_b_enc` (JumpReLU's ctx.pre). Adds to
    // the gradients of W_enc, b_enc and W_dec.
    void backward(PassContext& ctx, const float* pre, bool pre_has_b_enc = false);
    // Whether this step's backward will run (a coefficient, a dead latent): the pre-activations
    // must then be kept.
    bool active(const PassContext& ctx) const {
        return enabled() && ctx.n_dead > 0 && ctx.dead != nullptr;
    }
    bool enabled() const { return coeff_ > 0; }  // train.auxk_coeff > 0
    double penalty(const float* stats) const { return weight_ * stats[kStatAuxK]; }

private:
    int64_t k_aux_;
    double coeff_;
    double weight_ = 0;  // the last step's auxk_coeff * scale
    DeviceArray<float> bias_, ehat_, target_, val_, scratch_, stats_, zeros_;
    DeviceArray<int32_t> idx_, fires_, dead_ids_;
    std::vector<float> mask_host_;
    std::vector<int32_t> dead_ids_host_;
    ShardedTopkScratch scratch_host_;
};

// W_enc [d, n], b_enc [n] (named `b_enc_name`), W_dec [n, d], b_dec [d]: SAELens's four.
std::vector<ExportTensor> saelens_base(const SaeWeights& w, const char* b_enc_name = "b_enc");
// The extra tensor called `name` (an architecture's own parameter or buffer); throws naming it.
const std::vector<float>& extra_tensor(const SaeWeights& w, const std::string& name);

// The decoder-norm weighted L1 term of ReLU and Gated SAEs, as a summary column and an id.
std::string l1_suffix(const SaeConfig& cfg);

// sae.target_l0, declared once for the penalized architectures (ReLU, JumpReLU, Gated; and
// the transcoders and CLTs that run JumpReLU): each lists it in its config_keys.
const ArchKey<double>& target_l0_key();
// sae.target_l0_rate: how fast the controller's target falls, in log L0 a step.
const ArchKey<double>& target_l0_rate_key();

// The sparsity penalty's coefficient of a penalized architecture (the L1 term of ReLU and Gated,
// JumpReLU's L0 term). Without sae.target_l0 it is the configured coefficient on the L1 ramp
// (schedule.h). With it, a controller adapts the coefficient so the training L0 reaches the
// target: after every step, with err = log(L0 / target_t) (L0 per token over all replicas), it
// moves log(coefficient) by kGain * err + kDamping * (err - the previous step's err), starting
// from the configured coefficient. The first term (integral) removes a lasting error; the
// second (proportional, in velocity form) damps the swing the first alone leaves, because the
// L0 answers the coefficient only as the weights move. target_t falls geometrically from the
// first step's L0 to the target (the SAE sparsifies gradually) by sae.target_l0_rate in log L0 a
// step, over at least half the L1 ramp and at most all of it (descent_steps), then holds: a
// slower or a shorter descent trained worse (docs/architectures.md, "A target L0", has the
// runs). Gated, which starts at its target, has no descent (Gated::init_from_preactivations). The
// coefficient is frozen for the last kFrozenFraction of the run so its last steps are stationary.
// The coefficient, the first L0 and the last error are buffers (checkpointed: a resume continues
// them bitwise; written to final.h5); a checkpoint from before the damping has no error buffer and
// resumes from 0.
class SparsityCoefficient {
public:
    static constexpr double kGain = 0.1;
    static constexpr double kDamping = 1.5;
    static constexpr double kFrozenFraction = 0.1;
    // `configured`: sae.l1_coeff or train.l0_coeff; `name`: the buffer ("l1_coeff", "l0_coeff").
    SparsityCoefficient(const SaeConfig& cfg, double configured, std::string name);
    bool adaptive() const { return target_ > 0; }
    // The coefficient step `step` of `total_steps` uses.
    double at(int64_t step, int64_t total_steps) const;
    // The steps target_t takes to fall to the target: log(first L0 / target) / rate, rounded
    // up, within [half the L1 ramp, the ramp] (the ramp at rate 0; known once the first step has
    // run).
    int64_t descent_steps(int64_t total_steps) const;
    // The L0 the controller aims at after `step` (the target, or on the descent above it).
    double target_at(int64_t step, int64_t total_steps) const;
    // Returns the error it acted on, log(L0 / target_t) (0 when it did not move: no target, no
    // rows, the frozen tail).
    double after_update(const StepTotals& t);
    std::vector<NamedTensor> buffers() const;
    // False for a name that is not one of its buffers; throws for a wrong size.
    bool set_buffer(const std::string& name, const std::vector<float>& v);
    // The last error's buffer: a checkpoint from before the damping lacks it.
    bool buffer_optional(const std::string& name) const {
        return adaptive() && name == name_ + "_prev_err";
    }
    // {"<name>_final", coefficient} when adaptive (summary.csv).
    std::vector<std::pair<std::string, double>> summarize() const;

private:
    SparsityRamp ramp_;
    double target_;
    std::string name_;
    double rate_;         // sae.target_l0_rate
    double configured_;   // used as given (a double) without a target
    float coeff_;         // the adapted coefficient (a float: a checkpoint holds it exactly)
    float start_l0_ = 0;  // the first step's L0 per token (0: not measured yet)
    float prev_err_ = 0;  // the last step's err (0 before the first)
};

// Per-latent thresholds theta_i = s * rms_i, rms_i the RMS of latent i's values v [rows, n] and
// s the one factor at which `l0` (at most n / 2) of them a row are above their threshold: every
// latent starts as likely to fire relative to its own scale, on activations of any scale. Over
// all replicas' rows and latent shards' latents (sums and counts all-reduced, s by bisection on
// the count above it), so every replica gets the thresholds one process over all rows and latents
// would. A latent whose values are all 0 gets 0.
std::vector<double> thresholds_at_l0(const float* v, int64_t rows, int64_t n, double l0,
                                     Communicator& replicas,
                                     const SumOverLatentShards& over_latent_shards);

// ReLU's and Gated's signum lr (Architecture::signum_lr): `factor` times the rule's, at most
// 0.025. ReLU's factor is 2: on MiniLM x16 at target L0 32 (6,144 latents: 0.0121) twice the
// rule's lowered the held-out FVU by 7% (ReLU) and 4% (Gated), half of it raised it by 35% and
// 17%, four times was worse again for ReLU, and 1.5 times (0.009) raised ReLU's by 8% under
// the damped controller. Gated's is 1.5 (gated.cpp). The cap keeps small SAEs, whose rule's lr
// grows as 1 / sqrt(n), where planted features are recovered (128 latents: 0.084 uncapped;
// recovery fell below 0.85 from 0.06).
double penalized_signum_lr(double rule_lr, double factor);

// What ReLU and Gated share: sae.target_l0 and AuxK's keys, the L1 columns and id, signum at
// penalized_signum_lr, and AuxK's top-k among the dead latents as their only selection.
class L1Penalized : public Architecture {
public:
    std::vector<const ArchKeyDecl*> config_keys() const override;
    std::vector<std::string> summary_keys() const override {
        return {"sae.l1_coeff", "sae.target_l0"};
    }
    const char* default_optimizer() const override { return "signum"; }
    double signum_lr(double rule_lr) const override { return penalized_signum_lr(rule_lr, 2.0); }
    std::string id_suffix(const SaeConfig& cfg) const override { return l1_suffix(cfg); }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, 0, d, n);
    }
};

// What the ReLU, Gated and JumpReLU passes share: their sparsity coefficient's hooks.
class PenalizedPass : public ArchPass {
public:
    PenalizedPass(const SaeConfig& cfg, double configured, std::string name)
        : coeff_(cfg, configured, std::move(name)) {}
    void after_update(const StepTotals& t) override { coeff_.after_update(t); }
    std::vector<NamedTensor> buffers() const override { return coeff_.buffers(); }
    bool buffer_optional(const std::string& name) const override {
        return coeff_.buffer_optional(name);
    }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        if (!coeff_.set_buffer(name, v)) ArchPass::set_buffer(name, v);
    }
    std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>&, const std::vector<double>&) const override {
        return coeff_.summarize();
    }

protected:
    SparsityCoefficient coeff_;
};

// The decorrelation penalty train.decorr_coeff * R * rows (R: Backend::decorr_grad), added
// to an architecture's loss when the coefficient is positive.
class Decorrelation {
public:
    explicit Decorrelation(const SaeConfig& cfg) : coeff_(cfg.decorr_coeff) {}
    // Dense activations z [B, n]: adds the penalty's gradient to dz (dL/dz).
    void dense(PassContext& ctx, const float* z, float* dz);
    // (latent, value) pairs [B, width]: the penalty's gradient per pair (for topk_backward's
    // dval_extra), or null when the penalty is off.
    const float* sparse(PassContext& ctx, const int32_t* idx, const float* val, int64_t width);
    double penalty(const float* stats) const { return coeff_ * stats[kStatDecorr] * rows_; }

private:
    float scale(const PassContext& ctx) const {
        return static_cast<float>(coeff_ * static_cast<double>(ctx.B) / ctx.norm_rows);
    }
    double coeff_;
    double rows_ = 0;
    DeviceArray<float> extra_;
};

// What the TopK and BatchTopK passes share: a selection (idx, val) [rows, width] of latents per
// row, its sparse decoder, and a backward through topk_backward with the decorrelation
// penalty's gradient, then AuxK and the decoder bias's path through the encoder input.
class SelectionPass : public ArchPass {
public:
    SelectionPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : be_(be), auxk_(cfg, d, n, be), decorr_(cfg), width_(cfg.k) {}
    void backward(PassContext& c, int64_t step, int64_t total_steps) override;
    double penalty(const float* st) const override {
        return auxk_.penalty(st) + decorr_.penalty(st);
    }
    Activations activations() const override { return {nullptr, idx_.data(), val_.data(), width_}; }

protected:
    // Gradients a pass adds to the selection's after AuxK's and before b_dec's path through the
    // encoder input, which must see every dL/dpre column sum in G.b_enc (Matryoshka BatchTopK's
    // prefix losses). Default: none.
    virtual void extra_backward(PassContext& /*ctx*/) {}
    // Grows the selection to hold `rows` rows of width_ (contents are not kept).
    void reserve_selection(int64_t rows) {
        ensure(idx_, be_, rows * width_);
        ensure(val_, be_, rows * width_);
    }
    // ctx.xhat += the selection's rows of W_dec, weighted by their values.
    void decode_selection(PassContext& c) {
        decode_sparse(c, idx_.data(), val_.data(), c.B, width_, c.xhat);
    }

    Backend& be_;
    AuxK auxk_;
    Decorrelation decorr_;
    int64_t width_;  // entries per row: k for TopK, the widest row so far for BatchTopK
    DeviceArray<int32_t> idx_;
    DeviceArray<float> val_;
    ShardedTopkScratch scratch_;
};

const Architecture& relu_arch();
const Architecture& topk_arch();
const Architecture& batchtopk_arch();
const Architecture& jumprelu_arch();
// A JumpReLU pass over `layers` equal blocks of latents (a CLT's layers): with sae.target_l0 (the
// L0 over every block), each block's threshold shift holds that block's L0 at target / layers.
std::unique_ptr<ArchPass> make_layered_jumprelu_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                                     Backend& be, int64_t layers);
const Architecture& gated_arch();
const Architecture& switch_arch();
// A pass that runs another architecture's pass and adds to it (a transcoder's skip path, a
// CLT's layer structure): everything it does not override goes to the inner pass.
class WrappedPass : public ArchPass {
public:
    explicit WrappedPass(std::unique_ptr<ArchPass> inner) : inner_(std::move(inner)) {}
    void reserve(int64_t rows) override { inner_->reserve(rows); }
    void forward(PassContext& c, bool training) override { inner_->forward(c, training); }
    void backward(PassContext& c, int64_t step, int64_t total_steps) override {
        inner_->backward(c, step, total_steps);
    }
    double penalty(const float* stats) const override { return inner_->penalty(stats); }
    Activations activations() const override { return inner_->activations(); }
    std::vector<double> step_sums() const override { return inner_->step_sums(); }
    void after_step(const std::vector<double>& sums) override { inner_->after_step(sums); }
    void after_update(const StepTotals& t) override { inner_->after_update(t); }
    std::vector<NamedTensor> buffers() const override { return inner_->buffers(); }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        inner_->set_buffer(name, v);
    }
    bool uses_dense_pre() const override { return inner_->uses_dense_pre(); }
    std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>& window_sums, const std::vector<double>& fired) const override {
        return inner_->summarize(window_sums, fired);
    }

protected:
    std::unique_ptr<ArchPass> inner_;
};

const Architecture& transcoder_arch();
const Architecture& skip_transcoder_arch();
const Architecture& clt_arch();
// sae.transcoder_activation (transcoders and CLTs), its values, and the architecture whose
// activation a transcoder of `cfg` runs (transcoder.cpp).
const ArchKey<std::string>& transcoder_activation_key();
extern const std::array<const char*, 3> kTranscoderActivations;
const Architecture& transcoder_activation_arch(const SaeConfig& cfg);
const Architecture& matryoshka_batchtopk_arch();

}  // namespace saetrain::arch
