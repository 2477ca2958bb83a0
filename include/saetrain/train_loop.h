// train_loop.h — the training loop around one SaeTrainer: batches in, metrics out.
//
// Pulls batches from a BatchSource, steps the trainer, and every log.every_steps steps turns
// the interval's sums into a MetricsRow handed to `report` (rank 0 writes it and the console):
// the loss terms, tokens/s, model TFLOP/s and this rank's memory high-water marks (MFU, which
// needs every replica's peak, is the reporter's).
#pragma once

#include <functional>
#include <string>

#include "saetrain/batch_source.h"
#include "saetrain/host_alloc.h"  // defines: HostAllocator
#include "saetrain/metrics.h"
#include "saetrain/trainer.h"

namespace saetrain {

struct LoopResult {
    MetricsRow last;  // the final interval's metrics
    int64_t steps = 0, tokens = 0;
    int64_t iterations = 0;         // loop iterations done, counting those before a resume
    bool stopped = false;           // left early because some rank asked to stop (a signal)
    int64_t nonfinite_batches = 0;  // batches skipped for NaN/Inf in the data (this rank)
    int64_t skipped_steps = 0;      // steps not applied for a non-finite loss or gradient
    // Over this process's part of the run (a resumed run's earlier tokens are not counted):
    // seconds, tokens/s and model TFLOP/s of the SAE (all replicas), the loader's wait fraction.
    double seconds = 0, tokens_per_s = 0, wait_fraction = 0, tflops = 0;
    // Where this rank's seconds went: getting batches (the source's wait for the reader
    // included), the NaN/Inf check, the SAE's initialization from the first batch, trainer
    // steps (upload, compute, gradient exchange), and the rest (agreement, logging,
    // checkpoints).
    double data_s = 0, check_s = 0, init_s = 0, step_s = 0;
    // The CPU threads its steps used (LoopOptions::cpu_threads): the fewest, and on average.
    int min_threads = 0;
    double mean_threads = 0;
    // The held-out evaluation at the end (LoopOptions::evaluate); rows 0: none. Its seconds are
    // in none of the rates above.
    EvalResult eval;
    double eval_s = 0;
};

struct LoopOptions {
    // All ranks of the job: every iteration they agree (one small all-reduce) whether any of
    // them still has data, so all leave the loop together and every collective inside it
    // (gradient all-reduce, metrics gather) is reached by every rank. nullptr: one process.
    Communicator* world = nullptr;
    int64_t batch_size = 4096;
    int64_t log_every = 50;
    int64_t checkpoint_every = 0;  // 0: never
    std::string sae_id;
    std::function<void(const MetricsRow&)> report;  // every log interval and at the end
    // every checkpoint_every iterations, with the number of iterations done
    std::function<void(SaeTrainer&, int64_t)> checkpoint;
    std::function<void(int64_t)> on_iteration;  // before each iteration's batch
    // Polled every iteration on every rank; if any rank says yes, all stop together after the
    // current step (the decision rides on the per-iteration all-reduce).
    std::function<bool()> stop_requested;
    // A checkpoint written in the background is committed as soon as its write is done: every
    // iteration, whether this rank's write is still under way (`write_in_flight`) rides on the
    // same all-reduce, and `commit_written` runs on every rank with the agreed answer (true: some
    // rank is still writing). It may use collectives: every rank calls it at the same point
    // (Checkpointer::commit_when_written). Empty: nothing to commit.
    std::function<bool()> write_in_flight;
    std::function<void(bool)> commit_written;
    // Resuming: iterations already done, and the SAE is already initialized.
    int64_t start_iteration = 0;
    bool initialized = false;
    // A batch holding NaN or Inf: false skips it (counted), true stops the run with an error.
    bool stop_on_nonfinite = false;
    // Where the batch the trainer uploads lives: pinned memory on a CUDA rank makes the
    // upload a DMA. Empty: ordinary heap memory.
    HostAllocator batch_allocator;
    // CPU threads for the loop's own passes over a batch (the NaN/Inf check).
    int threads = 1;
    // Before each iteration: the CPU threads its step uses (CoreShare::threads, which sets them),
    // reported as metrics' cpu_threads. Empty: `threads` every step.
    std::function<int()> cpu_threads;
    // Fetch (and check) the next batch while the device computes the current step
    // (SaeTrainer::step_begin / step_end), so the host's share of an iteration hides behind
    // the GPU's. The batches and the results are the same either way; a step followed by a
    // checkpoint, or by a stop, does not fetch ahead, so cursors count trained batches only.
    bool overlap = true;
    // Held-out evaluation (SaeTrainer::evaluate; collective over the SAE's replicas): run on
    // the log iterations that are multiples of eval_every (0: none during the run) and once
    // at the end; the result rides on that iteration's MetricsRow. Empty: no evaluation.
    std::function<EvalResult(SaeTrainer&)> evaluate;
    int64_t eval_every = 0;
};

// Steps until no rank has data left. Logging and checkpoints happen on iterations that are
// multiples of their interval (the same iterations on every rank, so the report and
// checkpoint callbacks may use collectives). The first batch initializes the SAE (b_dec from
// its mean over replicas).
LoopResult train_loop(SaeTrainer& trainer, BatchSource& source, const LoopOptions& opt);

// Copies an evaluation into the eval_* fields of a metrics row.
void attach_eval(MetricsRow& m, const EvalResult& e);

// Steps the loop will take for a source of `rows` rows.
int64_t total_steps_for(int64_t rows, int64_t batch_size);

}  // namespace saetrain
