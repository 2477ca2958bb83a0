// mpi_world.h — MPI start-up and the MPI Communicator.
//
// MpiScope initializes MPI once per process (threads: FUNNELED, only the main thread calls
// MPI) and finalizes it on scope exit. world_abort ends every rank of the job after a fatal
// error, so no rank waits forever on a peer that already gave up.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "saetrain/comm.h"

namespace saetrain {

class MpiScope {
public:
    MpiScope(int* argc, char*** argv);
    ~MpiScope();
    MpiScope(const MpiScope&) = delete;
    MpiScope& operator=(const MpiScope&) = delete;
};

// MPI_COMM_WORLD as a Communicator.
std::unique_ptr<Communicator> make_mpi_world();
// The MPI communicator behind a Communicator made by make_mpi_world (or split from one), e.g.
// to bootstrap NCCL over the same group. Throws Error for any other Communicator.
MPI_Comm mpi_comm_handle(Communicator& comm);
// Where this rank sits on its node (from a shared-memory split of the world).
struct NodePlacement {
    int local_rank = 0;
    int local_size = 1;
    std::string host;
};
NodePlacement node_placement();

[[noreturn]] void world_abort(int code);

// True when the MPI library reports, at compile time and at run time, that it reads and writes
// CUDA device memory (Open MPI's MPIX_Query_cuda_support); false for any other MPI.
bool mpi_cuda_aware();

// Bounds every MPI collective of this process: when one has waited `seconds` for its peers (a
// rank died, hangs or was stopped), a watchdog thread prints one line naming this rank, its host
// and the collective, and aborts the job. 0 turns the watchdog off. Set once after start-up.
void set_collective_timeout(double seconds);

// Puts one blocking MPI call made outside the MPI Communicator (NCCL's id broadcast) under that
// watchdog for the object's lifetime. One at a time: watches do not nest.
class CollectiveWatch {
public:
    explicit CollectiveWatch(const char* what);  // `what`: a string literal, named on timeout
    ~CollectiveWatch();
    CollectiveWatch(const CollectiveWatch&) = delete;
    CollectiveWatch& operator=(const CollectiveWatch&) = delete;
};

}  // namespace saetrain
