// trainer.h — one SAE, its optimizer state and its training step, on any Backend.
//
// SaeTrainer runs the step every parallel mode shares (trainer.cpp reads it top-down: forward,
// loss, backward, reduce, clip, lr, Adam, finish). Beside it, each in its own file:
//   param_store.h  where the parameters, their gradient and Adam's moments live (one rank, the
//                  optimizer split over node memory, latent shards) and what that changes
//   evaluation.h   held-out evaluation, the end-of-run quality gates, reconstructions
//   trainer_io.h   the SAE as its checkpoint files' tensors and back (io, not core)
// The architecture (an ArchPass) runs the activation, the decoder and their backward pass; the
// trainer runs everything the architectures share.
//
// A latent-sharded SAE (parallel.latent_shards = S, a LatentShard given) is S trainers, one
// per rank, each holding n / S latents of every per-latent segment (b_dec and the segments of
// no latent whole on each), trained on the same rows: the partial reconstructions, b_dec's
// gradient, the sums over latents and the gradient norm are summed over the latent shards every
// step, the top-k selections are merged exactly (sharded_topk.h), and the backward pass and Adam
// are each latent shard's own. Checkpoints and final.h5 gather the whole SAE to the first latent
// shard chunk by chunk as it writes them (trainer_io.h; write_gathered in train_state.h).
//
// Forward: pre = (x - b_dec) W_enc^T; z = the architecture's activation of it;
// x_hat = z W_dec + b_dec. The loss per step is
//   L = mean_t ||x_hat_t - x_t||^2 + the architecture's penalty (L1, L0, AuxK, ...) / rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "saetrain/arch.h"          // defines: Architecture, ArchPass, ParamLayout
#include "saetrain/backend.h"       // defines: Backend, DeviceArray
#include "saetrain/comm.h"          // defines: Communicator
#include "saetrain/config.h"        // defines: SaeConfig
#include "saetrain/dtype.h"         // defines: BatchView
#include "saetrain/evaluation.h"    // defines: EvalResult, QualityWindow
#include "saetrain/optimizer.h"     // defines: Optimizer
#include "saetrain/param_store.h"   // defines: ParamStore, check_latent_sharding
#include "saetrain/quality.h"       // defines: QualityGates
#include "saetrain/sae_tensors.h"   // defines: CheckpointPart, NamedTensor
#include "saetrain/sharded_topk.h"  // defines: LatentShard

namespace saetrain {

struct StepResult {
    int64_t rows = 0;      // tokens in this step (all replicas)
    double loss = 0;       // L above, averaged over replicas
    double sse = 0;        // sum ||x_hat - x||^2
    double sst = 0;        // sum ||x - batch mean||^2
    double l1 = 0;         // sum_t sum_i z_ti ||W_dec_i|| (unweighted by the coefficient)
    double aux = 0;        // the architecture's auxiliary squared error (Gated, AuxK)
    double sum_sq_x = 0;   // sum ||x||^2
    double l0 = 0;         // non-zero activations
    double grad_norm = 0;  // before clipping
    double lr = 0;
    bool clipped = false;
    bool skipped = false;  // the loss or gradient was not finite: no update was applied
};

// Rows [first, first + count) of an SAE's random start, each a unit vector of d floats drawn
// from its own stream (row i's depends on the seed and i alone): any latent shard, thread count
// or machine draws the same row i. `threads` OpenMP threads take the rows (<= 0: OpenMP's
// default).
void random_unit_rows(uint64_t seed, int64_t first, int64_t count, int64_t d, float* out,
                      int threads = 0);

class SaeTrainer {
public:
    // grad_comm: the replicas of this SAE (data-parallel, the same latent shard of each);
    // gradients are averaged over it. latent shard: this rank's latent shard of a sharded SAE
    // (parallel.latent_shards > 1; null: the whole SAE). Every latent shard of a replica trains on
    // the same rows and calls every method alike (each is collective over the latent shards).
    SaeTrainer(const SaeConfig& cfg, int64_t d_model, int64_t total_steps, uint64_t seed,
               Backend& backend, Communicator& grad_comm,
               const LatentShard* latent_shard = nullptr);
    ~SaeTrainer();

    // Every x_host below is a BatchView (dtype.h): rows in host memory, float32 (a float
    // pointer converts) or 16-bit as a BatchSource delivers them; they are widened where they
    // are uploaded (Backend::upload_rows), exactly, so the dtype changes no result. Their rows
    // are row_width() values: x [rows, d_model] for an SAE; for a transcoder each row is its
    // input and its target side by side, [rows, 2 d_model], and "x_hat" below approximates the
    // target (the loss, FVU and b_dec's mean are the target's).

    // Initializes the parameters: decoder rows random unit vectors (random_unit_rows), W_enc as
    // W_dec transposed (times the fitted scale, train.encoder_init; a CLT's compact encoder is
    // its architecture's to start, Architecture::init_extra), b_enc = 0, b_dec = the
    // mean of x [rows, d] over all replicas.
    // `threads`: host threads for the random start (<= 0: OpenMP's default).
    void init(BatchView x_host, int64_t rows, int threads = 0);
    // One optimizer step on x [rows, d_model] (host memory) of this replica. Replicas may hold
    // different row counts (even 0): the step minimizes the mean loss over all their rows.
    // Returns rows = 0 (and changes nothing) when no replica had any row.
    StepResult step(BatchView x_host, int64_t rows);
    // step() in two halves, for overlapping the host's work with the device's: step_begin
    // uploads x and queues the forward and backward pass (on the CUDA backend it returns while
    // the GPU computes; x_host may be reused once it returns), step_end waits for the gradients,
    // exchanges them and applies the update. step(x, rows) == step_begin(x, rows); step_end().
    void step_begin(BatchView x_host, int64_t rows);
    StepResult step_end();

    // Forward pass only, on x [rows, d_model] (host memory) of this replica, in batches of at
    // most `batch_rows`; collective over the replicas, whose rows together are the set.
    // Changes no parameter or optimizer state (training after it is bitwise the same). On a
    // latent shard only the first latent shard's x is read (the others may pass null, with the same
    // rows): it broadcasts each batch to the others.
    EvalResult evaluate(BatchView x_host, int64_t rows, int64_t batch_rows);
    // The same inference pass on x [rows, d_model] (host memory), its x_hat written to
    // x_hat_host [rows, d_model] in the units of x (data.normalize's scale undone). This
    // replica's rows only, not collective; changes nothing. For checking exports against
    // saetrain's own forward (test/sae_forward.cpp).
    void reconstruct(BatchView x_host, int64_t rows, int64_t batch_rows, float* x_hat_host);
    // The same inference pass's activations of x (rows of row_width() values; a transcoder's
    // target half is not read), batch by batch: sink(first row, rows, activations) for each
    // batch of at most `batch_rows`. Not collective; changes nothing (sae-features).
    void activations(BatchView x_host, int64_t rows, int64_t batch_rows,
                     const std::function<void(int64_t, int64_t, const HostActivations&)>& sink);

    // Forward and backward only, for tests and the benchmark: gradients of
    // L * rows / norm_rows (norm_rows = rows: the mean loss L; 1: the summed loss) land in the
    // gradient buffer; returns L. `x_dev` is in backend memory.
    // A transcoder's target rows are y_dev [rows, d_model] (null: x_dev, for an SAE).
    StepResult compute_gradients(const float* x_dev, int64_t rows, int64_t norm_rows = 0,
                                 const float* y_dev = nullptr);

    // Host copies of the flat parameter and gradient buffers (param_store.h's layout; this latent
    // shard's latents on a latent shard), and a setter. After step() the gradients are the ones
    // summed over replicas. set_params_host, init and restore are collective over the replicas,
    // which must pass the same values; so is grads_host after a step when splits_update().
    std::vector<float> params_host() const;
    std::vector<float> grads_host() const;
    // Sets the parameters (train.optimizer: signum, also its iterate and average: a fresh start
    // from p).
    void set_params_host(const std::vector<float>& p);
    // train.optimizer: signum keeps the point its next gradient is taken at in the parameter
    // buffer while it trains, and the SAE (the average) in opt_v. This exchanges the two,
    // exactly, so that the parameter buffer holds the SAE until the next step exchanges them
    // back: evaluation and checkpoints call it (a checkpoint's weights are the SAE, its opt_v
    // the training point). Adam: nothing to do. Collective over the replicas.
    void rest();

    // The SAE in the checkpoint files' layout, and back, is io's (trainer_io.h: trainer_weights,
    // trainer_state, trainer_read_part, trainer_restore, the gathers of a latent-sharded SAE).
    // What it reads here: store() (the buffers, host copies, the latent shards' gathers),
    // input_scale(), arch_buffers() and since_fired().
    // Continues from this trainer's part of a checkpoint (trainer_read_part): installs it, and
    // the counters step and tokens. Collective over the replicas (and the latent shards).
    // Bitwise: the next step is the one the uninterrupted run would have taken.
    void restore(CheckpointPart part, int64_t step, int64_t tokens);
    // The architecture's state outside the parameters (BatchTopK's threshold), saved with them.
    std::vector<NamedTensor> arch_buffers() const { return pass_->buffers(); }
    bool arch_buffer_optional(const std::string& name) const {
        return pass_->buffer_optional(name);
    }
    // Tokens since each of this latent shard's latents last fired.
    const std::vector<int64_t>& since_fired() const { return since_fired_; }
    int64_t d_model() const { return d_; }
    // Values per row of the batches it takes: d_model, or 2 d_model for a transcoder (the input
    // and the target side by side, RowSpec::target).
    int64_t row_width() const { return arch_.rows().width(d_); }
    int64_t n_latents() const { return n_total_; }  // the whole SAE's
    int64_t local_latents() const { return n_; }    // this latent shard's (all without sharding)
    bool latent_sharded() const { return store_->latent_sharded(); }
    // data.normalize's factor c (1 without it): the SAE trains on c * x.
    float input_scale() const { return input_scale_; }
    int64_t step_count() const { return step_; }
    int64_t total_steps() const { return total_steps_; }
    int64_t tokens() const { return tokens_; }
    // Fraction of latents that have not fired for cfg.dead_tokens tokens.
    double dead_fraction() const;
    // The quality gates over the steps from 90% of total_steps on (those this process ran),
    // the decorrelation from the last step's batch; collective over the replicas.
    QualityGates training_quality();
    // The architecture's own summary figures over the same window (Switch: per-expert load);
    // empty for most architectures.
    std::vector<std::pair<std::string, double>> arch_summary() const;
    const SaeConfig& config() const { return cfg_; }
    const Architecture& arch() const { return arch_; }
    const ParamLayout& layout() const { return store_->layout(); }
    Backend& backend() { return be_; }
    // Where the parameters live (param_store.h).
    const ParamStore& store() const { return *store_; }
    // Parameters and Adam moments are in node memory, the update split across the replicas.
    bool splits_update() const { return store_->splits_update(); }
    DeviceArray<float>& batch_buffer() { return x_; }

private:
    // --- the batch and the forward pass (trainer.cpp) ----------------------------------------
    void ensure_batch(int64_t rows);
    // The rows one pass over `rows` rows takes at a time: all of them, or with
    // train.accum_steps > 1 a chunk of ceil(rows / accum_steps).
    // Architecture::init_from_preactivations from the first rows of x (init's last step).
    void init_from_preactivations(const float* x, int64_t rows, std::vector<float>& p);
    int64_t chunk_rows(int64_t rows) const {
        return cfg_.accum_steps > 1 ? (rows + cfg_.accum_steps - 1) / cfg_.accum_steps : rows;
    }
    // x_host [rows, row_width()] into x_ (widened on the backend), times the input scale
    // (data.normalize); a transcoder's rows into x_ (the input) and y_ (the target).
    void upload_batch(BatchView x_host, int64_t rows);
    // The target of the uploaded batch: y_ for a transcoder, else x_.
    const float* target() const { return transcodes_ ? y_.data() : x_.data(); }
    // The pass context over x_dev [rows, d] (and the target y_dev; null: x_dev) and the
    // trainer's buffers.
    PassContext context(const float* x_dev, int64_t rows, const float* y_dev = nullptr);
    // The encoder, activation and decoder on x_dev [rows, d]: x_hat in xhat_, the activations
    // in the pass. `training`: the pass a step uses (BatchTopK's batch selection).
    void forward(const float* x_dev, int64_t rows, bool training);
    // After the forward pass: x_hat summed over the latent shards.
    void reduce_x_hat(int64_t rows);
    int64_t off(const std::string& tensor) const { return store_->layout().offset(tensor); }

    // --- init (trainer.cpp) --------------------------------------------------------------------
    // sae.b_dec_init on x [rows, d] (already scaled), over all replicas' rows.
    std::vector<float> initial_b_dec(const float* x, int64_t rows);
    // The mean of x [rows, d] over all replicas' rows; `what` names the model in the error
    // an empty batch gets.
    std::vector<double> mean_over_replicas(const float* x, int64_t rows, const char* what);
    // train.encoder_init: fitted; p: the parameters init() set (W_enc is rescaled in it, and
    // b_enc with it when with_bias: Architecture::refits_encoder_scale).
    void fit_encoder_scale(const float* x_host, int64_t rows, std::vector<float>& p,
                           bool with_bias = false);

    // --- the step's pieces, in the order it runs them (trainer.cpp) ----------------------------
    // compute_gradients in two halves: queue forward, loss and backward (idle -> queued); then
    // read the step's sums back (queued -> idle).
    void launch_gradients(const float* x_dev, int64_t rows, int64_t norm_rows, const float* y_dev);
    StepResult collect_gradients();
    // train.accum_steps > 1: the gradients of x_host's rows in that many chunks, summed into
    // the gradient buffer; the step's result waits in accumulated_ (idle -> accumulated).
    void accumulate_gradients(BatchView x_host, int64_t rows);
    // step_end's first phase: the sums of the passes step_begin ran (any state -> idle).
    StepResult end_passes();
    // The architecture's sums for after_step (zeros from a replica that had no rows).
    std::vector<double> step_arch_sums(int64_t rows);
    // Sums the gradient, r's metrics, arch_sums and fires_host_ over the replicas.
    void reduce_over_replicas(StepResult& r, std::vector<double>& arch_sums);
    // A non-finite loss or gradient: marks r skipped and returns true (throws after
    // train.max_bad_steps in a row).
    bool skip_nonfinite(StepResult& r);
    // After the update: the architecture's after_step, the quality window, dead latents and
    // the counters.
    void finish_step(const StepResult& r, const std::vector<double>& arch_sums);
    // n_dead_total_ from every latent shard's n_dead_.
    void count_dead_over_latent_shards();

    // --- the step's state ------------------------------------------------------------------------
    //   idle --step_begin--> queued | accumulated | no_rows --step_end--> idle
    //   idle --launch_gradients--> queued --collect_gradients--> idle
    //        (compute_gradients, and each chunk of an accumulated step inside step_begin)
    // evaluate and reconstruct run only while idle.
    enum class StepState {
        idle,         // no step under way
        queued,       // a batch's passes are queued on the backend (queued_rows_ rows)
        accumulated,  // train.accum_steps chunks' gradients summed, their sums in accumulated_
        no_rows,      // this replica had no rows: a zero gradient waits to join the reduce
    };
    static const char* state_name(StepState s);
    // Throws unless the trainer is in `from` (naming `call`); then moves to `to`.
    void transition(StepState from, StepState to, const char* call);

    // --- evaluation (evaluation.cpp) -------------------------------------------------------------
    // Rows [r0, r0 + rows) of x_host; on a latent shard the first latent shard's, broadcast (in
    // their element type) into buf.
    BatchView first_latent_shard_rows(BatchView x_host, int64_t r0, int64_t rows,
                                      std::vector<char>& buf) const;

    SaeConfig cfg_;
    int64_t d_, n_total_, n_, total_steps_;  // n_: this latent shard's latents
    uint64_t seed_;
    Backend& be_;
    Communicator& comm_;
    const Architecture& arch_;
    std::unique_ptr<ArchPass> pass_;
    std::unique_ptr<ParamStore> store_;  // parameters, gradient, the optimizer's two buffers
    std::unique_ptr<Optimizer> opt_;     // clip -> lr -> apply, and signum's state
    int64_t step_ = 0, tokens_ = 0;
    int64_t bad_in_a_row_ = 0;
    float input_scale_ = 1.0f;  // data.normalize: every batch is multiplied by it

    bool transcodes_;  // arch_.rows().target: rows [x | y], y_ the target
    DeviceArray<float> x_, y_, xc_, pre_, xhat_, dec_norms_, zsum_, xcol_, stats_;
    DeviceArray<int32_t> fires_;
    int64_t batch_cap_ = 0;
    StepState state_ = StepState::idle;
    int64_t queued_rows_ = 0;           // the rows of the queued passes
    std::vector<int64_t> since_fired_;  // host: tokens since each latent last fired
    std::vector<uint8_t> dead_;         // host: 1 for latents dead before this step
    int64_t n_dead_ = 0;                // of this latent shard's latents
    int64_t n_dead_total_ = 0;          // of the SAE's
    std::vector<int32_t> fires_host_;
    std::vector<float> xcol_host_;           // the last collected batch's column sums of x
    std::vector<double> pending_arch_sums_;  // the pending step's ArchPass::step_sums
    // train.accum_steps > 1: the step's summed result and gradient (step_end takes them).
    StepResult accumulated_;
    DeviceArray<float> accum_grads_;
    int64_t last_rows_ = 0;  // the rows of the last pass whose activations the pass holds
    QualityWindow window_;   // the steps from 90% of total_steps on (evaluation.h)
};

}  // namespace saetrain
