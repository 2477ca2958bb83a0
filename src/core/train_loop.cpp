#include "saetrain/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/perfmodel.h"

namespace saetrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums over one log interval.
struct Interval {
    int64_t steps = 0, rows = 0;
    double loss = 0, sse = 0, sst = 0, l1 = 0, l0 = 0, grad_norm = 0, lr = 0;
    void add(const StepResult& r) {
        ++steps, rows += r.rows;
        loss += r.loss, sse += r.sse, sst += r.sst, l1 += r.l1, l0 += r.l0;
        grad_norm += r.grad_norm, lr = r.lr;
    }
};

bool all_finite(const float* x, int64_t n, int threads) {
    // NaN and Inf are the floats whose exponent bits are all ones. An integer OR-reduction over
    // the bits vectorizes (a float reduction would not, without -ffast-math). On several
    // threads: one core reads a 12.6 MB batch in about a millisecond, a GPU step's worth.
    uint32_t bad = 0;
    const bool parallel = n > (1 << 18);
    // clang-format off
#pragma omp parallel for simd schedule(static) num_threads(threads) reduction(|: bad) if (parallel)
    // clang-format on
    for (int64_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, x + i, sizeof(b));
        bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

}  // namespace

void attach_eval(MetricsRow& m, const EvalResult& e) {
    m.eval_rows = e.rows, m.eval_fvu = e.fvu, m.eval_l0 = e.l0;
    m.eval_dead_fraction = e.dead_fraction, m.eval_dense_fraction = e.dense_fraction;
}

int64_t total_steps_for(int64_t rows, int64_t batch_size) {
    return (rows + batch_size - 1) / batch_size;
}

LoopResult train_loop(SaeTrainer& trainer, BatchSource& source, const LoopOptions& opt) {
    const int64_t batch_size = opt.batch_size, d = source.d_model();
    const int64_t total_steps = trainer.total_steps();
    // The batch buffer, from opt.batch_allocator when one is given.
    const size_t batch_bytes = static_cast<size_t>(batch_size * d) * sizeof(float);
    std::vector<float> heap_batch;
    std::unique_ptr<float, std::function<void(float*)>> owned_batch;
    float* batch = nullptr;
    if (opt.batch_allocator.alloc) {
        void* p = opt.batch_allocator.alloc(batch_bytes);
        SAE_ENFORCE(p != nullptr, "cannot allocate the {:.1f} MB batch buffer ({} memory)",
                    static_cast<double>(batch_bytes) / 1e6, opt.batch_allocator.name);
        owned_batch = {static_cast<float*>(p), [free = opt.batch_allocator.free,
                                                batch_bytes](float* q) { free(q, batch_bytes); }};
        batch = owned_batch.get();
    } else {
        heap_batch.resize(static_cast<size_t>(batch_size * d));
        batch = heap_batch.data();
    }
    const auto t_start = Clock::now();
    auto t_interval = t_start;
    double wait_at_interval = source.wait_seconds();
    int64_t bytes_at_interval = source.bytes_read();
    Interval iv;
    LoopResult res;
    // Model FLOPs per token (the architecture's count): what TFLOP/s and MFU count. TopK runs
    // sparse kernels on every backend, so its count is 2*d*n + 8*k*d.
    const double flops_per_token =
        trainer.arch().flops_per_token(trainer.config(), d, trainer.n_latents());
    const int64_t tokens_at_start = trainer.tokens();  // > 0 when resuming

    // Runs the evaluation, its time kept out of the interval's rates.
    double eval_in_interval = 0;
    auto evaluate = [&] {
        const auto t = Clock::now();
        res.eval = opt.evaluate(trainer);
        const double s = seconds_since(t);
        eval_in_interval += s, res.eval_s += s;
        return res.eval;
    };
    auto emit = [&](const EvalResult* e) {
        const double dt = seconds_since(t_interval) - eval_in_interval;
        const double elapsed = seconds_since(t_start) - res.eval_s;
        const double rows = static_cast<double>(std::max<int64_t>(iv.rows, 1));
        const double steps = static_cast<double>(std::max<int64_t>(iv.steps, 1));
        MetricsRow m;
        m.sae = opt.sae_id;
        m.step = trainer.step_count();
        m.total_steps = total_steps;
        m.tokens = trainer.tokens();
        m.lr = iv.lr;
        m.loss = iv.loss / steps;
        m.mse = iv.sse / (rows * static_cast<double>(d));
        m.fvu = iv.sst > 0 ? iv.sse / iv.sst : 0.0;
        m.l0 = iv.l0 / rows;
        m.l1 = iv.l1 / rows;
        m.dead_fraction = trainer.dead_fraction();
        m.grad_norm = iv.grad_norm / steps;
        m.tokens_per_s = dt > 0 ? static_cast<double>(iv.rows) / dt : 0.0;
        m.read_MBps =
            dt > 0 ? static_cast<double>(source.bytes_read() - bytes_at_interval) / dt / 1e6 : 0.0;
        m.wait_fraction = dt > 0 ? (source.wait_seconds() - wait_at_interval) / dt : 0.0;
        m.elapsed_s = elapsed;
        m.tflops = flops_per_token * m.tokens_per_s / 1e12;
        m.gpu_mem_peak_GB = static_cast<double>(trainer.backend().device_memory_peak_bytes()) / 1e9;
        m.host_mem_peak_GB = static_cast<double>(host_peak_rss_bytes()) / 1e9;
        if (e) attach_eval(m, *e);
        const double per_step = m.step > 0 ? elapsed / static_cast<double>(m.step) : 0.0;
        m.eta_s = per_step * static_cast<double>(std::max<int64_t>(total_steps - m.step, 0));
        if (opt.report) opt.report(m);
        res.last = m;
        iv = Interval{};
        eval_in_interval = 0;
        t_interval = Clock::now();
        wait_at_interval = source.wait_seconds();
        bytes_at_interval = source.bytes_read();
    };

    int64_t iter = opt.start_iteration;
    bool initialized = opt.initialized;
    const int threads = std::max(1, opt.threads);
    // The batch in `batch`: its rows and whether every value is finite. `held`: it was fetched
    // during the previous step (LoopOptions::overlap) and is not trained yet.
    int64_t rows = 0;
    bool finite = true, held = false, stopping = false;
    auto fetch = [&] {
        auto t = Clock::now();
        rows = source.next(batch, batch_size);
        res.data_s += seconds_since(t);
        t = Clock::now();
        finite = rows == 0 || all_finite(batch, rows * d, threads);
        res.check_s += seconds_since(t);
    };
    for (;; ++iter) {
        if (opt.on_iteration) opt.on_iteration(iter);
        // [any rank has data, any rank wants to stop]: one all-reduce, same decision everywhere
        int64_t flags[2] = {0, opt.stop_requested && opt.stop_requested() ? 1 : 0};
        if (opt.world) opt.world->allreduce_max(&flags[1], 1);
        stopping = stopping || flags[1] != 0;
        // A held batch is trained before stopping: the source has delivered it, and the
        // checkpoint that follows a stop must not count it as consumed.
        if (!held) {
            if (stopping) {
                res.stopped = true;
                break;
            }
            fetch();
        }
        held = false;
        flags[0] = rows > 0 ? 1 : 0;
        if (opt.world) opt.world->allreduce_max(&flags[0], 1);
        if (!flags[0]) break;
        int64_t use = rows;
        if (!finite) {
            SAE_ENFORCE(!opt.stop_on_nonfinite,
                        "the batch of iteration {} holds NaN or Inf values (data.nonfinite: stop); "
                        "inspect the shards with sae-inspect or set data.nonfinite: skip",
                        iter);
            ++res.nonfinite_batches;
            use = 0;  // still joins the step's collectives, with no rows
        }
        if (!initialized) {
            // The SAE starts from the first batch that some rank can use: until then batches
            // holding NaN/Inf (data.nonfinite: skip) are passed over without a step.
            int64_t usable = use > 0 ? 1 : 0;
            if (opt.world) opt.world->allreduce_max(&usable, 1);
            if (!usable) continue;
            trainer.init(batch, use), initialized = true;
        }
        // Fetch the next batch while the device computes this step, unless a checkpoint follows
        // the step (its cursor must count trained batches only) or the ranks are stopping; the
        // conditions are the same on every rank, so a collective source stays in step.
        const bool checkpoint_after =
            opt.checkpoint && opt.checkpoint_every > 0 && (iter + 1) % opt.checkpoint_every == 0;
        const bool ahead = opt.overlap && !stopping && !checkpoint_after;
        auto t_step = Clock::now();
        trainer.step_begin(batch, use);  // the batch is uploaded: `batch` is free again
        if (ahead) {
            res.step_s += seconds_since(t_step);
            fetch();
            held = true;
            t_step = Clock::now();
        }
        const StepResult r = trainer.step_end();
        res.step_s += seconds_since(t_step);
        res.skipped_steps += r.skipped ? 1 : 0;
        if (r.rows > 0 && !r.skipped) iv.add(r);
        if (opt.log_every > 0 && (iter + 1) % opt.log_every == 0) {
            const bool eval_now =
                opt.evaluate && opt.eval_every > 0 && (iter + 1) % opt.eval_every == 0;
            const EvalResult e = eval_now ? evaluate() : EvalResult{};
            emit(eval_now ? &e : nullptr);
        }
        if (checkpoint_after) opt.checkpoint(trainer, iter + 1);
    }
    // The final partial interval; the condition depends only on iteration counts, which every
    // rank shares, because emit() may be collective.
    // The evaluation at the end rides on that row; when the last iteration was already logged
    // without one, that row is reported again with it (same step; the later line wins).
    const bool partial =
        iter > opt.start_iteration && (opt.log_every <= 0 || iter % opt.log_every != 0);
    if (opt.evaluate && initialized) {
        const bool evaluated_last = !partial && iter > opt.start_iteration && opt.eval_every > 0 &&
                                    iter % opt.eval_every == 0;
        if (!evaluated_last) evaluate();  // else res.eval holds that evaluation already
        if (partial) {
            emit(&res.eval);
        } else if (!evaluated_last && iter > opt.start_iteration) {
            MetricsRow m = res.last;
            attach_eval(m, res.eval);
            if (opt.report) opt.report(m);
            res.last = m;
        }
    } else if (partial) {
        emit(nullptr);
    }
    res.iterations = iter;
    res.steps = trainer.step_count();
    res.tokens = trainer.tokens();
    res.seconds = seconds_since(t_start) - res.eval_s;
    // Tokens trained by this process: a resumed run's earlier tokens took no time here.
    res.tokens_per_s =
        res.seconds > 0 ? static_cast<double>(res.tokens - tokens_at_start) / res.seconds : 0.0;
    res.tflops = flops_per_token * res.tokens_per_s / 1e12;
    res.wait_fraction = res.seconds > 0 ? source.wait_seconds() / res.seconds : 0.0;
    return res;
}

}  // namespace saetrain
