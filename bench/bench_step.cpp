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
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/backend.h"
#include "saetrain/backend_registry.h"
#include "saetrain/comm.h"
#include "saetrain/loader.h"
#include "saetrain/shards.h"
#include "saetrain/trainer.h"

using namespace saetrain;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of `reps` calls of f after two warm-up calls, each call's device work
// included (the backend is synchronized before each clock read).
template <typename F>
double time_median(Backend& be, int reps, F&& f) {
    for (int w = 0; w < 2; ++w) f();
    be.synchronize();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        f();
        be.synchronize();
        t.push_back(seconds(t0));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Gemm {
    bool ta, tb;
    int64_t m, n, k;
};

// Seconds for the given row-major GEMMs, called exactly as the trainer calls them, on random
// operands in the backend's memory (never zeros: they can run faster than real data).
double time_gemms(Backend& be, const std::vector<Gemm>& shapes, int reps) {
    int64_t most = 0;
    for (const Gemm& g : shapes) most = std::max({most, g.m * g.k, g.k * g.n, g.m * g.n});
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> host(static_cast<size_t>(most));
    for (float& v : host) v = normal(rng);
    DeviceArray<float> a(be, most), b(be, most), c(be, most);
    be.upload(a.data(), host.data(), a.bytes());
    be.upload(b.data(), host.data(), b.bytes());
    return time_median(be, reps, [&] {
        for (const Gemm& g : shapes)
            be.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(),
                    g.tb ? g.k : g.n, 0.0f, c.data(), g.n);
    });
}

// Forwards to a backend and accumulates wall time per op, to show where a step goes (the
// backend is synchronized after each op, so a GPU op's time is its own execution).
class TimedBackend final : public Backend {
public:
    explicit TimedBackend(Backend& be) : be_(be) {}
    std::map<std::string, double> seconds;
    bool active = true;  // false: pass every call through untimed and unsynchronized
    std::string name() const override { return be_.name(); }
    void* alloc_bytes(int64_t b) override { return be_.alloc_bytes(b); }
    void free_bytes(void* p) override { be_.free_bytes(p); }
    void upload(void* d, const void* s, int64_t b) override {
        timed("upload", [&] { be_.upload(d, s, b); });
    }
    void download(void* d, const void* s, int64_t b) override {
        timed("download", [&] { be_.download(d, s, b); });
    }
    void upload_rows(float* d, const void* s, DType t, int64_t n) override {
        timed("upload_rows", [&] { be_.upload_rows(d, s, t, n); });
    }
    void fill(float* x, int64_t n, float v) override {
        timed("fill", [&] { be_.fill(x, n, v); });
    }
    void synchronize() override { be_.synchronize(); }
    bool host_memory() const override { return be_.host_memory(); }
    bool supports(BackendOp op, const OpShape& shape, std::string* why) const override {
        return be_.supports(op, shape, why);
    }
    HostAllocator host_allocator() const override { return be_.host_allocator(); }
    void* native_stream() const override { return be_.native_stream(); }
    void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
        timed(fmt::format("gemm {}x{}x{}", m, n, k),
              [&] { be_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
    }
    double sum_squares(const float* x, int64_t n) override {
        double r = 0;
        timed("sum_squares", [&] { r = be_.sum_squares(x, n); });
        return r;
    }
    void sub_rows(float* o, const float* x, const float* b, int64_t r, int64_t c) override {
        timed("sub_rows", [&] { be_.sub_rows(o, x, b, r, c); });
    }
    void broadcast_rows(float* o, const float* b, int64_t r, int64_t c) override {
        timed("broadcast_rows", [&] { be_.broadcast_rows(o, b, r, c); });
    }
    void residual(float* xh, const float* x, int64_t r, int64_t d, float g, float* xc, float* db,
                  float* st) override {
        timed("residual", [&] { be_.residual(xh, x, r, d, g, xc, db, st); });
    }
    void relu_forward(float* p, const float* b, int64_t r, int64_t n) override {
        timed("relu_forward", [&] { be_.relu_forward(p, b, r, n); });
    }
    void relu_backward(const float* z, float* dz, const float* nr, float l1, int64_t r, int64_t n,
                       float* db, float* zs, int32_t* f, float* st) override {
        timed("relu_backward", [&] { be_.relu_backward(z, dz, nr, l1, r, n, db, zs, f, st); });
    }
    void topk_forward(const float* p, const float* b, int64_t r, int64_t n, int64_t k, int32_t* i,
                      float* v, bool relu) override {
        timed("topk_forward", [&] { be_.topk_forward(p, b, r, n, k, i, v, relu); });
    }
    void topk_forward_columns(const float* p, const float* b, int64_t r, int64_t n,
                              const int32_t* cols, int64_t count, int64_t k, int32_t* i, float* v,
                              bool relu, float* scratch) override {
        timed("topk_forward_columns",
              [&] { be_.topk_forward_columns(p, b, r, n, cols, count, k, i, v, relu, scratch); });
    }
    void sparse_decode(const int32_t* i, const float* v, const float* w, int64_t r, int64_t k,
                       int64_t d, float* xh) override {
        timed("sparse_decode", [&] { be_.sparse_decode(i, v, w, r, k, d, xh); });
    }
    void topk_backward(const SparseBackward& a) override {
        timed("topk_backward", [&] { be_.topk_backward(a); });
    }
    void decorr_grad(const float* z, const int32_t* i, int64_t w, int64_t r, int64_t n, float s,
                     float* dz, float* st) override {
        timed("decorr_grad", [&] { be_.decorr_grad(z, i, w, r, n, s, dz, st); });
    }
    float batch_threshold(const float* p, const float* b, int64_t r, int64_t n,
                          int64_t c) override {
        float t = 0;
        timed("batch_threshold", [&] { t = be_.batch_threshold(p, b, r, n, c); });
        return t;
    }
    int64_t select_above(const float* p, const float* b, float t, int64_t r, int64_t n, int64_t w,
                         int32_t* i, float* v) override {
        int64_t m = 0;
        timed("select_above", [&] { m = be_.select_above(p, b, t, r, n, w, i, v); });
        return m;
    }
    void jumprelu_forward(float* p, const float* b, const float* lt, int64_t r, int64_t n,
                          float* z) override {
        timed("jumprelu_forward", [&] { be_.jumprelu_forward(p, b, lt, r, n, z); });
    }
    void jumprelu_backward(const JumpReluBackward& a) override {
        timed("jumprelu_backward", [&] { be_.jumprelu_backward(a); });
    }
    void gated_forward(const float* p, const float* bg, const float* rm, const float* bm, int64_t r,
                       int64_t n, float* z, float* g) override {
        timed("gated_forward", [&] { be_.gated_forward(p, bg, rm, bm, r, n, z, g); });
    }
    void gated_backward(const GatedBackward& a) override {
        timed("gated_backward", [&] { be_.gated_backward(a); });
    }
    void gather_rows(float* dst, const float* src, const int32_t* rows_of, const float* scale,
                     float beta, int64_t rows, int64_t cols) override {
        timed("gather_rows", [&] { be_.gather_rows(dst, src, rows_of, scale, beta, rows, cols); });
    }
    void gather_index_rows(int32_t* dst, const int32_t* src, const int32_t* rows_of, int64_t rows,
                           int64_t width) override {
        timed("gather_rows", [&] { be_.gather_index_rows(dst, src, rows_of, rows, width); });
    }
    void row_dots(const float* a, const float* b, int64_t rows, int64_t cols, float* out) override {
        timed("row_dots", [&] { be_.row_dots(a, b, rows, cols, out); });
    }
    void offset_indices(int32_t* idx, int64_t count, int32_t offset) override {
        timed("offset_indices", [&] { be_.offset_indices(idx, count, offset); });
    }
    void axpby(float* y, const float* x, float a, float b, int64_t n) override {
        timed("axpby", [&] { be_.axpby(y, x, a, b, n); });
    }
    void row_norms(const float* w, int64_t r, int64_t c, float* o) override {
        timed("row_norms", [&] { be_.row_norms(w, r, c, o); });
    }
    void project_out_parallel(const float* w, float* g, int64_t r, int64_t c) override {
        timed("project_out_parallel", [&] { be_.project_out_parallel(w, g, r, c); });
    }
    void normalize_rows(float* w, int64_t r, int64_t c) override {
        timed("normalize_rows", [&] { be_.normalize_rows(w, r, c); });
    }
    void add_norm_grad(const float* w, const float* co, float s, float* g, int64_t r,
                       int64_t c) override {
        timed("add_norm_grad", [&] { be_.add_norm_grad(w, co, s, g, r, c); });
    }
    void adam(float* p, const float* g, float* m, float* v, int64_t n,
              const math::AdamScalars& s) override {
        timed("adam", [&] { be_.adam(p, g, m, v, n, s); });
    }
    double optimizer_grad_sum_squares(const float* p, float* g, int64_t n,
                                      const UnitRows& u) override {
        double r = 0;
        timed("optimizer_sum_squares", [&] { r = be_.optimizer_grad_sum_squares(p, g, n, u); });
        return r;
    }
    void optimizer_apply(float* p, float* g, float* m, float* v, const std::vector<AdamRange>& r,
                         const UnitRows& u, math::AdamScalars s, float wd) override {
        timed("optimizer_apply", [&] { be_.optimizer_apply(p, g, m, v, r, u, s, wd); });
    }

private:
    template <typename F>
    void timed(const std::string& op, F&& f) {
        if (!active) return f();
        be_.synchronize();
        const auto t0 = Clock::now();
        f();
        be_.synchronize();
        seconds[op] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    Backend& be_;
};

// Steps on real batches: the SAE first trains `train_steps` steps on the stream (so latent
// statistics, e.g. how unevenly latents fire, are those of training), then `reps` steps are
// timed one by one (the batch is fetched outside the timed region), then one step is broken
// down by op. `x` is a pinned (or heap) buffer of x_floats floats for the batch.
int bench_on_data(Backend& be, const std::string& path, const std::vector<std::string>& archs,
                  int64_t n, int64_t k, int64_t experts, int64_t batch, int64_t train_steps,
                  int reps, float* x, int64_t x_floats, bool breakdown, int64_t dead_tokens) {
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
        "training steps, then median of {}\n",
        be.name(), path, d, n, k, batch, train_steps, reps);
    for (const std::string& arch : archs) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.n_latents = n;
        cfg.k = k;
        cfg.l1_coeff = 5.0;
        cfg.n_experts = experts;
        if (dead_tokens > 0) cfg.dead_tokens = dead_tokens;
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
        std::vector<double> t;
        for (int i = 0; i < reps; ++i) {
            source.next(batch_mem, batch);
            be.synchronize();
            const auto t0 = Clock::now();
            tr.step(rows, batch);
            be.synchronize();
            t.push_back(seconds(t0));
        }
        std::sort(t.begin(), t.end());
        if (breakdown) {
            source.next(batch_mem, batch);
            timed.active = true;
            tr.step(rows, batch);
            for (const auto& [op, sec] : timed.seconds)
                fmt::print("    {:<28} {:>9.3f} ms\n", op, sec * 1e3);
        }
        const double step_s = t[t.size() / 2];
        fmt::print("{:<10} step {:.2f} ms, {:.0f} tokens/s after {} steps (dead {:.1f}%)\n", arch,
                   step_s * 1e3, static_cast<double>(batch) / step_s, train_steps,
                   100.0 * tr.dead_fraction());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int64_t d = 768, n = 6144, k = 32, batch = 4096, experts = 16, dead_tokens = 0;
    int reps = 5, threads = 0, device = 0;
    bool json = false, breakdown = false, pinned = true;
    std::string backend = "cpu", gemm = "fp32";
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
    app.add_flag("!--pageable", pinned,
                 "CUDA: upload the batch from pageable memory (default: pinned, as saetrain)");
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
    std::vector<float> x_heap(static_cast<size_t>(batch * d));
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
                             static_cast<int64_t>(x_heap.size()), breakdown, dead_tokens);

    nlohmann::ordered_json out;
    out["backend"] = be->name();
    out["batch_memory"] = x_pinned ? "pinned" : "pageable";
    out["shape"] = {{"d_model", d}, {"n_latents", n}, {"k", k}, {"batch", batch}};
    fmt::print(
        "bench_step | {} | d_model {} n_latents {} k {} batch {} | {} batch | median of {}\n",
        be->name(), d, n, k, batch, x_pinned ? "pinned" : "pageable", reps);
    // The GEMM rate of the dense step's five shapes: what every architecture's bound uses.
    const std::vector<Gemm> shapes = {{false, true, batch, n, d},   // encoder
                                      {false, false, batch, d, n},  // decoder
                                      {true, false, n, d, batch},   // dW_dec
                                      {false, true, batch, n, d},   // dz
                                      {true, false, n, d, batch}};  // dW_enc
    const double gemm_s = time_gemms(*be, shapes, reps);
    const double dd = static_cast<double>(d), dn = static_cast<double>(n);
    const double rate =
        2.0 * dd * dn * static_cast<double>(batch) * static_cast<double>(shapes.size()) / gemm_s;
    out["gemm_GFLOPs"] = rate / 1e9;
    fmt::print("GEMM rate {:.1f} GFLOP/s (the five d x n shapes of a dense step)\n", rate / 1e9);
    fmt::print("{:<10} {:>10} {:>11} {:>11} {:>11} {:>9} {:>8} {:>9}\n", "arch", "step", "tokens/s",
               "FLOP/token", "GEMM-bound", "fraction", "x topk", "FLOPs x");
    fmt::print("{:<10} {:>10} {:>11} {:>11} {:>11} {:>9} {:>8} {:>9}\n", "", "ms", "tok/s", "MFLOP",
               "tok/s", "%", "time", "topk");
    double topk_s = 0, topk_flops = 0;
    for (const std::string& arch : archs) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.n_latents = n;
        cfg.k = k;
        cfg.l1_coeff = 1.0;
        cfg.n_experts = experts;
        cfg.warmup_steps = 0;
        if (dead_tokens > 0) cfg.dead_tokens = dead_tokens;
        SaeTrainer tr(cfg, d, 1000, 0, *be, *self);
        tr.init(x, batch);
        const double step_s = time_median(*be, reps, [&] { tr.step(x, batch); });
        const double flops_per_token = tr.arch().flops_per_token(cfg, d, n);
        if (arch == "topk") topk_s = step_s, topk_flops = flops_per_token;
        const double bound = rate / flops_per_token;
        const double tps = static_cast<double>(batch) / step_s;
        if (breakdown) {
            TimedBackend timed(*be);
            SaeTrainer tt(cfg, d, 1000, 0, timed, *self);
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
        out[arch] = {{"step_ms", step_s * 1e3},
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
