// cores.h — how a rank shares its node's cores: the CPU threads it takes, and how its idle
// threads and MPI's waits give the cores back (docs/results.md, "Sharing cores"). Called by
// saetrain's main before MPI starts (the wait settings are read when the libraries start) and
// by the run's start-up line, which says what was chosen.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace saetrain {

// Unless the user chose an OpenMP wait policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT), sets a short
// spin count, and unless the user named OpenBLAS's kernels (OPENBLAS_CORETYPE), names them from
// the CPU's instructions (blas_core_for_this_cpu); then executes this program again with `argv`,
// once, before MPI starts (libgomp and OpenBLAS read them when they load). Returns only when
// nothing was to be done or the exec failed.
void exec_with_run_environment(char** argv);
// OpenBLAS's kernels for a CPU that `has` the instructions named as /proc/cpuinfo's flags name
// them: "SKYLAKEX" with AVX-512 (avx512f, avx512cd, avx512bw, avx512dq, avx512vl), "HASWELL"
// with avx2 and fma, else null (OpenBLAS's own detection).
const char* blas_core_for(const std::function<bool(const char*)>& has);
// blas_core_for this CPU (the instructions it reports through CPUID).
const char* blas_core_for_this_cpu();
// "; OpenBLAS kernels X (...)" for the start-up line, "" when OPENBLAS_CORETYPE is not set.
std::string blas_kernel_text();
// The ranks of this node, as the launcher says before MPI starts (0: not said).
int launcher_local_ranks();
// Whether a node's `ranks` of `threads` each outnumber the cores they run on: the node's
// `node_cores`, or the `allowed_cores` of this process's affinity, which the node's ranks share
// unless the launcher bound each rank to cores of its own (`bound_each`).
bool ranks_crowd_cores(int ranks, long threads, long node_cores, long allowed_cores,
                       bool bound_each);
// Sets Open MPI's mpi_yield_when_idle when the node's ranks times `threads_asked` outnumber
// their cores (ranks_crowd_cores: the node's, or a cpuset's such as Slurm's cgroup, a
// container's or taskset's; unless the user set it). Returns whether it was set.
bool yield_mpi_waits_when_crowded(int threads_asked);
// How this process's OpenMP threads wait, for the start-up line.
std::string wait_policy_text();
// How MPI's waits poll, for the start-up line ("" when MPI's default).
std::string mpi_wait_text();
// Cores this process may run on, shared fairly among the `local_size` ranks of its node.
int cpu_threads_for_rank(int local_size);

// ---- other processes on the rank's cores -------------------------------------------------------
// A step splits each pass over a batch evenly over its threads and waits for the last: with
// another job on the cores, whichever thread was descheduled holds up every pass (beside one
// busy loop per core a 2-thread run took 2.3-2.9x its time alone, a 1-thread run 2.0x). So the
// rank measures what other processes take of its cores and runs its next steps on what they
// leave (Backend::set_host_threads). That changes no result: the CPU backend sums reductions in
// fixed blocks and computes GEMMs in tiles fixed by their shape (cpu_backend.cpp; test_e2e
// LoopThreads, test_cli ResultsDoNotDependOnTheThreadCount).

struct CpuSeconds {
    double busy = 0, total = 0;
};
// The seconds the CPUs `cpus` were busy and in all, from /proc/stat's text, whose unit is
// `ticks_per_s` (USER_HZ): user, nice, system, irq, softirq and steal (the hypervisor ran
// another machine) are busy, idle and iowait are not. A CPU the text lacks adds nothing.
CpuSeconds cpu_seconds_of(const std::string& proc_stat, const std::vector<int>& cpus,
                          double ticks_per_s);

// The threads for a rank's next steps (1 to `most`) when, over the last window, processes other
// than this one kept `others` of the `cores` it runs on busy, cores its node's `sharing` ranks
// share (1: its own). The job's other ranks are taken at their fair share, cores / sharing:
// what others take beyond it is another job's, and each rank leaves its part of that.
int threads_for_share(int most, int cores, int sharing, double others);

class CoreShare {
public:
    // `most`: the threads asked for; `sharing`: the ranks that share this rank's cores;
    // `adapt` false: `most` for every step (--fixed-threads). Adapts only where /proc/stat and
    // the affinity mask can be read.
    CoreShare(int most, int sharing, bool adapt);
    // Before each step: at most every kWindow, what others took of the cores since the last
    // look, and the threads for the steps until the next look.
    int threads();
    bool adapts() const { return adapt_; }
    int most() const { return most_; }

    static constexpr std::chrono::milliseconds kWindow{250};

private:
    bool sample(CpuSeconds& cores, double& self_s) const;

    const int most_, sharing_;
    bool adapt_;
    std::vector<int> cpus_;
    double ticks_per_s_ = 100;
    int threads_;
    std::chrono::steady_clock::time_point t_last_;
    CpuSeconds last_;
    double self_last_ = 0;
};

}  // namespace saetrain
