// perfmodel.h — a paper model of SAE training on GPUs, and the peak table MFU is reported
// against.
//
// The model predicts tokens/s and memory per GPU from the SAE shape, the rank grid and hardware
// figures, and names the bound. It is arithmetic on published peak figures, never a
// measurement: every output says "prediction". Formulas (docs/cuda.md,
// /shared/references/performance-limits.md section 4):
//   FLOPs/token: dense SAE 10*d*n (five d x n GEMMs: encoder, decoder, decoder dgrad and
//     wgrad, encoder wgrad); TopK with sparse kernels 2*d*n + 8*k*d (only the encoder forward
//     stays dense).
//   Optimizer: Adam(W) in fp32 moves 28 B/param per step (read p, g, m, v; write p, m, v) over
//     HBM; params = 2*d*n + n + d.
//   Gradient all-reduce (data_parallel, fp32): 4 B/param, ring factor 2(R-1)/R over the
//     per-GPU network bandwidth (the intra-node link when every rank is on one node).
//   Data: d * bytes_per_element per token from disk, then across PCIe; in sweep mode with
//     shared data each of the G SAEs' readers reads 1/G of the stream and the batches are
//     all-gathered.
//   Latent shards (parallel.latent_shards = S): each replica is S GPUs of one node, each with
//     n/S latents (its rows of W_enc, b_enc, W_dec; b_dec whole). Compute and Adam divide by S;
//     the latent shard group adds, over the intra-node link, the batch broadcast (d *
//     bytes_per_element B/token: the rows as stored, widened after it on each latent shard), the
//     top-k candidates' all-gather ((S-1)*k*8 B/token, TopK only) and the all-reduce of x_hat
//     (2(S-1)/S * 4*d B/token, and b_dec's gradient once a step); the replicas all-reduce
//     only their latent shard's gradient.
// Pipeline: disk, PCIe and the GPU step overlap (background reader, copy stream); inside the
// GPU step, compute, optimizer and the collectives run one after the other (no overlap
// assumed, so the prediction is conservative where an implementation overlaps them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace saetrain {

// --- peak table (dense, no 2:4 sparsity), for MFU and the model's presets -------------------
struct GpuPeak {
    const char* name;    // preset name ("H100 SXM"); also what --gpu matches
    const char* match;   // words that must all occur in a device name, most specific rows first
    double bf16_tflops;  // tensor cores, 16-bit inputs, fp32 accumulate
    double tf32_tflops;  // tensor cores, TF32 (0: no TF32 on this GPU)
    double fp32_tflops;  // CUDA cores, plain fp32
    double hbm_gbps;     // device memory bandwidth, GB/s
    double pcie_gbps;    // host-to-device, one direction, GB/s (link rate, not measured)
    double nic_gbps;     // typical per-GPU network bandwidth of nodes with this GPU, GB/s
    double nvlink_gbps;  // GPU to GPU inside a node, one direction, GB/s (PCIe rate without
                         // an NVLink switch)
    const char* source;  // where the figures come from
};

// A100 (SXM 40/80 GB, PCIe 40/80 GB), H100 (SXM, PCIe, NVL), H200 (SXM, NVL), L40S,
// RTX 6000 Ada, T4.
const std::vector<GpuPeak>& gpu_peak_table();
// The first entry whose `match` words all occur among the words of `device_name` (split at
// anything not a letter or digit, case-insensitive): "NVIDIA H100 80GB HBM3" and "H100" find
// H100 SXM, "NVIDIA H100 PCIe" finds H100 PCIe, "NVIDIA A100-SXM4-40GB" finds A100 SXM 40GB.
// nullptr when nothing matches ("NVIDIA GH200 480GB", "NVIDIA L40": not in the table).
const GpuPeak* find_gpu_peak(const std::string& device_name);
// Peak FLOP/s for fp32 GEMMs with or without TF32, or bf16: what MFU divides by.
enum class MathMode { fp32, tf32, bf16 };
double peak_flops(const GpuPeak& gpu, MathMode mode);
// "fp32" | "tf32" | "bf16"; throws Error naming the value otherwise.
MathMode math_mode_parse(const std::string& name);
const char* math_mode_name(MathMode mode);

// What MFU is measured against on one device: the config's log.peak_tflops when > 0, else
// the table's peak for the device and the precision its GEMMs run in. flops = 0 when neither
// is known (the CPU backend, a GPU missing from the table): then no MFU is reported.
struct MfuPeak {
    double flops = 0;    // FLOP/s of one device
    std::string source;  // "log.peak_tflops", "H100 SXM fp32 (table)", or why there is none
};
MfuPeak mfu_peak(double override_tflops, const std::string& device_name, MathMode math);

// --- the model -----------------------------------------------------------------------------
enum class SaeKind { dense, topk };  // dense: ReLU/JumpReLU; topk: TopK/BatchTopK, sparse kernels
enum class ParallelMode { sweep_shared, sweep_disjoint, data_parallel };

struct PerfInputs {
    int64_t d_model = 768;
    int64_t n_latents = 24576;
    int64_t k = 32;
    SaeKind kind = SaeKind::topk;
    double flops_per_token = 0;    // the architecture's count (arch.h); 0: sae_flops_per_token
    int64_t batch = 4096;          // rows per replica per step (data.batch_size)
    double bytes_per_element = 4;  // activations on disk and over PCIe (2 for bf16/fp16)
    ParallelMode mode = ParallelMode::sweep_shared;
    int ranks = 1;  // GPUs in all: configs x replicas x latent_shards
    // parallel.latent_shards: each replica's latents split over S neighbouring GPUs of one
    // node; n_latents must divide by S, and (TopK) every latent shard must hold at least k latents.
    int latent_shards = 1;
    // Nodes the ranks span; 0: not said, and the replicas' gradient all-reduce runs at
    // nic_gbps as given. 1: it stays inside the node (nvlink_gbps); more: it crosses the NICs.
    int nodes = 0;
    // Hardware, per GPU (GB/s = 1e9 bytes/s).
    double tflops = 494.7;            // peak for the math mode used
    double compute_efficiency = 0.6;  // fraction of peak a mixed-shape step reaches
    double hbm_gbps = 3350;
    double disk_gbps = 1.0;  // this rank's read stream
    double pcie_gbps = 50;
    double nic_gbps = 48;      // all-reduce and all-gather bandwidth per GPU
    double nvlink_gbps = 450;  // inside a node, one direction: the latent shard group's collectives
};

// One term of the model: seconds per token of one replica's step it costs, and the replica's
// tokens/s if it alone were the limit (per GPU as well when latent_shards = 1).
struct PerfTerm {
    std::string name;  // disk, PCIe, all-gather, compute, optimizer, all-reduce, batch bcast,
                       // top-k gather, x_hat reduce
    double seconds_per_token = 0;
    double tokens_per_s() const { return seconds_per_token > 0 ? 1.0 / seconds_per_token : 0; }
};

// Device memory of one GPU, in bytes: what the trainer allocates for its share of the SAE and
// for one batch. Not counted: the CUDA context, NCCL's buffers, AuxK's and the architectures'
// own scratch beyond the latent gradient.
struct PerfMemory {
    double state = 0;        // parameters, gradient, Adam m and v: 16 B per local parameter
    double activations = 0;  // x, xc, x_hat [B, d]; pre (and dz, dense) [B, n/S]; [n/S] scratch
    double topk = 0;         // the selection [B, k] and the gathered candidates [S, B, k]
    double workspace = 0;    // the cuBLASLt workspace
    double total() const { return state + activations + topk + workspace; }
};

struct PerfPrediction {
    double flops_per_token = 0;
    double bytes_per_token = 0;
    int64_t params = 0;                   // the whole SAE
    int replicas = 1;                     // of each SAE (data_parallel: ranks / latent_shards)
    int64_t local_latents = 0;            // n / latent_shards
    int64_t local_params = 0;             // one GPU's: 2*d*n/S + n/S + d (b_dec whole)
    double optimizer_bytes_per_step = 0;  // per GPU
    double allreduce_bytes_per_step = 0;  // replicas' gradients on the wire per rank, ring included
    double latent_shard_bytes_per_step = 0;  // per GPU over the intra-node link (latent shards)
    std::vector<PerfTerm> io_terms;          // overlapped with the GPU step
    std::vector<PerfTerm> gpu_terms;         // summed into the GPU step
    PerfMemory memory;                       // per GPU
    double tokens_per_s = 0;                 // per GPU: a replica's tokens/s over its S GPUs
    double replica_tokens_per_s = 0;         // one replica (S GPUs together)
    double total_tokens_per_s = 0;           // every rank: SAE-tokens/s of all configs and replicas
    std::string bound;                       // the name of the largest term on the slower side
    double achieved_tflops = 0;              // useful FLOP/s per GPU at tokens_per_s
};

int64_t sae_params(int64_t d_model, int64_t n_latents);
// Model FLOPs of one training token (forward and backward): 10*d*n dense, 2*d*n + 8*k*d TopK
// with sparse kernels. The one formula behind the predictions and the TFLOP/s and MFU a run
// reports.
double sae_flops_per_token(SaeKind kind, int64_t d_model, int64_t n_latents, int64_t k);
// Throws Error naming the input for a shape or grid the trainer would refuse (n_latents not a
// multiple of latent_shards, ranks not a multiple of it, a latent shard group across nodes, ...).
PerfPrediction predict(const PerfInputs& in);

}  // namespace saetrain
