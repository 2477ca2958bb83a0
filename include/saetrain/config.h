// config.h — the run's configuration: YAML in, typed structs out, every default explicit.
//
// The section and key names are the user contract of the design brief (run, data, sae, train,
// parallel, backend, log, checkpoint). Unknown keys are errors that name the nearest valid key,
// so a typo never silently trains with a default. Any `sae`/`train` value may be a YAML list;
// lists expand to a sweep (the cartesian product), one SaeConfig per point.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace saetrain {

struct RunConfig {
    std::string out_dir = "runs/default";
    uint64_t seed = 0;
};

struct DataConfig {
    std::string path;           // directory or glob of .h5 shards (required)
    int64_t batch_size = 4096;  // rows per rank per step
    int64_t epochs = 1;
    int64_t max_tokens = 0;                // when > 0, replaces epochs
    int64_t shuffle_buffer_rows = 262144;  // rows held for shuffling (0: no shuffling)
    std::string dataset = "activations";   // dataset name inside each shard
    std::string stage_dir;                 // non-empty: copy the rank's shards here first
                                           // (node-local disk; "$TMPDIR" allowed)
    int64_t read_bytes = 8 << 20;          // size of one sequential read request
    int64_t prefetch_bytes = 32 << 20;     // converted rows buffered ahead of the trainer
    std::string nonfinite = "skip";        // a batch holding NaN/Inf: skip (and count) | stop
    // Held-out rows, never trained on, for the SAE's quality (log.eval_every_steps and the
    // end of the run). eval_path: shards of their own (same d_model), of which the first
    // eval_rows rows (0: all) are used. No eval_path: the last eval_rows rows of `path` are
    // held out of training (0: no evaluation).
    std::string eval_path;
    int64_t eval_rows = 0;
    // none | expected_average_only_in (SAELens's name and meaning): every SAE sees x * c, with
    // c = sqrt(d_model / mean ||x||^2) estimated on the first batch (all replicas' rows) and
    // kept with the checkpoints; final.h5 and exports fold c into the weights, so they work
    // on the raw activations.
    std::string normalize = "none";
};

// The architecture an SaeConfig trains unless it names one (the registry's, arch.h).
std::string default_arch_name();

// One point of a sweep: everything that differs between SAEs trained in one run.
struct SaeConfig {
    std::string arch = default_arch_name();  // a name in the registry (arch.h)
    int64_t expansion = 8;                   // n_latents = expansion * d_model unless n_latents > 0
    int64_t n_latents = 0;
    int64_t k = 32;         // TopK, BatchTopK: active latents per token (BatchTopK: on average)
    double l1_coeff = 5.0;  // ReLU, Gated: L1 penalty weight
    // TopK, BatchTopK: AuxK's latents per token (0: d_model / 2, at most 512; the CUDA top-k
    // selects at most 512 per row) and (train.auxk_coeff) the weight of its loss.
    int64_t k_aux = 0;
    // JumpReLU: the straight-through estimator's bandwidth and the initial threshold.
    double jumprelu_bandwidth = 0.001;
    double jumprelu_init_threshold = 0.001;
    // Switch: the experts (each a TopK SAE of n_latents / n_experts latents; a router sends each
    // token to one) and (train.balance_coeff) the weight of the router's load-balancing loss.
    int64_t n_experts = 8;
    // train section values (may also be swept)
    double lr = 1.0e-3;
    // Linear LR warmup from 0: warmup_steps when > 0, else this fraction of the run's steps.
    int64_t warmup_steps = 0;
    double warmup_fraction = 0.01;
    std::string lr_decay = "cosine";  // cosine | linear | constant | cosine_restarts
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
    double l0_coeff = 1.0;        // JumpReLU: L0 penalty weight (ramps in like the L1 term)
    double auxk_coeff = 0.03125;  // TopK, BatchTopK: AuxK loss weight (0: off)
    // Switch: E * sum_e (token fraction of e) * (mean router probability of e), in units of the
    // batch's squared norm about b_dec (so, like the FVU, independent of the data's scale).
    // 0.1, not Switch Transformers' 0.01 (whose routers also drop tokens beyond an expert's
    // capacity): docs/architectures.md.
    double balance_coeff = 0.1;
    // Decorrelation penalty weight (0: off): decorr_coeff times the RMS of the correlations
    // between distinct latents' activations over the batch (O(batch x n^2) per step).
    double decorr_coeff = 0.0;
    double grad_clip = 1.0;  // global gradient norm; 0 disables
    // Gradient accumulation: each batch (data.batch_size rows, one optimizer step) is processed
    // in this many chunks whose gradients are summed, so activation memory is that of one chunk.
    int64_t accum_steps = 1;
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
    int64_t dead_tokens = 10000000;  // a latent not fired for this many tokens counts as dead
    int64_t max_bad_steps = 10;      // stop after this many non-finite losses/gradients in a row

    int64_t resolved_latents(int64_t d_model) const {
        return n_latents > 0 ? n_latents : expansion * d_model;
    }
    // Readable id, e.g. "topk-x8-k32" or "relu-x4-l1_5" (the architecture's suffix).
    std::string id(int64_t d_model) const;
};

struct ParallelConfig {
    std::string mode = "sweep";         // sweep | data_parallel | hybrid
    std::string sweep_data = "shared";  // shared | disjoint
    int64_t replicas = 1;
    // Latent shards per replica: each holds n / S latents of the SAE (its rows of W_enc, b_enc,
    // W_dec and their Adam moments) and the shards of one replica exchange top-k candidates
    // and partial reconstructions every step (issue 15; rank_grid.h).
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
// One id per sweep point (cfg.sweep, or cfg.sae when the sweep is empty), in sweep order:
// SaeConfig::id, plus "-<key><value>" for the keys that tell apart points sharing an id
// (e.g. "topk-x8-k32-lr0.001"). The ids are unique; they name sae/<id>/ in out_dir.
std::vector<std::string> sweep_ids(const Config& cfg, int64_t d_model);

// The value of a sweepable key ("sae.k", "train.lr") of one sweep point, as text.
std::string sae_key_text(const Config& cfg, const SaeConfig& point, const std::string& key);

}  // namespace saetrain
