// saetrain — train sparse autoencoders on cached activations.
//
//   saetrain CONFIG.yaml [--set key=value ...]      (mpirun/srun: one rank per device)
//   saetrain --list-keys                           (every config key, its default and doc)
//
// Reads top-down (run() is the table of contents): start up, agreeing on failures (config,
// data, the rank grid, backend, the rows this rank reads); connect (the grid's communicators
// and the stream of batches); open run.out_dir; resume or start fresh; train; write the outputs
// and report.
// Only rank 0 writes the run's files and the console. docs/architecture.md follows a batch
// through the layers below.
#include <fmt/format.h>
#include <sched.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "app_cli.h"                    // defines: cli_parse (--version, usage errors: exit 2)
#include "saetrain/arch.h"              // defines: arch_get (the architecture registry)
#include "saetrain/backend_registry.h"  // defines: make_backend (cpu, cuda, auto)
#include "saetrain/build_config.h"      // defines: SAETRAIN_VERSION
#include "saetrain/checkpoint.h"        // defines: sae_write_h5
#include "saetrain/checkpointer.h"      // defines: Checkpointer (committed checkpoints, resume)
#include "saetrain/comm_choice.h"       // defines: comm_job_warnings (GPUs that ranks share)
#include "saetrain/config.h"            // defines: config_load, config_to_yaml, config_keys
#include "saetrain/data_split.h"        // defines: data_split_for (a rank's slice, seed, held-out)
#include "saetrain/error.h"             // defines: saetrain::Error, SAE_ENFORCE
#include "saetrain/fault.h"             // defines: Fault, fault_from_env (SAETRAIN_FAULT)
#include "saetrain/host_alloc.h"        // defines: machine_memory_bytes
#include "saetrain/loader.h"            // defines: ShardBatchSource (a rank's slice, shuffled)
#include "saetrain/metrics.h"           // defines: metrics_last_row
#include "saetrain/mpi_world.h"         // defines: MpiScope, make_mpi_world, node_placement
#include "saetrain/perfmodel.h"         // defines: mfu_peak (the peak MFU is measured against)
#include "saetrain/rank_grid.h"         // defines: RankGrid (coordinates, every communicator)
#include "saetrain/report.h"            // defines: RunReporter (rank 0 gathers metrics)
#include "saetrain/run_dir.h"           // defines: OutDirLock, remove_stale_files, RunStateFile
#include "saetrain/s3.h"                // defines: s3_settings_from (s3:// data.path)
#include "saetrain/schedule.h"          // defines: warmup_steps_for
#include "saetrain/shards.h"            // defines: dataset_open, dataset_info_pack, read_rows
#include "saetrain/shared_source.h"     // defines: SharedBatchSource, BroadcastBatchSource
#include "saetrain/synth.h"             // defines: synth_read_features, feature_recovery
#include "saetrain/train_loop.h"        // defines: train_loop, SaeTrainer
#include "saetrain/train_state.h"       // defines: write_gathered (latent-sharded SAE files)
#include "saetrain/trainer_io.h"        // defines: trainer_weights (the SAE in the file layout)
#include "stop_signals.h"               // defines: stop_signals_install (SIGTERM, SIGUSR1, Ctrl-C)

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct Args {
    std::string config;
    std::vector<std::string> sets;
    bool overwrite = false;
    bool allow_config_change = false;
    int threads = 0;
    bool dry_run = false;
    int ranks = 0;  // --dry-run's job size (0: the one the config asks for)
};

// Exit codes (docs/commands.md, "Signals and exit codes"): 0 done, 1 error, 2 usage error, 75
// stopped by SIGTERM, SIGUSR1 or Ctrl-C after committing a checkpoint (EX_TEMPFAIL: run the same
// command again, or let Slurm's --requeue do it); a second Ctrl-C ends the process by SIGINT (130).
constexpr int kExitStopped = 75;

// OpenMP's idle threads (saetrain's loops and OpenBLAS's, which is built on the same libgomp)
// spin for about 300,000 iterations before they sleep, the library's default. Alone on its cores
// that saves a wake-up; sharing them (another job, more ranks than cores, hyperthreads) the
// spinning threads take the time slices the working ones need, and a run beside one busy job
// took 19.6x its time alone. So saetrain waits briefly (GOMP_SPINCOUNT=kSpinCount, about a
// microsecond or two) and then sleeps, unless the user chose a policy (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT). libgomp reads them when it loads, before main: the process sets the variable
// and executes itself again, once, before MPI starts (the same pid, so launchers see no change).
constexpr const char* kSpinCount = "1000";

void exec_with_short_spins(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr)
        return;
    ::setenv("GOMP_SPINCOUNT", kSpinCount, 1);
    ::setenv("SAETRAIN_SPIN_SET", "1", 1);  // the start-up line says it was saetrain's choice
    ::execv("/proc/self/exe", argv);
    // Not possible here (no /proc): go on with the library's default.
    ::unsetenv("GOMP_SPINCOUNT");
    ::unsetenv("SAETRAIN_SPIN_SET");
}

// The ranks of this node, as the launcher says before MPI starts (0: not said).
int launcher_local_ranks() {
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
        if (const char* s = std::getenv(v); s != nullptr && std::atoi(s) > 0) return std::atoi(s);
    // Slurm's "2(x3),1": the first node's count is enough to tell a crowded node.
    if (const char* s = std::getenv("SLURM_STEP_TASKS_PER_NODE"); s != nullptr && std::atoi(s) > 0)
        return std::atoi(s);
    return 0;
}

// MPI's waits poll without pause: with more ranks than the node has cores, each waiting rank
// spends the time slices its peers need (4 ranks on 2 cores made 0.1% of 2 ranks' tokens/s).
// Open MPI yields the core between polls when mpi_yield_when_idle is set, which mpirun does
// only when told of oversubscription; srun never does. Set here, before MPI starts, when the
// node's ranks outnumber its cores (unless the user set it). Returns whether it was set.
bool yield_mpi_waits_when_crowded(int threads_asked) {
    if (std::getenv("OMPI_MCA_mpi_yield_when_idle") != nullptr) return false;
    const int ranks = launcher_local_ranks();
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (ranks <= 1 || cores <= 0) return false;
    const long threads = threads_asked > 0 ? threads_asked : 1;
    if (static_cast<long>(ranks) * threads <= cores) return false;
    ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
    return true;
}

// How this process's OpenMP threads wait, for the start-up line.
std::string wait_policy_text() {
    if (const char* p = std::getenv("OMP_WAIT_POLICY")) return fmt::format("OMP_WAIT_POLICY={}", p);
    if (const char* n = std::getenv("GOMP_SPINCOUNT"))
        return fmt::format("idle threads spin {} times, then sleep (GOMP_SPINCOUNT{})", n,
                           std::getenv("SAETRAIN_SPIN_SET") ? ", saetrain's default" : "");
    return "idle threads spin (libgomp's default)";
}

// How MPI's waits poll, for the start-up line ("" when MPI's default).
std::string mpi_wait_text() {
    const char* y = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    if (y == nullptr || std::string(y) == "0") return "";
    return fmt::format("; MPI waits yield the core (mpi_yield_when_idle{})",
                       std::getenv("SAETRAIN_YIELD_SET") ? ", set as ranks outnumber cores" : "");
}

// Cores this process may run on, shared fairly among the ranks of its node.
int cpu_threads_for_rank(int local_size) {
    cpu_set_t set;
    int cores = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    return std::max(1, cores / std::max(1, local_size));
}

struct Setup {
    std::unique_ptr<OutDirLock> lock;  // rank 0: held until the process ends
    Config cfg;
    RankGrid grid;      // the job's configs x replicas x latent shards
    RankCoords coords;  // this rank's place in it
    DatasetInfo data;   // data.path (a CLT's: its first layer's)
    // Transcoders: data.target_path, read row for row beside `data` (else empty: no shards).
    DatasetInfo target;
    // A CLT's other layers' inputs and targets (data.path[1:] and data.target_path[1:]; empty
    // otherwise), read row for row beside `data` and `target`.
    std::vector<DatasetInfo> more_inputs, more_targets;
    DataSplit split;  // the rows this rank reads and holds out
    std::vector<std::string> ids;
    std::unique_ptr<Backend> backend;
    std::string backend_note;
    std::unique_ptr<ShardBatchSource> local;  // this rank's slice (null: a latent shard > 0)
    // Held-out rows: this replica's share of them, [split.eval_mine.size(), d_model], on its
    // first latent shard (empty elsewhere).
    std::vector<float> eval_x;
    // The datasets a row is read from: data, and the target for a transcoder; a CLT's rows are
    // every layer's input, then every layer's target.
    std::vector<DatasetInfo> parts() const {
        if (target.shards.empty()) return {data};
        std::vector<DatasetInfo> p = {data};
        p.insert(p.end(), more_inputs.begin(), more_inputs.end());
        p.push_back(target);
        p.insert(p.end(), more_targets.begin(), more_targets.end());
        return p;
    }
    // The SAEs' d_model: the input's width (a CLT's: its layers' widths summed).
    int64_t model_d() const {
        return data.d_model * (1 + static_cast<int64_t>(more_inputs.size()));
    }
    // Values in one row as read: the parts' widths summed.
    int64_t row_width() const {
        int64_t w = 0;
        for (const DatasetInfo& p : parts()) w += p.d_model;
        return w;
    }
    int64_t eval_rows() const { return split.eval_all.size(); }  // 0: no evaluation
    int threads = 1;
    bool resume = false;    // out_dir has committed checkpoints
    bool complete = false;  // out_dir holds a finished run
    const SaeConfig& sae() const { return cfg.sweep[static_cast<size_t>(coords.config)]; }
    const std::string& id() const { return ids[static_cast<size_t>(coords.config)]; }
    fs::path out() const { return cfg.run.out_dir; }
    // Where this rank's reader is (nowhere on a latent shard that receives its batches).
    ReaderCursor cursor() const { return local ? local->cursor() : ReaderCursor{}; }
};

// This replica's share of the held-out rows (data_split.h), read by its first latent shard:
// `eval_parts` (data.eval_path and a transcoder's data.eval_target_path), or the last rows of
// the training parts.
void load_eval_rows(Setup& s, const std::vector<DatasetInfo>& eval_parts) {
    const double bytes = static_cast<double>(s.split.eval_mine.size()) *
                         static_cast<double>(s.row_width()) * sizeof(float);
    const double machine = machine_memory_bytes();
    SAE_ENFORCE(!s.split.loads_eval || machine <= 0 || bytes < machine / 2,
                "{}: the held-out rows this rank keeps in memory ({} rows x {} values as float32, "
                "{:.1f} GiB) would take more than half of this machine's {:.1f} GiB; lower "
                "data.eval_rows",
                s.cfg.source, s.split.eval_mine.size(), s.row_width(), bytes / (1 << 30),
                machine / (1 << 30));
    if (s.split.loads_eval)
        s.eval_x = read_rows(eval_parts.empty() ? s.parts() : eval_parts, s.split.eval_mine);
}

// What `--overwrite` would delete in `out`, for the refusals that offer it: "--overwrite would
// delete its N committed checkpoint(s) (the newest at step S), its final weights and its metrics
// to start over".
std::string overwrite_deletes(const fs::path& out) {
    std::vector<std::string> what;
    const std::vector<int64_t> steps = Checkpointer::committed_steps(out.string());  // newest first
    if (!steps.empty())
        what.push_back(fmt::format("its {} committed checkpoint(s) (the newest at step {})",
                                   steps.size(), steps.front()));
    std::error_code ec;
    if (fs::exists(fs::symlink_status(out / "COMPLETE", ec)))
        what.emplace_back("its final weights");
    what.emplace_back("its metrics");
    std::string list;
    for (size_t i = 0; i < what.size(); ++i)
        list += (i == 0 ? "" : i + 1 == what.size() ? " and " : ", ") + what[i];
    return fmt::format("--overwrite would delete {} to start over", list);
}

// The run in `out` was trained with `old_yaml`: the keys that change the result and differ now,
// each with both values ("sae.k: 8 -> 16; train.lr: 0.002 -> 0.001"), or "" when none does.
std::string result_key_changes(const std::string& old_yaml, const Config& now) {
    std::string keys;
    for (const std::string& d : config_result_differences(old_yaml, config_to_yaml(now)))
        keys += (keys.empty() ? "" : "; ") + d;
    return keys;
}

// Whether out_dir holds this run, finished: its COMPLETE marks the run there (run_dir.h), which
// was trained with this config. A finished run of another config is an error naming the keys;
// a COMPLETE that is not the marker of the run there is ignored (rank 0 warns), and the run goes
// on as an unfinished one would.
bool holds_finished_run(const Setup& s, int rank) {
    const fs::path out = s.out();
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(out / "COMPLETE", ec))) return false;
    std::string why_not;
    const std::optional<std::string> finished = finished_run_config(out.string(), &why_not);
    if (!finished) {
        if (rank == 0)
            fmt::print(stderr,
                       "saetrain: warning: ignoring {}: {}; the run goes on as unfinished\n",
                       (out / "COMPLETE").string(), why_not);
        return false;
    }
    const std::vector<std::string> diff =
        config_result_differences(*finished, config_to_yaml(s.cfg));
    SAE_ENFORCE(diff.empty(),
                "run.out_dir {} holds a finished run trained with a different config ({}); "
                "restore those values to keep it, or choose another run.out_dir ({})",
                out.string(), fmt::join(diff, "; "), overwrite_deletes(out));
    return true;
}

// What out_dir holds: a run to resume (committed checkpoints), a finished one, or one that died
// before its first checkpoint, which restarts only if it is this same run (its config.yaml
// agrees on every key that changes the result); anything else is kept. Rank 0 takes the lock.
void inspect_out_dir(Setup& s, const Args& args, int rank) {
    const fs::path out = s.out();
    if (rank == 0) {
        check_out_dir_is_ours(out.string());
        s.lock = std::make_unique<OutDirLock>(out.string());
    }
    s.resume = !args.overwrite && !Checkpointer::committed_steps(out.string()).empty();
    s.complete = !args.overwrite && holds_finished_run(s, rank);
    const auto run_config = [&] {
        std::ifstream in(out / "config.yaml");
        return std::string((std::istreambuf_iterator<char>(in)), {});
    };
    // A resume under another config: refused up front naming each key with its two values (a
    // key that names the SAE, such as sae.k, would otherwise find no checkpoint of its id).
    if (s.resume && !s.complete && !args.allow_config_change) {
        const std::string old = run_config();
        const std::string keys = old.empty() ? "" : result_key_changes(old, s.cfg);
        SAE_ENFORCE(keys.empty(),
                    "{} holds a run trained with a different config ({}); restore those values "
                    "and run again to resume it, pass --allow-config-change to resume it under "
                    "the new values, or choose another run.out_dir ({})",
                    out.string(), keys, overwrite_deletes(out));
    }
    if (rank != 0 || s.resume || s.complete || args.overwrite || !fs::exists(out / "metrics.jsonl"))
        return;
    const std::string old = run_config();
    const std::string keys = old.empty() ? "no config.yaml" : result_key_changes(old, s.cfg);
    SAE_ENFORCE(keys.empty(),
                "{} already holds another run with no committed checkpoint ({}); restore those "
                "values or choose another run.out_dir ({})",
                out.string(), keys, overwrite_deletes(out));
}

// The backend the config asks for on this rank's device, checked against the SAE it trains.
void choose_backend(Setup& s, const NodePlacement& place) {
    BackendRequest request;
    request.choice = s.cfg.backend;
    request.threads = s.threads;
    request.local_rank = place.local_rank;
    request.gemm = s.cfg.gpu.gemm;
    request.deterministic = s.cfg.gpu.deterministic;
    s.backend = make_backend(request, &s.backend_note);
    arch_check_backend(s.sae(), s.model_d(), s.sae().resolved_latents(s.model_d()), *s.backend);
}

// This rank's reader over its slice of the training rows (data_split.h; nothing on a latent
// shard after its replica's first, which reads for it).
void open_slice(Setup& s) {
    if (!s.split.reads) return;
    const DataConfig& dc = s.cfg.data;
    LoaderOptions lo;
    lo.epochs = dc.epochs;
    lo.shuffle_rows = dc.shuffle_buffer_rows;
    lo.seed = s.split.seed;
    lo.read_bytes = dc.read_bytes;
    lo.ring_bytes = dc.prefetch_bytes;
    lo.stage_dir = dc.stage_dir;
    lo.progress = s.coords.reader() == 0;
    lo.max_rows = s.split.max_rows;
    lo.copy_threads = s.threads;
    // Batches upload from the backend's host memory (pinned for a GPU: a DMA).
    lo.allocator = s.backend->host_allocator();
    // 16-bit rows stay 16-bit up to the upload, which widens them (on the GPU, or on the host
    // for the CPU backend): half the bytes through the ring, the exchanges and PCIe.
    lo.widen = false;
    // With the math on a device, the reader's gathering may use the rank's cores.
    if (!s.backend->host_memory()) lo.convert_threads = s.threads;
    s.local = std::make_unique<ShardBatchSource>(s.parts(), s.split.slice, lo);
}

// Everything a rank sets up before the first collective after the start-up agreement. `found`:
// the datasets as rank 0 validated them (data.path, a transcoder's data.target_path, the
// held-out shards when data.eval_path is set and their targets).
struct Datasets {
    DatasetInfo data, target;
    std::vector<DatasetInfo> more_inputs, more_targets;  // a CLT's layers after the first
    std::vector<DatasetInfo> eval;                       // empty: no data.eval_path
};
Setup set_up(const Args& args, Config cfg, Datasets found, int rank, int world,
             const NodePlacement& place) {
    Setup s;
    s.cfg = std::move(cfg);
    s.grid = RankGrid::from_config(s.cfg, world);
    s.coords = s.grid.at(rank);
    s.data = std::move(found.data);
    s.target = std::move(found.target);
    s.more_inputs = std::move(found.more_inputs);
    s.more_targets = std::move(found.more_targets);
    const DatasetInfo* eval_data = found.eval.empty() ? nullptr : &found.eval.front();
    config_validate_for_data(s.cfg, s.model_d());
    // train.optimizer: auto and train.lr: 0 as trained, so config.yaml and summary.csv say so.
    for (SaeConfig& c : s.cfg.sweep) c = c.with_optimizer_defaults(s.model_d());
    if (!s.cfg.sweep.empty()) s.cfg.sae = s.cfg.sweep.front();
    for (const SaeConfig& c : s.cfg.sweep)
        check_latent_sharding(c, s.model_d(), c.resolved_latents(s.model_d()),
                              s.coords.latent_shards, s.cfg.source + ": ");
    s.ids = sweep_ids(s.cfg, s.model_d());
    inspect_out_dir(s, args, rank);
    s.split = data_split_for(s.cfg, s.coords, s.data, eval_data);
    load_eval_rows(s, found.eval);
    s.threads = args.threads > 0 ? args.threads : cpu_threads_for_rank(place.local_size);
    choose_backend(s, place);
    open_slice(s);
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
            std::fprintf(stderr, "saetrain: error: rank %d: %s\n", world.rank(),
                         printable(error).c_str());
        else
            std::fprintf(stderr, "saetrain: error: %s\n", printable(error).c_str());
    }
    return false;
}

// One line per node: ranks, cores, threads. Returns the number of nodes (on rank 0).
int print_placement(Communicator& world, const NodePlacement& place, int threads) {
    struct Rec {
        char host[64];
        int32_t local_rank, local_size, threads;
    } mine{};
    std::snprintf(mine.host, sizeof(mine.host), "%s", place.host.c_str());
    mine.local_rank = place.local_rank, mine.local_size = place.local_size, mine.threads = threads;
    std::vector<Rec> all(static_cast<size_t>(world.size()));
    world.allgather(&mine, all.data(), sizeof(Rec));
    int nodes = 0;
    if (world.rank() != 0) return nodes;
    for (const Rec& r : all)
        if (r.local_rank == 0) {
            fmt::print("node {}: {} rank(s), {} CPU thread(s) each; {}{}\n", r.host, r.local_size,
                       r.threads, wait_policy_text(), mpi_wait_text());
            ++nodes;
        }
    return nodes;
}

// --- start-up ---------------------------------------------------------------------------------
// Every rank reads the config; rank 0 alone lists and validates the shards and broadcasts what
// it found (one metadata pass over a parallel file system per job, not one per rank); then
// every rank sets up locally (its loader opens only the shards of its own slice). Returns
// nothing when any rank failed (the lowest failing rank has said why).
// dataset_info_pack of data.path, data.target_path (one each per layer for a CLT),
// data.eval_path and data.eval_target_path (empty when not set).
struct DataFound {
    std::vector<std::string> packed_inputs, packed_targets;
    std::string packed_eval, packed_eval_target;
};
// "data.path" for one set, "data.path[2]" for a CLT's third layer.
std::string layer_key(const char* key, size_t layer, size_t layers) {
    return layers == 1 ? std::string(key) : fmt::format("{}[{}]", key, layer);
}
// Says (once per pair) that a pair's rows could not be matched token for token.
void check_paired(const DatasetInfo& input, const DatasetInfo& target, const std::string& input_key,
                  const std::string& target_key) {
    if (!dataset_check_paired(input, target, input_key, target_key))
        fmt::print(stderr,
                   "saetrain: warning: {} {} and {} {} carry no token_ids (nor the extraction's "
                   "contexts_sha256) on both sides, so only their row counts, width and type "
                   "were checked, not that row i of one is row i of the other; write both in one "
                   "extraction (tools/extract_activations.py, both hooks)\n",
                   input_key, printable(input.source), target_key, printable(target.source));
}

DataFound open_datasets(const Config& cfg) {
    DataFound found;
    const size_t layers = cfg.data.path.size();
    const S3Settings s3 = s3_settings_from(cfg.data);  // s3:// paths: the data.s3_* keys
    const DatasetInfo data = dataset_open(cfg.data.path.front(), cfg.data.dataset, s3);
    for (size_t l = 0; l < layers; ++l) {
        const DatasetInfo in = l == 0 ? data : dataset_open(cfg.data.path[l], cfg.data.dataset, s3);
        // Every layer's rows are the first layer's tokens (one extraction).
        if (l > 0) {
            SAE_ENFORCE(in.d_model == data.d_model,
                        "{} {}: d_model {} differs from data.path[0]'s {}; a CLT's layers must "
                        "have one width",
                        layer_key("data.path", l, layers), in.source, in.d_model, data.d_model);
            check_paired(data, in, "data.path[0]", layer_key("data.path", l, layers));
        }
        found.packed_inputs.push_back(dataset_info_pack(in));
        if (l < cfg.data.target_path.size()) {
            const DatasetInfo target = dataset_open(cfg.data.target_path[l], cfg.data.dataset, s3);
            check_paired(in, target, layer_key("data.path", l, layers),
                         layer_key("data.target_path", l, layers));
            found.packed_targets.push_back(dataset_info_pack(target));
        }
    }
    if (!cfg.data.eval_path.empty()) {
        const DatasetInfo ev = dataset_open(cfg.data.eval_path, cfg.data.dataset, s3);
        SAE_ENFORCE(ev.d_model == data.d_model,
                    "data.eval_path {}: d_model {} differs from the training data's {} ({}); "
                    "held-out rows must come from the same hook",
                    ev.source, ev.d_model, data.d_model, data.source);
        found.packed_eval = dataset_info_pack(ev);
        if (!cfg.data.eval_target_path.empty()) {
            const DatasetInfo et = dataset_open(cfg.data.eval_target_path, cfg.data.dataset, s3);
            check_paired(ev, et, "data.eval_path", "data.eval_target_path");
            found.packed_eval_target = dataset_info_pack(et);
        }
    }
    return found;
}

void bcast_string(Communicator& world, std::string& s) {
    auto size = static_cast<int64_t>(s.size());
    world.bcast(&size, sizeof(size), 0);
    s.resize(static_cast<size_t>(size));
    world.bcast(s.data(), size, 0);
}

std::optional<Setup> start_up(const Args& args, Communicator& world, const NodePlacement& place,
                              Fault& fault) {
    std::optional<Config> config;
    DataFound found;
    std::string error;
    try {
        config = config_load(args.config, args.sets);
        if (world.rank() == 0) found = open_datasets(*config);
    } catch (const StopRequested&) {
        throw;  // main says it (exit 75)
    } catch (const std::exception& e) {
        error = e.what();
    }
    try {
        fault = fault_from_env();
        if (fault.fires(world.rank(), Fault::kStartup, false)) fault.fire(Fault::kStartup);
    } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
    }
    // Bound every collective from the first one on (the start-up agreement included).
    set_collective_timeout(config ? config->parallel.timeout_s : ParallelConfig{}.timeout_s);
    if (!agree_on_startup(world, error)) return std::nullopt;
    for (std::vector<std::string>* list : {&found.packed_inputs, &found.packed_targets}) {
        auto count = static_cast<int64_t>(list->size());
        world.bcast(&count, sizeof(count), 0);
        list->resize(static_cast<size_t>(count));
        for (std::string& p : *list) bcast_string(world, p);
    }
    for (std::string* p : {&found.packed_eval, &found.packed_eval_target}) bcast_string(world, *p);
    std::optional<Setup> setup;
    try {
        Datasets sets;
        sets.data = dataset_info_unpack(found.packed_inputs.at(0));
        for (size_t l = 1; l < found.packed_inputs.size(); ++l)
            sets.more_inputs.push_back(dataset_info_unpack(found.packed_inputs[l]));
        if (!found.packed_targets.empty())
            sets.target = dataset_info_unpack(found.packed_targets[0]);
        for (size_t l = 1; l < found.packed_targets.size(); ++l)
            sets.more_targets.push_back(dataset_info_unpack(found.packed_targets[l]));
        if (!found.packed_eval.empty()) sets.eval.push_back(dataset_info_unpack(found.packed_eval));
        if (!found.packed_eval_target.empty())
            sets.eval.push_back(dataset_info_unpack(found.packed_eval_target));
        setup.emplace(
            set_up(args, std::move(*config), std::move(sets), world.rank(), world.size(), place));
    } catch (const StopRequested&) {
        throw;  // main says it (exit 75)
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (!agree_on_startup(world, error)) return std::nullopt;
    return setup;
}

// --- connect: the grid's communicators, the stream of batches ----------------------------------
struct Connections {
    GridComms groups;          // the replicas (gradients), the latent shards, the shared stream
    LatentShard latent_shard;  // this rank's part of the SAE (count 1: all)
    std::unique_ptr<SharedBatchSource> shared;
    std::unique_ptr<BroadcastBatchSource> from_reader;  // latent shards: the first one reads
    BatchSource* source = nullptr;                      // where this rank's batches come from
    int64_t steps = 0;                                  // optimizer steps of the run
    Communicator& grads() { return *groups.replicas; }  // the replicas of this rank's SAE
};

// Rank 0 prints each warning about the groups' communicators once, however many groups saw it.
// Collective over the world.
void warn_about_comms(const Setup& s, Communicator& world, const NodePlacement& place,
                      const std::vector<std::string>& notes) {
    CommFacts mine = s.backend->comm_facts();
    mine.world_rank = world.rank();
    mine.host = place.host;
    const std::vector<std::string> warnings = comm_job_warnings(world, mine, notes);
    if (world.rank() == 0)
        for (const std::string& w : warnings) fmt::print(stderr, "saetrain: warning: {}\n", w);
}

// Every communicator of this rank (RankGrid::connect: each group on the backend agrees on its
// kind, comm_choice.h; then the job agrees that every group got one), where its batches come
// from, and the run's length. Nothing when a group could not agree (the lowest failing rank said
// why).
std::optional<Connections> connect(Setup& s, Communicator& world, const NodePlacement& place) {
    std::optional<Connections> out(std::in_place);
    Connections& c = *out;
    const RankCoords& l = s.coords;
    c.groups = s.grid.connect(world, {s.backend.get(), place.host, s.cfg.parallel.timeout_s});
    if (!agree_on_startup(world, c.groups.error)) return std::nullopt;
    warn_about_comms(s, world, place, c.groups.notes);
    if (c.groups.shared_data && s.local)
        c.shared = std::make_unique<SharedBatchSource>(*s.local, *c.groups.shared_data,
                                                       s.cfg.data.batch_size);
    c.source = c.shared ? static_cast<BatchSource*>(c.shared.get()) : s.local.get();
    c.latent_shard = c.groups.latent_shard(s.sae().resolved_latents(s.model_d()));
    if (l.latent_shards > 1) {
        // The first latent shard's batches, as stored, to every latent shard of its replica.
        c.from_reader = std::make_unique<BroadcastBatchSource>(c.source, *c.groups.latent_shards,
                                                               s.row_width());
        c.source = c.from_reader.get();
    }
    // One SAE consumes replicas x batch_size rows a step, from its whole stream.
    double stream_rows = static_cast<double>(l.shared_data ? (s.local ? s.local->total_rows() : 0)
                                                           : c.source->total_rows());
    (l.shared_data ? world : c.grads()).allreduce_sum(&stream_rows, 1);
    c.steps =
        total_steps_for(static_cast<int64_t>(stream_rows), s.cfg.data.batch_size * l.replicas);
    return out;
}

// --- open run.out_dir (rank 0) ------------------------------------------------------------------
// A fresh start removes only what saetrain writes; anything else stays.
void prepare_out_dir(const Setup& s) {
    const fs::path out = s.out();
    if (!s.resume)
        for (const char* f : {"metrics.jsonl", "summary.csv", "COMPLETE", "run.json", "checkpoints",
                              "sae", "tb", "report"})
            fs::remove_all(out / f);
    fs::create_directories(out);
    remove_stale_files(out.string());
    // A resume keeps the config.yaml it was trained with until the checkpoint has accepted the
    // new config (resume_if_any): a refused resume leaves the run as it was.
    if (!s.resume) write_run_config(out.string(), config_to_yaml(s.cfg));
}

// Settings that the run's length makes meaningless: said before training.
void warn_about_run_length(const Setup& s, int64_t steps) {
    const int64_t run_tokens = steps * s.cfg.data.batch_size * s.coords.replicas;
    for (size_t i = 0; i < s.cfg.sweep.size(); ++i) {
        const SaeConfig& c = s.cfg.sweep[i];
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
                       s.eval_rows() > 0 ? " (the held-out dead % does not depend on it)"
                                         : " or hold rows out (data.eval_rows) for a dead % "
                                           "over them");
    }
}

void print_banner(const Setup& s, int world_size, int64_t steps) {
    fmt::print("saetrain {} | {} rank(s): {} | backend {}{}\n", SAETRAIN_VERSION, world_size,
               s.coords.describe(), s.backend->name(),
               s.backend_note.empty() ? "" : " | " + s.backend_note);
    fmt::print(
        "data {} | {} shard(s), {} rows, d_model {}, {} | {:.1f} MB\n", printable(s.data.source),
        s.data.shards.size(), s.data.total_rows, s.data.d_model, dtype_name(s.data.dtype),
        static_cast<double>(s.data.total_rows * s.data.d_model * dtype_size(s.data.dtype)) / 1e6);
    for (const DatasetInfo& more : s.more_inputs)
        fmt::print("data {} | the next layer's input, row for row beside it (CLT)\n",
                   printable(more.source));
    if (!s.target.shards.empty())
        fmt::print("target {} | {} shard(s), read row for row beside it (transcoder)\n",
                   printable(s.target.source), s.target.shards.size());
    for (const DatasetInfo& more : s.more_targets)
        fmt::print("target {} | the next layer's target, row for row beside it (CLT)\n",
                   printable(more.source));
    // Batches move as stored (reader, ring, exchanges, upload) and are widened on the backend;
    // a transcoder's rows are its input and its target side by side.
    const int64_t value_bytes = dtype_size(s.data.dtype);
    fmt::print(
        "{} step(s) of {} rows per SAE replica | batches move as {} ({} B per token, {:.1f} MB "
        "a batch), widened to float32 on upload\n",
        steps, s.cfg.data.batch_size, dtype_name(s.data.dtype), s.row_width() * value_bytes,
        static_cast<double>(s.cfg.data.batch_size * s.row_width() * value_bytes) / 1e6);
    warn_about_run_length(s, steps);
    if (s.eval_rows() > 0)
        fmt::print(
            "held-out: {} rows from {}, never trained on ({:.1f} MB in memory, split among "
            "an SAE's replicas)\n",
            s.eval_rows(), s.split.eval_source,
            static_cast<double>(s.eval_rows() * s.row_width() * 4) / 1e6);
}

// --- resume or start fresh ----------------------------------------------------------------------
SaeMeta sae_meta(const Setup& s, const SaeTrainer& t) {
    return SaeMeta{s.sae().arch, s.id(),         config_to_yaml(s.cfg),
                   s.sae().k,    t.step_count(), t.tokens()};
}

// Loads the newest committed checkpoint into `trainer` and the reader's cursor, and sets where
// the loop starts; returns the step it was taken at (metrics.jsonl and tb/ keep what was logged
// up to it), or -1 for a fresh start.
int64_t resume_if_any(Setup& s, const Args& args, Communicator& world, Checkpointer& checkpoints,
                      SaeTrainer& trainer, LoopOptions& opt) {
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
        // Before any writer thread exists: the atomic writer reads it on the write it names.
        ::setenv(
            "SAETRAIN_FAULT_KILL_IN_WRITE",
            (s.out() / "sae" / s.id() / fmt::format("checkpoint-{}.h5", fault.iteration)).c_str(),
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

// --- write and report ---------------------------------------------------------------------------
// This rank's SAE as the summary reports it. The quality gates: on the held-out rows when there
// are any, else the end of training.
SaeSummary summarize(const Setup& s, const LoopResult& res, SaeTrainer& trainer) {
    SaeSummary mine;
    mine.config = s.coords.config;
    mine.last = res.last;
    mine.steps = res.steps, mine.tokens = res.tokens;
    mine.tokens_per_s = res.tokens_per_s, mine.wait_fraction = res.wait_fraction;
    mine.tflops = res.tflops;
    mine.gates = res.eval.rows > 0 ? res.eval.quality : trainer.training_quality();
    mine.arch_figures = trainer.arch_summary();
    if (res.last.sae.empty()) {
        // Resumed with nothing left to train (stopped between the final checkpoint and
        // COMPLETE): report the SAE as the log last saw it, with that interval's rates, rather
        // than an empty interval of zeros.
        if (auto logged = metrics_last_row((s.out() / "metrics.jsonl").string(), s.id())) {
            mine.last = *logged;
            mine.tokens_per_s = logged->tokens_per_s, mine.wait_fraction = logged->wait_fraction;
            mine.tflops = logged->tflops;
        }
        if (res.eval.rows > 0) attach_eval(mine.last, res.eval);
    }
    return mine;
}

// sae/<id>/final.h5 on the raw activations (data.normalize's scale folded into the weights),
// its feature-density histogram, and the recovery of planted features when the data has them
// (the decoder's: a transcoder's are the target's).
void write_sae(const Setup& s, SaeTrainer& trainer, SaeSummary& mine) {
    const fs::path sae_dir = s.out() / "sae" / s.id();
    const std::string final_h5 = (sae_dir / "final.h5").string();
    const fs::path truth = fs::path(s.target.shards.empty() ? s.cfg.data.path.front()
                                                            : s.cfg.data.target_path.front()) /
                           "ground_truth.h5";
    SaeWeights w;
    if (trainer.latent_sharded()) {
        // Streamed from every latent shard to the first, which writes it (no whole copy).
        write_gathered(trainer, s.coords.latent_shard == 0, final_h5, "", sae_meta(s, trainer), {},
                       /*folded=*/true);
        if (s.coords.latent_shard != 0) return;
        if (fs::is_regular_file(truth)) w = sae_read_h5(final_h5);  // for the recovery below
    } else {
        w = fold_activation_scale(trainer_weights(trainer));
        sae_write_h5(final_h5, w, sae_meta(s, trainer));
    }
    if (mine.gates.measured)
        density_histogram_write((sae_dir / "feature_density.csv").string(), mine.gates.density);
    if (fs::is_regular_file(truth)) {
        int64_t m = 0, dt = 0;
        const std::vector<float> f = synth_read_features(truth.string(), &m, &dt);
        if (dt == w.d_model)
            mine.feature_recovery = feature_recovery(f.data(), m, w.w_dec.data(), w.n_latents, dt);
    }
}

// summary.csv's config columns: arch, n_latents, the keys any architecture reads (blank in the
// rows of architectures that do not read them: the same columns in every run), lr.
void config_columns(const Setup& s, std::vector<std::string>& names,
                    std::vector<std::map<std::string, std::string>>& rows) {
    const std::vector<std::string> keys = arch_summary_keys();
    names = {"arch", "n_latents"};
    for (const std::string& k : keys) names.push_back(k.substr(k.find('.') + 1));
    names.emplace_back("lr");
    for (const SaeConfig& c : s.cfg.sweep) {
        std::map<std::string, std::string> row = {
            {"arch", c.arch},
            {"n_latents", std::to_string(c.resolved_latents(s.model_d()))},
            {"lr", fmt::format("{:g}", c.lr)}};
        for (const std::string& k : arch_get(c.arch).summary_keys())
            row[k.substr(k.find('.') + 1)] = sae_key_text(s.cfg, c, k);
        rows.push_back(std::move(row));
    }
}

// run.json's record of this run (run_dir.h): written by rank 0 once training is about to start.
RunRecord run_record(const Setup& s, int ranks, int hosts, int64_t steps, int64_t resumed_step) {
    RunRecord r;
    r.version = SAETRAIN_VERSION;
    r.backend = s.backend->name();
    r.ranks = ranks, r.hosts = hosts;
    r.total_steps = steps;
    r.tokens_per_step = s.cfg.data.batch_size * s.coords.replicas;
    r.resumed_from_step = resumed_step;
    for (size_t i = 0; i < s.cfg.sweep.size(); ++i) r.saes.emplace_back(s.ids[i], s.cfg.sweep[i]);
    return r;
}

// --- the run ------------------------------------------------------------------------------------
// `state`: set on rank 0 once training starts (out_dir/run.json); main records the exit in it.
int run(const Args& args, Communicator& world, std::unique_ptr<RunStateFile>& state) {
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
    const int hosts = print_placement(world, place, s.threads);
    world.barrier();  // out_dir exists before anyone writes into it

    SaeTrainer trainer(s.sae(), s.model_d(), conn.steps, s.cfg.run.seed, *s.backend, conn.grads(),
                       &conn.latent_shard);
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
    const LoopResult res = train_loop(trainer, *conn.source, opt);
    print_loop_end(res, reporter, world);
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

// --dry-run: reads the config with its --set overrides, checks every key and value and the job
// size, and says what a run would train, without MPI, data or out_dir. Exit 0, or 1 with the
// error line a run would print.
int dry_run(const Args& args) {
    try {
        const Config cfg = config_load(args.config, args.sets);
        const int g = static_cast<int>(cfg.sweep.empty() ? 1 : cfg.sweep.size());
        const int per = static_cast<int>(cfg.parallel.latent_shards);
        const int asked = cfg.parallel.mode == "sweep"
                              ? g * per
                              : g * static_cast<int>(cfg.parallel.replicas) * per;
        const int ranks = args.ranks > 0 ? args.ranks : asked;
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

// --list-keys: every key from its declaration (config_keys), in config.yaml's order.
void print_keys() {
    fmt::print("{:<36} {:<14} {:<7} {}\n", "key", "default", "resume", "what it sets");
    for (const ConfigKeyInfo& k : config_keys()) {
        std::string doc = k.doc;
        if (!k.declared_by.empty()) doc += " [" + k.declared_by + "]";
        fmt::print("{:<36} {:<14} {:<7} {}\n", k.name,
                   k.default_text.empty() ? "\"\"" : k.default_text,
                   k.changes_results ? "same" : "any", doc);
    }
    fmt::print(
        "\nresume: \"same\" keys must keep their value for a run to resume (or "
        "--allow-config-change); [...]: the architectures that read the key\n");
}

}  // namespace

// Resource limits too low for MPI, OpenMP and OpenBLAS to start, found before they start: under
// them MPI_Init segfaults or spins and libgomp fails to create threads, with no line of ours.
// Measured on the 2-core VM (1 rank, 2 threads): MPI start-up opens about 30 files and the
// process needs 0.8 GiB of address space; the floors leave room for shards and more threads.
// "" when the limits are fine.
static std::string limits_too_low() {
    constexpr rlim_t kMinFiles = 64;
    constexpr rlim_t kMinAddressSpace = rlim_t{1} << 30;
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < kMinFiles)
        return fmt::format(
            "the open-file limit (ulimit -n) is {}; MPI's start-up alone opens about 30 files and "
            "each rank reads shards beside them: raise it to at least {} (ulimit -n 1024)",
            r.rlim_cur, kMinFiles);
    if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY &&
        r.rlim_cur < kMinAddressSpace)
        return fmt::format(
            "the address-space limit (ulimit -v) is {} MiB; MPI, OpenMP and OpenBLAS need about "
            "0.8 GiB to start, before any data: raise it to at least {} MiB (ulimit -v unlimited)",
            r.rlim_cur >> 20, kMinAddressSpace >> 20);
    return "";
}

int main(int argc, char** argv) {
    Args args;
    CLI::App app{"saetrain: train sparse autoencoders on cached activations"};
    app.add_option("CONFIG", args.config, "YAML config file")->required();
    app.add_option("--set", args.sets, "override a config key: section.key=value (repeatable)");
    app.add_flag("--overwrite", args.overwrite,
                 "start over: replace the run in run.out_dir instead of resuming it");
    app.add_flag("--allow-config-change", args.allow_config_change,
                 "resume even though the config changed in keys that change the result");
    // Bounded: OpenMP and OpenBLAS make every thread asked for (100,000 ended in a segmentation
    // fault); 1024 is beyond any node's cores per rank. A word that is no number is left to the
    // conversion, whose message says so.
    app.add_option("--threads", args.threads,
                   "CPU threads per rank, at most 1024 (default: the rank's cores / ranks on its "
                   "node)")
        ->check(CLI::Validator(
            [](std::string& value) -> std::string {
                long long n = 0;
                std::size_t used = 0;
                try {
                    n = std::stoll(value, &used);
                } catch (const std::exception&) {
                    return "";
                }
                if (used != value.size() || (n >= 0 && n <= 1024)) return "";
                return "Value " + value + " not in range 0 to 1024";
            },
            "0-1024"));
    app.add_flag("--dry-run", args.dry_run,
                 "check the config, its --set overrides and the job size, say what would be "
                 "trained, and exit (no MPI, data or out_dir)");
    app.add_option("--ranks", args.ranks, "with --dry-run: the job's rank count to check")
        ->check(CLI::PositiveNumber);
    app.add_flag_callback(
        "--list-keys",
        [] {
            print_keys();
            throw CLI::Success();
        },
        "print every config key with its default and doc, then exit");
    // Before MPI starts: --version, --help, --list-keys and a usage error need no MPI.
    if (const int code = cli_parse(app, "saetrain",
                                   "saetrain CONFIG.yaml [--set key=value ...] [--overwrite] "
                                   "[--allow-config-change] [--threads N] [--dry-run [--ranks N]] "
                                   "| --list-keys",
                                   argc, argv);
        code >= 0)
        return code;
    if (args.dry_run) return dry_run(args);
    if (const std::string low = limits_too_low(); !low.empty()) {
        std::fprintf(stderr, "saetrain: error: %s\n", low.c_str());
        return 1;
    }
    exec_with_short_spins(argv);
    if (yield_mpi_waits_when_crowded(args.threads)) ::setenv("SAETRAIN_YIELD_SET", "1", 1);
    // From here on a stop signal is a request: honoured at the first iteration if it arrives
    // during start-up, MPI's included (the default action would end the rank with the signal's
    // status, which Slurm does not requeue, and leave its peers waiting).
    stop_signals_install();
    // Test hook: SAETRAIN_FAULT_SIGNAL_BEFORE_MPI=TERM|INT|USR1 raises it here, before MPI starts.
    if (const char* f = std::getenv("SAETRAIN_FAULT_SIGNAL_BEFORE_MPI"))
        std::raise(std::string(f) == "INT" ? SIGINT : std::string(f) == "USR1" ? SIGUSR1 : SIGTERM);
    MpiScope mpi(&argc, &argv);
    stop_signals_install();  // again: MPI's start-up may have set handlers of its own
    s3_set_stop_check(&stop_signal_before_training);  // S3 waits of start-up end at a signal
    auto world = make_mpi_world();
    stop_signals_set_rank(world->rank());
    std::unique_ptr<RunStateFile> state;  // rank 0, once training starts: how the process ended
    try {
        const int code = run(args, *world, state);
        if (state) state->end(code);
        return code;
    } catch (const StopRequested&) {
        // A stop signal during start-up abandoned a wait for S3 data (s3_set_stop_check). Said
        // by the rank that caught it; with several, the job is ended (no rank left waiting).
        std::fprintf(stderr,
                     "saetrain: stopped by a signal before the first step; nothing to save. Run "
                     "the same command to start (exit code 75).\n");
        std::fflush(stderr);
        if (world->size() > 1) world_abort(kExitStopped);
        return kExitStopped;
    } catch (const std::exception& e) {
        if (state) state->end(1, e.what());
        // A failure after start-up: the other ranks may be waiting in a collective, so this
        // rank's message is the one printed and the whole job is aborted.
        if (world->size() > 1) {
            std::fprintf(stderr, "saetrain: error: rank %d: %s; stopping all %d ranks\n",
                         world->rank(), printable(e.what()).c_str(), world->size());
            std::fflush(stderr);
            world_abort(1);
        }
        std::fprintf(stderr, "saetrain: error: %s\n", printable(e.what()).c_str());
        return 1;
    }
}
