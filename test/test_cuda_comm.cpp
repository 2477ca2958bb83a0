// The GPU communicators against MPI (the reference) under mpirun, at any world size: NcclComm
// and the host-staged MPI communicator (cuda_staged_comm.h), every collective on device buffers
// (ordered after a CudaBackend's stream) and on host buffers, and a split. Skips, with the
// reason, where no CUDA device is visible; the NCCL cases also skip where ranks share a GPU
// (NCCL refuses two ranks on one device), the staged ones run there. Run:
//   mpirun -np 2 test_cuda_comm    (and -np 4 on a node with 4 GPUs)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/cuda_backend.h"
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

// GetParam(): "nccl" or "staged".
class GpuCommVsMpi : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        const int devices = cuda_device_count();
        int any = devices, world = 0;
        MPI_Allreduce(&devices, &any, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (any == 0)
            GTEST_SKIP() << "no CUDA device visible on at least one rank: these tests need GPUs";
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        size = world;
        const NodePlacement place = node_placement();
        const int device = place.local_rank % devices;
        be = make_cuda_backend(device);
        if (std::string(GetParam()) == "staged") {
            comm = make_cuda_staged_comm(make_mpi_world(), cuda_backend_stream(*be));
            return;
        }
#if SAETRAIN_HAVE_NCCL
        int own_gpu = place.local_size <= devices ? 1 : 0, all_own = 0;
        MPI_Allreduce(&own_gpu, &all_own, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_own) GTEST_SKIP() << "ranks share a GPU on some node: NCCL needs one GPU per rank";
        NcclOptions o;
        o.timeout_seconds = 120;
        o.compute_stream = cuda_backend_stream(*be);
        comm = make_nccl_comm(MPI_COMM_WORLD, device, o);
#else
        GTEST_SKIP() << "built without NCCL";
#endif
    }
    int rank = 0, size = 1;
    std::unique_ptr<Backend> be;
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

INSTANTIATE_TEST_SUITE_P(Comm, GpuCommVsMpi, ::testing::Values("nccl", "staged"),
                         [](const auto& p) { return std::string(p.param); });

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
