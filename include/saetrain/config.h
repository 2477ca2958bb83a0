// config.h — the run's configuration: YAML in, typed structs out, every default explicit.
//
// The section and key names are the user contract of the design brief (run, data, sae, train,
// parallel, backend, log, checkpoint). Unknown keys are errors that name the nearest valid key,
// so a typo never silently trains with a default. Any `sae`/`train` value may be a YAML list;
// lists expand to a sweep (the cartesian product), one SaeConfig per point; a list-valued key
// (ConfigValue below) sweeps a list of lists.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace saetrain {

struct RunConfig {
    std::string out_dir = "runs/default";
    uint64_t seed = 0;
};

// A key's list of strings (StringList, below; declared before DataConfig, which holds two).
using StringList = std::vector<std::string>;

// The largest data.batch_size, data.epochs and data.max_tokens accepted: far above any real
// run, and low enough that every count made from them (rows x epochs, steps, buffer bytes) stays
// far from int64's limit.
constexpr int64_t kMaxBatchRows = int64_t{1} << 24;
constexpr int64_t kMaxEpochs = 1000000;
constexpr int64_t kMaxTokens = int64_t{1} << 53;

struct DataConfig {
    // Directory or glob of .h5 shards (required): one for an SAE or a transcoder; for a
    // cross-layer transcoder (sae.arch clt) one per layer, in layer order (a YAML list).
    StringList path;
    // Transcoders (sae.arch transcoder, skip_transcoder, clt): the target set, e.g. an MLP's
    // output where data.path holds its input; the same shards, rows and token order as
    // data.path (a CLT: one per layer, as data.path).
    StringList target_path;
    // A cross-layer transcoder's layers (SaeConfig::layers): 0 counts them from the data (the
    // sets data.path lists, or the L of a multi-layer paired set's [rows, L, d]); the run
    // writes the count it found to config.yaml.
    int64_t layers = 0;
    int64_t batch_size = 4096;  // rows per rank per step
    int64_t epochs = 1;
    int64_t max_tokens = 0;                // when > 0, replaces epochs
    int64_t shuffle_buffer_rows = 262144;  // rows held for shuffling (0: no shuffling)
    // > 0: the shuffle buffer in bytes instead, as many rows as fit (a CLT's rows are 2 L d
    // values: 262,144 of Llama-3.2-1B's are 32 GiB in 16-bit); shuffle_buffer_rows then keeps
    // its default.
    int64_t shuffle_buffer_bytes = 0;
    std::string dataset = "activations";  // dataset name inside each shard
    std::string stage_dir;                // non-empty: copy the rank's shards here first
                                          // (node-local disk; "$TMPDIR" allowed)
    int64_t read_bytes = 8 << 20;         // size of one sequential read request
    int64_t prefetch_bytes = 32 << 20;    // converted rows buffered ahead of the trainer
    std::string nonfinite = "skip";       // a batch holding NaN/Inf: skip (and count) | stop
    // Held-out rows, never trained on, for the SAE's quality (log.eval_every_steps and the
    // end of the run). eval_path: shards of their own (same d_model), of which the first
    // eval_rows rows (0: all) are used. No eval_path: the last eval_rows rows of `path` are
    // held out of training (0: no evaluation).
    std::string eval_path;
    int64_t eval_rows = 0;
    std::string eval_target_path;  // transcoders with eval_path: its target set
    // none | expected_average_only_in (SAELens's name and meaning): every SAE sees x * c, with
    // c = sqrt(d_model / mean ||x||^2) estimated on the first batch (all replicas' rows) and
    // kept with the checkpoints; final.h5 and exports fold c into the weights, so they work
    // on the raw activations.
    std::string normalize = "none";
    // Shards in S3-compatible storage (path: s3://bucket/prefix/; s3.h): how they are reached.
    // "" means the AWS way (AWS_ENDPOINT_URL, AWS_REGION, the profile, else AWS's defaults).
    std::string s3_endpoint;             // e.g. http://127.0.0.1:9000 for a local store
    std::string s3_region;               // SigV4's region
    std::string s3_addressing = "auto";  // auto | path | virtual (auto: path on s3_endpoint)
    bool s3_anonymous = false;           // unsigned requests: public buckets
    int64_t s3_connections = 16;         // concurrent range GETs (connections) per rank
    int64_t s3_request_bytes = 8 << 20;  // bytes of one range GET
    int64_t s3_retries = 10;             // attempts of a request (backoff 0.1 s doubling to 5 s)
    double s3_timeout_s = 30;            // a request without progress this long is retried
};

// The architecture an SaeConfig trains unless it names one (the registry's, arch.h).
std::string default_arch_name();

// A key's value as the config holds it: a YAML scalar of the key's type, or, for a key declared
// list-valued (an IntList or StringList default), one YAML list of such scalars. For a list-valued
// sae.* or train.* key a list of lists is the sweep (`[[128, 512], [256]]`: two points); a plain
// list is one value, and a single scalar counts as a list of one.
using IntList = std::vector<int64_t>;
using ConfigValue = std::variant<int64_t, uint64_t, double, bool, std::string, IntList, StringList>;

// One point of a sweep: everything that differs between SAEs trained in one run.
struct SaeConfig {
    std::string arch = default_arch_name();  // a name in the registry (arch.h)
    int64_t expansion = 8;                   // n_latents = expansion * d_model unless n_latents > 0
    int64_t n_latents = 0;
    // The sparsity every architecture is set by, one way or the other (the keys of the brief's
    // contract; also the files' `k` attribute and the perf model): the latents a selecting
    // architecture keeps per token, and the penalized ones' coefficients below (l1_coeff and,
    // in train, its ramp and l0_coeff, schedule.h). An architecture's own keys are not
    // fields here: it declares them (ArchKey, below) and reads them from arch_values.
    int64_t k = 32;         // TopK, BatchTopK, Switch: latents per token (BatchTopK: on average)
    double l1_coeff = 5.0;  // ReLU, Gated: L1 penalty weight
    // train section values (may also be swept)
    // 0: the optimizer's own (with_optimizer_defaults): Adam kAdamLr, signum kSignumLr scaled
    // by sqrt(16384 / n_latents) as sparsify scales its.
    double lr = 0;
    // Linear LR warmup from 0: warmup_steps when > 0, else this fraction of the run's steps.
    int64_t warmup_steps = 0;
    double warmup_fraction = 0.01;
    // cosine | linear | constant | cosine_restarts | auto: constant for signum (schedule-free:
    // the average needs no decay; better on MiniLM, docs/architectures.md), cosine for adam
    // (with_optimizer_defaults).
    std::string lr_decay = "auto";
    // cosine_restarts (PyTorch's CosineAnnealingWarmRestarts): the first cycle's steps T_0 (0: a
    // quarter of the run) and the factor T_mult by which each next cycle is longer.
    int64_t restart_steps = 0;
    double restart_mult = 1.0;
    // The decay runs over the last (1 - decay_start) of the run: the LR holds at lr until
    // this fraction of the steps, then decays to lr * lr_min_ratio (0: decay from warmup on).
    double decay_start = 0.8;
    double lr_min_ratio = 0.0;  // final lr as a fraction of lr
    // ReLU: the L1 coefficient ramps linearly from 0 over l1_warmup_steps when > 0, else over
    // this fraction of the run's steps.
    int64_t l1_warmup_steps = 0;
    double l1_warmup_fraction = 0.2;
    double l0_coeff = 1.0;  // JumpReLU: L0 penalty weight (ramps in like the L1 term)
    // Decorrelation penalty weight (0: off): decorr_coeff times the RMS of the correlations
    // between distinct latents' activations over the batch (O(batch x n^2) per step).
    double decorr_coeff = 0.0;
    double grad_clip = 1.0;  // global gradient norm; 0 disables
    // Gradient accumulation: each batch (data.batch_size rows, one optimizer step) is processed
    // in this many chunks whose gradients are summed, so activation memory is that of one chunk.
    int64_t accum_steps = 1;
    // The optimizer: adam (AdamW) | signum (schedule-free sign descent: the SGD iterate z steps
    // by -lr sign(g), the average x weighs each z by lr_max^2, the gradient is taken at
    // y = momentum x + (1 - momentum) z; the SAE written and evaluated is x; sparsify's default)
    // | auto: the architecture's default_optimizer() when lr is unset (0), else adam, the
    // optimizer a given lr has always meant (with_optimizer_defaults).
    std::string optimizer = "auto";
    double momentum = 0.95;  // signum: the interpolation above
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1.0e-8;
    double weight_decay = 0.0;      // decoupled (AdamW); applied to weights, not biases
    bool normalize_decoder = true;  // unit-norm decoder rows after every step
    // W_enc at init: transpose (W_dec^T) | fitted (c W_dec^T, c the least-squares scale of the
    // first batch's reconstruction; exact for activations that scale with W_enc (ReLU, TopK,
    // BatchTopK, Gated at init), an approximation for JumpReLU, whose thresholds do not)
    std::string encoder_init = "fitted";
    // b_dec at init: mean of the first batch | geometric_median of it (Weiszfeld) | zeros
    std::string b_dec_init = "mean";
    // data.normalize, copied into every sweep point (the trainer reads it from here)
    std::string normalize = "none";
    // The layers a cross-layer transcoder spans: data.path's datasets, copied into every sweep
    // point (1 for the other architectures).
    int64_t layers = 1;
    int64_t dead_tokens = 10000000;  // a latent not fired for this many tokens counts as dead
    int64_t max_bad_steps = 10;      // stop after this many non-finite losses/gradients in a row

    // The values given for the keys the architectures declare (ArchKey below: AuxK's
    // sae.k_aux, JumpReLU's sae.jumprelu_bandwidth, Switch's sae.n_experts, ...), by full key
    // name; a key not here has its declared default. Read them through the key's declaration.
    std::map<std::string, ConfigValue> arch_values;

    int64_t resolved_latents(int64_t d_model) const {
        return n_latents > 0 ? n_latents : expansion * d_model;
    }
    static constexpr double kAdamLr = 1.0e-3;
    static constexpr double kSignumLr = 3.7e-3;  // at 16384 latents (MiniLM x16: best 0.006)
    // This point with train.optimizer: auto, train.lr: 0 and train.lr_decay: auto resolved (see
    // their fields) for an SAE of d_model inputs, and the architecture's own defaults of shared
    // keys it leaves unset (Architecture::key_defaults); what the trainer trains and the run's
    // config.yaml records.
    SaeConfig with_optimizer_defaults(int64_t d_model) const;
    // Readable id, e.g. "topk-x8-k32" or "relu-x4-l1_5" (the architecture's suffix).
    std::string id(int64_t d_model) const;
    // Sets the sae.* or train.* key `key` ("sae.n_experts", "train.lr") to `value`, converted to
    // the key's type as a config file's value would be (an integer where a number is expected;
    // not the reverse); throws Error for an unknown key, another type or a value outside the
    // key's choices. What code and tests use for keys without a field.
    template <class T>
    SaeConfig& set(const std::string& key, const T& value) {
        if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, IntList> ||
                      std::is_same_v<T, StringList>)
            return set_value(key, ConfigValue(value));
        else if constexpr (std::is_integral_v<T>)
            return set_value(key, ConfigValue(static_cast<int64_t>(value)));
        else if constexpr (std::is_floating_point_v<T>)
            return set_value(key, ConfigValue(static_cast<double>(value)));
        else
            return set_value(key, ConfigValue(std::string(value)));
    }
    SaeConfig& set_value(const std::string& key, const ConfigValue& value);
};

// --- keys an architecture declares ------------------------------------------------------------
// A key read by the architectures that register it (Architecture::config_keys, arch.h) rather
// than by the trainer: declared once, beside its architecture (src/core/arch/), with everything
// the config needs to know of it: section and name, type and default (ArchKey<T>), a doc line,
// its rule, and whether it changes results (a resume with another value is refused). The key
// table (config.cpp) places the registered keys at the end of their section's architecture
// keys (sae: after sae.l1_coeff; train: after train.l0_coeff), in registry order; only sae.*
// and train.* keys (sweepable) can be declared so.
struct KeyRule {
    std::function<bool(const ConfigValue&)> ok;  // null: any value of the key's type
    std::string says;                            // "must be >= 1": "<key> <says> (got <value>)"
};
// The rules of config.cpp's table, for architecture keys: v >= lo (`note` follows the bound,
// e.g. " (0: off)").
KeyRule key_at_least(int lo, const std::string& note = "");
// A string key's choices: "must be a, b or c".
KeyRule key_one_of(std::vector<std::string> choices);

class ArchKeyDecl {
public:
    ArchKeyDecl(std::string section, std::string name, ConfigValue default_value, std::string doc,
                KeyRule rule = {}, bool changes_results = true)
        : section_(std::move(section)),
          name_(std::move(name)),
          default_(std::move(default_value)),
          doc_(std::move(doc)),
          rule_(std::move(rule)),
          changes_results_(changes_results) {}
    virtual ~ArchKeyDecl() = default;
    const std::string& section() const { return section_; }
    const std::string& name() const { return name_; }
    std::string full() const { return section_ + "." + name_; }
    const ConfigValue& default_value() const { return default_; }
    const std::string& doc() const { return doc_; }
    const KeyRule& rule() const { return rule_; }
    bool changes_results() const { return changes_results_; }
    // The value of one sweep point: given, or the default.
    const ConfigValue& value(const SaeConfig& c) const {
        auto it = c.arch_values.find(full());
        return it == c.arch_values.end() ? default_ : it->second;
    }

private:
    std::string section_, name_;
    ConfigValue default_;
    std::string doc_;
    KeyRule rule_;
    bool changes_results_;
};

// A declared key of type T (int64_t, double, bool, std::string, IntList or StringList): key(cfg)
// is its value.
template <class T>
class ArchKey : public ArchKeyDecl {
public:
    ArchKey(std::string section, std::string name, T default_value, std::string doc,
            KeyRule rule = {}, bool changes_results = true)
        : ArchKeyDecl(std::move(section), std::move(name), ConfigValue(std::move(default_value)),
                      std::move(doc), std::move(rule), changes_results) {}
    T operator()(const SaeConfig& c) const { return std::get<T>(value(c)); }
};

struct ParallelConfig {
    std::string mode = "sweep";         // sweep | data_parallel | hybrid
    std::string sweep_data = "shared";  // shared | disjoint
    int64_t replicas = 1;
    // Latent shards per replica: each holds n / S latents of the SAE (its rows of W_enc, b_enc,
    // W_dec and their Adam moments) and the latent shards of one replica exchange top-k candidates
    // and partial reconstructions every step (rank_grid.h).
    int64_t latent_shards = 1;
    double timeout_s = 600;  // a collective waiting longer than this ends the job (0: never)
};

// Numerics of the CUDA backend (the CPU backend computes in fp32 and ignores these).
struct GpuConfig {
    // GEMM operand precision, fp32 accumulation in every mode: fp32 | tf32 | bf16
    // (CudaBackendOptions::gemm says what each costs and gains).
    std::string gemm = "fp32";
    // TopK backward without float atomics, bit-reproducible run to run (false: atomics).
    bool deterministic = true;
};

struct LogConfig {
    int64_t every_steps = 50;
    // Evaluate on the held-out rows (data.eval_path / data.eval_rows) every this many steps,
    // a multiple of every_steps; 0: only at the end of the run.
    int64_t eval_every_steps = 0;
    // Peak TFLOP/s of one device that MFU is reported against, for the precision its GEMMs
    // run in. 0: the built-in table (perfmodel.h) by the GPU's name; none on the CPU backend,
    // so no MFU there unless this is set.
    double peak_tflops = 0;
};

struct CheckpointConfig {
    int64_t every_steps = 500;
    int64_t keep = 3;
};

struct Config {
    RunConfig run;
    DataConfig data;
    SaeConfig sae;                 // the first sweep point (the only one when nothing is a list)
    std::vector<SaeConfig> sweep;  // every sweep point, in cartesian order (last key fastest)
    ParallelConfig parallel;
    std::string backend = "auto";  // auto | cpu | cuda
    GpuConfig gpu;
    LogConfig log;
    CheckpointConfig checkpoint;
    std::string source;  // the file it was read from, for messages
};

// Reads `path`, applies `overrides` ("section.key=value", YAML values, lists allowed) and
// validates. Throws Error naming the file and key on any problem.
Config config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from YAML text (tests and fuzzing); `source` names it in messages.
Config config_parse(const std::string& yaml_text, const std::vector<std::string>& overrides = {},
                    const std::string& source = "<string>");
// The resolved config as YAML with every default written out (sweep lists kept as lists).
std::string config_to_yaml(const Config& cfg);
// Checks that need d_model (k <= n_latents, ...); throws Error naming the key.
void config_validate_for_data(const Config& cfg, int64_t d_model);
// Whether `cfg` trains a cross-layer transcoder (sae.arch: clt) on a multi-layer paired set:
// one data.path and no data.target_path, whose shards hold `inputs` and `targets` [rows, L, d]
// (tools/extract_activations.py --layer-pairs), so one read covers every layer of a row block.
bool multi_layer_paired(const Config& cfg);
// The datasets data.path's shards are read by: {"inputs", "targets"} for a multi-layer paired
// set, else {data.dataset} (a transcoder's data.target_path is read by the same name).
std::vector<std::string> input_dataset_names(const Config& cfg);
// One id per sweep point (cfg.sweep, or cfg.sae when the sweep is empty), in sweep order:
// SaeConfig::id, plus "-<key><value>" for the keys that tell apart points sharing an id
// (e.g. "topk-x8-k32-lr0.001"). The ids are unique; they name sae/<id>/ in out_dir.
std::vector<std::string> sweep_ids(const Config& cfg, int64_t d_model);

// The value of a sweepable key ("sae.k", "train.lr") of one sweep point, as text.
std::string sae_key_text(const Config& cfg, const SaeConfig& point, const std::string& key);

// Every key of the config, in the order config.yaml lists them, from its one declaration (the
// trainer's in config.cpp's table, an architecture's beside it).
struct ConfigKeyInfo {
    std::string name;          // "sae.k", "backend"
    std::string default_text;  // as config.yaml writes it
    std::string doc;           // one line
    std::string declared_by;   // "" for the trainer's keys; else the architectures reading it
    bool sweepable = false;    // sae.* and train.*: a list is a sweep
    bool changes_results = true;
};
std::vector<ConfigKeyInfo> config_keys();
// Whether a different value of `key` ("train.lr", "backend") trains a different SAE: what a
// resume compares (Checkpointer). True for a key this version does not know.
bool config_key_changes_results(const std::string& key);

}  // namespace saetrain
