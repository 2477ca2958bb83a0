#include "saetrain/cores.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

namespace saetrain {

// OpenMP's idle threads (saetrain's loops and OpenBLAS's, which is built on the same libgomp)
// spin for about 300,000 iterations before they sleep, the library's default. Alone on its cores
// that saves a wake-up; sharing them (another job, more ranks than cores, hyperthreads) the
// spinning threads take the time slices the working ones need, and a run beside one busy job
// took 19.6x its time alone. So saetrain waits briefly (GOMP_SPINCOUNT=kSpinCount, about a
// microsecond or two) and then sleeps, unless the user chose a policy (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT).
constexpr const char* kSpinCount = "1000";

// OpenBLAS built for every x86 core (Debian's DYNAMIC_ARCH) picks its kernels from the CPU's
// family and model. Where a hypervisor hides them (a VM's "Intel(R) Xeon(R) Processor"), 0.3.21
// falls back to Prescott's SSE3 kernels on a CPU with AVX-512: the 4-SAE sweep of docs/config.md
// ran at 22.8K tokens/s where SkylakeX's kernels gave 59-61K. And each kernel sums in its own
// order, so one SAE trained on two machines differed in its last bits by what the detection
// said. Unless the user named one (OPENBLAS_CORETYPE), saetrain names the kernels from the
// instructions the CPU reports: SkylakeX's for AVX-512 (F, CD, BW, DQ, VL), Haswell's for AVX2
// with FMA, else OpenBLAS's own choice.
const char* blas_core_for(const std::function<bool(const char*)>& has) {
    if (has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") && has("avx512vl"))
        return "SKYLAKEX";
    if (has("avx2") && has("fma")) return "HASWELL";
    return nullptr;
}

const char* blas_core_for_this_cpu() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return blas_core_for([](const char* f) {
        const std::string n(f);  // __builtin_cpu_supports takes string literals only
        if (n == "avx512f") return __builtin_cpu_supports("avx512f") != 0;
        if (n == "avx512cd") return __builtin_cpu_supports("avx512cd") != 0;
        if (n == "avx512bw") return __builtin_cpu_supports("avx512bw") != 0;
        if (n == "avx512dq") return __builtin_cpu_supports("avx512dq") != 0;
        if (n == "avx512vl") return __builtin_cpu_supports("avx512vl") != 0;
        if (n == "avx2") return __builtin_cpu_supports("avx2") != 0;
        if (n == "fma") return __builtin_cpu_supports("fma") != 0;
        return false;
    });
#else
    return nullptr;
#endif
}

// libgomp and OpenBLAS read their variables when they load, before main: the process sets them
// and executes itself again, once, before MPI starts (the same pid, so launchers see no change).
void exec_with_run_environment(char** argv) {
    // What this sets, with the variable that tells the start-up line it was saetrain's choice.
    std::vector<const char*> set;
    if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
        ::setenv("GOMP_SPINCOUNT", kSpinCount, 1);
        ::setenv("SAETRAIN_SPIN_SET", "1", 1);
        set.insert(set.end(), {"GOMP_SPINCOUNT", "SAETRAIN_SPIN_SET"});
    }
    // An empty OPENBLAS_CORETYPE names no kernels (OpenBLAS detects its own): saetrain names them.
    const char* user_core = std::getenv("OPENBLAS_CORETYPE");
    if (user_core == nullptr || *user_core == '\0')
        if (const char* core = blas_core_for_this_cpu()) {
            ::setenv("OPENBLAS_CORETYPE", core, 1);
            ::setenv("SAETRAIN_BLAS_SET", "1", 1);
            set.insert(set.end(), {"OPENBLAS_CORETYPE", "SAETRAIN_BLAS_SET"});
        }
    if (set.empty()) return;
    // The binary's own path, so that the process keeps its name (the kernel names it after the
    // file executed: /proc/self/exe would make it "exe" to ps, pgrep and pkill).
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
        self[len] = '\0';
        ::execv(self, argv);  // fails when the file was removed since: then the link itself
    }
    ::execv("/proc/self/exe", argv);
    // Not possible here (no /proc): go on with the libraries' defaults.
    for (const char* v : set) ::unsetenv(v);
}

int launcher_local_ranks() {
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
        if (const char* s = std::getenv(v); s != nullptr && std::atoi(s) > 0) return std::atoi(s);
    // Slurm's "2(x3),1": the first node's count is enough to tell a crowded node.
    if (const char* s = std::getenv("SLURM_STEP_TASKS_PER_NODE"); s != nullptr && std::atoi(s) > 0)
        return std::atoi(s);
    return 0;
}

// MPI's waits poll without pause: with more ranks than the node has cores, each waiting rank
// spends the time slices its peers need (4 ranks on 2 cores made 0.1% of 2 ranks' tokens/s).
// Open MPI yields the core between polls when mpi_yield_when_idle is set, which mpirun does
// only when told of oversubscription; srun never does. Set here, before MPI starts, when the
// node's ranks outnumber its cores.
bool ranks_crowd_cores(int ranks, long threads, long node_cores, long allowed_cores,
                       bool bound_each) {
    if (ranks <= 1) return false;
    threads = std::max(1L, threads);
    const long all = static_cast<long>(ranks) * threads;
    if (node_cores > 0 && all > node_cores) return true;
    if (allowed_cores <= 0) return false;
    // Each rank on cores of its own (the launcher bound it): crowded when its own threads
    // outnumber them. Else the node's ranks share this process's cores (a job's cpuset: Slurm's
    // cgroup, a container's --cpuset-cpus, taskset).
    return bound_each ? threads > allowed_cores : all > allowed_cores;
}

bool yield_mpi_waits_when_crowded(int threads_asked) {
    if (std::getenv("OMPI_MCA_mpi_yield_when_idle") != nullptr) return false;
    cpu_set_t set;
    const long allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    const char* ompi_bound = std::getenv("OMPI_MCA_orte_bound_at_launch");
    const char* slurm_bind = std::getenv("SLURM_CPU_BIND_TYPE");
    const bool bound_each = (ompi_bound && std::string(ompi_bound) == "1") ||
                            (slurm_bind && *slurm_bind && std::string(slurm_bind) != "none" &&
                             std::string(slurm_bind).rfind("none", 0) != 0);
    if (!ranks_crowd_cores(launcher_local_ranks(), threads_asked > 0 ? threads_asked : 1,
                           ::sysconf(_SC_NPROCESSORS_ONLN), allowed, bound_each))
        return false;
    ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
    return true;
}

std::string wait_policy_text() {
    if (const char* p = std::getenv("OMP_WAIT_POLICY")) return fmt::format("OMP_WAIT_POLICY={}", p);
    if (const char* n = std::getenv("GOMP_SPINCOUNT"))
        return fmt::format("idle threads spin {} times, then sleep (GOMP_SPINCOUNT{})", n,
                           std::getenv("SAETRAIN_SPIN_SET") ? ", saetrain's default" : "");
    return "idle threads spin (libgomp's default)";
}

std::string blas_kernel_text() {
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    if (core == nullptr || *core == '\0') return "";
    return fmt::format("; OpenBLAS kernels {} (OPENBLAS_CORETYPE{})", core,
                       std::getenv("SAETRAIN_BLAS_SET") ? ", saetrain's choice for this CPU" : "");
}

std::string mpi_wait_text() {
    const char* y = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    if (y == nullptr || std::string(y) == "0") return "";
    return fmt::format("; MPI waits yield the core (mpi_yield_when_idle{})",
                       std::getenv("SAETRAIN_YIELD_SET") ? ", set as ranks outnumber cores" : "");
}

int cpu_threads_for_rank(int local_size) {
    cpu_set_t set;
    int cores = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    return std::max(1, cores / std::max(1, local_size));
}

// ---- other processes on the rank's cores -------------------------------------------------------
CpuSeconds cpu_seconds_of(const std::string& proc_stat, const std::vector<int>& cpus,
                          double ticks_per_s) {
    CpuSeconds out;
    std::istringstream in(proc_stat);
    std::string line;
    while (std::getline(in, line)) {
        // "cpuN user nice system idle iowait irq softirq steal guest guest_nice"; "cpu " is the
        // machine's sum, other lines are no CPU's.
        if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9')
            continue;
        std::istringstream fields(line.substr(3));
        int cpu = -1;
        fields >> cpu;
        if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) continue;
        double v[8] = {};
        for (double& x : v) fields >> x;  // a field the kernel lacks stays 0
        const double busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        out.busy += busy / ticks_per_s;
        out.total += (busy + v[3] + v[4]) / ticks_per_s;
    }
    return out;
}

int threads_for_share(int most, int cores, int sharing, double others) {
    if (most <= 1 || cores <= 0) return std::max(1, most);
    const int ranks = std::max(1, sharing);
    const double peers = static_cast<double>(ranks - 1) * cores / ranks;
    const double foreign = std::max(0.0, others - peers);
    const double left = (cores - foreign) / ranks;
    // A quarter of a core's slack: the system's own work (daemons, a VM's steal) takes a few
    // hundredths and must not cost a thread; a job on half a core leaves too little for a
    // thread that every loop would wait for.
    return std::clamp(static_cast<int>(std::floor(left + 0.25)), 1, most);
}

namespace {

bool read_text(const char* path, std::string& out) {
    std::ifstream f(path);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    return !out.empty();
}

double process_cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

CoreShare::CoreShare(int most, int sharing, bool adapt)
    : most_(std::max(1, most)),
      sharing_(std::max(1, sharing)),
      adapt_(adapt && most > 1),
      threads_(std::max(1, most)) {
    if (!adapt_) return;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus_.push_back(c);
    if (const long hz = ::sysconf(_SC_CLK_TCK); hz > 0) ticks_per_s_ = static_cast<double>(hz);
    t_last_ = std::chrono::steady_clock::now();
    adapt_ = !cpus_.empty() && sample(last_, self_last_);
}

bool CoreShare::sample(CpuSeconds& cores, double& self_s) const {
    std::string text;
    if (!read_text("/proc/stat", text)) return false;
    cores = cpu_seconds_of(text, cpus_, ticks_per_s_);
    self_s = process_cpu_seconds();
    return cores.total > 0;
}

int CoreShare::threads() {
    if (!adapt_) return threads_;
    const auto now = std::chrono::steady_clock::now();
    if (now - t_last_ < kWindow) return threads_;
    CpuSeconds cores;
    double self_s = 0;
    if (!sample(cores, self_s)) return threads_;
    const double busy = cores.busy - last_.busy, total = cores.total - last_.total;
    const double window_s = total / static_cast<double>(cpus_.size());  // the cores' own clock
    if (window_s > 0) {
        const double others = std::max(0.0, busy - (self_s - self_last_)) / window_s;
        threads_ = threads_for_share(most_, static_cast<int>(cpus_.size()), sharing_, others);
    }
    t_last_ = now, last_ = cores, self_last_ = self_s;
    return threads_;
}

}  // namespace saetrain
