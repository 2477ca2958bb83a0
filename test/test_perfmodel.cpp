// The paper performance model on hand-computed cases: FLOPs, bytes, each term and the bound,
// memory per GPU, the latent-sharding terms; the peak table MFU is measured against and its
// lookup by device name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/perfmodel.h"
#include "test_util.h"

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

// The hand case split over latent shards, with a 100 GB/s intra-node link (1e11 B/s) so the
// shard group's terms are easy to compute too.
PerfInputs sharded_case(int shards, int ranks) {
    PerfInputs in = hand_case();
    in.disk_gbps = 100;  // 0.04 us per token: the GPU step is the bound
    in.mode = ParallelMode::data_parallel;
    in.latent_shards = shards, in.ranks = ranks;
    in.nvlink_gbps = 100;
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

// --- latent shards ----------------------------------------------------------------------------

TEST(PerfModel, OneShardHasNoShardTermsAndPerGpuIsPerReplica) {
    for (const SaeKind kind : {SaeKind::dense, SaeKind::topk}) {
        PerfInputs in = sharded_case(1, 4);
        in.kind = kind;
        const PerfPrediction p = predict(in);
        for (const char* name : {"batch bcast", "top-k gather", "x_hat reduce"})
            EXPECT_EQ(term(p.gpu_terms, name), -1) << name;
        EXPECT_EQ(p.latent_shard_bytes_per_step, 0);
        EXPECT_EQ(p.replicas, 4);
        EXPECT_EQ(p.local_params, p.params);
        EXPECT_DOUBLE_EQ(p.replica_tokens_per_s, p.tokens_per_s);
        EXPECT_DOUBLE_EQ(p.total_tokens_per_s, 4 * p.tokens_per_s);
    }
}

TEST(PerfModel, TwoShardsHalveComputeAndAdamAndAddTheShardCollectives) {
    // One dense replica on 2 GPUs: 5000 latents each, b_dec (1000) whole on both.
    const PerfPrediction p = predict(sharded_case(2, 2));
    EXPECT_EQ(p.replicas, 1);
    EXPECT_EQ(p.local_latents, 5000);
    EXPECT_EQ(p.local_params, 2 * 1000 * 5000 + 5000 + 1000);  // 10006000
    EXPECT_EQ(p.params, 20011000);                             // the SAE's, unchanged
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "compute"), 0.5e-6);    // 1 us at S = 1
    EXPECT_DOUBLE_EQ(p.optimizer_bytes_per_step, 28.0 * 10006000);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "optimizer"), 280168000.0 / 1e12 / 1000);
    // Shard 0's fp32 batch to the other shard: 4 B x d per token.
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "batch bcast"), 4000.0 / 1e11);
    // Dense: no top-k exchange, but x_hat's ring all-reduce, 2 (S-1)/S x 4 B x d per token,
    // with b_dec's gradient (4 B x d) once per 1000-row step.
    EXPECT_EQ(term(p.gpu_terms, "top-k gather"), -1);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "x_hat reduce"), 4000.0 * 1001 / 1000 / 1e11);
    EXPECT_DOUBLE_EQ(p.latent_shard_bytes_per_step, (4000.0 + 4004.0) * 1000);
    EXPECT_EQ(term(p.gpu_terms, "all-reduce"), -1);  // one replica: nothing to average
    // Disk 0.04 us and PCIe 0.4 us per token overlap a 0.860208 us GPU step.
    const double step = 0.5e-6 + 0.280168e-6 + 0.04e-6 + 0.04004e-6;
    EXPECT_EQ(p.bound, "compute");
    EXPECT_DOUBLE_EQ(p.replica_tokens_per_s, 1.0 / step);
    EXPECT_DOUBLE_EQ(p.tokens_per_s, 0.5 / step);  // the replica's tokens over its 2 GPUs
    EXPECT_DOUBLE_EQ(p.total_tokens_per_s, 1.0 / step);
    EXPECT_DOUBLE_EQ(p.achieved_tflops, 1e8 * 0.5 / step / 1e12);
}

TEST(PerfModel, TopkShardsAllGatherTheirCandidates) {
    PerfInputs in = sharded_case(4, 4);
    in.kind = SaeKind::topk;
    const PerfPrediction p = predict(in);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "compute"), (2e7 + 8e4) / 4 / 1e14);
    // From each of the 3 other shards, k = 10 (value, index) pairs of 8 B per token.
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "top-k gather"), 3 * 10 * 8.0 / 1e11);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "x_hat reduce"), 1.5 * 4000.0 * 1001 / 1000 / 1e11);
    EXPECT_DOUBLE_EQ(p.latent_shard_bytes_per_step, (4000.0 + 240.0 + 6006.0) * 1000);
}

TEST(PerfModel, ReplicasAllReduceOnlyTheirShard) {
    // 8 GPUs = 4 replicas x 2 shards: each rank all-reduces its 10006000 parameters with the 3
    // other replicas' same shard, 2 (R-1)/R x 4 B each.
    PerfInputs in = sharded_case(2, 8);
    PerfPrediction p = predict(in);
    EXPECT_EQ(p.replicas, 4);
    EXPECT_DOUBLE_EQ(p.allreduce_bytes_per_step, 1.5 * 4.0 * 10006000);
    EXPECT_DOUBLE_EQ(term(p.gpu_terms, "all-reduce"), 60036000.0 / 1e10 / 1000);  // NIC 10 GB/s
    EXPECT_EQ(p.bound, "all-reduce");
    EXPECT_DOUBLE_EQ(p.total_tokens_per_s, 8 * p.tokens_per_s);
    EXPECT_DOUBLE_EQ(p.total_tokens_per_s, 4 * p.replica_tokens_per_s);
    // On one node the replicas' all-reduce stays on the intra-node link; on two it crosses
    // the NICs, as when the nodes are not said.
    in.nodes = 1;
    EXPECT_DOUBLE_EQ(term(predict(in).gpu_terms, "all-reduce"), 60036000.0 / 1e11 / 1000);
    in.nodes = 2;
    EXPECT_DOUBLE_EQ(term(predict(in).gpu_terms, "all-reduce"), 60036000.0 / 1e10 / 1000);
}

TEST(PerfModel, ShardedSweepReadsOncePerSae) {
    // 8 GPUs = 4 SAEs x 2 shards sharing one stream: shard 0 of each reads a quarter.
    PerfInputs in = sharded_case(2, 8);
    in.mode = ParallelMode::sweep_shared;
    const PerfPrediction p = predict(in);
    EXPECT_EQ(p.replicas, 1);
    EXPECT_DOUBLE_EQ(term(p.io_terms, "disk"), 4000.0 / 4 / 1e11);
    EXPECT_DOUBLE_EQ(term(p.io_terms, "all-gather"), 3.0 / 4 * 4000.0 / 1e10);
    EXPECT_EQ(term(p.gpu_terms, "all-reduce"), -1);
}

TEST(PerfModel, MemoryPerGpuByHand) {
    // The dense hand case on one GPU: 16 B x 20011000 parameters (p, grad, Adam m, v); x, xc,
    // x_hat [1000, 1000] and pre, dz [1000, 10000] in fp32; 3 x [10000] per-latent scratch.
    const PerfPrediction p = predict(hand_case());
    EXPECT_DOUBLE_EQ(p.memory.state, 16.0 * 20011000);
    EXPECT_DOUBLE_EQ(p.memory.activations, 12e6 + 8e7 + 120000);
    EXPECT_EQ(p.memory.topk, 0);
    EXPECT_DOUBLE_EQ(p.memory.workspace, 33554432.0);
    EXPECT_DOUBLE_EQ(p.memory.total(), 320176000.0 + 92120000 + 33554432);
}

TEST(PerfModel, MemoryPerGpuAboutHalvesWithTwoShardsOfAWideSae) {
    // TopK, d = 1000, n = 100000, k = 10, 1000 rows: the parameters dominate.
    PerfInputs in = sharded_case(1, 1);
    in.kind = SaeKind::topk, in.n_latents = 100000;
    const PerfMemory one = predict(in).memory;
    EXPECT_DOUBLE_EQ(one.state, 16.0 * (2e8 + 1e5 + 1e3));
    EXPECT_DOUBLE_EQ(one.activations, 12e6 + 4e8 + 1.2e6);  // pre [1000, 100000], no dz
    EXPECT_DOUBLE_EQ(one.topk, 8.0 * 1000 * 10);            // the [B, k] selection
    EXPECT_DOUBLE_EQ(one.total(), 3648450432.0);
    in.latent_shards = 2, in.ranks = 2;
    const PerfMemory two = predict(in).memory;
    EXPECT_DOUBLE_EQ(two.state, 16.0 * (1e8 + 5e4 + 1e3));  // b_dec whole on each shard
    EXPECT_DOUBLE_EQ(two.activations, 12e6 + 2e8 + 6e5);    // x, xc, x_hat stay [B, d]
    EXPECT_DOUBLE_EQ(two.topk, 8.0 * 1000 * 10 * 3);        // + the 2 gathered candidate sets
    EXPECT_DOUBLE_EQ(two.total(), 1847210432.0);
    EXPECT_NEAR(two.total() / one.total(), 0.5, 0.01);
}

TEST(PerfModel, RejectsShardingsTheTrainerWould) {
    PerfInputs in = sharded_case(3, 3);  // 10000 latents do not split 3 ways
    EXPECT_THROW(predict(in), Error);
    in = sharded_case(0, 4);
    EXPECT_THROW(predict(in), Error);
    in = sharded_case(4, 6);  // 6 ranks are not replicas x 4 shards
    EXPECT_THROW(predict(in), Error);
    in = sharded_case(2000, 2000);  // TopK: 5 latents per shard, fewer than k = 10
    in.kind = SaeKind::topk;
    EXPECT_THROW(predict(in), Error);
    in = sharded_case(4, 8);
    in.nodes = 4;  // 2 ranks per node: a 4-shard group would span two nodes
    EXPECT_THROW(predict(in), Error);
    in.nodes = 2;
    EXPECT_NO_THROW(predict(in));
    in.nvlink_gbps = 0;
    EXPECT_THROW(predict(in), Error);
}

// The program a user runs: its grid flags reach the model, the JSON line carries the new
// fields, and a sharding the trainer would refuse is an error naming the flags.
TEST(PerfModel, CliLatentShards) {
    const std::string bin = std::string(SAETRAIN_BIN_DIR) + "/sae-perfmodel";
    saetrain::testing::CommandResult r = saetrain::testing::run_command(
        bin + " --d-model 1000 --n-latents 100000 --k 10 --batch 1000 --replicas 2 " +
        "--latent-shards 2 --nodes 1 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    for (const char* field :
         {"\"ranks\": 4,", "\"nodes\": 1,", "\"replicas\": 2,", "\"latent_shards\": 2,",
          "\"batch\": 1000,", "\"mode\": \"data_parallel\"",
          "\"predicted_tokens_per_s_per_replica\": ", "\"predicted_tokens_per_s_total\": ",
          "\"x_hat reduce\": ", "\"top-k gather\": ", "\"all-reduce\": ",
          // MemoryPerGpuAboutHalvesWithTwoShardsOfAWideSae's 1847210432 B
          "\"predicted_memory_per_gpu_GB\": 1.847,"})
        EXPECT_NE(r.out.find(field), std::string::npos) << field << "\n" << r.out;
    r = saetrain::testing::run_command(bin + " --n-latents 1000 --latent-shards 3");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--n-latents 1000 is not a multiple of --latent-shards 3"),
              std::string::npos)
        << r.out;
    r = saetrain::testing::run_command(bin + " --latent-shards 0");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--latent-shards must be at least 1"), std::string::npos) << r.out;
    r = saetrain::testing::run_command(bin + " --replicas 2 --ranks 3");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--ranks 3 disagrees"), std::string::npos) << r.out;
    // The table names the grid and prints the memory per GPU.
    r = saetrain::testing::run_command(bin + " --n-latents 24576 --replicas 2 --latent-shards 4");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("grid: 2 replicas x 4 latent shards"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("memory per GPU: "), std::string::npos) << r.out;
}

TEST(PerfModel, PeakTableAndLookup) {
    ASSERT_EQ(gpu_peak_table().size(), 12u);
    const GpuPeak* h100 = find_gpu_peak("NVIDIA H100 80GB HBM3");
    ASSERT_NE(h100, nullptr);
    EXPECT_STREQ(h100->name, "H100 SXM");
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::bf16), 989.4e12);
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::tf32), 494.7e12);
    EXPECT_DOUBLE_EQ(peak_flops(*h100, MathMode::fp32), 66.9e12);
    EXPECT_DOUBLE_EQ(h100->nvlink_gbps, 450);  // NVLink 4: 900 GB/s both directions
    EXPECT_DOUBLE_EQ(find_gpu_peak("NVIDIA A100-SXM4-80GB")->nvlink_gbps, 300);
    EXPECT_DOUBLE_EQ(find_gpu_peak("NVIDIA L40S")->nvlink_gbps, 32);  // no NVLink: PCIe
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
