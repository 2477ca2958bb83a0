// saetrain — train sparse autoencoders on cached activations.
//
//   saetrain CONFIG.yaml [--set key=value ...]      (mpirun/srun: one rank per device)
//
// Reads top-down: parse the config, start MPI, pick the backend, open the data, train,
// write the outputs, report.
#include <fmt/format.h>
#include <sched.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "saetrain/backend.h"       // defines: Backend, make_cpu_backend
#include "saetrain/build_config.h"  // defines: SAETRAIN_HAS_CUDA, SAETRAIN_VERSION
#include "saetrain/checkpoint.h"    // defines: sae_write_h5
#include "saetrain/config.h"        // defines: config_load, config_to_yaml, sweep_ids
#if SAETRAIN_HAS_CUDA
#include "saetrain/cuda_device.h"  // defines: cuda_device_count, cuda_device_description
#endif
#include "saetrain/error.h"       // defines: saetrain::Error, SAE_ENFORCE
#include "saetrain/loader.h"      // defines: ShardBatchSource (shards -> shuffled batches)
#include "saetrain/metrics.h"     // defines: MetricsLog, progress_line, summary_write
#include "saetrain/mpi_world.h"   // defines: MpiScope, make_mpi_world, node_placement
#include "saetrain/shards.h"      // defines: dataset_open, partition_rows
#include "saetrain/synth.h"       // defines: synth_read_features, feature_recovery
#include "saetrain/train_loop.h"  // defines: train_loop, SaeTrainer

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct Args {
    std::string config;
    std::vector<std::string> sets;
    bool overwrite = false;
    int threads = 0;
};

// Cores this process may run on, shared fairly among the ranks of its node.
int cpu_threads_for_rank(int local_size) {
    cpu_set_t set;
    int cores = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    return std::max(1, cores / std::max(1, local_size));
}

// backend: cpu | cuda | auto. The CUDA backend itself is not written yet (issue 5), so auto
// says what it saw and runs on the CPU.
std::unique_ptr<Backend> make_backend(const std::string& choice, int threads, bool loud) {
#if SAETRAIN_HAS_CUDA
    const int devices = cuda_device_count();
    SAE_ENFORCE(choice != "cuda",
                "backend: cuda: {} device(s) visible, but this version has no CUDA backend yet; "
                "use backend: cpu",
                devices);
    if (loud && choice == "auto")
        fmt::print("backend: auto -> cpu ({})\n",
                   devices > 0 ? fmt::format("{} CUDA device(s) seen, first {}; CUDA backend not "
                                             "in this version",
                                             devices, cuda_device_description(0))
                               : std::string("no CUDA device visible"));
#else
    SAE_ENFORCE(choice != "cuda",
                "backend: cuda requested but this build has no CUDA backend (reconfigure with "
                "cmake --preset cuda, or set backend: cpu)");
    if (loud && choice == "auto") fmt::print("backend: auto -> cpu (built without CUDA)\n");
#endif
    return make_cpu_backend(threads);
}

std::string fmt_g(double v) { return fmt::format("{:.6g}", v); }

int run(const Args& args, Communicator& world) {
    const bool root = world.rank() == 0;
    // --- config --------------------------------------------------------------------------
    Config cfg = config_load(args.config, args.sets);
    SAE_ENFORCE(static_cast<int64_t>(cfg.sweep.size()) == world.size(),
                "{}: the sweep has {} SAE config(s) but the job has {} rank(s); run with "
                "{} rank(s) (one SAE per rank)",
                cfg.source, cfg.sweep.size(), world.size(), cfg.sweep.size());
    const SaeConfig& sae = cfg.sweep[static_cast<size_t>(world.rank())];

    // --- data -----------------------------------------------------------------------------
    const DatasetInfo data = dataset_open(cfg.data.path, cfg.data.dataset);
    config_validate_for_data(cfg, data.d_model);
    const std::string id = sweep_ids(cfg, data.d_model)[static_cast<size_t>(world.rank())];
    // Issue 3 adds shared sweeps; for now every SAE reads the whole dataset.
    const RowRange range{0, data.total_rows};
    LoaderOptions lo;
    lo.epochs = cfg.data.epochs;
    lo.max_rows = cfg.data.max_tokens;
    lo.shuffle_rows = cfg.data.shuffle_buffer_rows;
    lo.seed = cfg.run.seed * 1000003u + static_cast<uint64_t>(world.rank());
    ShardBatchSource source(data, range, lo);

    // --- outputs --------------------------------------------------------------------------
    const fs::path out = cfg.run.out_dir;
    if (root) {
        SAE_ENFORCE(args.overwrite || !fs::exists(out / "metrics.jsonl"),
                    "{} already holds a run (metrics.jsonl); choose another run.out_dir or pass "
                    "--overwrite to replace it",
                    out.string());
        fs::create_directories(out);
        fs::remove(out / "metrics.jsonl");
        std::ofstream(out / "config.yaml") << config_to_yaml(cfg);
    }
    world.barrier();

    // --- backend and model ----------------------------------------------------------------
    const NodePlacement place = node_placement();
    const int threads = args.threads > 0 ? args.threads : cpu_threads_for_rank(place.local_size);
    auto backend = make_backend(cfg.backend, threads, root);
    auto self = make_self_comm();  // gradient group: this rank alone (data-parallel: issue 3)
    const int64_t steps = total_steps_for(source.total_rows(), cfg.data.batch_size);
    SaeTrainer trainer(sae, data.d_model, steps, cfg.run.seed, *backend, *self);
    if (root) {
        fmt::print("saetrain {} | {} rank(s) | {}\n", SAETRAIN_VERSION, world.size(),
                   backend->name());
        fmt::print(
            "data {} | {} shard(s), {} rows, d_model {}, {} | {:.1f} MB\n", data.source,
            data.shards.size(), data.total_rows, data.d_model, dtype_name(data.dtype),
            static_cast<double>(data.total_rows * data.d_model * dtype_size(data.dtype)) / 1e6);
        fmt::print("sae {} | n_latents {} | {} steps of {} rows\n", id, trainer.n_latents(), steps,
                   cfg.data.batch_size);
    }

    // --- train ------------------------------------------------------------------------------
    std::unique_ptr<MetricsLog> log;
    if (root) log = std::make_unique<MetricsLog>((out / "metrics.jsonl").string());
    const fs::path sae_dir = out / "sae" / id;
    auto meta_now = [&](const SaeTrainer& t) {
        return SaeMeta{arch_name(sae.arch), id,        config_to_yaml(cfg), sae.k,
                       t.step_count(),      t.tokens()};
    };
    LoopOptions opt;
    opt.batch_size = cfg.data.batch_size;
    opt.log_every = cfg.log.every_steps;
    opt.checkpoint_every = cfg.checkpoint.every_steps;
    opt.sae_id = id;
    opt.report = [&](const MetricsRow& m) {
        if (!root) return;
        log->write(m);
        fmt::print("{}\n", progress_line(m));
        std::fflush(stdout);
    };
    opt.checkpoint = [&](SaeTrainer& t) {
        checkpoint_rotate(sae_dir.string(), t.step_count(), t.weights(), meta_now(t),
                          cfg.checkpoint.keep);
    };
    const LoopResult res = train_loop(trainer, source, opt);

    // --- write and report -------------------------------------------------------------------
    const SaeWeights w = trainer.weights();
    sae_write_h5((sae_dir / "final.h5").string(), w, meta_now(trainer));

    std::map<std::string, std::string> row = {
        {"sae", id},
        {"arch", arch_name(sae.arch)},
        {"n_latents", std::to_string(w.n_latents)},
        {"k", sae.arch == Arch::topk ? std::to_string(sae.k) : ""},
        {"l1_coeff", sae.arch == Arch::relu ? fmt_g(sae.l1_coeff) : ""},
        {"steps", std::to_string(res.steps)},
        {"tokens", std::to_string(res.tokens)},
        {"mse", fmt_g(res.last.mse)},
        {"fvu", fmt_g(res.last.fvu)},
        {"l0", fmt_g(res.last.l0)},
        {"dead_fraction", fmt_g(res.last.dead_fraction)},
        {"tokens_per_s", fmt_g(res.tokens_per_s)},
        {"wait_fraction", fmt_g(res.wait_fraction)}};
    std::string recovery;
    const fs::path truth = fs::path(cfg.data.path) / "ground_truth.h5";
    if (fs::is_regular_file(truth)) {
        int64_t m = 0, dt = 0;
        const std::vector<float> f = synth_read_features(truth.string(), &m, &dt);
        if (dt == w.d_model) {
            const double rec = feature_recovery(f.data(), m, w.w_dec.data(), w.n_latents, dt);
            row["feature_recovery"] = fmt_g(rec);
            recovery = fmt::format(
                " | feature recovery {:.3f} (mean best cosine over {} planted features)", rec, m);
        }
    }
    if (root) {
        summary_write((out / "summary.csv").string(),
                      {"sae", "arch", "n_latents", "k", "l1_coeff", "steps", "tokens", "mse", "fvu",
                       "l0", "dead_fraction", "tokens_per_s", "wait_fraction", "feature_recovery"},
                      {row});
        fmt::print("done {} | {} steps, {} tokens in {} ({} tok/s) | fvu {:.4f} | l0 {:.1f}{}\n",
                   id, res.steps, res.tokens, format_duration(res.seconds),
                   format_count(res.tokens_per_s), res.last.fvu, res.last.l0, recovery);
        fmt::print("wrote {}\n", (out / "sae" / id / "final.h5").string());
    }
    world.barrier();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    Args args;
    CLI::App app{"saetrain: train sparse autoencoders on cached activations"};
    app.add_option("config", args.config, "YAML config file")->required();
    app.add_option("--set", args.sets, "override a config key: section.key=value (repeatable)");
    app.add_flag("--overwrite", args.overwrite, "replace an existing run in run.out_dir");
    app.add_option("--threads", args.threads,
                   "CPU threads per rank (default: cores / ranks per node)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    auto world = make_mpi_world();
    try {
        return run(args, *world);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "saetrain: error: %s\n", e.what());
        if (world->size() > 1) {
            std::fprintf(stderr, "saetrain: rank %d failed; stopping all %d ranks\n", world->rank(),
                         world->size());
            std::fflush(stderr);
            world_abort(1);
        }
        return 1;
    }
}
