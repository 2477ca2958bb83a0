// bench_scaling — run under mpirun: data-parallel weak scaling and shared-sweep I/O.
//
//   mpirun -np 1 bench_scaling ...; mpirun -np 2 bench_scaling ...   (bench/scaling.sh does both)
//
// 1. Data parallel: every rank a replica with its own in-memory rows (no disk), one thread
//    each; prints the job's tokens/s, to compare with N x the 1-rank figure (weak scaling).
// 2. Shared sweep (with --data): every rank reads only its slice of the shards and the slices
//    are all-gathered, as saetrain does (rows in the shards' element type); prints the bytes each
//    rank read beside the dataset size, showing that one pass of disk I/O feeds every SAE of
//    the sweep, and the all-gather's bytes per token.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <random>

#include "harness.h"
#include "saetrain/backend.h"
#include "saetrain/loader.h"
#include "saetrain/mpi_world.h"
#include "saetrain/shared_source.h"
#include "saetrain/trainer.h"

using namespace saetrain;

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    auto world = make_mpi_world();
    int64_t d = 768, n = 6144, k = 32, batch = 1024, steps = 6;
    std::string arch = "topk", data;
    bool independent = false;
    CLI::App app{"bench_scaling: data-parallel weak scaling and shared-sweep bytes read"};
    app.add_option("--d-model", d);
    app.add_option("--latents", n);
    app.add_option("--k", k);
    app.add_option("--batch", batch, "rows per rank per step");
    app.add_option("--steps", steps, "timed steps (after one warm-up step)");
    app.add_option("--arch", arch, "topk | relu");
    app.add_option("--data", data, "shards for the shared-sweep I/O check (optional)");
    app.add_flag("--independent", independent,
                 "no gradient all-reduce (each rank its own SAE): separates the cost of the "
                 "all-reduce from contention between ranks");
    CLI11_PARSE(app, argc, argv);
    const bool root = world->rank() == 0;

    // --- 1. data-parallel weak scaling -----------------------------------------------------
    auto be = make_cpu_backend(1);
    SaeConfig cfg;
    cfg.arch = arch;
    cfg.n_latents = n;
    cfg.k = k;
    cfg.warmup_steps = 0;
    auto self = make_self_comm();
    std::mt19937 rng(static_cast<uint32_t>(world->rank()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(batch * d));
    for (float& v : x) v = normal(rng);
    // The limit, in this run: rank 0 alone (the others wait), then every rank at once.
    double alone_tps = 0;
    if (root) {
        SaeTrainer solo(cfg, d, steps + 1, 0, *be, *self);
        solo.init(x.data(), batch);
        alone_tps =
            static_cast<double>(batch * steps) /
            bench::time_span(1, static_cast<int>(steps), {}, [&] { solo.step(x.data(), batch); });
    }
    world->barrier();
    SaeTrainer tr(cfg, d, steps + 1, 0, *be, independent ? *self : *world);
    tr.init(x.data(), batch);
    const double sec = bench::time_span(
        1, static_cast<int>(steps), [&] { world->barrier(); }, [&] { tr.step(x.data(), batch); });
    const double tps = static_cast<double>(batch * steps * world->size()) / sec;
    if (root) {
        const double ranks = world->size();
        bench::Report r(fmt::format(
            "data_parallel {} | d_model {} n_latents {} k {} | {} rank(s) x 1 thread, {} "
            "rows/rank/step | optimizer: {}",
            arch, d, n, k, world->size(), batch,
            independent          ? "one per rank (no exchange)"
            : tr.splits_update() ? "node memory, update split over the replicas"
            : world->size() > 1  ? "gradients all-reduced by messages"
                                 : "one rank"));
        r.add("dp_tokens_per_s", tps, "tok/s", ranks * alone_tps,
              "ranks x rank 0's tokens/s alone in this run (perfect weak scaling)");
        r.add("tokens_per_s_per_rank", tps / ranks, "tok/s", alone_tps, "rank 0 alone");
        r.print();
    }

    // --- 2. shared sweep: bytes read per rank -------------------------------------------------
    if (!data.empty()) {
        const DatasetInfo info = dataset_open(data);
        LoaderOptions lo;
        lo.widen = false;  // as saetrain: 16-bit rows are all-gathered as stored
        ShardBatchSource local(info, partition_rows(info.total_rows, world->rank(), world->size()),
                               lo);
        SharedBatchSource stream(local, *world, batch);
        std::vector<char> buf(static_cast<size_t>(batch * info.d_model * dtype_size(info.dtype)));
        int64_t rows = 0;
        for (;;) {
            const int64_t got = stream.next(buf.data(), batch);
            int64_t any = got > 0;
            world->allreduce_max(&any, 1);
            if (!any) break;
            rows += got;
        }
        std::vector<int64_t> bytes(static_cast<size_t>(world->size()));
        const int64_t mine = local.bytes_read();
        world->allgather(&mine, bytes.data(), sizeof(int64_t));
        if (root) {
            const double size =
                static_cast<double>(info.total_rows * info.d_model * dtype_size(info.dtype));
            double sum = 0;
            fmt::print(
                "\nshared sweep over {} | {} rows, {:.1f} MB | every rank trained on {} rows\n",
                data, info.total_rows, size / 1e6, rows);
            fmt::print("{:>8} {:>14}\n", "rank", "MB read");
            for (int r = 0; r < world->size(); ++r) {
                fmt::print("{:>8} {:>14.2f}\n", r, static_cast<double>(bytes[r]) / 1e6);
                sum += static_cast<double>(bytes[r]);
            }
            fmt::print("{:>8} {:>14.2f}   = {:.3f} x the dataset for {} SAEs\n", "all", sum / 1e6,
                       sum / size, world->size());
            // The all-gather: what rank 0 received from the others, per token it trained on
            // (the others' rows in their element type, plus each block's row count and the
            // padding of short last blocks).
            const int64_t stored = info.d_model * dtype_size(info.dtype);
            fmt::print(
                "all-gather: {:.2f} MB received by rank 0, {:.0f} B per token trained (rows as "
                "{}: (G-1)/G x {} B = {:.0f} B, plus counts and padding)\n",
                static_cast<double>(stream.bytes_exchanged()) / 1e6,
                rows > 0 ? static_cast<double>(stream.bytes_exchanged()) / static_cast<double>(rows)
                         : 0.0,
                dtype_name(stream.dtype()), stored,
                static_cast<double>(stored) * (world->size() - 1) / world->size());
        }
    }
    return 0;
}
