// NcclComm: Communicator over NCCL, bootstrapped by MPI, with timeouts and abort.
#include "saetrain/nccl_comm.h"

#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "cuda_check.h"
#include "handles.h"
#include "saetrain/cuda_staged_comm.h"
#include "saetrain/mpi_world.h"  // defines: CollectiveWatch

#define SAE_NCCL_CHECK(stmt)                                                                   \
    do {                                                                                       \
        ncclResult_t _r = (stmt);                                                              \
        if (_r != ncclSuccess && _r != ncclInProgress)                                         \
            ::saetrain::throw_check_failure(                                                   \
                "NCCL", #stmt,                                                                 \
                fmt::format("{}: {}", static_cast<int>(_r), ncclGetErrorString(_r)), __FILE__, \
                __LINE__);                                                                     \
    } while (0)

namespace saetrain {
namespace {

using Clock = std::chrono::steady_clock;

std::string host_name() {
    char h[256] = {0};
    gethostname(h, sizeof(h) - 1);
    return h;
}

ncclConfig_t nonblocking_config() {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = 0;
    return c;
}

class NcclComm final : public Communicator {
public:
    // rank/size: known to the caller for the MPI bootstrap (named in an init failure), -1/0
    // after a split (read from NCCL once ready).
    NcclComm(ncclComm_t comm, int device, const NcclOptions& opt, int rank = -1, int size = 0)
        : comm_(comm), device_(device), opt_(opt), host_(host_name()), rank_(rank), size_(size) {
        wait_ready("ncclCommInitRank");
        SAE_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
        SAE_NCCL_CHECK(ncclCommCount(comm_, &size_));
        stream_ = cuda::make_stream();
        before_ = cuda::make_event();
        after_ = cuda::make_event();
    }
    ~NcclComm() override {
        if (!comm_) return;
        if (aborted_) return;
        // Finalize flushes outstanding work; a peer that died makes it fail, so bound it.
        if (ncclCommFinalize(comm_) == ncclInProgress) {
            const auto t0 = Clock::now();
            ncclResult_t st = ncclInProgress;
            while (st == ncclInProgress && !expired(t0)) {
                ncclCommGetAsyncError(comm_, &st);
                std::this_thread::yield();
            }
            if (st != ncclSuccess) {
                ncclCommAbort(comm_);
                return;
            }
        }
        ncclCommDestroy(comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return fmt::format("nccl ({} ranks)", size_); }

    void allreduce_sum(float* data, int64_t n) override {
        collective("all-reduce (float sum)", data, n * 4, [&](void* p, cudaStream_t s) {
            return ncclAllReduce(p, p, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, s);
        });
    }
    void allreduce_sum(double* data, int64_t n) override {
        collective("all-reduce (double sum)", data, n * 8, [&](void* p, cudaStream_t s) {
            return ncclAllReduce(p, p, static_cast<size_t>(n), ncclFloat64, ncclSum, comm_, s);
        });
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        collective("all-reduce (int64 max)", data, n * 8, [&](void* p, cudaStream_t s) {
            return ncclAllReduce(p, p, static_cast<size_t>(n), ncclInt64, ncclMax, comm_, s);
        });
    }
    void allgather(const void* send, void* recv, int64_t bytes) override {
        const int64_t total = bytes * size_;
        if (total == 0) return;
        const bool dev = cuda_is_device_pointer(send) && cuda_is_device_pointer(recv);
        if (dev) {
            order_after_compute();
            enqueue("all-gather", ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclInt8,
                                                comm_, stream_.get()));
            finish("all-gather");
            return;
        }
        char* stage = static_cast<char*>(staging(static_cast<size_t>(total)));
        char* mine = stage + bytes * rank_;
        SAE_CUDA_CHECK(cudaMemcpyAsync(mine, send, static_cast<size_t>(bytes), cudaMemcpyDefault,
                                       stream_.get()));
        enqueue("all-gather", ncclAllGather(mine, stage, static_cast<size_t>(bytes), ncclInt8,
                                            comm_, stream_.get()));
        SAE_CUDA_CHECK(cudaMemcpyAsync(recv, stage, static_cast<size_t>(total), cudaMemcpyDefault,
                                       stream_.get()));
        finish("all-gather");
    }
    void bcast(void* data, int64_t bytes, int root) override {
        collective("broadcast", data, bytes, [&](void* p, cudaStream_t s) {
            return ncclBroadcast(p, p, static_cast<size_t>(bytes), ncclInt8, root, comm_, s);
        });
    }
    void barrier() override {
        // NCCL has no barrier: an all-reduce of one value that every rank must join.
        float* one = static_cast<float*>(staging(sizeof(float)));
        SAE_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_.get()));
        enqueue("barrier", ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_.get()));
        finish("barrier");
    }
    std::unique_ptr<Communicator> split(int color, int key) override {
        ncclConfig_t cfg = nonblocking_config();
        ncclComm_t out = nullptr;
        enqueue("split",
                ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, &cfg));
        wait_ready("ncclCommSplit");
        if (!out) return nullptr;  // this rank asked for no group
        return std::make_unique<NcclComm>(out, device_, opt_);
    }

private:
    static double seconds_since(Clock::time_point t0) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
    }

    // In-place collective on `data` (device: directly; host: through the staging buffer).
    template <typename Op>
    void collective(const char* what, void* data, int64_t bytes, Op op) {
        if (bytes == 0) return;
        if (cuda_is_device_pointer(data)) {
            order_after_compute();
            enqueue(what, op(data, stream_.get()));
            finish(what);
            return;
        }
        void* stage = staging(static_cast<size_t>(bytes));
        SAE_CUDA_CHECK(cudaMemcpyAsync(stage, data, static_cast<size_t>(bytes),
                                       cudaMemcpyHostToDevice, stream_.get()));
        enqueue(what, op(stage, stream_.get()));
        SAE_CUDA_CHECK(cudaMemcpyAsync(data, stage, static_cast<size_t>(bytes),
                                       cudaMemcpyDeviceToHost, stream_.get()));
        finish(what);
    }

    // The collective reads buffers the compute stream wrote: wait for that work first.
    void order_after_compute() {
        if (opt_.compute_stream) {
            auto compute = static_cast<cudaStream_t>(opt_.compute_stream);
            SAE_CUDA_CHECK(cudaEventRecord(before_.get(), compute));
            SAE_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), before_.get(), 0));
        } else {
            SAE_CUDA_CHECK(cudaDeviceSynchronize());
        }
    }

    void enqueue(const char* what, ncclResult_t r) {
        if (r == ncclSuccess || r == ncclInProgress) {
            wait_ready(what);  // non-blocking comm: the enqueue itself may still be running
            return;
        }
        fail(what, fmt::format("{} ({})", ncclGetErrorString(r), static_cast<int>(r)));
    }

    // Waits until the communicator has no call in progress (init, split, enqueue).
    void wait_ready(const char* what) {
        const auto t0 = Clock::now();
        for (;;) {
            ncclResult_t st = ncclSuccess;
            const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
            if (q != ncclSuccess)
                fail(what, fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(q)));
            if (st == ncclSuccess) return;
            if (st != ncclInProgress)
                fail(what, fmt::format("{} ({})", ncclGetErrorString(st), static_cast<int>(st)));
            if (expired(t0)) fail_timeout(what);
            std::this_thread::yield();
        }
    }

    // Orders later compute-stream work after the collective, then blocks until it completed,
    // polling NCCL's error state so that a failed or vanished peer is noticed.
    void finish(const char* what) {
        SAE_CUDA_CHECK(cudaEventRecord(after_.get(), stream_.get()));
        if (opt_.compute_stream)
            SAE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(opt_.compute_stream),
                                               after_.get(), 0));
        const auto t0 = Clock::now();
        for (int spin = 0;; ++spin) {
            const cudaError_t q = cudaEventQuery(after_.get());
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) SAE_CUDA_CHECK(q);
            ncclResult_t st = ncclSuccess;
            ncclCommGetAsyncError(comm_, &st);
            if (st != ncclSuccess && st != ncclInProgress)
                fail(what, fmt::format("{} ({})", ncclGetErrorString(st), static_cast<int>(st)));
            if (expired(t0)) fail_timeout(what);
            if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    // timeout_seconds <= 0: wait for ever (parallel.timeout_s: 0 turns the watchdog off).
    bool expired(Clock::time_point t0) const {
        return opt_.timeout_seconds > 0 && seconds_since(t0) > opt_.timeout_seconds;
    }

    [[noreturn]] void fail(const char* what, const std::string& why) {
        abort_comm();
        throw Error(
            fmt::format("NCCL {} failed on rank {} of {} (host {}, GPU {}): {}; the "
                        "communicator was aborted. Check the other ranks' logs for the "
                        "first error.",
                        what, rank_, size_, host_, device_, why));
    }
    [[noreturn]] void fail_timeout(const char* what) {
        abort_comm();
        throw Error(fmt::format(
            "NCCL {} did not complete within {:.0f} s (parallel.timeout_s) on rank {} of {} "
            "(host {}, GPU {}): a peer rank has probably died or hung (the rank(s) that did not "
            "report this error are the suspects). The communicator was aborted; raise the "
            "timeout only if steps are legitimately that slow.",
            what, opt_.timeout_seconds, rank_, size_, host_, device_));
    }
    void abort_comm() {
        if (comm_ && !aborted_) ncclCommAbort(comm_);
        aborted_ = true;
    }

    void* staging(size_t bytes) {
        if (bytes > staging_bytes_) {
            // The old buffer may still be read by queued work: wait for the stream first.
            SAE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
            staging_ = cuda::make_device_buffer(bytes);
            staging_bytes_ = bytes;
        }
        return staging_.get();
    }

    ncclComm_t comm_ = nullptr;
    int device_ = 0;
    NcclOptions opt_;
    std::string host_;
    int rank_ = -1, size_ = 0;
    bool aborted_ = false;
    cuda::Stream stream_;
    cuda::Event before_, after_;
    cuda::DeviceBuffer staging_;
    size_t staging_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm comm, int device,
                                             const NcclOptions& options) {
    int rank = 0, size = 0;
    SAE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SAE_MPI_CHECK(MPI_Comm_size(comm, &size));
    SAE_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    if (rank == 0) SAE_NCCL_CHECK(ncclGetUniqueId(&id));
    {
        // A rank that never arrives (it died, or it is in another set-up call) ends the job
        // through the MPI watchdog (parallel.timeout_s) with a line naming this rank.
        CollectiveWatch watch("the NCCL id broadcast (MPI_Bcast)");
        SAE_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
    }
    ncclConfig_t cfg = nonblocking_config();
    ncclComm_t c = nullptr;
    SAE_NCCL_CHECK(ncclCommInitRankConfig(&c, size, id, rank, &cfg));
    // Non-blocking: the constructor polls the initialization with options.timeout_seconds and
    // throws saetrain::Error naming this rank when a peer never joins.
    return std::make_unique<NcclComm>(c, device, options, rank, size);
}

}  // namespace saetrain
