// MPI implementation of Communicator (host buffers).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/mpi_world.h"

namespace saetrain {
namespace {

// --- watchdog --------------------------------------------------------------------------------
// MPI has no timeout on collectives (ULFM aside), and a peer that hangs or was SIGSTOPped
// leaves the others blocked forever. Every collective marks its start; a thread checks the mark
// and ends the job when one has waited too long.
using Clock = std::chrono::steady_clock;
std::atomic<int64_t> g_wait_start_ns{0};  // 0: not inside a collective
std::atomic<const char*> g_wait_what{""};
std::atomic<double> g_timeout_s{0.0};
std::atomic<int> g_rank{-1};

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
}

void watchdog_loop() {
    for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        const double timeout = g_timeout_s.load();
        const int64_t start = g_wait_start_ns.load();
        if (timeout <= 0 || start == 0) continue;
        const double waited = static_cast<double>(now_ns() - start) * 1e-9;
        if (waited < timeout) continue;
        char host[256] = {0};
        gethostname(host, sizeof(host) - 1);
        std::fprintf(stderr,
                     "saetrain: error: rank %d (%s): %s has waited %.0f s for its peers; a rank "
                     "died, hangs or was stopped (parallel.timeout_s = %.0f). Aborting the job; "
                     "rerun the same command to resume from the last checkpoint\n",
                     g_rank.load(), host, g_wait_what.load(), waited, timeout);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
    }
}

// Marks one collective for the watchdog.
class Watch {
public:
    explicit Watch(const char* what) {
        g_wait_what.store(what);
        g_wait_start_ns.store(now_ns());
    }
    ~Watch() { g_wait_start_ns.store(0); }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
};

// --- node-local all-reduce -------------------------------------------------------------------
// When every rank of a communicator shares one node, large float all-reduces (the gradients of
// data-parallel replicas) go through one MPI-3 shared-memory window instead of messages: each
// rank copies its buffer in, sums its slice over all ranks in rank order, and copies the result
// out. That is 2-3x faster than MPI_Allreduce through Open MPI's shared-memory transport here
// (37.8 MB: ~18 ms vs 40-60 ms), and every rank ends with the same bits.
class NodeReducer {
public:
    static constexpr int64_t kMinFloats = 1 << 18;  // below this, MPI's latency path wins
    static constexpr int64_t kChunk = 1 << 24;      // floats per pass: bounds the window

    explicit NodeReducer(MPI_Comm comm) : comm_(comm) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~NodeReducer() {
        if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    }
    NodeReducer(const NodeReducer&) = delete;
    NodeReducer& operator=(const NodeReducer&) = delete;

    // Collective over comm_.
    void sum(float* data, int64_t n) {
        ensure(std::min(n, kChunk));
        for (int64_t off = 0; off < n; off += kChunk) {
            const int64_t len = std::min(kChunk, n - off);
            std::memcpy(seg_[rank_], data + off, static_cast<size_t>(len) * sizeof(float));
            fence();
            const int64_t lo = len * rank_ / size_, hi = len * (rank_ + 1) / size_;
            float* out = seg_[size_];  // the result area, after the ranks' segments
            for (int64_t i = lo; i < hi; ++i) {
                float acc = seg_[0][i];
                for (int q = 1; q < size_; ++q) acc += seg_[q][i];
                out[i] = acc;
            }
            fence();
            std::memcpy(data + off, out, static_cast<size_t>(len) * sizeof(float));
            fence();  // nobody overwrites a segment before everyone copied the result out
        }
    }

private:
    void fence() {
        MPI_Win_sync(win_);
        SAE_MPI_CHECK(MPI_Barrier(comm_));
        MPI_Win_sync(win_);
    }
    void ensure(int64_t floats) {
        if (floats <= cap_) return;
        if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
        cap_ = floats;
        // Rank 0's segment also holds the result area.
        const MPI_Aint bytes = static_cast<MPI_Aint>(cap_ * static_cast<int64_t>(sizeof(float)) *
                                                     (rank_ == 0 ? 2 : 1));
        float* base = nullptr;
        SAE_MPI_CHECK(
            MPI_Win_allocate_shared(bytes, sizeof(float), MPI_INFO_NULL, comm_, &base, &win_));
        seg_.assign(static_cast<size_t>(size_) + 1, nullptr);
        for (int q = 0; q < size_; ++q) {
            MPI_Aint sz = 0;
            int disp = 0;
            SAE_MPI_CHECK(MPI_Win_shared_query(win_, q, &sz, &disp, &seg_[q]));
        }
        seg_[size_] = seg_[0] + cap_;
    }

    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    MPI_Win win_ = MPI_WIN_NULL;
    int64_t cap_ = 0;
    std::vector<float*> seg_;  // each rank's segment, then the result area
};

class MpiComm final : public Communicator {
public:
    MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
        SAE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        SAE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
        // Is the whole communicator on one node? Then large all-reduces use shared memory.
        MPI_Comm node;
        SAE_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
        int node_size = 0;
        MPI_Comm_size(node, &node_size);
        if (node_size == size_ && size_ > 1 && !std::getenv("SAETRAIN_NO_SHM_ALLREDUCE"))
            node_comm_ = node;
        else
            MPI_Comm_free(&node);
    }
    ~MpiComm() override {
        reducer_.reset();
        if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
        if (owned_) MPI_Comm_free(&comm_);
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return "mpi"; }

    void allreduce_sum(float* data, int64_t n) override {
        Watch w("MPI all-reduce");
        if (node_comm_ != MPI_COMM_NULL && n >= NodeReducer::kMinFloats) {
            if (!reducer_) reducer_ = std::make_unique<NodeReducer>(node_comm_);
            reducer_->sum(data, n);
            return;
        }
        SAE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int(n), MPI_FLOAT, MPI_SUM, comm_));
    }
    void allreduce_sum(double* data, int64_t n) override {
        Watch w("MPI all-reduce");
        SAE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int(n), MPI_DOUBLE, MPI_SUM, comm_));
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        Watch w("MPI all-reduce (max)");
        SAE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int(n), MPI_INT64_T, MPI_MAX, comm_));
    }
    void allgather(const void* send, void* recv, int64_t bytes) override {
        Watch w("MPI all-gather");
        SAE_MPI_CHECK(
            MPI_Allgather(send, to_int(bytes), MPI_BYTE, recv, to_int(bytes), MPI_BYTE, comm_));
    }
    void bcast(void* data, int64_t bytes, int root) override {
        Watch w("MPI broadcast");
        SAE_MPI_CHECK(MPI_Bcast(data, to_int(bytes), MPI_BYTE, root, comm_));
    }
    void barrier() override {
        Watch w("MPI barrier");
        SAE_MPI_CHECK(MPI_Barrier(comm_));
    }
    std::unique_ptr<Communicator> split(int color, int key) override {
        MPI_Comm out;
        SAE_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
        return std::make_unique<MpiComm>(out, true);
    }

    MPI_Comm handle() const { return comm_; }

private:
    static int to_int(int64_t n) {
        SAE_ENFORCE(n <= INT32_MAX, "MPI message of {} elements exceeds the int count limit", n);
        return static_cast<int>(n);
    }
    MPI_Comm comm_;
    bool owned_;
    int rank_ = 0, size_ = 1;
    MPI_Comm node_comm_ = MPI_COMM_NULL;  // == the whole communicator, when on one node
    std::unique_ptr<NodeReducer> reducer_;
};

}  // namespace

MpiScope::MpiScope(int* argc, char*** argv) {
    int provided = 0;
    SAE_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    // Errors come back as codes and become saetrain::Error with the failing call named.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiScope::~MpiScope() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

void set_collective_timeout(double seconds) {
    static std::once_flag started;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_rank.store(rank);
    g_timeout_s.store(seconds);
    if (seconds > 0) std::call_once(started, [] { std::thread(watchdog_loop).detach(); });
}

std::unique_ptr<Communicator> make_mpi_world() {
    return std::make_unique<MpiComm>(MPI_COMM_WORLD, false);
}

MPI_Comm mpi_comm_handle(Communicator& comm) {
    auto* m = dynamic_cast<MpiComm*>(&comm);
    SAE_ENFORCE(m != nullptr, "communicator '{}' is not an MPI communicator", comm.name());
    return m->handle();
}

NodePlacement node_placement() {
    MPI_Comm node;
    SAE_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    NodePlacement p;
    MPI_Comm_rank(node, &p.local_rank);
    MPI_Comm_size(node, &p.local_size);
    MPI_Comm_free(&node);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    p.host.assign(name, static_cast<size_t>(len));
    return p;
}

void world_abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // not reached when MPI_Abort works
}

}  // namespace saetrain
