#include "saetrain/train_loop.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/perfmodel.h"
#include "saetrain/quality.h"  // defines: fvu_from_sums

namespace saetrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums over one log interval.
struct Interval {
    int64_t steps = 0, rows = 0;
    double loss = 0, sse = 0, sst = 0, sum_sq_x = 0, l1 = 0, l0 = 0, grad_norm = 0, lr = 0;
    double threads = 0;  // summed over the steps
    void add(const StepResult& r, int step_threads) {
        ++steps, rows += r.rows, threads += step_threads;
        loss += r.loss, sse += r.sse, sst += r.sst, sum_sq_x += r.sum_sq_x, l1 += r.l1, l0 += r.l0;
        grad_norm += r.grad_norm, lr = r.lr;
    }
};

// The batch buffer, from opt.batch_allocator when one is given (pinned memory on a CUDA rank),
// else the heap; `bytes` of the source's rows, in their element type (16-bit rows stay 16-bit
// up to the upload).
class BatchBuffer {
public:
    BatchBuffer(const HostAllocator& allocator, int64_t bytes_wanted) {
        const auto bytes = static_cast<size_t>(bytes_wanted);
        if (!allocator.alloc) {
            heap_.resize((bytes + sizeof(float) - 1) / sizeof(float));  // float-aligned
            data_ = heap_.data();
            return;
        }
        void* p = allocator.alloc(bytes);
        SAE_ENFORCE(p != nullptr, "cannot allocate the {:.1f} MB batch buffer ({} memory)",
                    static_cast<double>(bytes) / 1e6, allocator.name);
        allocated_ = {p, [free = allocator.free, bytes](void* q) { free(q, bytes); }};
        data_ = allocated_.get();
    }
    void* data() const { return data_; }

private:
    std::vector<float> heap_;
    std::unique_ptr<void, std::function<void(void*)>> allocated_;
    void* data_ = nullptr;
};

// One run of the loop: the state train_loop's phases share.
class TrainLoop {
public:
    TrainLoop(SaeTrainer& trainer, BatchSource& source, const LoopOptions& opt)
        : trainer_(trainer),
          source_(source),
          opt_(opt),
          d_(source.row_width()),
          dtype_(source.dtype()),
          batch_(opt.batch_allocator, opt.batch_size * source.row_width() * dtype_size(dtype_)),
          threads_(std::max(1, opt.threads)),
          step_threads_(threads_),
          // Model FLOPs per token (the architecture's count): what TFLOP/s and MFU count. TopK
          // runs sparse kernels on every backend, so its count is 2*d*n + 8*k*d.
          flops_per_token_(
              trainer.arch().flops_per_token(trainer.config(), d_, trainer.n_latents())),
          tokens_at_start_(trainer.tokens()),  // > 0 when resuming
          steps_at_start_(trainer.step_count()),
          iter_(opt.start_iteration),
          initialized_(opt.initialized) {
        start_interval();
    }

    // Iterates until no rank has data left or the ranks agree to stop.
    void run();
    // The final partial interval and the evaluation at the end.
    void report_end();
    // The run's totals and rates.
    LoopResult summarize();

private:
    bool next_batch();
    void fetch();
    BatchView batch() const;  // the batch in batch_
    int64_t usable_rows();
    bool initialize(int64_t use);
    void train(int64_t use);
    StepResult step(int64_t use, bool fetch_ahead);
    EvalResult evaluate();
    MetricsRow metrics_row(const EvalResult* e);
    void emit(const EvalResult* e);
    void start_interval();

    SaeTrainer& trainer_;
    BatchSource& source_;
    const LoopOptions& opt_;
    const int64_t d_;
    const DType dtype_;  // of the source's rows, and so of batch_
    BatchBuffer batch_;
    const int threads_;
    int step_threads_;  // CPU threads of the coming step (LoopOptions::cpu_threads)
    int64_t thread_steps_ = 0;
    double thread_sum_ = 0;
    const double flops_per_token_;
    const int64_t tokens_at_start_;
    const int64_t steps_at_start_;  // > 0 when resuming: steps this process did not take
    const Clock::time_point t_start_ = Clock::now();
    LoopResult res_;
    int64_t iter_;
    bool initialized_;
    // The batch in batch_: its rows and the first holding NaN/Inf (-1: none). `held_`: it was
    // fetched during the previous step (LoopOptions::overlap) and is not trained yet.
    int64_t rows_ = 0, bad_row_ = -1;
    bool held_ = false, stopping_ = false;
    // The log interval: its sums, its start, the source's counters then, and the seconds of
    // evaluation in it (kept out of its rates).
    Interval iv_;
    Clock::time_point t_interval_;
    double wait_at_interval_ = 0;
    int64_t bytes_at_interval_ = 0;
    double eval_in_interval_ = 0;
};

void TrainLoop::run() {
    for (;; ++iter_) {
        if (opt_.on_iteration) opt_.on_iteration(iter_);
        if (opt_.cpu_threads) step_threads_ = opt_.cpu_threads();
        if (!next_batch()) break;                         // the ranks agree: stop, or no data
        const int64_t use = usable_rows();                // 0 for a batch holding NaN or Inf
        if (!initialized_ && !initialize(use)) continue;  // no rank has a usable batch yet
        train(use);                                       // the step, its log row, checkpoint
    }
}

// Agrees with the other ranks whether to stop, whether a background checkpoint write is still
// under way anywhere (committing it when none is), and whether any rank has data, fetching the
// batch unless one is held; false: leave the loop (the same on every rank).
bool TrainLoop::next_batch() {
    // [any rank has data, any rank wants to stop, any rank still writing a checkpoint]: the last
    // two in one all-reduce, so every rank makes the same decisions at the same iteration.
    int64_t flags[3] = {0, opt_.stop_requested && opt_.stop_requested() ? 1 : 0,
                        opt_.write_in_flight && opt_.write_in_flight() ? 1 : 0};
    if (opt_.world) opt_.world->allreduce_max(&flags[1], 2);
    if (opt_.commit_written) opt_.commit_written(flags[2] != 0);
    stopping_ = stopping_ || flags[1] != 0;
    // A held batch is trained before stopping: the source has delivered it, and the
    // checkpoint that follows a stop must not count it as consumed.
    if (!held_) {
        if (stopping_) {
            res_.stopped = true;
            return false;
        }
        fetch();
    }
    held_ = false;
    flags[0] = rows_ > 0 ? 1 : 0;
    if (opt_.world) opt_.world->allreduce_max(&flags[0], 1);
    return flags[0] != 0;
}

void TrainLoop::fetch() {
    auto t = Clock::now();
    rows_ = source_.next(batch_.data(), opt_.batch_size);
    res_.data_s += seconds_since(t);
    t = Clock::now();
    // On the stored bits: 16-bit rows are checked at half the bytes, with the decision the
    // widened floats would give.
    bad_row_ = first_nonfinite_row(dtype_, batch_.data(), rows_, d_, threads_);
    res_.check_s += seconds_since(t);
}

BatchView TrainLoop::batch() const { return {batch_.data(), dtype_}; }

// The rows of the batch the step trains on: all of them, or none when it holds NaN or Inf.
int64_t TrainLoop::usable_rows() {
    if (bad_row_ < 0) return rows_;
    SAE_ENFORCE(!opt_.stop_on_nonfinite,
                "the batch of iteration {} holds NaN or Inf values, first in its row {} of {} "
                "(data.nonfinite: stop); inspect the shards with sae-inspect or set "
                "data.nonfinite: skip",
                iter_, bad_row_, rows_);
    ++res_.nonfinite_batches;
    return 0;  // still joins the step's collectives, with no rows
}

// The SAE starts from the first batch that some rank can use: until then batches holding
// NaN/Inf (data.nonfinite: skip) are passed over without a step (false).
bool TrainLoop::initialize(int64_t use) {
    int64_t usable = use > 0 ? 1 : 0;
    if (opt_.world) opt_.world->allreduce_max(&usable, 1);
    if (!usable) return false;
    const auto t = Clock::now();
    trainer_.init(batch(), use, threads_), initialized_ = true;
    res_.init_s += seconds_since(t);
    return true;
}

// One step on the batch, then the log interval's row and the checkpoint when they are due.
void TrainLoop::train(int64_t use) {
    // Fetch the next batch while the device computes this step, unless a checkpoint follows
    // the step (its cursor must count trained batches only) or the ranks are stopping; the
    // conditions are the same on every rank, so a collective source stays in step.
    const bool checkpoint_after =
        opt_.checkpoint && opt_.checkpoint_every > 0 && (iter_ + 1) % opt_.checkpoint_every == 0;
    const StepResult r = step(use, opt_.overlap && !stopping_ && !checkpoint_after);
    res_.skipped_steps += r.skipped ? 1 : 0;
    if (r.rows > 0 && !r.skipped) iv_.add(r, step_threads_);
    res_.min_threads =
        thread_steps_ == 0 ? step_threads_ : std::min(res_.min_threads, step_threads_);
    ++thread_steps_, thread_sum_ += step_threads_;
    if (opt_.log_every > 0 && (iter_ + 1) % opt_.log_every == 0) {
        const bool eval_now =
            opt_.evaluate && opt_.eval_every > 0 && (iter_ + 1) % opt_.eval_every == 0;
        const EvalResult e = eval_now ? evaluate() : EvalResult{};
        emit(eval_now ? &e : nullptr);
    }
    if (checkpoint_after) opt_.checkpoint(trainer_, iter_ + 1);
}

StepResult TrainLoop::step(int64_t use, bool fetch_ahead) {
    auto t_step = Clock::now();
    trainer_.step_begin(batch(), use);  // the batch is uploaded: batch_ is free again
    if (fetch_ahead) {
        res_.step_s += seconds_since(t_step);
        fetch();
        held_ = true;
        t_step = Clock::now();
    }
    const StepResult r = trainer_.step_end();
    res_.step_s += seconds_since(t_step);
    return r;
}

// Runs the evaluation, its time kept out of the interval's rates.
EvalResult TrainLoop::evaluate() {
    const auto t = Clock::now();
    res_.eval = opt_.evaluate(trainer_);
    const double s = seconds_since(t);
    eval_in_interval_ += s, res_.eval_s += s;
    return res_.eval;
}

MetricsRow TrainLoop::metrics_row(const EvalResult* e) {
    const double dt = seconds_since(t_interval_) - eval_in_interval_;
    const double elapsed = seconds_since(t_start_) - res_.eval_s;
    const double rows = static_cast<double>(std::max<int64_t>(iv_.rows, 1));
    const double steps = static_cast<double>(std::max<int64_t>(iv_.steps, 1));
    const int64_t total_steps = trainer_.total_steps();
    MetricsRow m;
    m.sae = opt_.sae_id;
    m.step = trainer_.step_count();
    m.total_steps = total_steps;
    m.tokens = trainer_.tokens();
    m.lr = iv_.lr;
    m.loss = iv_.loss / steps;
    m.mse = iv_.sse / (rows * static_cast<double>(d_));
    // NaN when the interval's rows have no variance (an interval of no rows keeps 0, as mse).
    m.fvu = iv_.rows == 0 ? 0.0
                          : fvu_from_sums(iv_.sse, iv_.sst, iv_.sum_sq_x,
                                          static_cast<double>(iv_.rows * trainer_.d_model()));
    m.l0 = iv_.l0 / rows;
    m.l1 = iv_.l1 / rows;
    m.dead_fraction = trainer_.dead_fraction();
    m.grad_norm = iv_.grad_norm / steps;
    m.tokens_per_s = dt > 0 ? static_cast<double>(iv_.rows) / dt : 0.0;
    m.read_MBps =
        dt > 0 ? static_cast<double>(source_.bytes_read() - bytes_at_interval_) / dt / 1e6 : 0.0;
    m.wait_fraction = dt > 0 ? (source_.wait_seconds() - wait_at_interval_) / dt : 0.0;
    m.elapsed_s = elapsed;
    m.tflops = flops_per_token_ * m.tokens_per_s / 1e12;
    m.gpu_mem_peak_GB = static_cast<double>(trainer_.backend().device_memory_peak_bytes()) / 1e9;
    m.host_mem_peak_GB = static_cast<double>(host_peak_rss_bytes()) / 1e9;
    m.cpu_threads = iv_.threads / steps;
    if (e) attach_eval(m, *e);
    // The ETA from this process's own pace: after a resume, the steps before it took no time
    // here (counting them made the ETA of a run resumed at 90% read ten times too short).
    const int64_t steps_here = m.step - steps_at_start_;
    const double per_step = steps_here > 0 ? elapsed / static_cast<double>(steps_here) : 0.0;
    m.eta_s = per_step * static_cast<double>(std::max<int64_t>(total_steps - m.step, 0));
    return m;
}

// Reports the interval's row (with the evaluation `e`, if any) and starts the next interval.
void TrainLoop::emit(const EvalResult* e) {
    const MetricsRow m = metrics_row(e);
    if (opt_.report) opt_.report(m);
    res_.last = m;
    start_interval();
}

void TrainLoop::start_interval() {
    iv_ = Interval{};
    eval_in_interval_ = 0;
    t_interval_ = Clock::now();
    wait_at_interval_ = source_.wait_seconds();
    bytes_at_interval_ = source_.bytes_read();
}

void TrainLoop::report_end() {
    // The final partial interval; the condition depends only on iteration counts, which every
    // rank shares, because emit() may be collective.
    // The evaluation at the end rides on that row; when the last iteration was already logged
    // without one, that row is reported again with it (same step; the later line wins).
    const int64_t iter = iter_, start = opt_.start_iteration;
    const bool partial = iter > start && (opt_.log_every <= 0 || iter % opt_.log_every != 0);
    if (!(opt_.evaluate && initialized_)) {
        if (partial) emit(nullptr);
        return;
    }
    const bool evaluated_last =
        !partial && iter > start && opt_.eval_every > 0 && iter % opt_.eval_every == 0;
    if (!evaluated_last) evaluate();  // else res_.eval holds that evaluation already
    if (partial) {
        emit(&res_.eval);
    } else if (!evaluated_last && iter > start) {
        MetricsRow m = res_.last;
        attach_eval(m, res_.eval);
        if (opt_.report) opt_.report(m);
        res_.last = m;
    }
}

LoopResult TrainLoop::summarize() {
    LoopResult res = res_;
    res.iterations = iter_;
    res.steps = trainer_.step_count();
    res.tokens = trainer_.tokens();
    res.seconds = seconds_since(t_start_) - res.eval_s;
    // Tokens trained by this process: a resumed run's earlier tokens took no time here.
    res.tokens_per_s =
        res.seconds > 0 ? static_cast<double>(res.tokens - tokens_at_start_) / res.seconds : 0.0;
    res.tflops = flops_per_token_ * res.tokens_per_s / 1e12;
    res.wait_fraction = res.seconds > 0 ? source_.wait_seconds() / res.seconds : 0.0;
    res.mean_threads = thread_steps_ > 0 ? thread_sum_ / static_cast<double>(thread_steps_) : 0.0;
    return res;
}

}  // namespace

void attach_eval(MetricsRow& m, const EvalResult& e) {
    m.eval_rows = e.rows, m.eval_fvu = e.fvu, m.eval_l0 = e.l0;
    m.eval_dead_fraction = e.dead_fraction, m.eval_dense_fraction = e.dense_fraction;
}

int64_t total_steps_for(int64_t rows, int64_t batch_size) {
    return (rows + batch_size - 1) / batch_size;
}

// The phases of a run; each is a TrainLoop method above.
LoopResult train_loop(SaeTrainer& trainer, BatchSource& source, const LoopOptions& opt) {
    TrainLoop loop(trainer, source, opt);  // the batch buffer, the clocks, the counters
    loop.run();                            // step until the data ends or the ranks stop
    loop.report_end();                     // the last interval's row and the final evaluation
    return loop.summarize();               // totals and rates over this process's part
}

}  // namespace saetrain
