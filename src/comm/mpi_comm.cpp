// MPI implementation of Communicator (host buffers).
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
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

using Watch = CollectiveWatch;

// Where Open MPI backs shared windows (its osc_sm_backing_directory, else /dev/shm), and its free
// bytes; < 0 when unknown.
std::string shm_dir() {
    const char* d = std::getenv("OMPI_MCA_osc_sm_backing_directory");
    return d && *d ? d : "/dev/shm";
}
double shm_room_bytes() {
    struct statvfs st {};
    if (statvfs(shm_dir().c_str(), &st) != 0) return -1;
    return static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
}

// --- node memory -----------------------------------------------------------------------------
// One MPI-3 shared window: rank 0's part holds the common area, then every rank its segment.
// Each rank zeroes (first-touches) its own segment; the caller initializes the common area, so
// the pages a rank updates can sit on its own socket.
class MpiNodeMemory final : public NodeMemory {
    static int64_t pad64(int64_t floats) { return (floats + 63) / 64 * 64; }

public:
    MpiNodeMemory(MPI_Comm comm, int64_t common_floats, int64_t segment_floats)
        : comm_(comm), common_floats_(common_floats), segment_floats_(segment_floats) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
        // Segments padded to 64 floats keep every rank's segment cache-line aligned.
        stride_ = pad64(segment_floats_);
        const int64_t common_pad = pad64(common_floats_);
        const int64_t mine = rank_ == 0 ? common_pad + stride_ * size_ : 0;
        float* base = nullptr;
        {
            Watch w("node memory allocation");
            const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(mine) * 4, sizeof(float),
                                                   MPI_INFO_NULL, comm_, &base, &win_);
            SAE_ENFORCE(rc == MPI_SUCCESS,
                        "MPI_Win_allocate_shared of {:.2f} GB for the data-parallel optimizer "
                        "failed (MPI error {}); make room in /dev/shm (e.g. docker --shm-size) or "
                        "set SAETRAIN_NO_SHM=1 to exchange gradients by messages",
                        bytes(common_floats_, segment_floats_, size_) / 1e9, rc);
        }
        MPI_Aint sz = 0;
        int disp = 0;
        SAE_MPI_CHECK(MPI_Win_shared_query(win_, 0, &sz, &disp, &base_));
        SAE_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
        common_ = base_;
        segments_ = base_ + common_pad;
        std::fill(segment(rank_), segment(rank_) + segment_floats_, 0.0f);
        fence();
    }
    // The window's size for these arguments.
    static double bytes(int64_t common_floats, int64_t segment_floats, int ranks) {
        return 4.0 * static_cast<double>(pad64(common_floats) + pad64(segment_floats) * ranks);
    }
    ~MpiNodeMemory() override {
        // MPI_Win_free is collective: while an exception unwinds (this rank is about to abort
        // the job) peers may be waiting elsewhere, so leave the window to the abort.
        if (std::uncaught_exceptions() > 0) return;
        Watch w("node memory release");
        MPI_Win_unlock_all(win_);
        MPI_Win_free(&win_);
    }
    MpiNodeMemory(const MpiNodeMemory&) = delete;
    MpiNodeMemory& operator=(const MpiNodeMemory&) = delete;

    float* common() override { return common_; }
    float* segment(int rank) override { return segments_ + stride_ * rank; }
    void fence() override {
        Watch w("node memory fence");
        MPI_Win_sync(win_);
        SAE_MPI_CHECK(MPI_Barrier(comm_));
        MPI_Win_sync(win_);
    }
    void sum_segments(int64_t offset, int64_t count) override {
        SAE_ENFORCE(offset >= 0 && count >= 0 && offset + count <= segment_floats_,
                    "sum_segments range [{}, {}) outside the segment of {} floats", offset,
                    offset + count, segment_floats_);
        float* out = segment(rank_) + offset;
        std::vector<const float*> in(static_cast<size_t>(size_));
        for (int q = 0; q < size_; ++q) in[static_cast<size_t>(q)] = segment(q) + offset;
        const int nq = size_;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < count; ++i) {
            float acc = in[0][i];
            for (int q = 1; q < nq; ++q) acc += in[static_cast<size_t>(q)][i];
            out[i] = acc;
        }
    }

private:
    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    int64_t common_floats_, segment_floats_, stride_ = 0;
    MPI_Win win_ = MPI_WIN_NULL;
    float *base_ = nullptr, *common_ = nullptr, *segments_ = nullptr;
};

class MpiComm final : public Communicator {
public:
    MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
        SAE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        SAE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
        // Is the whole communicator on one node? Then it can share memory (share_node_memory).
        MPI_Comm node;
        {
            Watch w("MPI_Comm_split_type (a new communicator's node)");
            SAE_MPI_CHECK(
                MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
        }
        int node_size = 0;
        MPI_Comm_size(node, &node_size);
        if (node_size == size_ && size_ > 1 && !std::getenv("SAETRAIN_NO_SHM") &&
            !std::getenv("SAETRAIN_NO_SHM_ALLREDUCE"))  // the variable's older name
            node_comm_ = node;
        else
            MPI_Comm_free(&node);
    }
    ~MpiComm() override {
        if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
        if (owned_) MPI_Comm_free(&comm_);
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return "mpi"; }

    void allreduce_sum(float* data, int64_t n) override {
        Watch w("MPI all-reduce");
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
        {
            Watch w("MPI_Comm_split");
            SAE_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
        }
        return std::make_unique<MpiComm>(out, true);
    }

    std::unique_ptr<NodeMemory> share_node_memory(int64_t common_floats, int64_t segment_floats,
                                                  bool want) override {
        // Every rank must agree: the window is allocated collectively.
        const double need = MpiNodeMemory::bytes(common_floats, segment_floats, size_);
        int64_t cannot = want && node_comm_ != MPI_COMM_NULL ? 0 : 1;
        if (!cannot) {
            const double room = shm_room_bytes();
            if (room >= 0 && room < need * 1.05) {
                cannot = 2;
                if (rank_ == 0)
                    std::fprintf(stderr,
                                 "saetrain: warning: %s has %.1f MB free; the data-parallel "
                                 "optimizer's shared memory needs %.1f MB, so replicas exchange "
                                 "gradients by messages instead (slower; enlarge it, e.g. docker "
                                 "--shm-size)\n",
                                 shm_dir().c_str(), room / 1e6, need / 1e6);
            }
        }
        allreduce_max(&cannot, 1);
        if (cannot) return nullptr;
        return std::make_unique<MpiNodeMemory>(node_comm_, common_floats, segment_floats);
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

CollectiveWatch::CollectiveWatch(const char* what) {
    g_wait_what.store(what);
    g_wait_start_ns.store(now_ns());
}
CollectiveWatch::~CollectiveWatch() { g_wait_start_ns.store(0); }

void set_collective_timeout(double seconds) {
    static std::once_flag started;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_rank.store(rank);
    g_timeout_s.store(seconds);
    if (seconds > 0) std::call_once(started, [] { std::thread(watchdog_loop).detach(); });
}

bool mpi_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#else
    return false;
#endif
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
    {
        Watch w("MPI_Comm_split_type (node placement)");
        SAE_MPI_CHECK(
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    }
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
