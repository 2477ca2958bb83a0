// arch.h — the architecture seam: what makes a ReLU, TopK, BatchTopK, JumpReLU, Gated or Switch
// SAE different, in one place, and the one registry that names them.
//
// An Architecture is a stateless description (validation, id, the tensors it declares and what
// its rows are made of, FLOPs, export fields, summary columns) plus a factory for an ArchPass:
// the per-SAE object that owns the scratch and runs the activation, the decoder and their
// backward pass on the Backend. The trainer (trainer.h) owns everything the architectures share:
// the parameter buffer laid out from the declaration, the encoder GEMM, the residual, the
// optimizer, the replicas.
//
// An architecture owns what is its own: its config keys (ArchKey, config.h; config_keys), the
// backend ops only it runs (arch_ops.h; op_sets, with their CPU reference), its tensors (their
// shapes, latent axis, optimizer treatment and activation-scale fold), its rows and its export
// fields. Adding one: its file in
// src/core/arch/ (and include/saetrain/arch/<name>.h when it has ops of its own), its CUDA
// kernels with their line in src/cuda/arch_ops.cpp, its tests, its declaration in
// src/core/arch/common.h and one line in src/core/arch/registry.cpp (docs/architecture.md,
// "Where to add": ten files for a toy with two ops and a key of its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/arch_ops.h"  // defines: ArchOpSet
#include "saetrain/backend.h"
#include "saetrain/config.h"
#include "saetrain/sae_tensors.h"  // defines: SaeWeights, NamedTensor

namespace saetrain {

struct LatentShard;  // sharded_topk.h
class Communicator;  // comm.h
using SumOverLatentShards = std::function<void(double*, int64_t)>;

// The architecture of an SaeConfig that does not name one.
inline constexpr const char* kDefaultArch = "topk";

// One parameter tensor an architecture declares (Architecture::tensors), and its slice of the
// trainer's flat buffer (and of the gradient and the optimizer's two buffers). In the buffer it
// is rows x cols, row-major; a per-latent tensor's rows are its latents, the latent axis that a
// latent shard and the node split divide. ParamStore, initialization, the activation-scale fold,
// the file format, checkpoints, resume and exports read these fields and nothing else.
struct ParamSegment {
    std::string name;  // as in SAE files: W_enc, W_dec, b_enc, b_dec, log_threshold, r_mag, ...
    int64_t rows = 0, cols = 0;
    bool per_latent = true;  // its rows are latents (replicas split the optimizer by latent)
    bool decay = false;      // weight decay applies (weights, not biases)
    int64_t offset = 0;      // in floats, filled in by ParamLayout
    float lr_scale = 1.0f;   // multiplies the learning rate of this tensor's optimizer step
    // Its shape in files: `dims` when given (the same values in the same order, shaped: Switch's
    // W_router flat, [E * d], as the format has always held it; a layered model's b_enc [L, F]),
    // else [cols, rows] when `transposed` (W_enc: [d_model, n_latents], the transpose of its
    // latent rows), else [rows, cols] ([rows] or [cols] for a vector).
    std::vector<int64_t> dims = {};
    bool transposed = false;
    // A layered model's tensor of one layer (a cross-layer transcoder's W_enc[l]); -1: none.
    int layer = -1;
    bool unit_rows = false;  // sae.normalize_decoder keeps its rows at unit norm (W_dec)
    // How data.normalize's scale folds into it (sae_tensors.h): what reads the centred input
    // is times c, what is in the input's units over c, the rest (biases of the pre-activations,
    // thresholds, gates) as it is.
    ScaleFold fold = ScaleFold::keep;
    int64_t size() const { return rows * cols; }
    std::vector<int64_t> file_shape() const;
};

// The declarations every architecture builds on. sae_tensors: an SAE's four, in buffer order
// W_enc [n, d] (latent-major; files [d, n]), W_dec [n, d] (unit rows), b_enc [n], b_dec [d].
// latent_vector: one value a latent ([n]: thresholds, gates). whole_tensor: rows x cols that
// belong to no latent (Switch's router), flat in files ([rows * cols]).
std::vector<ParamSegment> sae_tensors(int64_t n, int64_t d);
ParamSegment latent_vector(const std::string& name, int64_t n);
ParamSegment whole_tensor(const std::string& name, int64_t rows, int64_t cols, bool decay);

// `w` as the same function of the raw activations, its activation_scale removed (sae_tensors.h):
// each tensor `declared` folded as its declaration says, the others (a pass's state) kept; `w`
// as it is when it has no activation_scale.
SaeWeights fold_activation_scale(const SaeWeights& w, const std::vector<ParamSegment>& declared);

// An architecture's declared tensors, in buffer order, with their offsets.
class ParamLayout {
public:
    // Throws Error for an empty or repeated name or an empty tensor.
    explicit ParamLayout(std::vector<ParamSegment> tensors);
    const std::vector<ParamSegment>& segments() const { return segs_; }
    int64_t total() const { return total_; }
    // The tensor called `name`; throws Error for a name the layout does not have.
    const ParamSegment& segment(const std::string& name) const;
    int64_t offset(const std::string& name) const { return segment(name).offset; }
    const ParamSegment* find(const std::string& name) const;
    bool has(const std::string& name) const { return find(name) != nullptr; }

private:
    std::vector<ParamSegment> segs_;
    int64_t total_ = 0;
};

// What an architecture's rows are made of: the datasets that feed its encoder input and its
// target (Architecture::rows). An SAE reads data.path and reconstructs it. A transcoder's rows
// are pairs, the input x (data.path) and the target y (data.target_path) side by side ([B, 2 d]):
// the encoder reads x as it is (no b_dec: that bias is the target's), and x_hat, the loss, FVU
// and b_dec's initial mean are the target's. A layered model (a cross-layer transcoder) reads one
// input and one target set per layer (SaeConfig::layers), side by side, [x_1 .. x_L | y_1 ..
// y_L]; its d_model is the layers' widths summed.
struct RowSpec {
    bool target = false;     // data.target_path beside data.path: rows [x | y]
    bool per_layer = false;  // data.path and data.target_path list one set per layer
    // Values a row holds for d_model d.
    int64_t width(int64_t d) const { return target ? 2 * d : d; }
};

// Everything an ArchPass reads and writes during one pass over B rows. Pointers are in backend
// memory; `p` and `g` are the flat parameter and gradient buffers (ParamLayout offsets).
struct PassContext {
    Backend& be;
    const ParamLayout& layout;
    int64_t B = 0, d = 0, n = 0;
    const float* p = nullptr;
    float* g = nullptr;
    const float* x = nullptr;      // [B, d] the batch (a transcoder's input)
    const float* y = nullptr;      // [B, d] the target x_hat approximates: x, or a transcoder's
    float* xc = nullptr;           // [B, d] x - b_dec, the encoder's input (written by encode())
    float* pre = nullptr;          // [B, n] xc W_enc^T (written by encode())
    float* xhat = nullptr;         // [B, d] x_hat; after the residual, dL/dx_hat
    float* stats = nullptr;        // [kStatCount] the step's sums
    int32_t* fires = nullptr;      // [n] non-zero activations per latent in this batch
    float* dec_norms = nullptr;    // [n] scratch for decoder row norms
    float* col_scratch = nullptr;  // [n] scratch for column sums
    float grad_scale = 0;          // d/dx_hat of the summed squared error per row: 2 / norm_rows
    float norm_rows = 1;           // the loss is summed over rows and divided by this
    // A transcoder's pass (RowSpec::target): the encoder reads x as it is, so encode()
    // copies x into xc and b_dec, the target's bias, has no path through the encoder input
    // (encoder_input_grad adds nothing).
    bool encode_x = false;
    // A cross-layer transcoder's pass (RowSpec::per_layer): x and y hold `layers` blocks of
    // d / layers values, latent l belongs to layer l / (n / layers), W_enc is [n, d / layers]
    // (each latent's weights on its own layer's values), and encode() and encoder_weight_grad()
    // run one GEMM per layer on it.
    int64_t layers = 1;
    // Latents dead before this step (host: 1 = dead) and their count, for AuxK.
    const std::vector<uint8_t>* dead = nullptr;
    int64_t n_dead = 0;  // over the whole SAE (all latent shards)
    // A latent-sharded SAE (parallel.latent_shards > 1): n, the segments and `dead` are this
    // latent shard's latents; x_hat is the sum of the latent shards' partial reconstructions (see
    // Architecture::latent_shardable). Null: the whole SAE.
    const LatentShard* latent_shard = nullptr;
    const float* seg(const std::string& name) const { return p + layout.offset(name); }
    float* grad(const std::string& name) const { return g + layout.offset(name); }
};

// Which latents an SAE activated on the rows of its last forward pass, in backend memory:
// dense [rows, n] activations, or `width` (latent, value) pairs per row (value 0: unused).
struct Activations {
    const float* dense = nullptr;
    const int32_t* idx = nullptr;
    const float* val = nullptr;
    int64_t width = 0;
};

// One step's figures over the whole SAE and all replicas (ArchPass::after_update).
struct StepTotals {
    int64_t step = 0, total_steps = 0;  // the step just taken (0-based) of the run's
    int64_t rows = 0;                   // rows of all replicas
    double l0 = 0;                      // non-zero latent activations summed over those rows
    // Each latent's non-zero activations over those rows ([n], this latent shard's latents;
    // null where the caller has none).
    const std::vector<int32_t>* fires = nullptr;
};

class ArchPass {
public:
    virtual ~ArchPass() = default;
    // Scratch for batches of up to `rows` rows.
    virtual void reserve(int64_t rows) = 0;
    // From ctx.x: the encoder (usually arch::encode), the activations and x_hat. `training`:
    // the pass a gradient step uses (BatchTopK selects over the batch); otherwise inference.
    virtual void forward(PassContext& ctx, bool training) = 0;
    // After the trainer's residual (ctx.xhat holds dL/dx_hat, G.b_dec its column sums): every
    // gradient but that one, including b_dec's term through the encoder input; fires; stats.
    // `step`, `total_steps` select the scheduled coefficients.
    virtual void backward(PassContext& ctx, int64_t step, int64_t total_steps) = 0;
    // The step's penalty terms added to the summed squared error, from its stats (after
    // backward has queued them and the stats were read back).
    virtual double penalty(const float* stats) const = 0;
    virtual Activations activations() const = 0;
    // Sums this replica contributes after a step (summed over replicas), and the hook that
    // receives them once the update was applied. Default: none.
    virtual std::vector<double> step_sums() const { return {}; }
    virtual void after_step(const std::vector<double>& /*sums*/) {}
    // The step's totals once its update was applied, the same on every replica and latent
    // shard: sae.target_l0's controller adapts its coefficient to them. Default: nothing.
    virtual void after_update(const StepTotals& /*totals*/) {}
    // State outside the parameters (saved with the weights; restored before training resumes).
    virtual std::vector<NamedTensor> buffers() const { return {}; }
    virtual void set_buffer(const std::string& name, const std::vector<float>& /*value*/);
    // True for a buffer a checkpoint written before it existed may lack: the pass then keeps its
    // initial value (sae.target_l0's last error).
    virtual bool buffer_optional(const std::string& /*name*/) const { return false; }
    // False when the pass computes its own pre-activations (Switch: only the chosen expert's),
    // so the trainer allocates no [rows, n] ctx.pre.
    virtual bool uses_dense_pre() const { return true; }
    // Figures for the run's summary from the step_sums of the last tenth of the steps (summed)
    // and how often each latent fired in them: Switch's per-expert load. Default: none.
    virtual std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>& /*window_sums*/, const std::vector<double>& /*fired*/) const {
        return {};
    }
};

// What Architecture::init_extra may use beyond the config; the same on every replica.
struct InitInputs {
    uint64_t seed = 0;
    double centred_rms = 1;  // RMS over the first batch's rows of ||x - b_dec||
    // A transcoder's: the mean of its input x over all replicas' first batches ([d]; empty for
    // an SAE). The trainer set b_enc = -W_enc mean(x) from it.
    std::vector<double> input_mean;
};

// What an export format needs from the architecture (export.h does the writing).
struct ExportTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};
struct ArchExport {
    std::string saelens_architecture;           // SAELens cfg "architecture"
    std::vector<ExportTensor> saelens_tensors;  // in SAELens's names and layout
    std::string saelens_refusal;                // non-empty: SAELens has no such SAE; why
    // Extra cfg.json entries, the values as JSON text: {"k", "32"}, {"rescale_...", "false"}.
    std::vector<std::pair<std::string, std::string>> saelens_cfg;
    // sparsify loads it as a SparseCoder with this activation and k (empty: it cannot, and
    // sparsify_refusal says why).
    std::string sparsify_activation;
    int64_t sparsify_k = 0;
    std::string sparsify_refusal;
    // A transcoder (sparsify's transcode: true); W_skip, when it has one (skip_connection).
    bool transcode = false;
    std::vector<float> w_skip;  // [d, d], sparsify's and circuit-tracer's layout (x @ W_skip^T)
    // circuit-tracer loads a transcoder as a JumpReLU with this threshold per latent (empty: it
    // cannot, and circuit_tracer_refusal says why).
    std::vector<float> circuit_tracer_threshold;
    std::string circuit_tracer_refusal;
    // A cross-layer transcoder in circuit-tracer's CLT layout (cross_layer_transcoder.py,
    // load_clt), one entry per layer l of L, each of F features and d_l values a layer:
    // W_enc [F, d_l] (pre = x_l W_enc^T + b_enc), b_enc [F], b_dec [d_l], threshold [F] (a
    // JumpReLU's), W_dec [F, L - l, d_l] (a feature's decoders to layers l..L-1, one row).
    // Empty unless it is one and circuit-tracer can load it (circuit_tracer_refusal says why).
    struct CltLayer {
        std::vector<float> w_enc, b_enc, b_dec, threshold, w_dec;
    };
    std::vector<CltLayer> clt_layers;
    int64_t clt_features = 0, clt_width = 0;  // F and d_l
};

class Architecture {
public:
    virtual ~Architecture() = default;
    virtual const char* name() const = 0;
    // One line for the docs and `--help`: what it is and the keys it reads.
    virtual const char* describe() const = 0;
    // The keys it declares (ArchKey, config.h: its own, and those it shares with others, such as
    // AuxK's): the registry adds them to the config's key table, so the YAML, --set, sweeps,
    // config.yaml and the resume check know them with no line elsewhere. Default: none.
    virtual std::vector<const ArchKeyDecl*> config_keys() const { return {}; }
    // The sae.*/train.* keys that tell its SAEs apart, for summary.csv's columns.
    virtual std::vector<std::string> summary_keys() const = 0;
    // The op sets (arch_ops.h) its pass runs beyond the Backend's: a backend must implement
    // each (arch_check_backend refuses it at start-up otherwise), and the parity suite runs
    // every registered set's case on every backend. Default: none.
    virtual std::vector<const ArchOpSet*> op_sets() const { return {}; }
    // Config checks that need the latent count (n_latents > 0) or none (0); throws Error
    // naming the key. `where` prefixes messages (the config file).
    virtual void validate(const SaeConfig& cfg, int64_t n_latents, const std::string& where) const;
    // The id after "<arch>-x<expansion>": "k32", "l1_5", ...
    virtual std::string id_suffix(const SaeConfig& cfg) const = 0;
    // Its parameter tensors for n latents of d_model d (this latent shard's n, or the whole
    // SAE's), in buffer order. Default: an SAE's four (sae_tensors). init_extra sets those
    // beyond the four, whose values start at zero.
    virtual std::vector<ParamSegment> tensors(const SaeConfig& /*cfg*/, int64_t n,
                                              int64_t d) const {
        return sae_tensors(n, d);
    }
    virtual void init_extra(const SaeConfig& /*cfg*/, const ParamLayout& /*layout*/,
                            std::vector<float>& /*params*/, const InitInputs& /*in*/) const {}
    // A start fitted to the data (the Switch router's clusters): right after init_extra, with
    // b_dec set, the trainer hands this replica's first batch (x as the SAE reads it: [rows, d])
    // and the replicas' communicator to init_from_rows, whose collectives must give every
    // replica the same parameters.
    virtual void init_from_rows(const SaeConfig& /*cfg*/, const ParamLayout& /*layout*/,
                                std::vector<float>& /*params*/, const float* /*x*/,
                                int64_t /*rows*/, Communicator& /*replicas*/) const {}
    // A start that depends on the scale of the data (JumpReLU's thresholds): when
    // inits_from_preactivations, the trainer runs a forward pass over (up to a bounded number
    // of) the first batch's rows after init_extra and the fitted encoder, and hands the
    // pre-activations the pass left in ctx.pre (v [rows, n], this latent shard's latents;
    // JumpReLU's with b_enc added, Gated's without b_gate) to init_from_preactivations, with the
    // replicas' communicator and a sum over the latent shards (in place; nothing without latent
    // shards): collectives that give every replica the same parameters, those one process over all
    // rows and latents would get.
    virtual bool inits_from_preactivations(const SaeConfig& /*cfg*/) const { return false; }
    virtual void init_from_preactivations(const SaeConfig& /*cfg*/, const ParamLayout& /*layout*/,
                                          std::vector<float>& /*params*/, const float* /*v*/,
                                          int64_t /*rows*/, int64_t /*n*/,
                                          Communicator& /*replicas*/,
                                          const SumOverLatentShards& /*over_latent_shards*/) const {
    }
    // Whether, after init_from_preactivations, the trainer fits the encoder's scale again
    // (train.encoder_init: fitted), scaling b_enc with W_enc: right for an activation that is
    // positively homogeneous in the two together (Gated's gate and, with b_mag 0, its
    // magnitude), whose firing the scale then leaves as it is.
    virtual bool refits_encoder_scale() const { return false; }
    // Model FLOPs of one training token (forward and backward), the count behind TFLOP/s and
    // MFU; and whether its kernels are sparse (the perf model's SaeKind).
    virtual double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const = 0;
    virtual bool sparse() const = 0;
    virtual ArchExport export_fields(const SaeWeights& w, const SaeConfig& cfg) const = 0;
    virtual std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                                Backend& be) const = 0;
    // The ops its pass asks of a backend at shapes a backend may limit (the top-k's k), each
    // with the key that sets the shape: arch_check_backend asks the backend before training.
    struct OpUse {
        BackendOp op;
        OpShape shape;
        std::string key;
    };
    // Whether its pass trains a latent shard (PassContext::latent_shard): a partial x_hat that the
    // trainer sums over the latent shards (start_reconstruction: b_dec on the first latent shard
    // only), top-k selections through select_topk (common.h), stats that are sums over latents (L0,
    // L1), and no state over all latents in its step_sums. All but Switch do.
    virtual bool latent_shardable() const { return false; }
    // What its rows are made of (RowSpec). Default: an SAE's, one set it reconstructs.
    virtual RowSpec rows() const { return {}; }
    // The optimizer train.optimizer: auto picks when train.lr is unset (SaeConfig::
    // with_optimizer_defaults): "signum" where it trains better on the MiniLM rows (TopK,
    // BatchTopK, Matryoshka, Switch, ReLU, Gated, JumpReLU: docs/architectures.md, "The
    // optimizer"), else "adam".
    virtual const char* default_optimizer() const { return "adam"; }
    // signum's lr when train.lr is unset, from the rule's (SaeConfig::with_optimizer_defaults:
    // kSignumLr * sqrt(16384 / n_latents)). Default: the rule's.
    virtual double signum_lr(double rule_lr) const { return rule_lr; }
    // Its own defaults for keys it shares with other architectures ("train.auxk_coeff" for
    // Gated), each as the key's value: SaeConfig::with_optimizer_defaults sets those the config
    // leaves unset, so the trainer and config.yaml see them; --list-keys shows them beside the
    // key's default. Default: none.
    virtual std::vector<std::pair<std::string, ConfigValue>> key_defaults() const { return {}; }
    virtual std::vector<OpUse> limited_ops(const SaeConfig& /*cfg*/, int64_t /*d*/,
                                           int64_t /*n*/) const {
        return {};
    }
};

// Throws Error naming the key when `be` cannot run an op the SAE of `cfg` needs (at d_model d,
// n latents), or has no implementation of one of its architecture's op sets: at start-up, not
// at the first step.
void arch_check_backend(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be);

// --- the registry -----------------------------------------------------------------------------
// Every architecture, in the order summaries and docs list them.
const std::vector<const Architecture*>& architectures();
std::vector<std::string> arch_names();
// Every key the architectures declare, in registry order (each once, where its first
// architecture lists it): the key table's architecture keys (config.cpp).
std::vector<const ArchKeyDecl*> arch_config_keys();
// Every summary key of every architecture, in registry order (each once): summary.csv's
// configuration columns.
std::vector<std::string> arch_summary_keys();
// Every op set the architectures register, in registry order (each once): what every backend
// is held to (test_backend_parity).
std::vector<const ArchOpSet*> arch_op_sets();
// The architecture called `name`; throws Error listing the known names.
const Architecture& arch_get(const std::string& name);
const Architecture* arch_find(const std::string& name);

}  // namespace saetrain
