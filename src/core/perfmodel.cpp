#include "saetrain/perfmodel.h"

#include <algorithm>
#include <cctype>

#include "saetrain/error.h"

namespace saetrain {

// --- peak table ----------------------------------------------------------------------------
// Dense (no 2:4 sparsity) vendor datasheet figures; H100/H200 as cited in
// /shared/references/performance-limits.md section 2. NIC figures are typical per-GPU network
// bandwidth of servers built with each GPU (override them for your cluster).
const std::vector<GpuPeak>& gpu_peak_table() {
    static const std::vector<GpuPeak> table = {
        {"A100", 312.0, 156.0, 19.5, 2039, 32, 25,
         "NVIDIA A100 datasheet (SXM 80GB); PCIe Gen4 x16; 1x HDR 200 Gb/s per GPU"},
        {"H100", 989.4, 494.7, 66.9, 3350, 64, 48,
         "H100 SXM: glennklockwood.com; PCIe Gen5 x16; NDR 400 Gb/s, 46-48 GB/s in NCCL"},
        {"H200", 989.4, 494.7, 66.9, 4800, 64, 48,
         "H200 SXM: H100 compute, 4.8 TB/s HBM3e; PCIe Gen5 x16; NDR 400 Gb/s"},
        {"L40S", 362.05, 183.0, 91.6, 864, 32, 25,
         "NVIDIA L40S datasheet (dense = half the sparse figure); PCIe Gen4 x16"},
        {"RTX 6000 Ada", 364.2, 182.1, 91.1, 960, 32, 12.5,
         "NVIDIA RTX 6000 Ada datasheet (1457 TF FP8 sparse / 4); PCIe Gen4 x16; 100 GbE"},
        {"T4", 65.0, 0.0, 8.1, 320, 16, 6.25,
         "NVIDIA T4 datasheet: fp16 tensor cores (no bf16, no TF32); PCIe Gen3 x16"},
    };
    return table;
}

namespace {
std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}
}  // namespace

const GpuPeak* find_gpu_peak(const std::string& device_name) {
    const std::string dev = lower(device_name);
    for (const GpuPeak& g : gpu_peak_table())
        if (dev.find(lower(g.name)) != std::string::npos) return &g;
    return nullptr;
}

double peak_flops(const GpuPeak& gpu, MathMode mode) {
    switch (mode) {
        case MathMode::bf16:
            return gpu.bf16_tflops * 1e12;
        case MathMode::tf32:  // GPUs without TF32 run fp32 GEMMs on CUDA cores
            return (gpu.tf32_tflops > 0 ? gpu.tf32_tflops : gpu.fp32_tflops) * 1e12;
        case MathMode::fp32:
            return gpu.fp32_tflops * 1e12;
    }
    return 0;
}

// --- the model -----------------------------------------------------------------------------
int64_t sae_params(int64_t d_model, int64_t n_latents) {
    return 2 * d_model * n_latents + n_latents + d_model;
}

double sae_flops_per_token(SaeKind kind, int64_t d_model, int64_t n_latents, int64_t k) {
    const double d = static_cast<double>(d_model), n = static_cast<double>(n_latents);
    if (kind == SaeKind::dense) return 10.0 * d * n;
    return 2.0 * d * n + 8.0 * static_cast<double>(k) * d;
}

PerfPrediction predict(const PerfInputs& in) {
    SAE_ENFORCE(in.d_model > 0 && in.n_latents > 0 && in.batch > 0 && in.ranks > 0,
                "perf model: d_model, n_latents, batch and ranks must be positive");
    SAE_ENFORCE(in.kind == SaeKind::dense || (in.k > 0 && in.k <= in.n_latents),
                "perf model: k = {} must be in [1, n_latents = {}]", in.k, in.n_latents);
    SAE_ENFORCE(in.tflops > 0 && in.compute_efficiency > 0 && in.hbm_gbps > 0 && in.disk_gbps > 0 &&
                    in.pcie_gbps > 0 && in.nic_gbps > 0,
                "perf model: every hardware figure must be positive");
    PerfPrediction p;
    const double N = in.ranks;
    p.flops_per_token = sae_flops_per_token(in.kind, in.d_model, in.n_latents, in.k);
    p.bytes_per_token = static_cast<double>(in.d_model) * in.bytes_per_element;
    p.params = sae_params(in.d_model, in.n_latents);
    p.optimizer_bytes_per_step = 28.0 * static_cast<double>(p.params);
    const double batch = static_cast<double>(in.batch);

    // Data path. Shared sweep data: each rank reads and uploads 1/N of the stream, then the
    // batches are all-gathered, so each rank receives (N-1)/N of every token over the network.
    const bool shared = in.mode == ParallelMode::sweep_shared;
    const double share = shared ? 1.0 / N : 1.0;
    p.io_terms.push_back({"disk", share * p.bytes_per_token / (in.disk_gbps * 1e9)});
    p.io_terms.push_back({"PCIe", share * p.bytes_per_token / (in.pcie_gbps * 1e9)});
    if (shared && in.ranks > 1)
        p.io_terms.push_back(
            {"all-gather", (N - 1.0) / N * p.bytes_per_token / (in.nic_gbps * 1e9)});

    // GPU step, per token.
    p.gpu_terms.push_back(
        {"compute", p.flops_per_token / (in.tflops * 1e12 * in.compute_efficiency)});
    p.gpu_terms.push_back({"optimizer", p.optimizer_bytes_per_step / (in.hbm_gbps * 1e9) / batch});
    if (in.mode == ParallelMode::data_parallel && in.ranks > 1) {
        p.allreduce_bytes_per_step = 2.0 * (N - 1.0) / N * 4.0 * static_cast<double>(p.params);
        p.gpu_terms.push_back(
            {"all-reduce", p.allreduce_bytes_per_step / (in.nic_gbps * 1e9) / batch});
    }

    auto slowest = [](const std::vector<PerfTerm>& t) {
        return *std::max_element(t.begin(), t.end(), [](const PerfTerm& a, const PerfTerm& b) {
            return a.seconds_per_token < b.seconds_per_token;
        });
    };
    const PerfTerm io = slowest(p.io_terms), gpu_max = slowest(p.gpu_terms);
    double gpu_sum = 0;
    for (const PerfTerm& t : p.gpu_terms) gpu_sum += t.seconds_per_token;
    const double per_token = std::max(io.seconds_per_token, gpu_sum);
    p.bound = io.seconds_per_token > gpu_sum ? io.name : gpu_max.name;
    p.tokens_per_s = 1.0 / per_token;
    p.achieved_tflops = p.flops_per_token * p.tokens_per_s / 1e12;
    return p;
}

}  // namespace saetrain
