// perfmodel.h — a paper model of SAE training on GPUs, and the peak table MFU is reported
// against.
//
// The model predicts tokens/s per GPU from the SAE shape and hardware figures, and names the
// bound. It is arithmetic on published peak figures, never a measurement: every output says
// "prediction". Formulas (docs/cuda.md, /shared/references/performance-limits.md section 4):
//   FLOPs/token: dense SAE 10*d*n (five d x n GEMMs: encoder, decoder, decoder dgrad and
//     wgrad, encoder wgrad); TopK with sparse kernels 2*d*n + 8*k*d (only the encoder forward
//     stays dense).
//   Optimizer: Adam(W) in fp32 moves 28 B/param per step (read p, g, m, v; write p, m, v) over
//     HBM; params = 2*d*n + n + d.
//   Gradient all-reduce (data_parallel, fp32): 4 B/param, ring factor 2(N-1)/N over the
//     per-GPU network bandwidth.
//   Data: d * bytes_per_element per token from disk, then across PCIe; in sweep mode with
//     shared data each rank reads 1/N of the stream and the batches are all-gathered.
// Pipeline: disk, PCIe and the GPU step overlap (background reader, copy stream); inside the
// GPU step, compute, optimizer and all-reduce run one after the other (no overlap assumed, so
// the prediction is conservative where an implementation overlaps the all-reduce).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace saetrain {

// --- peak table (dense, no 2:4 sparsity), for MFU and the model's presets -------------------
struct GpuPeak {
    const char* name;    // short name matched against the device name ("H100")
    double bf16_tflops;  // tensor cores, 16-bit inputs, fp32 accumulate
    double tf32_tflops;  // tensor cores, TF32 (0: no TF32 on this GPU)
    double fp32_tflops;  // CUDA cores, plain fp32
    double hbm_gbps;     // device memory bandwidth, GB/s
    double pcie_gbps;    // host-to-device, one direction, GB/s (link rate, not measured)
    double nic_gbps;     // typical per-GPU network bandwidth of nodes with this GPU, GB/s
    const char* source;  // where the figures come from
};

// A100 SXM 80GB, H100 SXM, H200 SXM, L40S, RTX 6000 Ada, T4.
const std::vector<GpuPeak>& gpu_peak_table();
// The entry whose name occurs in `device_name` (case-insensitive; "NVIDIA H100 80GB HBM3"
// finds H100), or nullptr.
const GpuPeak* find_gpu_peak(const std::string& device_name);
// Peak FLOP/s for fp32 GEMMs with or without TF32, or bf16: what MFU divides by.
enum class MathMode { fp32, tf32, bf16 };
double peak_flops(const GpuPeak& gpu, MathMode mode);

// --- the model -----------------------------------------------------------------------------
enum class SaeKind { dense, topk };  // dense: ReLU/JumpReLU; topk: TopK/BatchTopK, sparse kernels
enum class ParallelMode { sweep_shared, sweep_disjoint, data_parallel };

struct PerfInputs {
    int64_t d_model = 768;
    int64_t n_latents = 24576;
    int64_t k = 32;
    SaeKind kind = SaeKind::topk;
    int64_t batch = 4096;          // rows per rank per step
    double bytes_per_element = 4;  // activations on disk and over PCIe (2 for bf16/fp16)
    ParallelMode mode = ParallelMode::sweep_shared;
    int ranks = 1;
    // Hardware, per GPU (GB/s = 1e9 bytes/s).
    double tflops = 494.7;            // peak for the math mode used
    double compute_efficiency = 0.6;  // fraction of peak a mixed-shape step reaches
    double hbm_gbps = 3350;
    double disk_gbps = 1.0;  // this rank's read stream
    double pcie_gbps = 50;
    double nic_gbps = 48;  // all-reduce and all-gather bandwidth per GPU
};

// One term of the model: seconds per token it costs, and tokens/s if it alone were the limit.
struct PerfTerm {
    std::string name;  // disk, PCIe, all-gather, compute, optimizer, all-reduce
    double seconds_per_token = 0;
    double tokens_per_s() const { return seconds_per_token > 0 ? 1.0 / seconds_per_token : 0; }
};

struct PerfPrediction {
    double flops_per_token = 0;
    double bytes_per_token = 0;
    int64_t params = 0;
    double optimizer_bytes_per_step = 0;
    double allreduce_bytes_per_step = 0;  // on the wire per rank, ring factor included
    std::vector<PerfTerm> io_terms;       // overlapped with the GPU step
    std::vector<PerfTerm> gpu_terms;      // summed into the GPU step
    double tokens_per_s = 0;              // per GPU
    std::string bound;                    // the name of the largest term on the slower side
    double achieved_tflops = 0;           // useful FLOP/s at tokens_per_s
};

int64_t sae_params(int64_t d_model, int64_t n_latents);
double sae_flops_per_token(SaeKind kind, int64_t d_model, int64_t n_latents, int64_t k);
PerfPrediction predict(const PerfInputs& in);

}  // namespace saetrain
