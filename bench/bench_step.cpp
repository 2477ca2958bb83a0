// bench_step — tokens/s of one SAE training step on a backend (CPU, or CUDA with --backend cuda),
// beside the limit that the backend's own GEMM rate (OpenBLAS sgemm, cuBLASLt) sets for the same
// FLOPs on the same shapes, measured in the same run. Device work is synchronized before each
// clock read, so GPU figures are whole-step times, not launch times.
//
// Every architecture of the registry (or --arch), each with its own FLOPs per token (arch.h):
// dense ReLU-L1 and JumpReLU steps = five d x n GEMMs = 10*d*n, Gated seven = 14*d*n; TopK and
// BatchTopK with the sparse decoder and backward = 2*d*n (dense encoder) + 8*k*d; Switch (E
// experts, --experts) = 2*d*n/E (the chosen expert's encoder) + 8*k*d + 4*d*E (router). The GEMM
// bound is the rate of the five dense GEMM shapes divided by those FLOPs; "x topk" is the step
// time over TopK's at the same shape, beside the FLOP ratio that would explain it.
#include <cblas.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "harness.h"
#include "saetrain/arch.h"
#include "saetrain/backend.h"
#include "saetrain/backend_registry.h"
#include "saetrain/comm.h"
#include "saetrain/forwarding_backend.h"
#include "saetrain/loader.h"
#include "saetrain/shards.h"
#include "saetrain/trainer.h"

using namespace saetrain;
using bench::Clock;

namespace {

// Forwards to a backend and accumulates wall time per op, to show where a step goes (the
// backend is synchronized around each op, so a GPU op's time is its own execution).
class TimedBackend final : public ForwardingBackend {
public:
    explicit TimedBackend(Backend& be) : ForwardingBackend(be) {}
    std::map<std::string, double> seconds;
    bool active = true;  // false: pass every call through untimed and unsynchronized

    void around(const std::string& op, const std::function<void()>& f) override {
        if (!active) return f();
        inner().synchronize();
        const auto t0 = Clock::now();
        f();
        inner().synchronize();
        seconds[op] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
};

// The SaeConfig timed for `arch`. A key with no default gets the bench's choice: Matryoshka's
// prefixes are a sixteenth and a quarter of the latents (the frontier's [384, 1536] of 6,144).
// A CLT's shape and activation (--layers, --k-scope, --activation; a transcoder's activation too).
struct LayeredOptions {
    int64_t layers = 1;
    std::string k_scope = "token", activation = "topk";
};

SaeConfig bench_config(const std::string& arch, int64_t n, int64_t k, int64_t experts,
                       double l1_coeff, const std::string& optimizer, int64_t dead_tokens,
                       const LayeredOptions& lay = {}) {
    SaeConfig cfg;
    cfg.arch = arch;
    if (arch == "clt") {
        cfg.layers = lay.layers;
        cfg.set("sae.k_scope", lay.k_scope);
    }
    if (arch == "clt" || arch == "transcoder" || arch == "skip_transcoder")
        cfg.set("sae.transcoder_activation", lay.activation);
    cfg.n_latents = n;
    cfg.k = k;
    cfg.l1_coeff = l1_coeff;
    cfg.optimizer = optimizer;
    cfg.set("sae.n_experts", experts);
    if (arch == "matryoshka_batchtopk")
        cfg.set("sae.matryoshka_prefixes", IntList{std::max<int64_t>(1, n / 16), n / 4});
    if (dead_tokens > 0) cfg.dead_tokens = dead_tokens;
    return cfg;
}

// Steps on real batches: the SAE first trains `train_steps` steps on the stream (so latent
// statistics, e.g. how unevenly latents fire, are those of training), then `reps` steps are
// timed one by one (the batch is fetched outside the timed region), then one step is broken
// down by op. `x` is a pinned (or heap) buffer of x_floats floats for the batch.
int bench_on_data(Backend& be, const std::string& path, const std::vector<std::string>& archs,
                  int64_t n, int64_t k, int64_t experts, int64_t batch, int64_t train_steps,
                  int reps, float* x, int64_t x_floats, bool breakdown, int64_t dead_tokens,
                  const std::string& optimizer) {
    const DatasetInfo info = dataset_open(path);
    const int64_t d = info.d_model;
    LoaderOptions lo;
    lo.epochs = 1000;
    lo.shuffle_rows = 262144;
    lo.copy_threads = 4;
    lo.convert_threads = 4;
    lo.widen = false;  // as saetrain: the step uploads the stored rows and widens them
    ShardBatchSource source(info, {0, info.total_rows}, lo);
    std::vector<float> buf;
    auto self = make_self_comm();
    fmt::print(
        "bench_step | {} | data {} (d_model {}) | n_latents {} k {} batch {} | {} "
        "training steps, then median of {} | optimizer {}\n",
        be.name(), path, d, n, k, batch, train_steps, reps, optimizer);
    for (const std::string& arch : archs) {
        if (arch_get(arch).rows().target) {  // its rows are [x | y] pairs; these shards are not
            fmt::print("{:<10} skipped: --data holds single activations, not transcoder pairs\n",
                       arch);
            continue;
        }
        const SaeConfig cfg = bench_config(arch, n, k, experts, 5.0, optimizer, dead_tokens);
        TimedBackend timed(be);
        timed.active = false;
        SaeTrainer tr(cfg, d, train_steps + reps + 2, 0, timed, *self);
        // x (pinned on a CUDA rank) when it is large enough for this dataset's rows.
        if (batch * d > x_floats) buf.resize(static_cast<size_t>(batch * d));
        float* batch_mem = batch * d <= x_floats ? x : buf.data();
        const BatchView rows{batch_mem, source.dtype()};  // 16-bit rows fit a float buffer
        source.next(batch_mem, batch);
        tr.init(rows, batch);
        for (int64_t s = 0; s < train_steps; ++s) {
            source.next(batch_mem, batch);
            tr.step(rows, batch);
        }
        // Each timed step on a fresh batch, fetched outside the clock.
        bench::Timing t;
        for (int i = 0; i < reps; ++i) {
            source.next(batch_mem, batch);
            be.synchronize();
            t.seconds.push_back(bench::time_span(
                0, 1, [&] { be.synchronize(); }, [&] { tr.step(rows, batch); }));
        }
        if (breakdown) {
            source.next(batch_mem, batch);
            timed.active = true;
            tr.step(rows, batch);
            for (const auto& [op, sec] : timed.seconds)
                fmt::print("    {:<28} {:>9.3f} ms\n", op, sec * 1e3);
        }
        const double step_s = t.median();
        fmt::print("{:<10} step {:.2f} ms, {:.0f} tokens/s after {} steps (dead {:.1f}%)\n", arch,
                   step_s * 1e3, static_cast<double>(batch) / step_s, train_steps,
                   100.0 * tr.dead_fraction());
        std::fflush(stdout);
    }
    return 0;
}

int run(int argc, char** argv) {
    int64_t d = 768, n = 6144, k = 32, batch = 4096, experts = 16, dead_tokens = 0;
    int reps = 5, threads = 0, device = 0;
    bool json = false, breakdown = false, pinned = true;
    std::string backend = "cpu", gemm = "fp32", optimizer = "adam";
    CLI::App app{"bench_step: SAE training-step throughput vs the GEMM-rate limit"};
    app.add_option("--d-model", d);
    app.add_option("--latents", n);
    app.add_option("--k", k);
    app.add_option("--experts", experts, "Switch: sae.n_experts");
    app.add_option("--batch", batch);
    app.add_option("--reps", reps, "timed repetitions (median reported)");
    app.add_option("--threads", threads, "CPU threads (default: all)");
    app.add_flag("--json", json, "also print one JSON object");
    app.add_flag("--breakdown", breakdown, "print the time per backend op of one step");
    std::vector<std::string> archs = arch_names();
    app.add_option("--arch", archs, "architectures to time (default: all, TopK first)")
        ->check(CLI::IsMember(arch_names()));
    std::string data;
    int64_t train_steps = 200;
    app.add_option("--data", data,
                   "time steps on batches from these shards (a directory or glob), after "
                   "--train-steps steps of training on them, instead of on one random batch");
    app.add_option("--train-steps", train_steps, "with --data: steps before timing");
    app.add_option("--dead-tokens", dead_tokens,
                   "train.dead_tokens (0: the default): small values make latents dead within "
                   "the warm-up, so TopK's AuxK selection runs in the timed steps");
    app.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--device", device, "CUDA device (--backend cuda)");
    app.add_option("--gemm", gemm, "CUDA GEMM operands: fp32 | tf32 | bf16 (--backend cuda)")
        ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
    // adam by default: the figures on record (docs/cuda.md) are AdamW steps; auto times each
    // architecture's default optimizer (signum for TopK, BatchTopK and Switch).
    app.add_option("--optimizer", optimizer, "train.optimizer: adam (default) | signum | auto")
        ->check(CLI::IsMember({"adam", "signum", "auto"}));
    app.add_flag("!--pageable", pinned,
                 "CUDA: upload the batch from pageable memory (default: pinned, as saetrain)");
    LayeredOptions lay;
    app.add_option("--layers", lay.layers,
                   "clt: its layers, each of --d-model values (the trainer's d_model is layers x "
                   "d-model) and --latents / layers features (default 1)")
        ->check(CLI::PositiveNumber);
    app.add_option("--k-scope", lay.k_scope,
                   "clt: sae.k_scope, token (default) | layer (--k a layer)")
        ->check(CLI::IsMember({"token", "layer"}));
    app.add_option("--activation", lay.activation,
                   "clt and transcoders: sae.transcoder_activation, topk (default) | batchtopk | "
                   "jumprelu")
        ->check(CLI::IsMember({"topk", "batchtopk", "jumprelu"}));
    CLI11_PARSE(app, argc, argv);
    // TopK first: the others' "x topk" ratios need its time.
    std::stable_partition(archs.begin(), archs.end(),
                          [](const std::string& a) { return a == "topk"; });

    BackendRequest request;
    request.choice = backend;
    request.threads = threads;
    request.local_rank = device;
    request.gemm = gemm;
    std::unique_ptr<Backend> be;
    try {
        std::string note;
        be = make_backend(request, &note);
    } catch (const std::exception& e) {
        fmt::print(stderr, "bench_step: {}\n", e.what());
        return 1;
    }
    auto self = make_self_comm();
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Twice a batch's floats: a transcoder's rows are its input and its target side by side,
    // [batch, 2 d]; an SAE reads the first batch x d.
    // A CLT's rows are its layers' pairs side by side: [batch, 2 layers d].
    const bool clt = std::find(archs.begin(), archs.end(), "clt") != archs.end();
    std::vector<float> x_heap(static_cast<size_t>(2 * batch * d * (clt ? lay.layers : 1)));
    for (float& v : x_heap) v = normal(rng);
    // The batch as saetrain holds it: pinned host memory on a CUDA rank (the upload is a DMA).
    float* x = x_heap.data();
    std::unique_ptr<void, std::function<void(void*)>> x_pinned;
    if (const HostAllocator al = be->host_allocator(); al.alloc && pinned) {
        const size_t bytes = x_heap.size() * sizeof(float);
        x_pinned = {al.alloc(bytes), [al, bytes](void* p) { al.free(p, bytes); }};
        if (!x_pinned) {
            fmt::print(stderr, "bench_step: cannot allocate {} bytes of pinned memory\n", bytes);
            return 1;
        }
        x = static_cast<float*>(std::memcpy(x_pinned.get(), x_heap.data(), bytes));
    }

    if (!data.empty())
        return bench_on_data(*be, data, archs, n, k, experts, batch, train_steps, reps, x,
                             static_cast<int64_t>(x_heap.size()), breakdown, dead_tokens,
                             optimizer);

    nlohmann::ordered_json out;
    out["backend"] = be->name();
    out["batch_memory"] = x_pinned ? "pinned" : "pageable";
    out["optimizer"] = optimizer;
    out["shape"] = {{"d_model", d}, {"n_latents", n}, {"k", k}, {"batch", batch}};
    fmt::print(
        "bench_step | {} | d_model {} n_latents {} k {} batch {} | {} batch | median of {} | "
        "optimizer {}\n",
        be->name(), d, n, k, batch, x_pinned ? "pinned" : "pageable", reps, optimizer);
    // The GEMM rate of the dense step's five shapes: what every architecture's bound uses.
    const double rate = bench::gemm_flops_per_s(*be, bench::dense_step_gemms(batch, d, n), reps);
    out["gemm_GFLOPs"] = rate / 1e9;
    fmt::print("GEMM rate {:.1f} GFLOP/s (the five d x n shapes of a dense step)\n", rate / 1e9);
    fmt::print("{:<10} {:>10} {:>11} {:>11} {:>11} {:>9} {:>8} {:>9}\n", "arch", "step", "tokens/s",
               "FLOP/token", "GEMM-bound", "fraction", "x topk", "FLOPs x");
    fmt::print("{:<10} {:>10} {:>11} {:>11} {:>11} {:>9} {:>8} {:>9}\n", "", "ms", "tok/s", "MFLOP",
               "tok/s", "%", "time", "topk");
    double topk_s = 0, topk_flops = 0;
    for (const std::string& arch : archs) {
        SaeConfig cfg = bench_config(arch, n, k, experts, 1.0, optimizer, dead_tokens, lay);
        cfg.warmup_steps = 0;
        const int64_t dt = arch == "clt" ? lay.layers * d : d;  // the trainer's d_model
        if (arch == "clt")
            fmt::print("clt        {} layers of d_model {}, {} features a layer, k {} a {}, {}\n",
                       lay.layers, d, n / lay.layers, k,
                       lay.k_scope == "layer" ? "layer" : "token and layer on average",
                       lay.activation);
        SaeTrainer tr(cfg, dt, 1000, 0, *be, *self);
        tr.init(x, batch);
        const double step_s = bench::time_calls(
                                  2, reps, [&] { be->synchronize(); }, [&] { tr.step(x, batch); })
                                  .median();
        // The same steps back to back with one clock read around them, as the training loop
        // runs them: the next batch's upload may then overlap the previous step's tail.
        const double streamed_s =
            bench::time_span(
                0, reps, [&] { be->synchronize(); }, [&] { tr.step(x, batch); }) /
            reps;
        const double flops_per_token = tr.arch().flops_per_token(cfg, dt, n);
        if (arch == "topk") topk_s = step_s, topk_flops = flops_per_token;
        const double bound = rate / flops_per_token;
        const double tps = static_cast<double>(batch) / step_s;
        if (breakdown) {
            TimedBackend timed(*be);
            SaeTrainer tt(cfg, dt, 1000, 0, timed, *self);
            tt.init(x, batch);
            tt.step(x, batch);  // warm-up
            timed.seconds.clear();
            tt.step(x, batch);
            for (const auto& [op, sec] : timed.seconds)
                fmt::print("    {:<28} {:>9.3f} ms\n", op, sec * 1e3);
        }
        if (dead_tokens > 0)
            fmt::print("{:<10} dead latents after the timed steps: {:.1f}%\n", arch,
                       100.0 * tr.dead_fraction());
        const double vs_time = topk_s > 0 ? step_s / topk_s : 0;
        const double vs_flops = topk_flops > 0 ? flops_per_token / topk_flops : 0;
        fmt::print("{:<10} {:>10.1f} {:>11.0f} {:>11.2f} {:>11.0f} {:>9.1f} {:>8.2f} {:>9.2f}\n",
                   arch, step_s * 1e3, tps, flops_per_token / 1e6, bound, 100.0 * tps / bound,
                   vs_time, vs_flops);
        fmt::print(
            "{:<10} streamed: {:.3f} ms a step over {} back-to-back steps, {:.0f} tokens/s\n", arch,
            streamed_s * 1e3, reps, static_cast<double>(batch) / streamed_s);
        std::fflush(stdout);  // each architecture's lines survive a later one's failure
        out[arch] = {{"step_ms", step_s * 1e3},
                     {"streamed_step_ms", streamed_s * 1e3},
                     {"tokens_per_s", tps},
                     {"flops_per_token", flops_per_token},
                     {"gemm_bound_tokens_per_s", bound},
                     {"fraction_of_bound", tps / bound},
                     {"step_time_vs_topk", vs_time},
                     {"flops_vs_topk", vs_flops}};
    }
    if (json) fmt::print("{}\n", out.dump());
    return 0;
}

}  // namespace

// A config or backend error is one line and exit 1, not std::terminate's abort.
int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "bench_step: {}\n", e.what());
        return 1;
    }
}
