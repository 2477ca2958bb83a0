// sae-perfmodel: predict tokens/s and memory per GPU for an SAE configuration and name the
// bound.
//
// A paper model (include/saetrain/perfmodel.h), not a measurement: every figure it prints is a
// prediction from peak hardware figures. Examples:
//   sae-perfmodel --gpu H100 --d-model 4096 --n-latents 131072 --k 64 --arch batchtopk
//                 --bytes-per-element 2 --disk-gbps 7 --mode data_parallel --ranks 8
//   sae-perfmodel --gpu H100 --d-model 4096 --n-latents 1048576 --k 64 --disk-gbps 7
//                 --nodes 2 --replicas 4 --latent-shards 4      (16 GPUs: 4 replicas x 4 shards)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "app_cli.h"  // defines: cli_parse (--version, usage errors)
#include "saetrain/arch.h"
#include "saetrain/error.h"      // defines: saetrain::Error
#include "saetrain/perfmodel.h"  // defines: gpu_peak_table, predict, PerfInputs

using namespace saetrain;

namespace {

std::string si(double v) {  // 1234567 -> "1.23M"
    const char* unit[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (v >= 1000.0 && u < 4) v /= 1000.0, ++u;
    return fmt::format("{:.3g}{}", v, unit[u]);
}

void print_presets() {
    fmt::print("{:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}\n", "gpu", "bf16", "tf32",
               "fp32", "HBM", "PCIe", "NIC", "NVLink");
    fmt::print("{:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}\n", "", "TFLOP/s", "TFLOP/s",
               "TFLOP/s", "GB/s", "GB/s", "GB/s", "GB/s");
    for (const GpuPeak& g : gpu_peak_table())
        fmt::print("{:<16} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.0f} {:>9.0f} {:>9.2f} {:>9.0f}  {}\n",
                   g.name, g.bf16_tflops, g.tf32_tflops, g.fp32_tflops, g.hbm_gbps, g.pcie_gbps,
                   g.nic_gbps, g.nvlink_gbps, g.source);
}

// The flags, and the preset figures they leave to the chosen --gpu.
struct Options {
    PerfInputs in;
    std::string gpu = "H100", math = "bf16", arch = kDefaultArch;
    std::string mode;  // empty: data_parallel with --replicas, else sweep
    double tflops = 0, hbm = 0, pcie = 0, nic = 0, nvlink = 0;
    int ranks = 0, replicas = 0;  // 0: not given (PerfInputs::ranks from the grid)
    int64_t experts = 16;
    bool list = false, json = false;
};

void add_options(CLI::App& app, Options& o) {
    PerfInputs& in = o.in;
    app.add_option("--d-model", in.d_model, "activation width d")->capture_default_str();
    app.add_option("--n-latents", in.n_latents, "SAE latents n")->capture_default_str();
    app.add_option("--k", in.k, "active latents per token (topk)")->capture_default_str();
    app.add_option("--experts", o.experts, "experts of a switch SAE (sae.n_experts)")
        ->capture_default_str();
    app.add_option("--arch", o.arch, fmt::format("{} (sae.arch)", fmt::join(arch_names(), " | ")))
        ->capture_default_str();
    app.add_option("--batch", in.batch, "rows per replica per step (data.batch_size)")
        ->capture_default_str();
    app.add_option("--bytes-per-element", in.bytes_per_element,
                   "activation bytes per value on disk and PCIe (4 fp32, 2 bf16/fp16)")
        ->capture_default_str();
    app.add_option("--mode", o.mode,
                   "sweep | sweep_disjoint | data_parallel (default: data_parallel with "
                   "--replicas, else sweep)");
    app.add_option("--ranks", o.ranks,
                   "GPUs (one rank each): configs x replicas x latent shards (default: "
                   "--replicas x --latent-shards, else --latent-shards)");
    app.add_option("--replicas", o.replicas,
                   "data-parallel replicas of the SAE (parallel.replicas); sets --ranks");
    app.add_option("--latent-shards", in.latent_shards,
                   "GPUs of one node each replica's latents are split over "
                   "(parallel.latent_shards); must divide --n-latents")
        ->capture_default_str();
    app.add_option("--nodes", in.nodes,
                   "nodes the ranks span: 1 keeps the replicas' all-reduce on the intra-node link "
                   "(0: not said, --nic-gbps)")
        ->capture_default_str();
    app.add_option("--gpu", o.gpu,
                   "preset or device name: A100, \"H100 PCIe\", H100, H200, L40S, \"RTX 6000 "
                   "Ada\", T4 (--list-gpus)")
        ->capture_default_str();
    app.add_option("--math", o.math, "GEMM precision for the preset peak: bf16 | tf32 | fp32")
        ->capture_default_str();
    app.add_option("--tflops", o.tflops, "peak TFLOP/s (overrides the preset)");
    app.add_option("--efficiency", in.compute_efficiency,
                   "fraction of peak a step reaches (0.6 ~ 600 of 989 TF on H100)")
        ->capture_default_str();
    app.add_option("--hbm-gbps", o.hbm, "device memory GB/s (overrides the preset)");
    app.add_option("--disk-gbps", in.disk_gbps, "read GB/s of one rank's stream")
        ->capture_default_str();
    app.add_option("--pcie-gbps", o.pcie, "host-to-device GB/s (overrides the preset)");
    app.add_option("--nic-gbps", o.nic, "per-GPU all-reduce/all-gather GB/s (overrides preset)");
    app.add_option("--nvlink-gbps", o.nvlink,
                   "GPU-to-GPU GB/s inside a node, one direction: the latent shards' collectives "
                   "(overrides the preset)");
    app.add_flag("--list-gpus", o.list, "print the preset table and exit");
    app.add_flag("--json", o.json, "print one JSON object instead of the table");
}

const char* mode_name(ParallelMode mode) {
    switch (mode) {
        case ParallelMode::sweep_shared:
            return "sweep";
        case ParallelMode::sweep_disjoint:
            return "sweep_disjoint";
        case ParallelMode::data_parallel:
            return "data_parallel";
    }
    return "?";
}

// The rank grid: the mode, the latent shards, and the ranks (--ranks, or --replicas x
// --latent-shards for one data-parallel SAE). Throws Error for a grid the trainer would refuse.
void resolve_grid(const Options& o, PerfInputs& in) {
    const std::string mode = !o.mode.empty() ? o.mode : o.replicas > 0 ? "data_parallel" : "sweep";
    if (mode == "sweep") {
        in.mode = ParallelMode::sweep_shared;
    } else if (mode == "sweep_disjoint") {
        in.mode = ParallelMode::sweep_disjoint;
    } else {
        SAE_ENFORCE(mode == "data_parallel",
                    "--mode must be sweep, sweep_disjoint or data_parallel, not '{}'", mode);
        in.mode = ParallelMode::data_parallel;
    }
    const int S = in.latent_shards;
    SAE_ENFORCE(S >= 1, "--latent-shards must be at least 1, not {}", S);
    SAE_ENFORCE(in.n_latents % S == 0,
                "--n-latents {} is not a multiple of --latent-shards {}: each shard holds an "
                "equal share of the latents (parallel.latent_shards must divide n_latents)",
                in.n_latents, S);
    SAE_ENFORCE(o.ranks >= 0 && o.replicas >= 0, "--ranks and --replicas must be positive");
    if (o.replicas > 0) {
        SAE_ENFORCE(in.mode == ParallelMode::data_parallel,
                    "--replicas counts one SAE's data-parallel replicas; use it with --mode "
                    "data_parallel or without --mode, not with --mode {}",
                    mode);
        SAE_ENFORCE(o.ranks == 0 || o.ranks == o.replicas * S,
                    "--ranks {} disagrees with --replicas {} x --latent-shards {} = {}; give "
                    "one or the other",
                    o.ranks, o.replicas, S, o.replicas * S);
        in.ranks = o.replicas * S;
    } else {
        in.ranks = o.ranks > 0 ? o.ranks : S;
    }
}

// The model's inputs: the flags, the preset's figures where no flag overrides them, and the
// architecture's FLOPs per token. Throws Error for an unknown GPU, precision, arch or mode.
PerfInputs resolve_inputs(const Options& o, const GpuPeak& g) {
    PerfInputs in = o.in;
    SAE_ENFORCE(o.math == "bf16" || o.math == "tf32" || o.math == "fp32",
                "--math must be bf16, tf32 or fp32, not '{}'", o.math);
    in.tflops = o.tflops > 0 ? o.tflops : peak_flops(g, math_mode_parse(o.math)) / 1e12;
    in.hbm_gbps = o.hbm > 0 ? o.hbm : g.hbm_gbps;
    in.pcie_gbps = o.pcie > 0 ? o.pcie : g.pcie_gbps;
    in.nic_gbps = o.nic > 0 ? o.nic : g.nic_gbps;
    in.nvlink_gbps = o.nvlink > 0 ? o.nvlink : g.nvlink_gbps;
    const Architecture& a = arch_get(o.arch);
    in.kind = a.sparse() ? SaeKind::topk : SaeKind::dense;
    SaeConfig sc;
    sc.arch = o.arch, sc.k = in.k;
    sc.set("sae.n_experts", o.experts);
    a.validate(sc, in.n_latents, "");
    in.flops_per_token = a.flops_per_token(sc, in.d_model, in.n_latents);
    resolve_grid(o, in);
    return in;
}

void print_json(const Options& o, const GpuPeak& g, const PerfInputs& in, const PerfPrediction& p) {
    std::string terms;
    for (const auto* list : {&p.io_terms, &p.gpu_terms})
        for (const PerfTerm& t : *list)
            terms += fmt::format("{}\"{}\": {:.6g}", terms.empty() ? "" : ", ", t.name,
                                 t.tokens_per_s());
    const PerfMemory& m = p.memory;
    fmt::print(
        "{{\"kind\": \"prediction\", \"gpu\": \"{}\", \"d_model\": {}, \"n_latents\": {}, "
        "\"k\": {}, \"arch\": \"{}\", \"mode\": \"{}\", \"ranks\": {}, \"nodes\": {}, "
        "\"replicas\": {}, \"latent_shards\": {}, \"batch\": {}, "
        "\"predicted_tokens_per_s_per_gpu\": {:.6g}, "
        "\"predicted_tokens_per_s_per_replica\": {:.6g}, \"predicted_tokens_per_s_total\": {:.6g}, "
        "\"bound\": \"{}\", \"predicted_tflops\": {:.4g}, \"predicted_memory_per_gpu_GB\": {:.4g}, "
        "\"memory_per_gpu_bytes\": {{\"state\": {:.6g}, \"activations\": {:.6g}, \"topk\": {:.6g}, "
        "\"workspace\": {:.6g}, \"total\": {:.6g}}}, \"latent_shard_bytes_per_step\": {:.6g}, "
        "\"term_tokens_per_s\": {{{}}}}}\n",
        g.name, in.d_model, in.n_latents, in.k, o.arch, mode_name(in.mode), in.ranks, in.nodes,
        p.replicas, in.latent_shards, in.batch, p.tokens_per_s, p.replica_tokens_per_s,
        p.total_tokens_per_s, p.bound, p.achieved_tflops, m.total() / 1e9, m.state, m.activations,
        m.topk, m.workspace, m.total(), p.latent_shard_bytes_per_step, terms);
}

// "2 nodes, 4 replicas x 4 latent shards (262K latents per GPU)"; "8 ranks" for a plain grid.
std::string grid_text(const PerfInputs& in, const PerfPrediction& p) {
    std::string s = in.nodes > 0 ? fmt::format("{} node{}, ", in.nodes, in.nodes == 1 ? "" : "s")
                                 : std::string();
    if (in.mode == ParallelMode::data_parallel)
        s += fmt::format("{} replica{}", p.replicas, p.replicas == 1 ? "" : "s");
    else
        s += fmt::format("{} SAE{}", in.ranks / in.latent_shards,
                         in.ranks / in.latent_shards == 1 ? "" : "s");
    if (in.latent_shards > 1)
        s += fmt::format(" x {} latent shards ({} latents per GPU)", in.latent_shards,
                         si(static_cast<double>(p.local_latents)));
    return s;
}

void print_table(const Options& o, const GpuPeak& g, const PerfInputs& in,
                 const PerfPrediction& p) {
    fmt::print("PREDICTION (paper model from peak figures, not a measurement)\n");
    fmt::print(
        "  SAE: d={} n={} {} k={} batch={} | {} x {} ({} TF x {:.2f}, HBM {:.0f} GB/s, disk "
        "{:g} GB/s, PCIe {:g} GB/s, NIC {:g} GB/s, NVLink {:g} GB/s) | mode {}\n",
        in.d_model, in.n_latents, o.arch, in.k, in.batch, in.ranks, g.name, in.tflops,
        in.compute_efficiency, in.hbm_gbps, in.disk_gbps, in.pcie_gbps, in.nic_gbps, in.nvlink_gbps,
        mode_name(in.mode));
    fmt::print("  grid: {}\n", grid_text(in, p));
    fmt::print("  FLOP/token {} | bytes/token {:g} | params {} | Adam {}B/step/GPU",
               si(p.flops_per_token), p.bytes_per_token, si(static_cast<double>(p.params)),
               si(p.optimizer_bytes_per_step));
    if (p.allreduce_bytes_per_step > 0)
        fmt::print(" | all-reduce {}B/step/rank", si(p.allreduce_bytes_per_step));
    if (p.latent_shard_bytes_per_step > 0)
        fmt::print(" | shard links {}B/step/GPU", si(p.latent_shard_bytes_per_step));
    fmt::print("\n\n{:<12} {:<10} {:>16} {:>14}\n", "term", "stage", "alone: tokens/s",
               "us per 1K tok");
    for (const auto& [stage, terms] :
         {std::pair{"overlapped", &p.io_terms}, std::pair{"GPU step", &p.gpu_terms}})
        for (const PerfTerm& t : *terms)
            fmt::print("{:<12} {:<10} {:>16} {:>14.2f}\n", t.name, stage, si(t.tokens_per_s()),
                       t.seconds_per_token * 1e9);
    if (in.latent_shards > 1)
        fmt::print("(tokens/s and times per token of one replica: its {} GPUs together)\n",
                   in.latent_shards);
    const PerfMemory& m = p.memory;
    fmt::print(
        "\nmemory per GPU: {:.2f} GB (Adam state {}B, activations {}B, top-k {}B, cuBLASLt "
        "workspace {}B)\n",
        m.total() / 1e9, si(m.state), si(m.activations), si(m.topk), si(m.workspace));
    fmt::print(
        "predicted: {} tokens/s per GPU ({} per replica, {} in all), bound: {}, {:.1f} "
        "TFLOP/s useful per GPU\n",
        si(p.tokens_per_s), si(p.replica_tokens_per_s), si(p.total_tokens_per_s), p.bound,
        p.achieved_tflops);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"sae-perfmodel: predicted SAE training throughput per GPU (a paper model)"};
    Options o;
    add_options(app, o);
    if (const int code = cli_parse(app, "sae-perfmodel",
                                   "sae-perfmodel [--gpu NAME] [--d-model D] [--n-latents N] "
                                   "[--k K] [--arch ARCH] [--mode MODE] [--ranks N] ... | "
                                   "--list-gpus",
                                   argc, argv);
        code >= 0)
        return code;

    try {
        if (o.list) {
            print_presets();
            return 0;
        }
        const GpuPeak* g = find_gpu_peak(o.gpu);
        SAE_ENFORCE(g != nullptr, "unknown --gpu '{}'; run --list-gpus for the presets", o.gpu);
        const PerfInputs in = resolve_inputs(o, *g);
        const PerfPrediction p = predict(in);
        if (o.json)
            print_json(o, *g, in, p);
        else
            print_table(o, *g, in, p);
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "sae-perfmodel: %s\n", printable(e.what()).c_str());
        return 2;
    }
}
