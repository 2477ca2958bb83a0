// A training run (run.h), top-down: run_training is the table of contents. Start up, agreeing
// on failures (config, data, the rank grid, backend, the rows this rank reads); connect (the
// grid's communicators and the stream of batches); open run.out_dir; resume or start fresh;
// train; write the outputs and report.
#include "saetrain/run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "run_parts.h"
#include "saetrain/checkpoint_parts.h"
#include "saetrain/checkpointer.h"  // defines: Checkpointer (committed checkpoints, resume)
#include "saetrain/cores.h"         // defines: CoreShare (the threads other processes leave)
#include "saetrain/error.h"         // defines: saetrain::Error, SAE_ENFORCE, printable
#include "saetrain/perfmodel.h"     // defines: mfu_peak (the peak MFU is measured against)
#include "saetrain/report.h"        // defines: RunReporter (rank 0 gathers metrics)
#include "saetrain/stop_signals.h"  // defines: stop_signals_training, stop_signal_received

namespace saetrain {

namespace run_parts {
namespace {

// Loads the newest committed checkpoint into `trainer` and the reader's cursor, and sets where
// the loop starts; returns the step it was taken at (metrics.jsonl and tb/ keep what was logged
// up to it), or -1 for a fresh start.
int64_t resume_if_any(Setup& s, const RunRequest& args, Communicator& world,
                      Checkpointer& checkpoints, SaeTrainer& trainer, LoopOptions& opt) {
    if (!s.resume) return -1;
    const auto t0 = std::chrono::steady_clock::now();
    const auto at = checkpoints.resume(trainer, config_to_yaml(s.cfg), args.allow_config_change);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SAE_ENFORCE(at.has_value(),
                "{}: no committed checkpoint could be loaded ({}); restore what it names and run "
                "again to resume ({})",
                s.out().string(),
                checkpoints.newest_failure().empty() ? "see the warnings above"
                                                     : checkpoints.newest_failure(),
                overwrite_deletes(s.out()));
    if (s.local) s.local->restore(ReaderCursor{at->epoch, at->offset});
    opt.start_iteration = at->iteration;
    opt.initialized = true;
    if (world.rank() == 0) {
        write_run_config(s.out().string(), config_to_yaml(s.cfg));
        drop_metrics_after((s.out() / "metrics.jsonl").string(), at->step);
        fmt::print(
            "resumed from the checkpoint at step {} ({} iterations done; read and "
            "verified in {:.1f} s)\n",
            at->step, at->iteration, secs);
    }
    return at->step;
}

// --- train --------------------------------------------------------------------------------------
// MFU: against log.peak_tflops, or the table's peak for this rank's GPU and GEMM precision.
MfuPeak announce_peak(const Setup& s, bool root) {
    const MfuPeak peak = mfu_peak(s.cfg.log.peak_tflops, s.backend->device_name(),
                                  math_mode_parse(s.backend->gemm_precision()));
    if (root)
        fmt::print("{}\n",
                   peak.flops > 0
                       ? fmt::format("MFU against {:.4g} TFLOP/s per device ({})",
                                     peak.flops / 1e12, peak.source)
                       : fmt::format("TFLOP/s counted as model FLOPs; no MFU: {}", peak.source));
    return peak;
}

// The loop's hooks: reports to rank 0, checkpoints, stop signals, held-out evaluation and the
// SAETRAIN_FAULT test hook. `writer`: this rank writes its SAE's files (replica 0).
void set_loop_hooks(LoopOptions& opt, Setup& s, Communicator& world, RunReporter& reporter,
                    Checkpointer& checkpoints, const Fault& fault, bool writer) {
    opt.threads = s.threads;
    opt.world = &world;
    opt.batch_allocator = s.backend->host_allocator();
    opt.batch_size = s.cfg.data.batch_size;
    opt.log_every = s.cfg.log.every_steps;
    opt.checkpoint_every = s.cfg.checkpoint.every_steps;
    opt.sae_id = s.id();
    opt.report = [&reporter](const MetricsRow& m) { reporter.gather(m); };
    if (fault.at_checkpoint && fault.rank == world.rank() && writer) {
        SAE_ENFORCE(fault.signal == SIGKILL, "SAETRAIN_FAULT: only KILL lands mid-write");
        // Before any writer thread exists: the atomic writer reads it on the write it names (a
        // latent shard's: its part).
        const std::string dir = (s.out() / "sae" / s.id()).string();
        const int64_t parts = s.cfg.parallel.latent_shards;
        ::setenv(
            "SAETRAIN_FAULT_KILL_IN_WRITE",
            (parts > 1 ? checkpoint_part_path(dir, fault.iteration, s.coords.latent_shard, parts)
                       : checkpoint_weights_path(dir, fault.iteration))
                .c_str(),
            1);
    }
    opt.checkpoint = [&s, &world, &checkpoints, &fault, writer](SaeTrainer& t, int64_t iteration) {
        if (!writer && fault.fires(world.rank(), iteration, true)) fault.fire(iteration);
        const ReaderCursor c = s.cursor();
        checkpoints.save(t, iteration, c.epoch, c.offset, /*wait=*/false);
    };
    // Committed at the first iteration at which no rank is still writing it (checkpointer.h).
    opt.write_in_flight = [&checkpoints] { return checkpoints.write_in_flight(); };
    opt.commit_written = [&checkpoints](bool busy) { checkpoints.commit_when_written(busy); };
    opt.stop_requested = [] { return stop_signal_received(); };
    opt.stop_on_nonfinite = s.cfg.data.nonfinite == "stop";
    if (s.eval_rows() > 0) {
        opt.evaluate = [&s](SaeTrainer& t) {
            return t.evaluate(s.eval_x.data(), s.split.eval_mine.size(), s.cfg.data.batch_size);
        };
        opt.eval_every = s.cfg.log.eval_every_steps;
    }
    opt.on_iteration = [&world, &fault, &checkpoints](int64_t iter) {
        if (fault.fires(world.rank(), iter, false)) fault.fire(iter);
        if (fault.watches_write(world.rank(), iter)) {  // phase `written` (fault.h)
            if (iter > fault.iteration) fault.fire(iter);
            while (checkpoints.write_in_flight())
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    };
}

void print_loop_end(const LoopResult& res, const RunReporter& reporter, Communicator& world) {
    if (world.rank() == 0 && res.seconds > 0)
        fmt::print(
            "rank 0 time: {:.2f} s | batches {:.2f} s (waiting for the reader {:.2f} s) | "
            "NaN/Inf check {:.2f} s | initialization {:.2f} s | steps {:.2f} s | other {:.2f} s "
            "| writing metrics.jsonl and tb/ {:.4f} s ({:.3f}% of the steps)\n",
            res.seconds, res.data_s, res.wait_fraction * res.seconds, res.check_s, res.init_s,
            res.step_s, res.seconds - res.data_s - res.check_s - res.init_s - res.step_s,
            reporter.log_write_seconds(),
            res.step_s > 0 ? 100.0 * reporter.log_write_seconds() / res.step_s : 0.0);
    if (res.nonfinite_batches > 0 || res.skipped_steps > 0)
        fmt::print(stderr,
                   "saetrain: warning: rank {}: skipped {} batch(es) holding NaN/Inf "
                   "(data.nonfinite: skip) and {} step(s) with a non-finite loss or gradient\n",
                   world.rank(), res.nonfinite_batches, res.skipped_steps);
}

}  // namespace
}  // namespace run_parts

// --- the run ------------------------------------------------------------------------------------
int run_training(const RunRequest& args, Communicator& world,
                 std::unique_ptr<RunStateFile>& state) {
    using namespace run_parts;
    const bool root = world.rank() == 0;
    const NodePlacement place = node_placement();
    Fault fault;
    std::optional<Setup> setup = start_up(args, world, place, fault);
    if (!setup) return 1;
    Setup& s = *setup;
    if (s.complete) {
        if (root)
            fmt::print(
                "{} holds a finished run (COMPLETE); nothing to do. Pass --overwrite to "
                "train it again (it deletes its final weights and metrics).\n",
                s.cfg.run.out_dir);
        return 0;
    }
    if (fault.fires(world.rank(), Fault::kConnect, false)) fault.fire(Fault::kConnect);
    std::optional<Connections> connected = connect(s, world, place);
    if (!connected) return 1;
    Connections& conn = *connected;
    if (root) {
        prepare_out_dir(s);
        print_banner(s, world.size(), conn.steps);
    }
    // The CPU backend's threads compute the steps; a GPU rank's host threads only feed it.
    CoreShare cores(s.threads, place.local_size, !args.fixed_threads && s.backend->host_memory());
    const int hosts = print_placement(world, place, s.threads, cores.adapts());
    world.barrier();  // out_dir exists before anyone writes into it

    SaeTrainer trainer(s.sae(), s.model_d(), conn.steps, s.cfg.run.seed, *s.backend, conn.grads(),
                       &conn.latent_shard);
    if (root && trainer.store().replicas() > 1)
        fmt::print(
            "replicas: {} of each SAE; {}\n", trainer.store().replicas(),
            !trainer.splits_update()
                ? std::string("a copy each, their gradients summed by all-reduce messages (node "
                              "memory serves CPU replicas only, as many on each node, with room "
                              "and SAETRAIN_NO_SHM unset)")
            : trainer.store().nodes() == 1
                ? std::string("one copy of its parameters and optimizer state in node memory, "
                              "the update split among them")
                : fmt::format("one copy of its parameters and optimizer state in each of {} "
                              "nodes' memory, the update split among a node's replicas and "
                              "their ranges' sums all-reduced across the nodes",
                              trainer.store().nodes()));
    // Replicas are identical: replica 0 writes (its latent shards gather the SAE to latent shard
    // 0).
    const bool writer = s.coords.replica == 0;
    Checkpointer checkpoints(world, conn.grads(), s.out().string(),
                             (s.out() / "sae" / s.id()).string(), sae_meta(s, trainer),
                             s.cfg.checkpoint.keep, s.coords.latent_shard);
    LoopOptions opt;
    const int64_t resumed_step = resume_if_any(s, args, world, checkpoints, trainer, opt);
    // What a second Ctrl-C keeps: the newest committed checkpoint, kept up to date.
    stop_signals_training((s.out() / "checkpoints").string(), checkpoints.newest_committed());
    checkpoints.on_commit([](int64_t step) { stop_signals_committed(step); });
    if (root)
        state = std::make_unique<RunStateFile>(
            s.out().string(), run_record(s, world.size(), hosts, conn.steps, resumed_step));

    const MfuPeak peak = announce_peak(s, root);
    RunReporter reporter(world, s.coords, s.ids, (s.out() / "metrics.jsonl").string(), peak.flops,
                         (s.out() / "tb").string(), resumed_step);
    std::vector<std::string> names;
    std::vector<std::map<std::string, std::string>> rows;
    config_columns(s, names, rows);  // summary.csv's and TensorBoard's description of each SAE
    reporter.write_config_text(config_to_yaml(s.cfg), names, rows,
                               std::max<int64_t>(resumed_step, 0));
    set_loop_hooks(opt, s, world, reporter, checkpoints, fault, writer);
    if (cores.adapts())
        opt.cpu_threads = [&cores, &s, in_use = s.threads]() mutable {
            const int t = cores.threads();
            if (t != in_use) s.backend->set_host_threads(t), in_use = t;
            return t;
        };
    const LoopResult res = train_loop(trainer, *conn.source, opt);
    print_loop_end(res, reporter, world);
    if (root && res.min_threads > 0 && res.min_threads < cores.most())
        fmt::print(
            "rank 0 ran its steps on {:.2f} CPU threads on average, {} at fewest, of the {} "
            "asked: other processes took the rest of its cores\n",
            res.mean_threads, res.min_threads, cores.most());
    if (res.stopped && trainer.step_count() == 0) {
        // Stopped before the first step (a signal during start-up): no SAE to save yet.
        if (root)
            fmt::print(stderr,
                       "saetrain: stopped by a signal before the first step; nothing to save. Run "
                       "the same command to start (exit code {}).\n",
                       kExitStopped);
        return kExitStopped;
    }
    // A run that applied no step (every batch held NaN/Inf, or every step's loss or gradient was
    // non-finite) has nothing to show: an error, and no checkpoint, final.h5 or COMPLETE that
    // would call the untrained SAE finished. Collective: res.stopped is the same on every rank.
    int64_t idle = trainer.step_count() == 0 ? world.size() - world.rank() : 0;
    world.allreduce_max(&idle, 1);
    if (idle > 0) {
        if (world.size() - world.rank() == idle)
            fmt::print(stderr,
                       "saetrain: error: {}{} applied no optimizer step: {} batch(es) held NaN/Inf "
                       "and {} step(s) had a non-finite loss or gradient; check the data "
                       "(sae-inspect) before training again\n",
                       world.size() > 1 ? fmt::format("rank {}: ", world.rank()) : "", s.id(),
                       res.nonfinite_batches, res.skipped_steps);
        return 1;
    }
    // The last checkpoint: committed before anything else is written.
    const ReaderCursor end = s.cursor();
    checkpoints.save(trainer, res.iterations, end.epoch, end.offset, /*wait=*/true);
    if (res.stopped) {
        if (root)
            fmt::print(stderr,
                       "saetrain: stopped by a signal after {} steps; checkpoint committed in {}. "
                       "Run the same command to continue (exit code {}).\n",
                       trainer.step_count(), (s.out() / "checkpoints").string(), kExitStopped);
        return kExitStopped;
    }

    SaeSummary mine = summarize(s, res, trainer);
    if (writer) write_sae(s, trainer, mine);
    reporter.finish(mine, (s.out() / "summary.csv").string(), names, rows);
    world.barrier();
    if (root) {
        write_complete_marker(s.out().string(), trainer.step_count(), conn.steps,
                              config_to_yaml(s.cfg));
        fmt::print("wrote {}/summary.csv and sae/<id>/final.h5\n", s.out().string());
    }
    return 0;
}

int run_dry(const RunRequest& args, int ranks_asked) {
    try {
        const Config cfg = config_load(args.config, args.sets);
        const int g = static_cast<int>(cfg.sweep.empty() ? 1 : cfg.sweep.size());
        const int per = static_cast<int>(cfg.parallel.latent_shards);
        const int asked = cfg.parallel.mode == "sweep"
                              ? g * per
                              : g * static_cast<int>(cfg.parallel.replicas) * per;
        const int ranks = ranks_asked > 0 ? ranks_asked : asked;
        const RankGrid grid = RankGrid::from_config(cfg, ranks);
        std::vector<std::string> ids = sweep_ids(cfg, 0);
        const size_t n = ids.size();
        // A long sweep's ids: the first 16 and the last, on one line that stays readable.
        if (n > 20) {
            const std::string last = ids.back();
            ids.resize(16);
            ids.push_back(fmt::format("... ({} more)", n - 17));
            ids.push_back(last);
        }
        fmt::print("saetrain: {}: config OK: {} SAE{}: {}\n", printable(cfg.source), n,
                   n == 1 ? "" : "s", fmt::join(ids, ", "));
        fmt::print("saetrain: {} mode on {} rank(s): {}; out_dir {}; data {}\n", cfg.parallel.mode,
                   ranks, grid.describe(), printable(cfg.run.out_dir),
                   printable(fmt::format("{}", fmt::join(cfg.data.path, ", "))));
        return 0;
    } catch (const std::exception& e) {
        fmt::print(stderr, "saetrain: error: {}\n", printable(e.what()));
        return 1;
    }
}

}  // namespace saetrain
