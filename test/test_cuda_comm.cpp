// The GPU communicators against MPI (the reference) under mpirun, at any world size: NcclComm,
// the host-staged MPI communicator and CUDA-aware MPI ordered after the stream
// (cuda_staged_comm.h), and whatever Backend::gradient_comm agrees on for the group ("agreed"):
// every collective on device buffers (ordered after a CudaBackend's stream) and on host buffers,
// and a split. Then the collective-delay debug mode (cuda_collective_delay.h): ordered
// collectives under it see the data; a staged copy on the wrong stream reads the NaN poison.
// Skips, with the reason, where no CUDA device is visible; the NCCL cases also skip where ranks
// share a GPU (NCCL refuses two ranks on one device), the CUDA-aware ones where MPI is not; the
// staged ones run there. Run:
//   mpirun -np 2 test_cuda_comm    (and -np 4 on a node with 4 GPUs)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/comm_choice.h"
#include "saetrain/cuda_backend.h"
#include "saetrain/cuda_collective_delay.h"
#include "saetrain/cuda_device.h"
#include "saetrain/cuda_staged_comm.h"
#include "saetrain/mpi_world.h"
#include "test_util.h"
#if SAETRAIN_HAVE_NCCL
#include "saetrain/nccl_comm.h"
#endif

using namespace saetrain;

namespace {

using saetrain::testing::randn;

// True on every rank when `mine` is true on every rank.
bool on_every_rank(bool mine) {
    int v = mine ? 1 : 0, all = 0;
    MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all != 0;
}

// A CUDA backend on this rank's device (local rank % visible devices), or a skip.
class OnGpu {
protected:
    // False (the caller skips) when some rank sees no device.
    bool start() {
        const int devices = cuda_device_count();
        if (!on_every_rank(devices > 0)) return false;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        place = node_placement();
        device = place.local_rank % devices;
        be = make_cuda_backend(device);
        return true;
    }
    int rank = 0, size = 1, device = 0;
    NodePlacement place;
    std::unique_ptr<Backend> be;
};

constexpr const char* kNoDevice =
    "no CUDA device visible on at least one rank: these tests need GPUs";

// GetParam(): "nccl", "staged", "ordered" (CUDA-aware MPI) or "agreed" (gradient_comm's choice).
class GpuCommVsMpi : public ::testing::TestWithParam<const char*>, protected OnGpu {
protected:
    void SetUp() override {
        if (!start()) GTEST_SKIP() << kNoDevice;
        const std::string kind = GetParam();
        void* stream = cuda_backend_stream(*be);
        if (kind == "staged") {
            comm = make_cuda_staged_comm(make_mpi_world(), stream);
            return;
        }
        if (kind == "ordered") {
            if (!on_every_rank(mpi_cuda_aware()))
                GTEST_SKIP() << "MPI is not CUDA-aware on every rank (MPIX_Query_cuda_support)";
            comm = make_cuda_ordered_comm(make_mpi_world(), stream);
            return;
        }
        if (kind == "agreed") {
            comm = be->gradient_comm(make_mpi_world(), rank, place.host, 120, &choice);
            return;
        }
#if SAETRAIN_HAVE_NCCL
        // NCCL refuses two ranks on one GPU: the same UUID on one host (comm_choice.h).
        CommFacts mine = be->comm_facts();
        mine.world_rank = rank;
        mine.host = place.host;
        auto world = make_mpi_world();
        if (!comm_gpu_tenants(comm_gather_facts(*world, mine)).empty())
            GTEST_SKIP() << "ranks share a GPU on some node: NCCL needs one GPU per rank";
        NcclOptions o;
        o.timeout_seconds = 120;
        o.compute_stream = stream;
        comm = make_nccl_comm(MPI_COMM_WORLD, device, o);
#else
        GTEST_SKIP() << "built without NCCL";
#endif
    }
    CommChoice choice;
    std::unique_ptr<Communicator> comm;
};

}  // namespace

TEST_P(GpuCommVsMpi, AllReduceFloatOnDeviceBuffers) {
    const int64_t n = 1 << 20;  // several NCCL chunks
    auto mine = randn(n, 100 + static_cast<uint32_t>(rank));
    std::vector<float> want(mine.size());
    MPI_Allreduce(mine.data(), want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    DeviceArray<float> d(*be, n);
    be->upload(d.data(), mine.data(), d.bytes());
    be->fill(d.data(), 1, 0.0f);  // queued on the compute stream: the all-reduce must see it
    mine[0] = 0.0f;
    MPI_Allreduce(mine.data(), want.data(), 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    comm->allreduce_sum(d.data(), n);
    std::vector<float> got(mine.size());
    be->download(got.data(), d.data(), d.bytes());
    // Sums of `size` terms in different orders (ring vs MPI's tree): a few ulps each.
    double e = 0, w = 0;
    for (int64_t i = 0; i < n; ++i) e += std::pow(got[i] - want[i], 2), w += want[i] * want[i];
    EXPECT_LE(std::sqrt(e / w), 1e-6 * size);
}

TEST_P(GpuCommVsMpi, HostBuffersAreStaged) {
    std::vector<double> v = {1.0 * rank, 2.5, -3.0 * rank};
    std::vector<double> want(v.size());
    MPI_Allreduce(v.data(), want.data(), 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    comm->allreduce_sum(v.data(), 3);
    EXPECT_EQ(v, want);  // small integers and halves: exact in any order

    std::vector<int64_t> m = {rank, -rank, 7};
    std::vector<int64_t> mwant(3);
    MPI_Allreduce(m.data(), mwant.data(), 3, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    comm->allreduce_max(m.data(), 3);
    EXPECT_EQ(m, mwant);
}

TEST_P(GpuCommVsMpi, AllGatherBcastBarrier) {
    const int64_t bytes = 1000;
    std::vector<char> send(bytes, static_cast<char>('a' + rank % 26)), got(bytes * size),
        want(bytes * size);
    MPI_Allgather(send.data(), static_cast<int>(bytes), MPI_CHAR, want.data(),
                  static_cast<int>(bytes), MPI_CHAR, MPI_COMM_WORLD);
    comm->allgather(send.data(), got.data(), bytes);
    EXPECT_EQ(got, want);

    DeviceArray<float> d(*be, 64);
    be->fill(d.data(), 64, static_cast<float>(rank + 1));
    comm->bcast(d.data(), d.bytes(), size - 1);
    std::vector<float> b(64);
    be->download(b.data(), d.data(), d.bytes());
    for (float x : b) EXPECT_EQ(x, static_cast<float>(size));
    comm->barrier();
}

TEST_P(GpuCommVsMpi, SplitMatchesMpiSplit) {
    const int color = rank % 2;
    auto sub = comm->split(color, rank);
    ASSERT_NE(sub, nullptr);
    MPI_Comm mpi_sub;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &mpi_sub);
    int r = 0, s = 0;
    MPI_Comm_rank(mpi_sub, &r);
    MPI_Comm_size(mpi_sub, &s);
    EXPECT_EQ(sub->rank(), r);
    EXPECT_EQ(sub->size(), s);
    double v = rank, want = 0;
    MPI_Allreduce(&v, &want, 1, MPI_DOUBLE, MPI_SUM, mpi_sub);
    sub->allreduce_sum(&v, 1);
    EXPECT_EQ(v, want);
    MPI_Comm_free(&mpi_sub);
}

INSTANTIATE_TEST_SUITE_P(Comm, GpuCommVsMpi,
                         ::testing::Values("nccl", "staged", "ordered", "agreed"),
                         [](const auto& p) { return std::string(p.param); });

// --- the collective-delay debug mode ---------------------------------------------------------
namespace {

class CollectiveDelay : public ::testing::Test, protected OnGpu {
protected:
    void SetUp() override {
        if (!start()) GTEST_SKIP() << kNoDevice;
    }
    void TearDown() override { unsetenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US"); }
};

}  // namespace

// The group's own communicator (gradient_comm: NCCL, CUDA-aware MPI or staged, whichever the
// ranks agree on) under SAETRAIN_DEBUG_COLLECTIVE_DELAY_US: each collective's input is NaN for
// 20 ms on the compute stream right after the kernel that wrote it, so only a collective ordered
// after that stream sums the real values. Small integers: the sums are exact in any order.
TEST_F(CollectiveDelay, OrderedCollectivesSeeTheDataUnderTheDelay) {
    if (size < 2) GTEST_SKIP() << "a group of one rank has no collective to delay: run at np >= 2";
    setenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US", "20000", 1);
    CommChoice choice;
    auto comm = be->gradient_comm(make_mpi_world(), rank, place.host, 120, &choice);
    ASSERT_NE(comm->name().find("NaN delay"), std::string::npos) << comm->name();
    const int64_t n = 1 << 16;
    DeviceArray<float> d(*be, n);
    be->fill(d.data(), n, static_cast<float>(rank + 1));  // a kernel, still queued
    comm->allreduce_sum(d.data(), n);
    std::vector<float> got(n);
    be->download(got.data(), d.data(), d.bytes());
    const float want = static_cast<float>(size * (size + 1) / 2);
    int64_t wrong = 0;
    for (float x : got) wrong += x != want;
    EXPECT_EQ(wrong, 0) << "through " << comm_kind_name(choice.kind) << ": got " << got[0];

    DeviceArray<double> b(*be, 8);
    std::vector<double> mine(8, static_cast<double>(rank + 1)), bgot(8);
    be->upload(b.data(), mine.data(), b.bytes());
    comm->bcast(b.data(), b.bytes(), size - 1);
    be->download(bgot.data(), b.data(), b.bytes());
    for (double x : bgot) EXPECT_EQ(x, static_cast<double>(size));

    DeviceArray<float> g(*be, 4 * size);
    be->fill(d.data(), 4, static_cast<float>(rank));
    comm->allgather(d.data(), g.data(), 4 * sizeof(float));
    std::vector<float> all(static_cast<size_t>(4 * size));
    be->download(all.data(), g.data(), g.bytes());
    for (int q = 0; q < size; ++q)
        for (int i = 0; i < 4; ++i) EXPECT_EQ(all[q * 4 + i], static_cast<float>(q));
}

// The mode's point: a collective NOT ordered after the stream that wrote its input reads the
// poison every time. The staged communicator copies on a second backend's stream (the bug the
// mode is there to catch); the gathered host copy is NaN from every rank. With the right stream,
// the same call gathers the values.
TEST_F(CollectiveDelay, CollectiveOnTheWrongStreamReadsThePoison) {
    auto other = make_cuda_backend(device);  // another stream on the same GPU
    for (const bool right : {true, false}) {
        void* copies_on = cuda_backend_stream(right ? *be : *other);
        auto comm = make_cuda_collective_delay_comm(
            make_cuda_staged_comm(make_mpi_world(), copies_on), cuda_backend_stream(*be), 200000);
        DeviceArray<float> d(*be, 256);
        be->fill(d.data(), 256, static_cast<float>(rank + 1));
        std::vector<float> got(static_cast<size_t>(256 * size));
        comm->allgather(d.data(), got.data(), 256 * sizeof(float));
        int64_t nan = 0, real = 0;
        for (int q = 0; q < size; ++q)
            for (int i = 0; i < 256; ++i) {
                const float x = got[static_cast<size_t>(q * 256 + i)];
                nan += std::isnan(x);
                real += x == static_cast<float>(q + 1);
            }
        if (right) {
            EXPECT_EQ(real, 256 * size) << "ordered on the producing stream";
        } else {
            EXPECT_EQ(nan, 256 * size) << "a copy on another stream must read the NaN poison";
        }
        be->synchronize();  // the restore, before the buffer is freed
    }
}

TEST(CollectiveDelayEnv, ParsesMicrosecondsAndRefusesTheRest) {
    unsetenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US");
    EXPECT_EQ(collective_delay_us_from_env(), 0);
    setenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US", "1500", 1);
    EXPECT_EQ(collective_delay_us_from_env(), 1500);
    for (const char* bad : {"abc", "-5", "12ms", "99999999999"}) {
        setenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US", bad, 1);
        EXPECT_THROW(collective_delay_us_from_env(), Error) << bad;
    }
    unsetenv("SAETRAIN_DEBUG_COLLECTIVE_DELAY_US");
}

int main(int argc, char** argv) {
    MpiScope mpi(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {  // one rank prints; all run
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    return RUN_ALL_TESTS();
}
