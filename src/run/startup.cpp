// Start-up and connect (run_parts.h): every rank agrees on the config, the datasets rank 0
// validated, its place in the grid, its backend and the rows it reads; then on the grid's
// communicators and where each rank's batches come from.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <fstream>

#include "run_parts.h"
#include "saetrain/arch.h"              // defines: arch_check_backend, check_latent_sharding
#include "saetrain/backend_registry.h"  // defines: make_backend (cpu, cuda, auto)
#include "saetrain/checkpointer.h"      // defines: Checkpointer::committed_steps
#include "saetrain/comm_choice.h"       // defines: comm_job_warnings (GPUs that ranks share)
#include "saetrain/cores.h"  // defines: cpu_threads_for_rank, wait_policy_text, blas_kernel_text
#include "saetrain/error.h"  // defines: saetrain::Error, SAE_ENFORCE
#include "saetrain/host_alloc.h"  // defines: machine_memory_bytes
#include "saetrain/s3.h"          // defines: s3_settings_from (s3:// data.path)
#include "saetrain/schedule.h"    // defines: total_steps_for

namespace saetrain::run_parts {

namespace {

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

}  // namespace

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

namespace {

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
void inspect_out_dir(Setup& s, const RunRequest& args, int rank) {
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
    lo.shuffle_rows = s.shuffle_rows();
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
Setup set_up(const RunRequest& args, Config cfg, Datasets found, int rank, int world,
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
    // A multi-layer paired set's layers, from its shape; config.yaml records them (data.layers),
    // so sae-export and a resume read the CLT as trained.
    if (s.data.layers > 0) {
        s.cfg.data.layers = s.data.layers;
        for (SaeConfig& c : s.cfg.sweep) c.layers = s.data.layers;
        s.cfg.sae.layers = s.data.layers;
    }
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

}  // namespace

int print_placement(Communicator& world, const NodePlacement& place, int threads, bool adapts) {
    struct Rec {
        char host[64];
        int32_t local_rank, local_size, threads, adapts;
    } mine{};
    std::snprintf(mine.host, sizeof(mine.host), "%s", place.host.c_str());
    mine.local_rank = place.local_rank, mine.local_size = place.local_size, mine.threads = threads;
    mine.adapts = adapts ? 1 : 0;
    std::vector<Rec> all(static_cast<size_t>(world.size()));
    world.allgather(&mine, all.data(), sizeof(Rec));
    int nodes = 0;
    if (world.rank() != 0) return nodes;
    for (const Rec& r : all)
        if (r.local_rank == 0) {
            fmt::print("node {}: {} rank(s), {} CPU thread(s) each{}; {}{}{}\n", r.host,
                       r.local_size, r.threads,
                       r.adapts ? " (fewer while other processes take their cores)" : "",
                       wait_policy_text(), mpi_wait_text(), blas_kernel_text());
            ++nodes;
        }
    return nodes;
}

// --- start-up ---------------------------------------------------------------------------------
namespace {

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

// Throws naming the key unless `set` is [rows, d_model]: a multi-layer paired set's [rows, L,
// d] is read only as one (open_layer_pairs).
void require_2d(const DatasetInfo& set, const std::string& key) {
    SAE_ENFORCE(set.layers == 0,
                "{} {}: dataset '{}' is [rows, {}, {}], a multi-layer paired set's; only sae.arch "
                "clt reads it, with that one data.path and no data.target_path",
                key, printable(set.source), set.dataset, set.layers,
                set.layers > 0 ? set.d_model / set.layers : 0);
}

// A CLT's multi-layer paired set (multi_layer_paired): its shards' `inputs` and `targets`, each
// [rows, L, d], as the CLT's input and target parts.
void open_layer_pairs(const Config& cfg, const S3Settings& s3, DataFound& found) {
    const std::string& path = cfg.data.path.front();
    const std::vector<std::string> names = input_dataset_names(cfg);  // inputs, targets
    const auto open = [&](const std::string& name) {
        try {
            return dataset_open(path, name, s3);
        } catch (const Error& e) {
            throw Error(fmt::format(
                "data.path {}: {} (a CLT given one data.path and no data.target_path reads a "
                "multi-layer paired set, whose shards hold 'inputs' and 'targets' [rows, layers, "
                "d_model]: tools/extract_activations.py --layer-pairs; else list each layer's "
                "sets in data.path and data.target_path)",
                printable(path), e.what()));
        }
    };
    const DatasetInfo in = open(names.at(0));
    SAE_ENFORCE(in.layers > 0,
                "data.path {}: dataset 'inputs' is [rows, {}]; a multi-layer paired set's "
                "'inputs' and 'targets' are [rows, layers, d_model] (tools/extract_activations.py "
                "--layer-pairs), else list each layer's sets in data.path and data.target_path",
                printable(path), in.d_model);
    SAE_ENFORCE(cfg.data.layers == 0 || cfg.data.layers == in.layers,
                "data.layers is {}, but data.path {} holds {} layers a row ('inputs' [rows, {}, "
                "{}]); set it to {} or leave it 0",
                cfg.data.layers, printable(path), in.layers, in.layers, in.d_model / in.layers,
                in.layers);
    const DatasetInfo target = open(names.at(1));
    check_paired(in, target, "data.path's 'inputs'", "data.path's 'targets'");
    found.packed_inputs.push_back(dataset_info_pack(in));
    found.packed_targets.push_back(dataset_info_pack(target));
}

// A CLT's data.eval_path: a multi-layer paired set ('inputs' and 'targets' [rows, L, d]) of the
// training data's layers and width, read as the held-out rows' input and target parts (a row
// [x_1 .. x_L | y_1 .. y_L], as the training rows are, from per-layer lists or one such set).
void open_eval_layer_pairs(const Config& cfg, const S3Settings& s3, const DatasetInfo& data,
                           DataFound& found) {
    const std::string& path = cfg.data.eval_path;
    const int64_t layers =
        data.layers > 0 ? data.layers : static_cast<int64_t>(cfg.data.path.size());
    const int64_t width = data.layers > 0 ? data.d_model / data.layers : data.d_model;
    const auto open = [&](const char* name) {
        try {
            return dataset_open(path, name, s3);
        } catch (const Error& e) {
            throw Error(fmt::format(
                "data.eval_path {}: {} (a CLT's held-out set is a multi-layer paired set, whose "
                "shards hold 'inputs' and 'targets' [rows, layers, d_model]: "
                "tools/extract_activations.py --layer-pairs)",
                printable(path), e.what()));
        }
    };
    const DatasetInfo in = open("inputs");
    SAE_ENFORCE(in.layers == layers && in.d_model == layers * width,
                "data.eval_path {}: 'inputs' is {}, but the CLT trains on {} layers of d_model {}; "
                "held-out rows must come from the same hooks",
                printable(path),
                in.layers > 0
                    ? fmt::format("[rows, {}, {}]", in.layers, in.d_model / in.layers)
                    : fmt::format("[rows, {}] (not a multi-layer paired set)", in.d_model),
                layers, width);
    const DatasetInfo target = open("targets");
    check_paired(in, target, "data.eval_path's 'inputs'", "data.eval_path's 'targets'");
    found.packed_eval = dataset_info_pack(in);
    found.packed_eval_target = dataset_info_pack(target);
}

DataFound open_datasets(const Config& cfg) {
    DataFound found;
    const size_t layers = cfg.data.path.size();
    const S3Settings s3 = s3_settings_from(cfg.data);  // s3:// paths: the data.s3_* keys
    if (multi_layer_paired(cfg)) {
        open_layer_pairs(cfg, s3, found);
    } else {
        const DatasetInfo data = dataset_open(cfg.data.path.front(), cfg.data.dataset, s3);
        for (size_t l = 0; l < layers; ++l) {
            const DatasetInfo in =
                l == 0 ? data : dataset_open(cfg.data.path[l], cfg.data.dataset, s3);
            require_2d(in, layer_key("data.path", l, layers));
            // Every layer's rows are the first layer's tokens (one extraction).
            if (l > 0) {
                SAE_ENFORCE(in.d_model == data.d_model,
                            "{} {}: d_model {} differs from data.path[0]'s {}; a CLT's layers "
                            "must have one width",
                            layer_key("data.path", l, layers), in.source, in.d_model, data.d_model);
                check_paired(data, in, "data.path[0]", layer_key("data.path", l, layers));
            }
            found.packed_inputs.push_back(dataset_info_pack(in));
            if (l < cfg.data.target_path.size()) {
                const DatasetInfo target =
                    dataset_open(cfg.data.target_path[l], cfg.data.dataset, s3);
                require_2d(target, layer_key("data.target_path", l, layers));
                check_paired(in, target, layer_key("data.path", l, layers),
                             layer_key("data.target_path", l, layers));
                found.packed_targets.push_back(dataset_info_pack(target));
            }
        }
    }
    const DatasetInfo data = dataset_info_unpack(found.packed_inputs.front());
    const Architecture* arch = arch_find(cfg.sae.arch);
    if (!cfg.data.eval_path.empty() && arch && arch->rows().per_layer) {
        open_eval_layer_pairs(cfg, s3, data, found);
    } else if (!cfg.data.eval_path.empty()) {
        const DatasetInfo ev = dataset_open(cfg.data.eval_path, cfg.data.dataset, s3);
        require_2d(ev, "data.eval_path");
        SAE_ENFORCE(ev.d_model == data.d_model,
                    "data.eval_path {}: d_model {} differs from the training data's {} ({}); "
                    "held-out rows must come from the same hook",
                    ev.source, ev.d_model, data.d_model, data.source);
        found.packed_eval = dataset_info_pack(ev);
        if (!cfg.data.eval_target_path.empty()) {
            const DatasetInfo et = dataset_open(cfg.data.eval_target_path, cfg.data.dataset, s3);
            require_2d(et, "data.eval_target_path");
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

}  // namespace

std::optional<Setup> start_up(const RunRequest& args, Communicator& world,
                              const NodePlacement& place, Fault& fault) {
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

namespace {

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

}  // namespace

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

}  // namespace saetrain::run_parts
