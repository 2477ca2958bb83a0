// The communicator decision of a group (comm_choice.h) on faked per-rank facts: per-task GPU
// binding, shared GPUs, builds without NCCL, CUDA-aware MPI on some ranks, a CPU rank among GPU
// ranks; and the job's warnings. The agreement itself, under mpirun, is test_mpi's
// (Mpi.CommAgreement*).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "saetrain/comm.h"
#include "saetrain/comm_choice.h"
#include "saetrain/error.h"

using namespace saetrain;

namespace {

// A 16-byte UUID whose first byte is `id` (comm_uuid_text shows the first four bytes).
std::string uuid(int id) {
    std::string u(16, '\0');
    u[0] = static_cast<char>(id);
    u[1] = static_cast<char>(0xab);
    u[15] = static_cast<char>(id);
    return u;
}

CommFacts gpu_rank(int rank, const std::string& host, int gpu, int device = 0) {
    CommFacts f;
    f.world_rank = rank;
    f.host = host;
    f.device_uuid = uuid(gpu);
    f.device = device;
    f.nccl = true;
    f.mpi_cuda_aware = false;
    return f;
}

CommFacts cpu_rank(int rank, const std::string& host) {
    CommFacts f;
    f.world_rank = rank;
    f.host = host;
    return f;
}

std::string what_of(const std::vector<CommFacts>& facts) {
    try {
        comm_choose(facts);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(CommChoice, RankListsAndUuids) {
    EXPECT_EQ(comm_rank_list({3}), "rank 3");
    EXPECT_EQ(comm_rank_list({1, 0}), "ranks 0,1");
    EXPECT_EQ(comm_rank_list({7, 4, 5, 6, 0, 9, 10}), "ranks 0,4-7,9,10");
    EXPECT_EQ(comm_uuid_text(uuid(0x8c)), "GPU-8cab0000");
    EXPECT_EQ(comm_uuid_text(""), "no GPU");
    EXPECT_STREQ(comm_kind_name(CommKind::mpi_device), "mpi_device");
}

TEST(CommChoice, CpuRanksStayOnHostMpi) {
    const CommChoice c = comm_choose({cpu_rank(0, "n1"), cpu_rank(1, "n1"), cpu_rank(2, "n2")});
    EXPECT_EQ(c.kind, CommKind::host);
    EXPECT_TRUE(c.notes.empty());
}

// srun --gpus-per-task=1: every rank sees one device (ordinal 0) but each has its own GPU, so
// NCCL applies (the old gate, local_size <= visible devices, refused it).
TEST(CommChoice, PerTaskBindingDistinctUuidsOnOneHostGetNccl) {
    std::vector<CommFacts> f;
    for (int r = 0; r < 4; ++r) f.push_back(gpu_rank(r, "n1", 10 + r, /*device=*/0));
    const CommChoice c = comm_choose(f);
    EXPECT_EQ(c.kind, CommKind::nccl);
    EXPECT_TRUE(c.notes.empty());
    // Two nodes, the same UUID bytes on each (a fake or cloned UUID): different hosts, no clash.
    const CommChoice two = comm_choose({gpu_rank(0, "n1", 5), gpu_rank(1, "n2", 5)});
    EXPECT_EQ(two.kind, CommKind::nccl);
}

TEST(CommChoice, GpuOfSeveralRanksFallsBackToStagedAndNamesTheRanks) {
    // Ranks 0 and 1 on GPU 0 of n1, rank 2 on its own GPU of n1, rank 3 on n2.
    const std::vector<CommFacts> f = {gpu_rank(0, "n1", 0x8c), gpu_rank(1, "n1", 0x8c),
                                      gpu_rank(2, "n1", 0x11, 1), gpu_rank(3, "n2", 0x8c)};
    const CommChoice c = comm_choose(f);
    EXPECT_EQ(c.kind, CommKind::mpi_staged);
    ASSERT_EQ(c.notes.size(), 1u);
    EXPECT_EQ(c.notes[0],
              "ranks 0,1 share GPU 0 (GPU-8cab0000) on node n1: gradients go through MPI staged "
              "through host memory (NCCL refuses two ranks on one GPU)");
}

TEST(CommChoice, GpuOfSeveralRanksWithCudaAwareMpiUsesDeviceMpi) {
    std::vector<CommFacts> f = {gpu_rank(0, "n1", 1), gpu_rank(1, "n1", 1), gpu_rank(2, "n1", 1)};
    for (CommFacts& x : f) x.mpi_cuda_aware = true;
    const CommChoice c = comm_choose(f);
    EXPECT_EQ(c.kind, CommKind::mpi_device);
    ASSERT_EQ(c.notes.size(), 1u);
    EXPECT_EQ(c.notes[0],
              "ranks 0-2 share GPU 0 (GPU-01ab0000) on node n1: gradients go through CUDA-aware "
              "MPI on device memory (NCCL refuses two ranks on one GPU)");
    // One rank whose MPI is not CUDA-aware makes the whole group stage through host memory.
    f[1].mpi_cuda_aware = false;
    const CommChoice mixed = comm_choose(f);
    EXPECT_EQ(mixed.kind, CommKind::mpi_staged);
    ASSERT_EQ(mixed.notes.size(), 2u);
    EXPECT_EQ(mixed.notes[1],
              "MPI reads device memory on ranks 0,2 but not on rank 1: gradients go through MPI "
              "staged through host memory");
}

// A rank built without NCCL: every rank of the group falls back together (not: the NCCL ranks
// in NCCL's bootstrap and the other in MPI, hanging).
TEST(CommChoice, MixedNcclBuildsAgreeOnAFallback) {
    std::vector<CommFacts> f = {gpu_rank(0, "n1", 1), gpu_rank(1, "n1", 2), gpu_rank(2, "n2", 3),
                                gpu_rank(3, "n2", 4)};
    f[2].nccl = false;
    CommChoice c = comm_choose(f);
    EXPECT_EQ(c.kind, CommKind::mpi_staged);
    ASSERT_EQ(c.notes.size(), 1u);
    EXPECT_EQ(c.notes[0],
              "saetrain on rank 2 was built without NCCL: gradients go through MPI staged through "
              "host memory");
    for (CommFacts& x : f) x.mpi_cuda_aware = true;
    EXPECT_EQ(comm_choose(f).kind, CommKind::mpi_device);
    // The decision does not depend on which rank computes it, nor on the order of the facts
    // apart from the group order the gather gives every rank alike.
    f[2].nccl = true;
    EXPECT_EQ(comm_choose(f).kind, CommKind::nccl);
}

TEST(CommChoice, CpuRankInAGpuGroupIsRefusedInOneLine) {
    const std::string what =
        what_of({gpu_rank(0, "n1", 1), gpu_rank(1, "n1", 2), cpu_rank(2, "n2"), cpu_rank(3, "n2")});
    EXPECT_EQ(what,
              "one group of ranks mixes backends: ranks 2,3 (node n2) on the CPU, ranks 0,1 "
              "(node n1) on GPUs; the replicas and latent shards of an SAE exchange buffers "
              "through one kind of communicator, so give every rank a GPU (check "
              "CUDA_VISIBLE_DEVICES and the job's GPU request) or set backend: cpu");
    EXPECT_EQ(what.find('\n'), std::string::npos);
    const std::string one = what_of({cpu_rank(0, "a"), gpu_rank(1, "b", 1), gpu_rank(2, "c", 2)});
    EXPECT_NE(one.find("rank 0 (node a) on the CPU, ranks 1,2 (nodes b,c) on GPUs;"),
              std::string::npos)
        << one;
}

// The job's warnings: every distinct note once, and a GPU shared by ranks that no group note
// names (ranks of different SAEs in a sweep) once more, with what sharing costs.
TEST(CommChoice, JobWarningsNameEachGpuOfSeveralRanksOnce) {
    // 4 ranks on one GPU of n1, 2 on one GPU of n2: a sweep of 2 configs x 3 replicas, say.
    std::vector<CommFacts> world;
    for (int r = 0; r < 4; ++r) world.push_back(gpu_rank(r, "n1", 7));
    for (int r = 4; r < 6; ++r) world.push_back(gpu_rank(r, "n2", 9));
    const std::string group_note =
        "ranks 4,5 share GPU 0 (GPU-09ab0000) on node n2: gradients go through MPI staged "
        "through host memory (NCCL refuses two ranks on one GPU)";
    const std::vector<std::string> lines = comm_warnings(world, {group_note, group_note});
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], group_note);
    EXPECT_EQ(lines[1],
              "ranks 0-3 share GPU 0 (GPU-07ab0000) on node n1: they take turns on it (each "
              "runs slower than on a GPU of its own)");
    // GPUs of their own, or CPU ranks: nothing to say.
    EXPECT_TRUE(comm_warnings({gpu_rank(0, "n1", 1), gpu_rank(1, "n1", 2)}, {}).empty());
    EXPECT_TRUE(comm_warnings({cpu_rank(0, "n1"), cpu_rank(1, "n1")}, {}).empty());
    EXPECT_EQ(comm_gpu_tenants(world).size(), 2u);
}

// A group of one through the collective path: self communicator, no peers.
TEST(CommChoice, AgreementOfOneRank) {
    auto self = make_self_comm();
    const CommChoice c = comm_agree(*self, gpu_rank(0, "n1", 3));
    EXPECT_EQ(c.kind, CommKind::nccl);
    const std::vector<CommFacts> facts = comm_gather_facts(*self, gpu_rank(5, "host-x", 3, 2));
    ASSERT_EQ(facts.size(), 1u);
    EXPECT_EQ(facts[0].world_rank, 5);
    EXPECT_EQ(facts[0].host, "host-x");
    EXPECT_EQ(facts[0].device_uuid, uuid(3));
    EXPECT_EQ(facts[0].device, 2);
    EXPECT_EQ(comm_agree(*self, cpu_rank(0, "n1")).kind, CommKind::host);
}
