// bench_latent_shards — run under mpirun: one wide SAE split into latent shards (issue 15).
//
//   mpirun -np 1 bench_latent_shards ...; mpirun -np 2 bench_latent_shards ...
//   (bench/latent_shards.sh runs both and prints the ratios beside the targets)
//
// Every rank is one latent shard of a single replica (np 1: the unsharded SAE). Rank 0 holds the
// rows in memory and passes every batch to the other latent shards (BroadcastBatchSource, as
// saetrain does), so the broadcast is part of each timed step. Prints the tokens/s over the timed
// steps and each rank's peak resident memory (VmHWM) at the end of training, with the bytes of its
// parameters, gradient and Adam moments: the training footprint.
//
// --checkpoint-dir DIR then times a checkpoint of the SAE written to DIR beside the same bytes
// written sequentially with one fsync (the disk's limit, in the same run), and the resume from it
// (the files are likely in page cache). Sharded: every latent shard writes its part and the first
// the manifest (write_checkpoint_parts; --checkpoint-write gather: the whole SAE gathered to the
// first latent shard, which writes it, write_gathered, as checkpoints were written before the
// parts), and each latent shard resumes its latents from the parts, verifying its own.
// Unsharded: trainer_weights() and trainer_state() written as a run's writer thread does. Each
// rank's peak resident memory during the write is measured from a reset of the peak
// (/proc/self/clear_refs) as its rise over the memory resident before it, with the bytes it
// wrote (/proc/self/io) and the write's seconds. Run the two ways as two processes: memory a
// first write freed would stay resident and hide a second one's peak.
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "harness.h"
#include "saetrain/backend.h"
#include "saetrain/checkpoint_parts.h"
#include "saetrain/error.h"
#include "saetrain/metrics.h"
#include "saetrain/mpi_world.h"
#include "saetrain/rank_grid.h"
#include "saetrain/shared_source.h"
#include "saetrain/train_state.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"

using namespace saetrain;
using bench::Clock;
using bench::seconds_since;
namespace fs = std::filesystem;

namespace {

// Seconds to write `bytes` to `path` in 64 MiB writes and fsync it.
double raw_write_seconds(const std::string& path, int64_t bytes) {
    std::vector<char> block(size_t{64} << 20, 1);
    const auto t0 = Clock::now();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    SAE_ENFORCE(f != nullptr, "cannot create {}", path);
    for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(block.size()))
        std::fwrite(block.data(), 1, std::min<size_t>(block.size(), static_cast<size_t>(left)), f);
    std::fflush(f);
    fsync(fileno(f));
    std::fclose(f);
    const double secs = seconds_since(t0);
    fs::remove(path);
    return secs;
}

// A /proc/self/status field in bytes ("VmRSS", "VmHWM"), 0 when absent.
int64_t status_bytes(const char* field) {
    std::ifstream in("/proc/self/status");
    const std::string key = std::string(field) + ":";
    for (std::string line; std::getline(in, line);)
        if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
    return 0;
}

// Resets VmHWM to the current resident size (Linux 4.0+); false when the kernel refuses.
bool reset_peak_rss() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    return f.good();
}

int64_t bytes_written_by_this_process() {  // /proc/self/io "wchar"
    std::ifstream f("/proc/self/io");
    std::string key;
    int64_t value = 0;
    while (f >> key >> value)
        if (key == "wchar:") return value;
    return 0;
}

void time_checkpoint(SaeTrainer& tr, Communicator& world, const std::string& dir,
                     const SaeConfig& cfg, bool gather) {
    const bool first = world.rank() == 0;
    const std::string wpath = (fs::path(dir) / "bench.h5").string();
    const std::string spath = (fs::path(dir) / "bench.state.h5").string();
    const bool parts = tr.latent_sharded() && !gather;
    if (first) fs::create_directories(dir);
    TrainState header;
    header.step = tr.step_count(), header.tokens = tr.tokens(), header.cursors = {0, 0};
    const SaeMeta meta{cfg.arch, "bench", "", cfg.k, header.step, header.tokens};
    world.barrier();
    malloc_trim(0);  // what earlier phases freed leaves the resident set
    const int64_t rss0 = status_bytes("VmRSS"), wrote0 = bytes_written_by_this_process();
    const bool reset = reset_peak_rss();
    auto t0 = Clock::now();
    if (parts) {
        write_checkpoint_parts(tr, dir, meta, header);
    } else if (tr.latent_sharded()) {
        write_gathered(tr, first, wpath, spath, meta, header, false);
    } else {
        const SaeWeights w = trainer_weights(tr);
        TrainState s = trainer_state(tr);
        s.cursors = header.cursors;
        sae_write_h5(wpath, w, meta);
        train_state_write(spath, w, s);
    }
    const int64_t rise = reset ? status_bytes("VmHWM") - rss0 : -1;
    const int64_t wrote = bytes_written_by_this_process() - wrote0;
    world.barrier();
    const double write_s = seconds_since(t0);
    // Every rank's figures, for the first's table.
    const int S = world.size();
    const int64_t mine[2] = {rise, wrote};
    std::vector<int64_t> all(static_cast<size_t>(2 * S));
    world.allgather(mine, all.data(), sizeof(mine));
    int64_t bytes = 0;
    double raw_s = 0;
    const std::string manifest = checkpoint_manifest_path(dir, header.step);
    if (first) {
        if (parts) {
            for (const auto& e : fs::directory_iterator(dir))
                if (e.path().filename().string().rfind(fmt::format("checkpoint-{}.", header.step),
                                                       0) == 0)
                    bytes += static_cast<int64_t>(fs::file_size(e.path()));
        } else {
            bytes = static_cast<int64_t>(fs::file_size(wpath) + fs::file_size(spath));
        }
        raw_s = raw_write_seconds((fs::path(dir) / "raw.bin").string(), bytes);
    }
    world.barrier();
    t0 = Clock::now();
    if (parts) {
        const CheckpointParts files(manifest);
        const int64_t own = tr.store().latent_shard().first();
        for (int64_t k = 0; k < files.parts(); ++k)
            if (files.first_latent(k) >= own && files.first_latent(k) < own + tr.local_latents())
                files.verify(k);
        tr.restore(trainer_read_part(tr, files), header.step, header.tokens);
    } else if (tr.latent_sharded()) {
        CheckpointFiles files(wpath, spath);
        if (first) files.verify();
        tr.restore(trainer_read_part(tr, files), header.step, header.tokens);
    } else {
        const SaeWeights w = sae_read_h5(wpath);
        trainer_restore(tr, w, train_state_read(spath, w));
    }
    world.barrier();
    const double resume_s = seconds_since(t0);
    if (!first) return;
    if (parts) {
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().filename().string().rfind(fmt::format("checkpoint-{}.", header.step), 0) ==
                0)
                fs::remove(e.path());
    } else {
        fs::remove(wpath), fs::remove(spath);
    }
    const std::string how = parts ? "parts" : tr.latent_sharded() ? "gathered" : "pair";
    fmt::print("checkpoint ({}) of {:.1f} MB over {} latent shard(s), each rank's write:\n", how,
               static_cast<double>(bytes) / 1e6, S);
    fmt::print("{:>5} {:>16} {:>14}\n", "rank", "peak rise (MB)", "written (MB)");
    for (int r = 0; r < S; ++r)
        fmt::print("{:>5} {:>16.1f} {:>14.1f}\n", r, static_cast<double>(all[2 * r]) / 1e6,
                   static_cast<double>(all[2 * r + 1]) / 1e6);
    int64_t others_rise = 0, others_wrote = 0;
    for (int r = 1; r < S; ++r) {
        others_rise = std::max(others_rise, all[2 * r]);
        others_wrote = std::max(others_wrote, all[2 * r + 1]);
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    bench::Report r(fmt::format("checkpoint ({}) of {:.2f} GB ({} latent shard(s))", how, gb, S));
    r.add("checkpoint_write_GBps", gb / write_s, "GB/s", gb / raw_s,
          "the same bytes written sequentially with fsync");
    r.add("resume_GBps", gb / resume_s, "GB/s");
    r.add("first_peak_rise_bytes", static_cast<double>(all[0]), "B");
    r.add("others_peak_rise_bytes", static_cast<double>(others_rise), "B");
    r.add("first_written_bytes", static_cast<double>(all[1]), "B");
    r.add("others_written_bytes", static_cast<double>(others_wrote), "B");
    r.print();
}

}  // namespace

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    auto world = make_mpi_world();
    int64_t d = 768, n = 98304, k = 32, batch = 4096, steps = 3;
    std::string arch = "topk", checkpoint_dir;
    CLI::App app{"bench_latent_shards: one SAE over the ranks' latent shards"};
    app.add_option("--d-model", d)->capture_default_str();
    app.add_option("--latents", n)->capture_default_str();
    app.add_option("--k", k)->capture_default_str();
    app.add_option("--batch", batch, "rows per step")->capture_default_str();
    app.add_option("--steps", steps, "timed steps (after one warm-up step)")->capture_default_str();
    app.add_option("--arch", arch, "topk | relu | jumprelu")->capture_default_str();
    bool with_bound = true;
    app.add_flag("!--no-bound", with_bound,
                 "skip timing the GEMM-rate bound (one encoder GEMM of the shard, twice)");
    app.add_option("--checkpoint-dir", checkpoint_dir,
                   "also time a checkpoint written there, and the resume from it");
    std::string checkpoint_write = "parts";
    app.add_option("--checkpoint-write", checkpoint_write,
                   "latent-sharded: parts (every latent shard its own) | gather (to the first)")
        ->check(CLI::IsMember({"parts", "gather"}))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    const int S = world->size(), me = world->rank();

    SaeConfig cfg;
    cfg.arch = arch;
    cfg.n_latents = n;
    cfg.k = k;
    cfg.warmup_steps = 0;
    auto be = make_cpu_backend(1);
    // One SAE, one replica (nothing to all-reduce over replicas), the ranks its latent shards.
    const GridComms comms = RankGrid(1, 1, S, false).connect(*world);
    const LatentShard part = comms.latent_shard(n);
    SaeTrainer tr(cfg, d, steps + 1, 0, *be, *comms.replicas, &part);

    std::unique_ptr<MemoryBatchSource> rows;
    if (me == 0) {
        std::mt19937 rng(0);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>((steps + 1) * batch * d));
        for (float& v : x) v = normal(rng);
        rows = std::make_unique<MemoryBatchSource>(std::move(x), d);
    }
    // np 1: no latent shard group (the unsharded SAE); the world is that one rank.
    BroadcastBatchSource src(rows.get(), comms.latent_shards ? *comms.latent_shards : *world, d);
    std::vector<float> x(static_cast<size_t>(batch * d));
    src.next(x.data(), batch);
    tr.init(x.data(), batch);
    const double secs = bench::time_span(
        1, static_cast<int>(steps), [&] { world->barrier(); },
        [&] {
            src.next(x.data(), batch);
            tr.step(x.data(), batch);
        });
    const double tok_s = static_cast<double>(steps * batch) / secs;
    // The limit: a rank's GEMM rate on the encoder shape of its n / S latents (the step's FLOPs
    // are the encoder's, dense, plus a sparse part), over the FLOPs per token of those latents.
    double bound = std::nan("");
    if (with_bound) {
        const int64_t own = n / S;
        const double rate = bench::gemm_flops_per_s(*be, {{false, true, batch, own, d}}, 1);
        bound = rate / tr.arch().flops_per_token(cfg, d, own);
    }

    double peak = static_cast<double>(host_peak_rss_bytes());
    std::vector<double> peaks(static_cast<size_t>(S));
    world->allgather(&peak, peaks.data(), sizeof(double));
    const double state_bytes = 4.0 * static_cast<double>(tr.layout().total()) * sizeof(float);
    if (me == 0) {
        double worst = 0;
        for (double p : peaks) worst = std::max(worst, p);
        fmt::print(
            "{} SAE d {} x n {} (k {}), batch {}, {} latent shard(s) x 1 thread: {:.0f} tok/s "
            "over {} steps ({:.2f} s/step); per rank: parameters + gradient + Adam {:.2f} GB, "
            "peak resident {:.2f} GB (largest over ranks)\n",
            arch, d, n, k, batch, S, tok_s, steps, secs / static_cast<double>(steps),
            state_bytes / 1e9, worst / 1e9);
        bench::Report r(fmt::format("{} SAE d {} x n {} over {} latent shard(s)", arch, d, n, S));
        r.add("tokens_per_s", tok_s, "tok/s", bound,
              "one rank's GEMM rate on its n/S latents' encoder / their FLOPs per token");
        r.add("peak_bytes", worst, "B");
        r.add("state_bytes", state_bytes, "B");
        r.print();
    }
    if (!checkpoint_dir.empty())
        time_checkpoint(tr, *world, checkpoint_dir, cfg, checkpoint_write == "gather");
    return 0;
}
