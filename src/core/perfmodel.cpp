#include "saetrain/perfmodel.h"

#include <algorithm>
#include <cctype>

#include "saetrain/error.h"

namespace saetrain {

// --- peak table ----------------------------------------------------------------------------
// Dense (no 2:4 sparsity) figures: vendor datasheets list the tensor-core rates with sparsity,
// so those are halved here. H100 SXM as cited in /shared/references/performance-limits.md
// section 2 (glennklockwood.com: 528 tensor cores at 1.83 GHz); the others from NVIDIA's
// datasheets named in `source`. PCIe is the link rate of the card's generation, one direction.
// NIC figures are typical per-GPU network bandwidth of servers built with each GPU (override
// them for your cluster). Rows are matched in order, so a variant precedes its family's
// fallback row.
const std::vector<GpuPeak>& gpu_peak_table() {
    static const std::vector<GpuPeak> table = {
        {"A100 PCIe 80GB", "a100 pcie 80gb", 312.0, 156.0, 19.5, 1935, 32, 25,
         "NVIDIA A100 datasheet: 312/156/19.5 TF bf16/tf32/fp32, 1,935 GB/s; PCIe Gen4 x16"},
        {"A100 PCIe 40GB", "a100 pcie", 312.0, 156.0, 19.5, 1555, 32, 25,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 1,555 GB/s; PCIe Gen4 x16"},
        {"A100 SXM 40GB", "a100 40gb", 312.0, 156.0, 19.5, 1555, 32, 25,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 1,555 GB/s; 1x HDR 200 Gb/s per GPU"},
        {"A100 SXM 80GB", "a100", 312.0, 156.0, 19.5, 2039, 32, 25,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 2,039 GB/s; 1x HDR 200 Gb/s per GPU"},
        {"H100 PCIe", "h100 pcie", 756.5, 378.0, 51.0, 2000, 64, 25,
         "NVIDIA H100 datasheet, PCIe: 1,513/756 TF bf16/tf32 sparse, 51 TF fp32, 2 TB/s"},
        {"H100 NVL", "h100 nvl", 835.5, 417.5, 60.0, 3900, 64, 48,
         "NVIDIA H100 NVL datasheet: 1,671/835 TF bf16/tf32 sparse, 60 TF fp32, 3.9 TB/s"},
        {"H100 SXM", "h100", 989.4, 494.7, 66.9, 3350, 64, 48,
         "H100 SXM: glennklockwood.com; PCIe Gen5 x16; NDR 400 Gb/s, 46-48 GB/s in NCCL"},
        {"H200 NVL", "h200 nvl", 835.5, 417.5, 60.0, 4800, 64, 48,
         "NVIDIA H200 datasheet, NVL: 1,671/835 TF bf16/tf32 sparse, 60 TF fp32, 4.8 TB/s"},
        {"H200 SXM", "h200", 989.4, 494.7, 66.9, 4800, 64, 48,
         "NVIDIA H200 datasheet, SXM: H100 SXM compute, 4.8 TB/s HBM3e; NDR 400 Gb/s"},
        {"L40S", "l40s", 362.05, 183.0, 91.6, 864, 32, 25,
         "NVIDIA L40S datasheet (dense = half the sparse figure); PCIe Gen4 x16"},
        {"RTX 6000 Ada", "rtx 6000 ada", 364.2, 182.1, 91.1, 960, 32, 12.5,
         "NVIDIA RTX 6000 Ada datasheet (1457 TF FP8 sparse / 4); PCIe Gen4 x16; 100 GbE"},
        {"T4", "t4", 65.0, 0.0, 8.1, 320, 16, 6.25,
         "NVIDIA T4 datasheet: fp16 tensor cores (no bf16, no TF32); PCIe Gen3 x16"},
    };
    return table;
}

namespace {
// Lower-case words: runs of letters and digits ("NVIDIA A100-SXM4-80GB" -> nvidia a100 sxm4 80gb).
std::vector<std::string> words_of(const std::string& s) {
    std::vector<std::string> out;
    std::string w;
    for (const char ch : s + " ") {
        const auto c = static_cast<unsigned char>(ch);
        if (std::isalnum(c)) {
            w += static_cast<char>(std::tolower(c));
        } else if (!w.empty()) {
            out.push_back(w);
            w.clear();
        }
    }
    return out;
}
}  // namespace

const GpuPeak* find_gpu_peak(const std::string& device_name) {
    const std::vector<std::string> dev = words_of(device_name);
    for (const GpuPeak& g : gpu_peak_table()) {
        bool all = true;
        for (const std::string& w : words_of(g.match))
            all = all && std::find(dev.begin(), dev.end(), w) != dev.end();
        if (all) return &g;
    }
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

MathMode math_mode_parse(const std::string& name) {
    if (name == "fp32") return MathMode::fp32;
    if (name == "tf32") return MathMode::tf32;
    SAE_ENFORCE(name == "bf16", "unknown GEMM precision '{}'; expected fp32, tf32 or bf16", name);
    return MathMode::bf16;
}

const char* math_mode_name(MathMode mode) {
    switch (mode) {
        case MathMode::fp32:
            return "fp32";
        case MathMode::tf32:
            return "tf32";
        case MathMode::bf16:
            return "bf16";
    }
    return "?";
}

MfuPeak mfu_peak(double override_tflops, const std::string& device_name, MathMode math) {
    SAE_ENFORCE(override_tflops >= 0, "log.peak_tflops must be >= 0 (got {})", override_tflops);
    if (override_tflops > 0) return {override_tflops * 1e12, "log.peak_tflops"};
    if (device_name.empty())
        return {0, "no peak for the CPU backend (set log.peak_tflops to report MFU)"};
    const GpuPeak* g = find_gpu_peak(device_name);
    if (g == nullptr)
        return {0, fmt::format("'{}' is not in the peak table (set log.peak_tflops to report MFU)",
                               device_name)};
    return {peak_flops(*g, math), fmt::format("{} {} (table)", g->name, math_mode_name(math))};
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
    p.flops_per_token = in.flops_per_token > 0
                            ? in.flops_per_token
                            : sae_flops_per_token(in.kind, in.d_model, in.n_latents, in.k);
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
