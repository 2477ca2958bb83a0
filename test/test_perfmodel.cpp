// The paper performance model on hand-computed cases: FLOPs, bytes, each term and the bound;
// the peak table MFU is measured against and its lookup by device name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/perfmodel.h"

using namespace saetrain;

namespace {

// Round numbers so every term is easy to compute by hand:
// d=1000, n=10000, batch 1000, 100 TF at efficiency 1, HBM 1000 GB/s, fp32 activations.
PerfInputs hand_case() {
    PerfInputs in;
    in.d_model = 1000, in.n_latents = 10000, in.k = 10, in.batch = 1000;
    in.kind = SaeKind::dense;
    in.bytes_per_element = 4;
    in.mode = ParallelMode::sweep_disjoint;
    in.ranks = 1;
    in.tflops = 100, in.compute_efficiency = 1.0, in.hbm_gbps = 1000;
    in.disk_gbps = 1, in.pcie_gbps = 10, in.nic_gbps = 10;
    return in;
}

double term(const std::vector<PerfTerm>& terms, const std::string& name) {
    for (const PerfTerm& t : terms)
        if (t.name == name) return t.seconds_per_token;
    return -1;
}

}  // namespace

TEST(PerfModel, FlopsPerTokenMatchTheReferenceTable) {
    // performance-limits.md section 4: A dense 1.89e8, A TopK 3.79e7, B dense 5.37e9, B TopK
    // (k=128) 1.08e9.
    EXPECT_EQ(sae_flops_per_token(SaeKind::dense, 768, 24576, 32), 188743680.0);
    EXPECT_EQ(sae_flops_per_token(SaeKind::topk, 768, 24576, 32), 37748736.0 + 196608.0);
    EXPECT_EQ(sae_flops_per_token(SaeKind::dense, 4096, 131072, 0), 5368709120.0);
    EXPECT_EQ(sae_flops_per_token(SaeKind::topk, 4096, 131072, 128), 1073741824.0 + 4194304.0);
    EXPECT_EQ(sae_params(4096, 131072), 1073741824 + 131072 + 4096);
}

TEST(PerfModel, DiskBoundDenseCase) {
    const PerfPrediction p = predict(hand_case());
    EXPECT_EQ(p.flops_per_token, 1e8);
    EXPECT_EQ(p.params, 20011000);
    EXPECT_DOUBLE_EQ(p.optimizer_bytes_per_step, 28.0 * 20011000);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "compute"), 1e8 / 1e14);                   // 1 us
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "optimizer"), 560308000.0 / 1e12 / 1000);  // 0.56 us
    EXPECT_DOUBLE_EQ(term(p.io_terms, "disk"), 4000.0 / 1e9);                     // 4 us
    EXPECT_DOUBLE_EQ(term(p.io_terms, "PCIe"), 4000.0 / 1e10);                    // 0.4 us
    EXPECT_EQ(term(p.gpu_terms, "all-reduce"), -1);  // not data parallel
    EXPECT_EQ(p.bound, "disk");
    EXPECT_DOUBLE_EQ(p.tokens_per_s, 250000.0);
    EXPECT_DOUBLE_EQ(p.achieved_tflops, 25.0);
}

TEST(PerfModel, ComputeBoundWhenTheDiskIsFast) {
    PerfInputs in = hand_case();
    in.disk_gbps = 100;
    const PerfPrediction p = predict(in);
    // GPU step = compute 1 us + optimizer 0.560308 us per token; disk 0.04 us, PCIe 0.4 us.
    EXPECT_EQ(p.bound, "compute");
    EXPECT_DOUBLE_EQ(p.tokens_per_s, 1.0 / (1e-6 + 0.560308e-6));
}

TEST(PerfModel, OptimizerBoundForTopkWithSmallBatches) {
    PerfInputs in = hand_case();
    in.disk_gbps = 100, in.kind = SaeKind::topk, in.batch = 100;
    const PerfPrediction p = predict(in);
    EXPECT_EQ(p.flops_per_token, 2e7 + 8e4);                                     // 2dn + 8kd
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "optimizer"), 560308000.0 / 1e12 / 100);  // 5.6 us
    EXPECT_EQ(p.bound, "optimizer");
}

TEST(PerfModel, RingAllReduceInDataParallel) {
    PerfInputs in = hand_case();
    in.disk_gbps = 100, in.mode = ParallelMode::data_parallel, in.ranks = 4;
    const PerfPrediction p = predict(in);
    // 2 (N-1)/N * 4 B * params = 1.5 * 4 * 20011000 B on the wire per rank per step.
    EXPECT_DOUBLE_EQ(p.allreduce_bytes_per_step, 1.5 * 4.0 * 20011000);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "all-reduce"), 120066000.0 / 1e10 / 1000);  // 12 us
    EXPECT_EQ(p.bound, "all-reduce");
    // Data parallel: each rank reads its own tokens in full.
    EXPECT_DOUBLE_EQ(term(p.io_terms, "disk"), 4000.0 / 1e11);
}

TEST(PerfModel, SharedSweepSplitsTheReadsAndAllGathers) {
    PerfInputs in = hand_case();
    in.mode = ParallelMode::sweep_shared, in.ranks = 8;
    const PerfPrediction p = predict(in);
    EXPECT_DOUBLE_EQ(term(p.io_terms, "disk"), 4000.0 / 8 / 1e9);               // 0.5 us
    EXPECT_DOUBLE_EQ(term(p.io_terms, "all-gather"), 7.0 / 8 * 4000.0 / 1e10);  // 0.35 us
    EXPECT_EQ(term(p.gpu_terms, "all-reduce"), -1);
    EXPECT_EQ(p.bound, "compute");  // 1.56 us GPU step > 0.5 us disk
}

TEST(PerfModel, PeakTableAndLookup) {
    ASSERT_EQ(gpu_peak_table().size(), 12u);
    const GpuPeak* h100 = find_gpu_peak("NVIDIA H100 80GB HBM3");
    ASSERT_NE(h100, nullptr);
    EXPECT_STREQ(h100->name, "H100 SXM");
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::bf16), 989.4e12);
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::tf32), 494.7e12);
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::fp32), 66.9e12);
    const GpuPeak* t4 = find_gpu_peak("Tesla T4");
    ASSERT_NE(t4, nullptr);
    EXPECT_DOUBLE_EQ(peak_flops(*t4, MathMode::tf32), 8.1e12);  // no TF32: CUDA-core fp32
    EXPECT_EQ(find_gpu_peak("Radeon"), nullptr);
}

// Device names as the CUDA driver reports them (cudaDeviceProp::name), and the preset names
// sae-perfmodel --gpu takes, each to the row with its own figures.
TEST(PerfModel, PeakLookupByDeviceName) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"},
        {"NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"},
        {"NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"},
        {"NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"},
        {"A100", "A100 SXM 80GB"},
        {"NVIDIA H100 80GB HBM3", "H100 SXM"},
        {"NVIDIA H100 PCIe", "H100 PCIe"},
        {"NVIDIA H100 NVL", "H100 NVL"},
        {"H100", "H100 SXM"},
        {"NVIDIA H200", "H200 SXM"},
        {"NVIDIA H200 NVL", "H200 NVL"},
        {"NVIDIA L40S", "L40S"},
        {"NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"},
        {"Tesla T4", "T4"},
    };
    for (const auto& [device, row] : cases) {
        const GpuPeak* g = find_gpu_peak(device);
        ASSERT_NE(g, nullptr) << device;
        EXPECT_EQ(std::string(g->name), row) << device;
    }
    // Whole words only: other GPUs whose names contain a listed one are not mistaken for it.
    for (const char* other : {"NVIDIA GH200 480GB", "NVIDIA L40", "Quadro RTX 6000",
                              "NVIDIA GeForce RTX 4090", "NVIDIA H800", ""})
        EXPECT_EQ(find_gpu_peak(other), nullptr) << other;
    // Variants differ where their datasheets do.
    EXPECT_DOUBLE_EQ(find_gpu_peak("NVIDIA H100 PCIe")->bf16_tflops, 756.5);
    EXPECT_DOUBLE_EQ(find_gpu_peak("NVIDIA A100-SXM4-40GB")->hbm_gbps, 1555);
    EXPECT_DOUBLE_EQ(find_gpu_peak("NVIDIA A100-SXM4-80GB")->hbm_gbps, 2039);
}

TEST(PerfModel, MfuPeakFromTableOrOverride) {
    // The table, in the precision the GEMMs run in.
    MfuPeak p = mfu_peak(0, "NVIDIA H100 80GB HBM3", MathMode::fp32);
    EXPECT_DOUBLE_EQ(p.flops, 66.9e12);
    EXPECT_EQ(p.source, "H100 SXM fp32 (table)");
    EXPECT_DOUBLE_EQ(mfu_peak(0, "NVIDIA A100-SXM4-80GB", MathMode::tf32).flops, 156e12);
    // The override wins over the table, and gives the CPU backend a peak.
    p = mfu_peak(312, "NVIDIA H100 80GB HBM3", MathMode::fp32);
    EXPECT_DOUBLE_EQ(p.flops, 312e12);
    EXPECT_EQ(p.source, "log.peak_tflops");
    EXPECT_DOUBLE_EQ(mfu_peak(0.5, "", MathMode::fp32).flops, 0.5e12);
    // Neither: no peak, and the reason names the key that would give one.
    p = mfu_peak(0, "", MathMode::fp32);
    EXPECT_EQ(p.flops, 0);
    EXPECT_NE(p.source.find("log.peak_tflops"), std::string::npos) << p.source;
    p = mfu_peak(0, "NVIDIA GH200 480GB", MathMode::bf16);
    EXPECT_EQ(p.flops, 0);
    EXPECT_NE(p.source.find("GH200"), std::string::npos) << p.source;
    EXPECT_THROW(mfu_peak(-1, "", MathMode::fp32), Error);
    EXPECT_EQ(math_mode_parse("tf32"), MathMode::tf32);
    EXPECT_STREQ(math_mode_name(MathMode::bf16), "bf16");
    EXPECT_THROW(math_mode_parse("fp16"), Error);
}

TEST(PerfModel, RejectsNonsense) {
    PerfInputs in = hand_case();
    in.kind = SaeKind::topk, in.k = 0;
    EXPECT_THROW(predict(in), Error);
    in = hand_case();
    in.disk_gbps = 0;
    EXPECT_THROW(predict(in), Error);
}
