#include "saetrain/cores.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace saetrain {

// OpenMP's idle threads (saetrain's loops and OpenBLAS's, which is built on the same libgomp)
// spin for about 300,000 iterations before they sleep, the library's default. Alone on its cores
// that saves a wake-up; sharing them (another job, more ranks than cores, hyperthreads) the
// spinning threads take the time slices the working ones need, and a run beside one busy job
// took 19.6x its time alone. So saetrain waits briefly (GOMP_SPINCOUNT=kSpinCount, about a
// microsecond or two) and then sleeps, unless the user chose a policy (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT). libgomp reads them when it loads, before main: the process sets the variable
// and executes itself again, once, before MPI starts (the same pid, so launchers see no change).
constexpr const char* kSpinCount = "1000";

void exec_with_short_spins(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr)
        return;
    ::setenv("GOMP_SPINCOUNT", kSpinCount, 1);
    ::setenv("SAETRAIN_SPIN_SET", "1", 1);  // the start-up line says it was saetrain's choice
    // The binary's own path, so that the process keeps its name (the kernel names it after the
    // file executed: /proc/self/exe would make it "exe" to ps, pgrep and pkill).
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
        self[len] = '\0';
        ::execv(self, argv);  // fails when the file was removed since: then the link itself
    }
    ::execv("/proc/self/exe", argv);
    // Not possible here (no /proc): go on with the library's default.
    ::unsetenv("GOMP_SPINCOUNT");
    ::unsetenv("SAETRAIN_SPIN_SET");
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
bool yield_mpi_waits_when_crowded(int threads_asked) {
    if (std::getenv("OMPI_MCA_mpi_yield_when_idle") != nullptr) return false;
    const int ranks = launcher_local_ranks();
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (ranks <= 1 || cores <= 0) return false;
    const long threads = threads_asked > 0 ? threads_asked : 1;
    if (static_cast<long>(ranks) * threads <= cores) return false;
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

}  // namespace saetrain
