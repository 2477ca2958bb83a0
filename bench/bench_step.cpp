// bench_step — tokens/s of one SAE training step on the CPU backend, beside the limit that
// OpenBLAS's sgemm rate sets for the same FLOPs on the same shapes, measured in the same run.
//
// FLOPs per token: dense (ReLU-L1) step = five d x n GEMMs = 10*d*n; TopK step with the sparse
// decoder and sparse backward = 2*d*n (dense encoder) + 8*k*d (decode, dval, dW_dec, dW_enc).
#include <cblas.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/trainer.h"

using namespace saetrain;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of `reps` calls of f after one warm-up call.
template <typename F>
double time_median(int reps, F&& f) {
    f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        f();
        t.push_back(seconds(t0));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Gemm {
    bool ta, tb;
    int64_t m, n, k;
};

// Seconds for the given row-major GEMMs, called exactly as the trainer calls them.
double time_gemms(Backend& be, const std::vector<Gemm>& shapes, int reps) {
    int64_t most = 0;
    for (const Gemm& g : shapes) most = std::max({most, g.m * g.k, g.k * g.n, g.m * g.n});
    std::vector<float> a(most, 0.01f), b(most, 0.02f), c(most, 0.0f);
    return time_median(reps, [&] {
        for (const Gemm& g : shapes)
            be.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(),
                    g.tb ? g.k : g.n, 0.0f, c.data(), g.n);
    });
}

}  // namespace

int main(int argc, char** argv) {
    int64_t d = 768, n = 6144, k = 32, batch = 4096;
    int reps = 5, threads = 0;
    bool json = false;
    CLI::App app{"bench_step: SAE training-step throughput vs the sgemm limit"};
    app.add_option("--d-model", d);
    app.add_option("--latents", n);
    app.add_option("--k", k);
    app.add_option("--batch", batch);
    app.add_option("--reps", reps, "timed repetitions (median reported)");
    app.add_option("--threads", threads, "CPU threads (default: all)");
    app.add_flag("--json", json, "also print one JSON object");
    CLI11_PARSE(app, argc, argv);

    auto be = make_cpu_backend(threads);
    auto self = make_self_comm();
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(batch * d));
    for (float& v : x) v = normal(rng);

    nlohmann::ordered_json out;
    out["backend"] = be->name();
    out["shape"] = {{"d_model", d}, {"n_latents", n}, {"k", k}, {"batch", batch}};
    fmt::print("bench_step | {} | d_model {} n_latents {} k {} batch {} | median of {}\n",
               be->name(), d, n, k, batch, reps);
    fmt::print("{:<8} {:>12} {:>12} {:>14} {:>14} {:>10}\n", "arch", "step", "tokens/s",
               "sgemm rate", "sgemm-bound", "fraction");
    fmt::print("{:<8} {:>12} {:>12} {:>14} {:>14} {:>10}\n", "", "ms", "tok/s", "GFLOP/s", "tok/s",
               "%");

    for (Arch arch : {Arch::topk, Arch::relu}) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.n_latents = n;
        cfg.k = k;
        cfg.l1_coeff = 1.0;
        cfg.warmup_steps = 0;
        SaeTrainer tr(cfg, d, 1000, 0, *be, *self);
        tr.init(x.data(), batch);
        const double step_s = time_median(reps, [&] { tr.step(x.data(), batch); });

        // The GEMMs whose FLOPs the formula counts, at the trainer's shapes and transposes.
        std::vector<Gemm> shapes = {{false, true, batch, n, d}};  // encoder
        const double dd = static_cast<double>(d), dn = static_cast<double>(n);
        double flops_per_token = 2.0 * dd * dn + 8.0 * static_cast<double>(k) * dd;
        if (arch == Arch::relu) {
            shapes.push_back({false, false, batch, d, n});  // decoder
            shapes.push_back({true, false, n, d, batch});   // dW_dec
            shapes.push_back({false, true, batch, n, d});   // dz
            shapes.push_back({true, false, n, d, batch});   // dW_enc
            flops_per_token = 10.0 * dd * dn;
        }
        const double gemm_s = time_gemms(*be, shapes, reps);
        const double gemm_flops =
            2.0 * dd * dn * static_cast<double>(batch) * static_cast<double>(shapes.size());
        const double rate = gemm_flops / gemm_s;
        const double bound = rate / flops_per_token;
        const double tps = static_cast<double>(batch) / step_s;
        fmt::print("{:<8} {:>12.1f} {:>12.0f} {:>14.1f} {:>14.0f} {:>10.1f}\n", arch_name(arch),
                   step_s * 1e3, tps, rate / 1e9, bound, 100.0 * tps / bound);
        out[arch_name(arch)] = {
            {"step_ms", step_s * 1e3},           {"tokens_per_s", tps},
            {"sgemm_GFLOPs", rate / 1e9},        {"flops_per_token", flops_per_token},
            {"sgemm_bound_tokens_per_s", bound}, {"fraction_of_bound", tps / bound}};
    }
    if (json) fmt::print("{}\n", out.dump());
    return 0;
}
