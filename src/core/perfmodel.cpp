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
// them for your cluster). The intra-node link, one direction, is where a latent-sharded
// replica's collectives run: NVLink 3 on A100 SXM (600 GB/s bidirectional, A100 datasheet),
// NVLink 4 on H100/H200 SXM (900 GB/s bidirectional, performance-limits.md section 2; NCCL
// measures ~370 GB/s ring bus bandwidth on 8x H100, nccl-tests issue 212, a figure to pass as
// --nvlink-gbps for a measured rather than a peak bound). PCIe and NVL cards get their PCIe
// rate: their NVLink bridges join two (or four) cards, so a larger latent shard group crosses PCIe.
// Rows are matched in order, so a variant precedes its family's fallback row.
const std::vector<GpuPeak>& gpu_peak_table() {
    static const std::vector<GpuPeak> table = {
        {"A100 PCIe 80GB", "a100 pcie 80gb", 312.0, 156.0, 19.5, 1935, 32, 25, 32,
         "NVIDIA A100 datasheet: 312/156/19.5 TF bf16/tf32/fp32, 1,935 GB/s; PCIe Gen4 x16"},
        {"A100 PCIe 40GB", "a100 pcie", 312.0, 156.0, 19.5, 1555, 32, 25, 32,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 1,555 GB/s; PCIe Gen4 x16"},
        {"A100 SXM 40GB", "a100 40gb", 312.0, 156.0, 19.5, 1555, 32, 25, 300,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 1,555 GB/s; 1x HDR 200 Gb/s per GPU; NVLink 3"},
        {"A100 SXM 80GB", "a100", 312.0, 156.0, 19.5, 2039, 32, 25, 300,
         "NVIDIA A100 datasheet: 312/156/19.5 TF, 2,039 GB/s; 1x HDR 200 Gb/s per GPU; NVLink 3"},
        {"H100 PCIe", "h100 pcie", 756.5, 378.0, 51.0, 2000, 64, 25, 64,
         "NVIDIA H100 datasheet, PCIe: 1,513/756 TF bf16/tf32 sparse, 51 TF fp32, 2 TB/s"},
        {"H100 NVL", "h100 nvl", 835.5, 417.5, 60.0, 3900, 64, 48, 64,
         "NVIDIA H100 NVL datasheet: 1,671/835 TF bf16/tf32 sparse, 60 TF fp32, 3.9 TB/s"},
        {"H100 SXM", "h100", 989.4, 494.7, 66.9, 3350, 64, 48, 450,
         "H100 SXM: glennklockwood.com; PCIe Gen5 x16; NDR 400 Gb/s, 46-48 GB/s in NCCL; NVLink 4"},
        {"H200 NVL", "h200 nvl", 835.5, 417.5, 60.0, 4800, 64, 48, 64,
         "NVIDIA H200 datasheet, NVL: 1,671/835 TF bf16/tf32 sparse, 60 TF fp32, 4.8 TB/s"},
        {"H200 SXM", "h200", 989.4, 494.7, 66.9, 4800, 64, 48, 450,
         "NVIDIA H200 datasheet, SXM: H100 SXM compute, 4.8 TB/s HBM3e; NDR 400 Gb/s; NVLink 4"},
        {"L40S", "l40s", 362.05, 183.0, 91.6, 864, 32, 25, 32,
         "NVIDIA L40S datasheet (dense = half the sparse figure); PCIe Gen4 x16"},
        {"RTX 6000 Ada", "rtx 6000 ada", 364.2, 182.1, 91.1, 960, 32, 12.5, 32,
         "NVIDIA RTX 6000 Ada datasheet (1457 TF FP8 sparse / 4); PCIe Gen4 x16; 100 GbE"},
        {"T4", "t4", 65.0, 0.0, 8.1, 320, 16, 6.25, 16,
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

namespace {

// What the trainer's layout and the sharded top-k would refuse, said about the model's inputs.
void check_inputs(const PerfInputs& in) {
    SAE_ENFORCE(in.d_model > 0 && in.n_latents > 0 && in.batch > 0 && in.ranks > 0,
                "perf model: d_model, n_latents, batch and ranks must be positive");
    SAE_ENFORCE(in.kind == SaeKind::dense || (in.k > 0 && in.k <= in.n_latents),
                "perf model: k = {} must be in [1, n_latents = {}]", in.k, in.n_latents);
    SAE_ENFORCE(in.tflops > 0 && in.compute_efficiency > 0 && in.hbm_gbps > 0 && in.disk_gbps > 0 &&
                    in.pcie_gbps > 0 && in.nic_gbps > 0 && in.nvlink_gbps > 0,
                "perf model: every hardware figure must be positive");
    const int S = in.latent_shards;
    SAE_ENFORCE(S >= 1, "perf model: latent_shards = {} must be at least 1", S);
    SAE_ENFORCE(
        in.n_latents % S == 0,
        "perf model: n_latents = {} is not a multiple of latent_shards = {} (each latent shard "
        "holds n_latents / latent_shards latents)",
        in.n_latents, S);
    SAE_ENFORCE(in.ranks % S == 0,
                "perf model: ranks = {} is not a multiple of latent_shards = {} (the ranks are "
                "configs x replicas x latent_shards)",
                in.ranks, S);
    SAE_ENFORCE(in.kind == SaeKind::dense || in.n_latents / S >= in.k,
                "perf model: each of {} latent shards holds {} latents, fewer than k = {}", S,
                in.n_latents / S, in.k);
    SAE_ENFORCE(in.nodes >= 0, "perf model: nodes = {} must be >= 0 (0: not said)", in.nodes);
    SAE_ENFORCE(in.nodes == 0 || (in.ranks % in.nodes == 0 && (in.ranks / in.nodes) % S == 0),
                "perf model: {} ranks on {} nodes split a group of {} latent shards across "
                "nodes; the ranks per node must be a multiple of latent_shards",
                in.ranks, in.nodes, S);
}

// Data path. One rank per config (sweep) or per replica (data parallel) reads: with latent
// shards, latent shard 0 reads its replica's batch for the group. Shared sweep data: each of
// the G configs' readers reads and uploads 1/G of the stream, then the batches are all-gathered, so
// each receives (G-1)/G of every token over the network.
void add_io_terms(const PerfInputs& in, PerfPrediction& p) {
    const double G = static_cast<double>(in.ranks / in.latent_shards);
    const bool shared = in.mode == ParallelMode::sweep_shared;
    const double share = shared ? 1.0 / G : 1.0;
    p.io_terms.push_back({"disk", share * p.bytes_per_token / (in.disk_gbps * 1e9)});
    p.io_terms.push_back({"PCIe", share * p.bytes_per_token / (in.pcie_gbps * 1e9)});
    if (shared && G > 1)
        p.io_terms.push_back(
            {"all-gather", (G - 1.0) / G * p.bytes_per_token / (in.nic_gbps * 1e9)});
}

// The latent shard group's collectives over the intra-node link, per token of the replica's batch:
// latent shard 0's batch broadcast as stored (bytes_per_element: 16-bit rows are widened after it,
// on each latent shard's upload), the all-gather of
// every latent shard's (value, index) candidates (TopK: k of 8 B per token from each of the S-1
// others), and the ring all-reduce of the partial x_hat [B, d] with b_dec's gradient [d]
// once a step.
void add_latent_shard_terms(const PerfInputs& in, PerfPrediction& p) {
    const double S = in.latent_shards, d = static_cast<double>(in.d_model);
    const double batch = static_cast<double>(in.batch), link = in.nvlink_gbps * 1e9;
    const double bcast = in.bytes_per_element * d;
    const double gather =
        in.kind == SaeKind::topk ? (S - 1.0) * static_cast<double>(in.k) * 8.0 : 0;
    const double reduce = 2.0 * (S - 1.0) / S * 4.0 * d * (batch + 1.0) / batch;
    p.latent_shard_bytes_per_step = (bcast + gather + reduce) * batch;
    p.gpu_terms.push_back({"batch bcast", bcast / link});
    if (gather > 0) p.gpu_terms.push_back({"top-k gather", gather / link});
    p.gpu_terms.push_back({"x_hat reduce", reduce / link});
}

// One replica's GPU step, per token: compute and Adam over this GPU's 1/S of the SAE, the
// latent shard group's collectives, and the replicas' ring all-reduce of the latent shard's
// gradient (inside the node when the ranks are on one node, else over the NICs).
void add_step_terms(const PerfInputs& in, PerfPrediction& p) {
    const double S = in.latent_shards, batch = static_cast<double>(in.batch);
    p.gpu_terms.push_back(
        {"compute", p.flops_per_token / S / (in.tflops * 1e12 * in.compute_efficiency)});
    p.gpu_terms.push_back({"optimizer", p.optimizer_bytes_per_step / (in.hbm_gbps * 1e9) / batch});
    if (in.latent_shards > 1) add_latent_shard_terms(in, p);
    if (p.replicas > 1) {
        const double R = p.replicas;
        const double link = (in.nodes == 1 ? in.nvlink_gbps : in.nic_gbps) * 1e9;
        p.allreduce_bytes_per_step =
            2.0 * (R - 1.0) / R * 4.0 * static_cast<double>(p.local_params);
        p.gpu_terms.push_back({"all-reduce", p.allreduce_bytes_per_step / link / batch});
    }
}

// One GPU's device memory (PerfMemory says what is counted). The latent gradient dz [B, n/S]
// is a dense architecture's (ReLU keeps it for the backward); TopK keeps only pre and its
// [B, k] selection, plus, sharded, the [S, B, k] candidates an all-gather lays down.
PerfMemory memory_per_gpu(const PerfInputs& in, const PerfPrediction& p) {
    const double B = static_cast<double>(in.batch), d = static_cast<double>(in.d_model);
    const double m = static_cast<double>(p.local_latents), S = in.latent_shards;
    PerfMemory mem;
    mem.state = 16.0 * static_cast<double>(p.local_params);
    const double latent_arrays = in.kind == SaeKind::dense ? 2.0 : 1.0;  // pre (+ dz)
    // fires (int32), decoder norms and column sums: [n/S] each.
    mem.activations = 3.0 * 4.0 * B * d + latent_arrays * 4.0 * B * m + 3.0 * 4.0 * m;
    if (in.kind == SaeKind::topk)
        mem.topk = 8.0 * B * static_cast<double>(in.k) * (S > 1 ? 1.0 + S : 1.0);
    mem.workspace = 32.0 * 1024 * 1024;  // docs/cuda.md: fixed at 32 MiB, as llm.c on Hopper
    return mem;
}

}  // namespace

PerfPrediction predict(const PerfInputs& in) {
    check_inputs(in);
    PerfPrediction p;
    p.flops_per_token = in.flops_per_token > 0
                            ? in.flops_per_token
                            : sae_flops_per_token(in.kind, in.d_model, in.n_latents, in.k);
    p.bytes_per_token = static_cast<double>(in.d_model) * in.bytes_per_element;
    p.params = sae_params(in.d_model, in.n_latents);
    p.replicas = in.mode == ParallelMode::data_parallel ? in.ranks / in.latent_shards : 1;
    p.local_latents = in.n_latents / in.latent_shards;
    p.local_params = 2 * in.d_model * p.local_latents + p.local_latents + in.d_model;
    p.optimizer_bytes_per_step = 28.0 * static_cast<double>(p.local_params);
    add_io_terms(in, p);
    add_step_terms(in, p);
    p.memory = memory_per_gpu(in, p);

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
    // A replica's S GPUs share its tokens: per GPU is the replica's rate over S.
    p.replica_tokens_per_s = 1.0 / per_token;
    p.tokens_per_s = p.replica_tokens_per_s / in.latent_shards;
    p.total_tokens_per_s = p.tokens_per_s * in.ranks;
    p.achieved_tflops = p.flops_per_token * p.tokens_per_s / 1e12;
    return p;
}

}  // namespace saetrain
