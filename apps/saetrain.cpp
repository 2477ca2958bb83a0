// saetrain — train sparse autoencoders on cached activations.
//
//   saetrain CONFIG.yaml [--set key=value ...]      (mpirun/srun: one rank per device)
//
// Reads top-down: start MPI, set up everything that can fail locally (config, layout, data,
// backend) and agree that it worked, then split the communicators, train, write the outputs
// and report. Only rank 0 writes the run's shared files and the console.
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "saetrain/arch.h"              // defines: arch_get (the architecture registry)
#include "saetrain/backend_registry.h"  // defines: make_backend (cpu, cuda, auto)
#include "saetrain/build_config.h"      // defines: SAETRAIN_VERSION
#include "saetrain/checkpoint.h"        // defines: sae_write_h5
#include "saetrain/checkpointer.h"      // defines: Checkpointer (committed checkpoints, resume)
#include "saetrain/config.h"            // defines: config_load, config_to_yaml, sweep_ids
#include "saetrain/error.h"             // defines: saetrain::Error, SAE_ENFORCE
#include "saetrain/layout.h"            // defines: layout_for (which SAE / replica this rank is)
#include "saetrain/loader.h"            // defines: ShardBatchSource (a rank's slice, shuffled)
#include "saetrain/metrics.h"           // defines: metrics_last_row
#include "saetrain/mpi_world.h"         // defines: MpiScope, make_mpi_world, node_placement
#include "saetrain/perfmodel.h"         // defines: mfu_peak (the peak MFU is measured against)
#include "saetrain/report.h"            // defines: RunReporter (rank 0 gathers metrics)
#include "saetrain/schedule.h"          // defines: warmup_steps_for
#include "saetrain/shards.h"            // defines: dataset_open, dataset_info_pack, partition_rows
#include "saetrain/shared_source.h"     // defines: SharedBatchSource (slices -> one stream)
#include "saetrain/synth.h"             // defines: synth_read_features, feature_recovery
#include "saetrain/train_loop.h"        // defines: train_loop, SaeTrainer

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct Args {
    std::string config;
    std::vector<std::string> sets;
    bool overwrite = false;
    bool allow_config_change = false;
    int threads = 0;
};

// Exit codes (README "Faults"): 0 done, 1 error, 75 stopped by SIGTERM/SIGUSR1 after writing a
// checkpoint (EX_TEMPFAIL: run the same command again, or let Slurm's --requeue do it).
constexpr int kExitStopped = 75;

// Set by SIGTERM / SIGUSR1 (Slurm's time limit and --signal); read once per iteration.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Cores this process may run on, shared fairly among the ranks of its node.
int cpu_threads_for_rank(int local_size) {
    cpu_set_t set;
    int cores = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    return std::max(1, cores / std::max(1, local_size));
}

// Test hook: SAETRAIN_FAULT="rank:when[:action[:phase]]" makes that rank throw (action `error`,
// the default) or send itself a signal (TERM, USR1, KILL, STOP), so tests of failures and
// signals land where they mean to by construction, not by racing the clock (test_cli,
// test_resume, tools/fault-matrix.sh). `when` is a loop iteration, or `startup` (during set-up,
// while the other ranks wait in the start-up agreement). Phase `step` (the default) fires at the
// start of that iteration; `checkpoint` inside the checkpoint taken after that many iterations:
// a rank that writes files (an SAE's replica 0) dies halfway through its weights temp file
// (KILL only, through SAETRAIN_FAULT_KILL_IN_WRITE, see atomic_file.cpp), any other rank on
// entering the checkpoint's collectives. Unset in normal runs.
struct Fault {
    static constexpr int64_t kStartup = -2;
    int rank = -1;
    int64_t iteration = -1;
    int signal = 0;  // 0: throw
    bool at_checkpoint = false;
    bool fires(int r, int64_t iter, bool checkpoint) const {
        return rank == r && iteration == iter && at_checkpoint == checkpoint;
    }
    void fire(int64_t iter) const {
        if (signal != 0) {
            // The wall-clock time of the signal, for tools/fault-matrix.sh's time to exit.
            timespec now{};
            ::clock_gettime(CLOCK_REALTIME, &now);
            std::fprintf(stderr,
                         "saetrain: SAETRAIN_FAULT: rank %d raises signal %d (%s) at %.3f\n", rank,
                         signal, iter == kStartup ? "start-up" : "iteration",
                         static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec));
            std::fflush(stderr);
            std::raise(signal);
            return;
        }
        throw Error(iter == kStartup
                        ? std::string("injected fault during start-up (SAETRAIN_FAULT)")
                        : fmt::format("injected fault at iteration {} (SAETRAIN_FAULT)", iter));
    }
};
Fault fault_from_env() {
    Fault f;
    const char* v = std::getenv("SAETRAIN_FAULT");
    if (!v) return f;
    char when[16] = "", action[16] = "error", phase[16] = "step";
    const int got = std::sscanf(v, "%d:%15[^:]:%15[^:]:%15s", &f.rank, when, action, phase);
    const std::map<std::string, int> signals = {
        {"error", 0}, {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"KILL", SIGKILL}, {"STOP", SIGSTOP}};
    const auto it = signals.find(action);
    char* end = nullptr;
    f.iteration = std::string(when) == "startup" ? Fault::kStartup : std::strtoll(when, &end, 10);
    SAE_ENFORCE(got >= 2 && it != signals.end() && (end == nullptr || (*end == 0 && end != when)) &&
                    (std::string(phase) == "step" || std::string(phase) == "checkpoint"),
                "SAETRAIN_FAULT='{}': expected rank:iteration|startup[:error|TERM|USR1|KILL|STOP[:"
                "step|checkpoint]]",
                v);
    f.signal = it->second;
    f.at_checkpoint = std::string(phase) == "checkpoint";
    return f;
}

// What a killed run can leave behind in out_dir, never read and never removed otherwise:
// temp files of atomic writes (sae/<id>/*.h5.tmp.<pid>, checkpoints/*.commit.tmp), named by pid
// so that every SIGKILL during a write would leave one more; and checkpoint pairs with no commit
// marker (written but not committed, or rotated out while their deletion was deferred, see
// Checkpointer::commit). Only rank 0 calls this, holding out_dir's lock, before the barrier that
// lets anyone write.
void remove_stale_files(const fs::path& out) {
    std::error_code ec;
    const std::vector<int64_t> committed = Checkpointer::committed_steps(out.string());
    auto sweep = [&](const fs::path& dir, bool checkpoints) {
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            const std::string name = e.path().filename().string();
            const size_t at = name.rfind(".tmp");
            const bool temp = at != std::string::npos && at > 0 &&
                              name.find_first_not_of("0123456789", std::min(name.size(), at + 5)) ==
                                  std::string::npos &&
                              (at + 4 == name.size() || name[at + 4] == '.');
            long long step = -1;
            char rest[16] = "";
            const bool pair = checkpoints && !temp &&
                              std::sscanf(name.c_str(), "checkpoint-%lld%15s", &step, rest) == 2 &&
                              (std::string(rest) == ".h5" || std::string(rest) == ".state.h5");
            if (temp ||
                (pair && std::find(committed.begin(), committed.end(), step) == committed.end()))
                fs::remove(e.path(), ec);
        }
    };
    sweep(out / "checkpoints", false);
    for (const auto& e : fs::directory_iterator(out / "sae", ec))
        if (e.is_directory(ec)) sweep(e.path(), true);
}

// On resume, metrics logged after the checkpoint will be logged again: drop them.
void drop_metrics_after(const fs::path& path, int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    std::vector<std::string> keep;
    for (std::string line; std::getline(in, line);) {
        const size_t p = line.find("\"step\":");
        if (p == std::string::npos || std::stoll(line.substr(p + 7)) <= step) keep.push_back(line);
    }
    in.close();
    std::ofstream out(path, std::ios::trunc);
    for (const std::string& l : keep) out << l << "\n";
}

// Everything a rank sets up before the first collective. Any failure here is agreed on by all
// ranks (see agree_on_startup) so that the job ends with one message, not a hang.
// An advisory lock on out_dir (flock on out_dir/.saetrain.lock), held by rank 0 for the whole
// run: a second run on the same out_dir refuses to start, and a run that was killed leaves no
// lock behind (the kernel drops it with the process), only the file, which blocks nothing.
class OutDirLock {
public:
    explicit OutDirLock(const fs::path& out) {
        std::error_code ec;
        fs::create_directories(out, ec);
        SAE_ENFORCE(!ec,
                    "run.out_dir {}: cannot create it ({}); choose a directory this job can "
                    "write",
                    out.string(), ec.message());
        const fs::path path = out / ".saetrain.lock";
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        SAE_ENFORCE(fd_ >= 0,
                    "run.out_dir {}: cannot create the lock file {} ({}); choose a directory "
                    "this job can write",
                    out.string(), path.string(), std::strerror(errno));
        if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            std::string holder(256, '\0');
            const ssize_t got = ::pread(fd_, holder.data(), holder.size() - 1, 0);
            holder.resize(got > 0 ? static_cast<size_t>(got) : 0);
            while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0'))
                holder.pop_back();
            ::close(fd_);
            fd_ = -1;
            SAE_ENFORCE(err != EWOULDBLOCK,
                        "{} is in use by another saetrain run ({}); wait for it to end or choose "
                        "another run.out_dir",
                        out.string(), holder.empty() ? "its lock file is empty" : holder);
            throw Error(fmt::format("cannot lock {}: {}", path.string(), std::strerror(err)));
        }
        char host[256] = {};
        ::gethostname(host, sizeof(host) - 1);
        const std::string me = fmt::format("pid {} on {}\n", ::getpid(), host);
        if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
            // The lock holds without the note; only the message of a refused run is poorer.
        }
    }
    ~OutDirLock() {
        if (fd_ >= 0) ::close(fd_);  // releases the lock
    }
    OutDirLock(const OutDirLock&) = delete;
    OutDirLock& operator=(const OutDirLock&) = delete;

private:
    int fd_ = -1;
};

struct Setup {
    std::unique_ptr<OutDirLock> lock;  // rank 0: held until the process ends
    Config cfg;
    RankLayout layout;
    DatasetInfo data;
    std::vector<std::string> ids;
    std::unique_ptr<Backend> backend;
    std::string backend_note;
    std::unique_ptr<ShardBatchSource> local;  // this rank's slice
    // Held-out rows: this replica's share of them, [eval_local_rows, d_model] (see
    // load_eval_rows); eval_rows is the whole set's size (0: no evaluation).
    std::vector<float> eval_x;
    int64_t eval_local_rows = 0, eval_rows = 0;
    std::string eval_source;
    int threads = 1;
    bool resume = false;    // out_dir has committed checkpoints
    bool complete = false;  // out_dir holds a finished run
};

// The held-out rows (data.eval_path, or the last data.eval_rows rows of data.path, which
// are then not trained on): replica q of R holds its contiguous share of them in memory.
void load_eval_rows(Setup& s, const DatasetInfo* eval_data) {
    const DataConfig& dc = s.cfg.data;
    const DatasetInfo& src = eval_data ? *eval_data : s.data;
    RowRange all;
    if (eval_data) {
        all = {0, dc.eval_rows > 0 ? std::min(dc.eval_rows, src.total_rows) : src.total_rows};
    } else {
        if (dc.eval_rows == 0) return;
        all = {src.total_rows - dc.eval_rows, src.total_rows};
    }
    s.eval_rows = all.size();
    s.eval_source = eval_data ? src.source : fmt::format("the last rows of {}", src.source);
    const RowRange part = partition_rows(all.size(), s.layout.replica, s.layout.replicas);
    const RowRange mine{all.begin + part.begin, all.begin + part.end};
    s.eval_local_rows = mine.size();
    s.eval_x = read_rows(src, mine);
}

// `data` (and `eval_data`, the held-out shards when data.eval_path is set): the datasets as
// rank 0 validated them.
Setup set_up(const Args& args, Config cfg, DatasetInfo data, const DatasetInfo* eval_data, int rank,
             int world, const NodePlacement& place) {
    Setup s;
    s.cfg = std::move(cfg);
    s.layout = layout_for(s.cfg, world, rank);
    s.data = std::move(data);
    config_validate_for_data(s.cfg, s.data.d_model);
    s.ids = sweep_ids(s.cfg, s.data.d_model);
    const fs::path out = s.cfg.run.out_dir;
    if (rank == 0) s.lock = std::make_unique<OutDirLock>(out);
    s.resume = !args.overwrite && !Checkpointer::committed_steps(out.string()).empty();
    s.complete = !args.overwrite && fs::exists(out / "COMPLETE");
    if (rank == 0 && !s.resume && !s.complete && !args.overwrite &&
        fs::exists(out / "metrics.jsonl")) {
        // A run that died before its first checkpoint restarts, if it is this same run (its
        // config.yaml agrees on every key that changes the result); anything else is kept.
        std::ifstream in(out / "config.yaml");
        const std::string old((std::istreambuf_iterator<char>(in)), {});
        const std::vector<std::string> diff =
            old.empty() ? std::vector<std::string>{"no config.yaml"}
                        : config_result_differences(old, config_to_yaml(s.cfg));
        std::string keys;
        for (const std::string& d : diff) keys += (keys.empty() ? "" : "; ") + d;
        SAE_ENFORCE(diff.empty(),
                    "{} already holds another run with no committed checkpoint ({}); choose "
                    "another run.out_dir or pass --overwrite to replace it",
                    out.string(), keys);
    }

    // Each rank reads its own disjoint, contiguous slice of the global row space, less the
    // held-out rows at its end when they come from the same data.
    const DataConfig& dc = s.cfg.data;
    int64_t train_rows = s.data.total_rows;
    if (dc.eval_path.empty() && dc.eval_rows > 0) {
        SAE_ENFORCE(dc.eval_rows + world <= s.data.total_rows,
                    "data.eval_rows = {} leaves too few of the {} rows of {} to train {} rank(s) "
                    "on; hold out fewer rows or give data.eval_path",
                    dc.eval_rows, s.data.total_rows, s.data.source, world);
        train_rows -= dc.eval_rows;
    }
    load_eval_rows(s, eval_data);
    const RowRange range = partition_rows(train_rows, rank, world);
    LoaderOptions lo;
    lo.epochs = s.cfg.data.epochs;
    lo.shuffle_rows = s.cfg.data.shuffle_buffer_rows;
    lo.seed = s.cfg.run.seed * 1000003u + static_cast<uint64_t>(rank);
    lo.read_bytes = s.cfg.data.read_bytes;
    lo.ring_bytes = s.cfg.data.prefetch_bytes;
    lo.stage_dir = s.cfg.data.stage_dir;
    lo.progress = rank == 0;
    if (s.cfg.data.max_tokens > 0) {
        // max_tokens counts one SAE's tokens: split over the ranks that feed that SAE.
        lo.max_rows =
            s.layout.shared
                ? partition_rows(s.cfg.data.max_tokens, rank, world).size()
                : partition_rows(s.cfg.data.max_tokens, s.layout.replica, s.layout.replicas).size();
    }
    s.threads = args.threads > 0 ? args.threads : cpu_threads_for_rank(place.local_size);
    lo.copy_threads = s.threads;
    BackendRequest request;
    request.choice = s.cfg.backend;
    request.threads = s.threads;
    request.local_rank = place.local_rank;
    request.gemm = s.cfg.gpu.gemm;
    request.deterministic = s.cfg.gpu.deterministic;
    s.backend = make_backend(request, &s.backend_note);
    const SaeConfig& sae = s.cfg.sweep[static_cast<size_t>(s.layout.config)];
    arch_check_backend(sae, s.data.d_model, sae.resolved_latents(s.data.d_model), *s.backend);
    // Batches upload from the backend's host memory (pinned for a GPU: a DMA).
    lo.allocator = s.backend->host_allocator();
    // With the math on a device, the reader's conversion may use the rank's cores.
    if (!s.backend->host_memory()) lo.convert_threads = s.threads;
    s.local = std::make_unique<ShardBatchSource>(s.data, range, lo);
    return s;
}

// Every rank reports whether its set-up worked; if any failed, the lowest failing rank prints
// its message (once for the job) and every rank returns false.
bool agree_on_startup(Communicator& world, const std::string& error) {
    int64_t failed = error.empty() ? 0 : world.size() - world.rank();  // max -> lowest rank
    world.allreduce_max(&failed, 1);
    if (failed == 0) return true;
    if (world.size() - world.rank() == failed) {
        if (world.size() > 1)
            std::fprintf(stderr, "saetrain: error: rank %d: %s\n", world.rank(), error.c_str());
        else
            std::fprintf(stderr, "saetrain: error: %s\n", error.c_str());
    }
    return false;
}

// One line per node: ranks, cores, threads.
void print_placement(Communicator& world, const NodePlacement& place, int threads) {
    struct Rec {
        char host[64];
        int32_t local_rank, local_size, threads;
    } mine{};
    std::snprintf(mine.host, sizeof(mine.host), "%s", place.host.c_str());
    mine.local_rank = place.local_rank, mine.local_size = place.local_size, mine.threads = threads;
    std::vector<Rec> all(static_cast<size_t>(world.size()));
    world.allgather(&mine, all.data(), sizeof(Rec));
    if (world.rank() != 0) return;
    for (const Rec& r : all)
        if (r.local_rank == 0)
            fmt::print("node {}: {} rank(s), {} CPU thread(s) each\n", r.host, r.local_size,
                       r.threads);
}

int run(const Args& args, Communicator& world) {
    const bool root = world.rank() == 0;
    const NodePlacement place = node_placement();

    // --- set up, agreeing on failures -------------------------------------------------------
    // Every rank reads the config; rank 0 alone lists and validates the shards and broadcasts
    // what it found (one metadata pass over a parallel file system per job, not one per rank);
    // then every rank sets up locally (its loader opens only the shards of its own slice).
    std::optional<Config> config;
    std::string error, packed, packed_eval;
    try {
        config = config_load(args.config, args.sets);
        if (root) {
            const DatasetInfo data = dataset_open(config->data.path, config->data.dataset);
            packed = dataset_info_pack(data);
            if (!config->data.eval_path.empty()) {
                const DatasetInfo ev = dataset_open(config->data.eval_path, config->data.dataset);
                SAE_ENFORCE(ev.d_model == data.d_model,
                            "data.eval_path {}: d_model {} differs from the training data's {} "
                            "({}); held-out rows must come from the same hook",
                            ev.source, ev.d_model, data.d_model, data.source);
                packed_eval = dataset_info_pack(ev);
            }
        }
    } catch (const std::exception& e) {
        error = e.what();
    }
    Fault fault;
    try {
        fault = fault_from_env();
        if (fault.fires(world.rank(), Fault::kStartup, false)) fault.fire(Fault::kStartup);
    } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
    }
    // Bound every collective from the first one on (the start-up agreement included).
    set_collective_timeout(config ? config->parallel.timeout_s : ParallelConfig{}.timeout_s);
    if (!agree_on_startup(world, error)) return 1;
    for (std::string* p : {&packed, &packed_eval}) {
        int64_t size = static_cast<int64_t>(p->size());
        world.bcast(&size, sizeof(size), 0);
        p->resize(static_cast<size_t>(size));
        world.bcast(p->data(), size, 0);
    }
    std::optional<Setup> setup;
    try {
        std::optional<DatasetInfo> eval_data;
        if (!packed_eval.empty()) eval_data = dataset_info_unpack(packed_eval);
        setup.emplace(set_up(args, std::move(*config), dataset_info_unpack(packed),
                             eval_data ? &*eval_data : nullptr, world.rank(), world.size(), place));
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (!agree_on_startup(world, error)) return 1;
    Setup& s = *setup;
    const Config& cfg = s.cfg;
    if (s.complete) {
        if (root)
            fmt::print(
                "{} holds a finished run (COMPLETE); nothing to do. Pass --overwrite to "
                "train it again.\n",
                cfg.run.out_dir);
        return 0;
    }
    const SaeConfig& sae = cfg.sweep[static_cast<size_t>(s.layout.config)];
    const std::string& id = s.ids[static_cast<size_t>(s.layout.config)];
    const fs::path out = cfg.run.out_dir;

    // --- communicators: replicas of one SAE; ranks that share a stream ------------------------
    auto grads =
        s.backend->gradient_comm(world.split(s.layout.config, s.layout.replica), place.local_rank,
                                 place.local_size, cfg.parallel.timeout_s);
    auto stream = world.split(s.layout.replica, s.layout.config);
    std::unique_ptr<SharedBatchSource> shared;
    if (s.layout.shared)
        shared = std::make_unique<SharedBatchSource>(*s.local, *stream, cfg.data.batch_size);
    BatchSource& source = shared ? static_cast<BatchSource&>(*shared) : *s.local;
    // One SAE consumes replicas x batch_size rows a step, from its whole stream.
    double stream_rows = static_cast<double>(s.local->total_rows());
    (s.layout.shared ? world : *grads).allreduce_sum(&stream_rows, 1);
    const int64_t steps =
        total_steps_for(static_cast<int64_t>(stream_rows), cfg.data.batch_size * s.layout.replicas);

    if (root) {
        if (!s.resume)  // a fresh start: only what saetrain writes; anything else stays
            for (const char* f :
                 {"metrics.jsonl", "summary.csv", "COMPLETE", "checkpoints", "sae", "tb", "report"})
                fs::remove_all(out / f);
        fs::create_directories(out);
        remove_stale_files(out);
        std::ofstream(out / "config.yaml") << config_to_yaml(cfg);
        fmt::print("saetrain {} | {} rank(s): {} | backend {}{}\n", SAETRAIN_VERSION, world.size(),
                   s.layout.describe(), s.backend->name(),
                   s.backend_note.empty() ? "" : " | " + s.backend_note);
        fmt::print(
            "data {} | {} shard(s), {} rows, d_model {}, {} | {:.1f} MB\n", s.data.source,
            s.data.shards.size(), s.data.total_rows, s.data.d_model, dtype_name(s.data.dtype),
            static_cast<double>(s.data.total_rows * s.data.d_model * dtype_size(s.data.dtype)) /
                1e6);
        fmt::print("{} step(s) of {} rows per SAE replica\n", steps, cfg.data.batch_size);
        // Settings that the run's length makes meaningless: say so before training.
        const int64_t run_tokens = steps * cfg.data.batch_size * s.layout.replicas;
        for (size_t i = 0; i < cfg.sweep.size(); ++i) {
            const SaeConfig& c = cfg.sweep[i];
            const int64_t warmup = warmup_steps_for(c, steps);
            if (warmup * 10 > steps)
                fmt::print(stderr,
                           "saetrain: warning: {}: train.warmup_steps = {} is {:.0f}% of the "
                           "run's {} steps; the LR spends that long below train.lr\n",
                           s.ids[i], warmup, 100.0 * double(warmup) / double(steps), steps);
            if (c.dead_tokens * 2 > run_tokens)
                fmt::print(stderr,
                           "saetrain: warning: {}: train.dead_tokens = {} is more than half of the "
                           "run's {} tokens per SAE, so few latents can ever count as dead; lower "
                           "it{}\n",
                           s.ids[i], c.dead_tokens, run_tokens,
                           s.eval_rows > 0 ? " (the held-out dead % does not depend on it)"
                                           : " or hold rows out (data.eval_rows) for a dead % "
                                             "over them");
        }
        if (s.eval_rows > 0)
            fmt::print(
                "held-out: {} rows from {}, never trained on ({:.1f} MB in memory, split among "
                "an SAE's replicas)\n",
                s.eval_rows, s.eval_source,
                static_cast<double>(s.eval_rows * s.data.d_model * 4) / 1e6);
    }
    print_placement(world, place, s.threads);
    world.barrier();  // out_dir exists before anyone writes into it

    // --- model, resume ------------------------------------------------------------------------
    SaeTrainer trainer(sae, s.data.d_model, steps, cfg.run.seed, *s.backend, *grads);
    const fs::path sae_dir = out / "sae" / id;
    const bool writer = s.layout.replica == 0;  // replicas are identical: one writes
    auto meta_now = [&](const SaeTrainer& t) {
        return SaeMeta{sae.arch, id, config_to_yaml(cfg), sae.k, t.step_count(), t.tokens()};
    };
    Checkpointer checkpoints(world, *grads, out.string(), sae_dir.string(), meta_now(trainer),
                             cfg.checkpoint.keep);
    LoopOptions opt;
    opt.threads = s.threads;
    int64_t resumed_step = -1;  // metrics.jsonl and tb/ keep what was logged up to it
    if (s.resume) {
        const auto at = checkpoints.resume(trainer, config_to_yaml(cfg), args.allow_config_change);
        SAE_ENFORCE(at.has_value(),
                    "{}: no committed checkpoint could be loaded (see the warnings above); pass "
                    "--overwrite to start over",
                    out.string());
        s.local->restore(ReaderCursor{at->epoch, at->offset});
        opt.start_iteration = at->iteration;
        opt.initialized = true;
        resumed_step = at->step;
        if (root) {
            drop_metrics_after(out / "metrics.jsonl", at->step);
            fmt::print("resumed from the checkpoint at step {} ({} iterations done)\n", at->step,
                       at->iteration);
        }
    }

    // --- train ---------------------------------------------------------------------------------
    // MFU: against log.peak_tflops, or the table's peak for this rank's GPU and GEMM precision.
    const MfuPeak peak = mfu_peak(cfg.log.peak_tflops, s.backend->device_name(),
                                  math_mode_parse(s.backend->gemm_precision()));
    if (root)
        fmt::print("{}\n",
                   peak.flops > 0
                       ? fmt::format("MFU against {:.4g} TFLOP/s per device ({})",
                                     peak.flops / 1e12, peak.source)
                       : fmt::format("TFLOP/s counted as model FLOPs; no MFU: {}", peak.source));
    RunReporter reporter(world, s.layout, s.ids, (out / "metrics.jsonl").string(), peak.flops,
                         (out / "tb").string(), resumed_step);
    opt.world = &world;
    opt.batch_allocator = s.backend->host_allocator();
    opt.batch_size = cfg.data.batch_size;
    opt.log_every = cfg.log.every_steps;
    opt.checkpoint_every = cfg.checkpoint.every_steps;
    opt.sae_id = id;
    opt.report = [&](const MetricsRow& m) { reporter.gather(m); };
    if (fault.at_checkpoint && fault.rank == world.rank() && writer) {
        SAE_ENFORCE(fault.signal == SIGKILL, "SAETRAIN_FAULT: only KILL lands mid-write");
        // Before any writer thread exists: the atomic writer reads it on the write it names.
        ::setenv("SAETRAIN_FAULT_KILL_IN_WRITE",
                 (sae_dir / fmt::format("checkpoint-{}.h5", fault.iteration)).c_str(), 1);
    }
    opt.checkpoint = [&](SaeTrainer& t, int64_t iteration) {
        if (!writer && fault.fires(world.rank(), iteration, true)) fault.fire(iteration);
        const ReaderCursor c = s.local->cursor();
        checkpoints.save(t, iteration, c.epoch, c.offset, /*wait=*/false);
    };
    opt.stop_requested = [] { return g_stop_signal.load() != 0; };
    opt.stop_on_nonfinite = cfg.data.nonfinite == "stop";
    if (s.eval_rows > 0) {
        opt.evaluate = [&](SaeTrainer& t) {
            return t.evaluate(s.eval_x.data(), s.eval_local_rows, cfg.data.batch_size);
        };
        opt.eval_every = cfg.log.eval_every_steps;
    }
    opt.on_iteration = [&](int64_t iter) {
        if (fault.fires(world.rank(), iter, false)) fault.fire(iter);
    };
    const LoopResult res = train_loop(trainer, source, opt);
    if (root && res.seconds > 0)
        fmt::print(
            "rank 0 time: {:.2f} s | batches {:.2f} s (waiting for the reader {:.2f} s) | "
            "NaN/Inf check {:.2f} s | steps {:.2f} s | other {:.2f} s | writing metrics.jsonl "
            "and tb/ {:.4f} s ({:.3f}% of the steps)\n",
            res.seconds, res.data_s, res.wait_fraction * res.seconds, res.check_s, res.step_s,
            res.seconds - res.data_s - res.check_s - res.step_s, reporter.log_write_seconds(),
            res.step_s > 0 ? 100.0 * reporter.log_write_seconds() / res.step_s : 0.0);
    if (res.nonfinite_batches > 0 || res.skipped_steps > 0)
        fmt::print(stderr,
                   "saetrain: warning: rank {}: skipped {} batch(es) holding NaN/Inf "
                   "(data.nonfinite: skip) and {} step(s) with a non-finite loss or gradient\n",
                   world.rank(), res.nonfinite_batches, res.skipped_steps);
    // The last checkpoint: committed before anything else is written.
    const ReaderCursor end_cursor = s.local->cursor();
    checkpoints.save(trainer, res.iterations, end_cursor.epoch, end_cursor.offset, /*wait=*/true);
    if (res.stopped) {
        if (root)
            fmt::print(stderr,
                       "saetrain: stopped by a signal after {} steps; checkpoint committed in {}. "
                       "Run the same command to continue (exit code {}).\n",
                       trainer.step_count(), (out / "checkpoints").string(), kExitStopped);
        return kExitStopped;
    }

    // --- write and report ----------------------------------------------------------------------
    SaeSummary mine;
    mine.config = s.layout.config;
    mine.last = res.last;
    mine.steps = res.steps, mine.tokens = res.tokens;
    mine.tokens_per_s = res.tokens_per_s, mine.wait_fraction = res.wait_fraction;
    mine.tflops = res.tflops;
    // The quality gates: on the held-out rows when there are any, else the end of training.
    mine.gates = res.eval.rows > 0 ? res.eval.quality : trainer.training_quality();
    mine.arch_figures = trainer.arch_summary();
    if (res.last.sae.empty()) {
        // Resumed with nothing left to train (stopped between the final checkpoint and
        // COMPLETE): report the SAE as the log last saw it, with that interval's rates, rather
        // than an empty interval of zeros.
        if (auto logged = metrics_last_row((out / "metrics.jsonl").string(), id)) {
            mine.last = *logged;
            mine.tokens_per_s = logged->tokens_per_s, mine.wait_fraction = logged->wait_fraction;
            mine.tflops = logged->tflops;
        }
        if (res.eval.rows > 0) attach_eval(mine.last, res.eval);
    }
    if (writer) {
        // On the raw activations: data.normalize's scale folded into the weights.
        const SaeWeights w = fold_activation_scale(trainer.weights());
        sae_write_h5((sae_dir / "final.h5").string(), w, meta_now(trainer));
        if (mine.gates.measured)
            density_histogram_write((sae_dir / "feature_density.csv").string(), mine.gates.density);
        const fs::path truth = fs::path(cfg.data.path) / "ground_truth.h5";
        if (fs::is_regular_file(truth)) {
            int64_t m = 0, dt = 0;
            const std::vector<float> f = synth_read_features(truth.string(), &m, &dt);
            if (dt == w.d_model)
                mine.feature_recovery =
                    feature_recovery(f.data(), m, w.w_dec.data(), w.n_latents, dt);
        }
    }
    // summary.csv: arch, n_latents, the keys any architecture reads (blank in the rows of
    // architectures that do not read them: the same columns in every run), lr.
    std::vector<std::string> keys;
    for (const Architecture* a : architectures())
        for (const std::string& k : a->keys())
            if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    std::vector<std::string> names = {"arch", "n_latents"};
    for (const std::string& k : keys) names.push_back(k.substr(k.find('.') + 1));
    names.emplace_back("lr");
    std::vector<std::map<std::string, std::string>> columns;
    for (const SaeConfig& c : cfg.sweep) {
        std::map<std::string, std::string> row = {
            {"arch", c.arch},
            {"n_latents", std::to_string(c.resolved_latents(s.data.d_model))},
            {"lr", fmt::format("{:g}", c.lr)}};
        for (const std::string& k : arch_get(c.arch).keys())
            row[k.substr(k.find('.') + 1)] = sae_key_text(cfg, c, k);
        columns.push_back(std::move(row));
    }
    reporter.finish(mine, (out / "summary.csv").string(), names, columns);
    world.barrier();
    if (root) {
        std::ofstream(out / "COMPLETE") << trainer.step_count() << "\n";
        fmt::print("wrote {}/summary.csv and sae/<id>/final.h5\n", out.string());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    Args args;
    CLI::App app{"saetrain: train sparse autoencoders on cached activations"};
    app.add_option("config", args.config, "YAML config file")->required();
    app.add_option("--set", args.sets, "override a config key: section.key=value (repeatable)");
    app.add_flag("--overwrite", args.overwrite,
                 "start over: replace the run in run.out_dir instead of resuming it");
    app.add_flag("--allow-config-change", args.allow_config_change,
                 "resume even though the config changed in keys that change the result");
    app.add_option("--threads", args.threads,
                   "CPU threads per rank (default: the rank's cores / ranks on its node)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    // From here on a stop signal is a request: honoured at the first iteration if it arrives
    // during start-up (the default action would kill the rank and leave its peers waiting).
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
    auto world = make_mpi_world();
    try {
        return run(args, *world);
    } catch (const std::exception& e) {
        // A failure after start-up: the other ranks may be waiting in a collective, so this
        // rank's message is the one printed and the whole job is aborted.
        if (world->size() > 1) {
            std::fprintf(stderr, "saetrain: error: rank %d: %s; stopping all %d ranks\n",
                         world->rank(), e.what(), world->size());
            std::fflush(stderr);
            world_abort(1);
        }
        std::fprintf(stderr, "saetrain: error: %s\n", e.what());
        return 1;
    }
}
