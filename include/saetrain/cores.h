// cores.h — how a rank shares its node's cores: the CPU threads it takes, and how its idle
// threads and MPI's waits give the cores back (docs/results.md, "Sharing cores"). Called by
// saetrain's main before MPI starts (the wait settings are read when the libraries start) and
// by the run's start-up line, which says what was chosen.
#pragma once

#include <string>

namespace saetrain {

// Unless the user chose an OpenMP wait policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT), sets a short
// spin count and executes this program again with `argv`, once, before MPI starts (libgomp reads
// it when it loads). Returns only when nothing was to be done or the exec failed.
void exec_with_short_spins(char** argv);
// The ranks of this node, as the launcher says before MPI starts (0: not said).
int launcher_local_ranks();
// Sets Open MPI's mpi_yield_when_idle when the node's ranks times `threads_asked` outnumber its
// cores (unless the user set it). Returns whether it was set.
bool yield_mpi_waits_when_crowded(int threads_asked);
// How this process's OpenMP threads wait, for the start-up line.
std::string wait_policy_text();
// How MPI's waits poll, for the start-up line ("" when MPI's default).
std::string mpi_wait_text();
// Cores this process may run on, shared fairly among the `local_size` ranks of its node.
int cpu_threads_for_rank(int local_size);

}  // namespace saetrain
