// bench_latent_shards — run under mpirun: one wide SAE split into latent shards (issue 15).
//
//   mpirun -np 1 bench_latent_shards ...; mpirun -np 2 bench_latent_shards ...
//   (bench/latent_shards.sh runs both and prints the ratios beside the targets)
//
// Every rank is one latent shard of a single replica (np 1: the unsharded SAE). Rank 0 holds the
// rows in memory and passes every batch to the other shards (BroadcastBatchSource, as saetrain
// does), so the broadcast is part of each timed step. Prints the tokens/s over the timed steps
// and each rank's peak resident memory (VmHWM) at the end of training, with the bytes of its
// parameters, gradient and Adam moments: the training footprint, without the whole-SAE copy a
// checkpoint gathers onto the first shard.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <random>

#include "saetrain/backend.h"
#include "saetrain/metrics.h"
#include "saetrain/mpi_world.h"
#include "saetrain/shared_source.h"
#include "saetrain/trainer.h"

using namespace saetrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    auto world = make_mpi_world();
    int64_t d = 768, n = 98304, k = 32, batch = 4096, steps = 3;
    std::string arch = "topk";
    CLI::App app{"bench_latent_shards: one SAE over the ranks' latent shards"};
    app.add_option("--d-model", d)->capture_default_str();
    app.add_option("--latents", n)->capture_default_str();
    app.add_option("--k", k)->capture_default_str();
    app.add_option("--batch", batch, "rows per step")->capture_default_str();
    app.add_option("--steps", steps, "timed steps (after one warm-up step)")->capture_default_str();
    app.add_option("--arch", arch, "topk | relu | jumprelu")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    const int S = world->size(), me = world->rank();

    SaeConfig cfg;
    cfg.arch = arch;
    cfg.n_latents = n;
    cfg.k = k;
    cfg.warmup_steps = 0;
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();  // one replica: nothing to all-reduce over replicas
    LatentShard part;
    part.group = part.backend_group = world.get();
    part.index = me, part.count = S, part.n_total = n;
    SaeTrainer tr(cfg, d, steps + 1, 0, *be, *self, &part);

    std::unique_ptr<MemoryBatchSource> rows;
    if (me == 0) {
        std::mt19937 rng(0);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>((steps + 1) * batch * d));
        for (float& v : x) v = normal(rng);
        rows = std::make_unique<MemoryBatchSource>(std::move(x), d);
    }
    BroadcastBatchSource src(rows.get(), *world, d);
    std::vector<float> x(static_cast<size_t>(batch * d));
    src.next(x.data(), batch);
    tr.init(x.data(), batch);
    tr.step(x.data(), batch);  // warm-up
    world->barrier();
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < steps; ++s) {
        src.next(x.data(), batch);
        tr.step(x.data(), batch);
    }
    world->barrier();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tok_s = static_cast<double>(steps * batch) / secs;

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
        fmt::print("RESULT tokens_per_s={:.1f} peak_bytes={:.0f} state_bytes={:.0f}\n", tok_s,
                   worst, state_bytes);
    }
    return 0;
}
