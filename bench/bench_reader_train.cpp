// bench_reader_train — a CPU training run fed by the reader beside the same run fed from memory.
//
// Trains one TopK SAE for --steps steps twice: once from MemoryBatchSource (the rows already in
// RAM: the limit), once from ShardBatchSource over the same shards (background reads, shuffle),
// both delivering the rows as saetrain does: in the shards' element type, widened on upload.
// Prints tokens/s of both, their ratio, the reader run's starvation (wait_fraction: time
// next() blocked on the reader over wall time) and the bytes per token each stage moves.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "harness.h"
#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/loader.h"
#include "saetrain/train_loop.h"
#include "saetrain/trainer.h"

using namespace saetrain;

int main(int argc, char** argv) {
    CLI::App app{"CPU training tokens/s: reader in the loop vs rows from memory."};
    std::string data;
    int64_t batch = 4096, steps = 60, n_latents = 6144, k = 32, shuffle_rows = 262144;
    int threads = 0;
    app.add_option("DATA", data, "dataset")->required();
    app.add_option("--batch", batch)->capture_default_str();
    app.add_option("--steps", steps)->capture_default_str();
    app.add_option("--n-latents", n_latents)->capture_default_str();
    app.add_option("--k", k)->capture_default_str();
    app.add_option("--shuffle-rows", shuffle_rows)->capture_default_str();
    app.add_option("--threads", threads, "CPU backend threads (0: all)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const DatasetInfo info = dataset_open(data);
    const int64_t rows = std::min(info.total_rows, batch * steps);
    auto be = make_cpu_backend(threads);
    auto self = make_self_comm();
    SaeConfig cfg;
    cfg.arch = "topk";
    cfg.n_latents = n_latents;
    cfg.k = k;
    cfg.warmup_steps = 10;
    LoopOptions lo;
    lo.batch_size = batch;
    lo.log_every = 1000000;

    // Memory: the rows the reader will deliver, read up front.
    LoaderOptions ro;
    ro.shuffle_rows = shuffle_rows;
    ro.max_rows = rows;
    ro.widen = false;  // as saetrain: rows as stored, widened by the backend on upload
    const int64_t values = rows * info.d_model;
    std::unique_ptr<MemoryBatchSource> msrc;
    {
        ShardBatchSource pre(info, RowRange{0, info.total_rows}, ro);
        if (info.dtype == DType::f32) {
            std::vector<float> mem(static_cast<size_t>(values));
            pre.next(mem.data(), rows);
            msrc = std::make_unique<MemoryBatchSource>(std::move(mem), info.d_model, 1);
        } else {
            std::vector<uint16_t> mem(static_cast<size_t>(values));
            pre.next(mem.data(), rows);
            msrc = std::make_unique<MemoryBatchSource>(std::move(mem), info.dtype, info.d_model, 1);
        }
    }
    SaeTrainer t1(cfg, info.d_model, steps, 0, *be, *self);
    const LoopResult a = train_loop(t1, *msrc, lo);

    ShardBatchSource rsrc(info, RowRange{0, info.total_rows}, ro);
    SaeTrainer t2(cfg, info.d_model, steps, 0, *be, *self);
    const LoopResult b = train_loop(t2, rsrc, lo);

    bench::Report r(fmt::format("TopK n {} k {}, batch {}, {} steps: the reader beside memory",
                                n_latents, k, batch, b.steps));
    r.add("memory_tokens_per_s", a.tokens_per_s, "tok/s");
    r.add("reader_tokens_per_s", b.tokens_per_s, "tok/s", a.tokens_per_s,
          "the same rows from memory (target >= 97%)");
    r.add("reader_wait_percent", 100 * b.wait_fraction, "%", std::nan(""),
          "time next() blocked on the reader (target < 3%)");
    r.print();
    // What one token costs on the way, by stage (d_model values of the element size each).
    const auto stored = static_cast<long long>(info.d_model * dtype_size(info.dtype));
    const auto wide = static_cast<long long>(info.d_model * 4);
    std::printf(
        "bytes per token: disk %lld (%s) | shuffle window, ring, next(), batch %lld (%s) | "
        "upload %lld, widened on the backend to %lld (float32)\n",
        stored, dtype_name(info.dtype), stored, dtype_name(rsrc.dtype()), stored, wide);
    return 0;
}
