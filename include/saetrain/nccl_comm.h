// nccl_comm.h — the Communicator on GPU buffers through NCCL (CUDA builds with NCCL only).
//
// Bootstrapped over MPI: rank 0 of the MPI communicator makes the NCCL id, MPI broadcasts it,
// every rank joins (ncclCommInitRank). Collectives run on a dedicated stream. The communicator
// is non-blocking: every wait polls NCCL's asynchronous error state with a timeout, and on an
// error or timeout the communicator is aborted and saetrain::Error names this rank, its host
// and the collective, so a dead peer ends the run instead of hanging it.
//
// Buffers may be device memory (the trainer's gradients: no copy) or host memory (metric sums:
// staged through a device buffer). Collectives block until complete, as comm.h requires; with
// `compute_stream` set (cuda_backend_stream of the rank's CudaBackend) the collective is
// ordered after the work queued there by events, with no device-wide synchronization.
#pragma once

#include <mpi.h>

#include <memory>

#include "saetrain/comm.h"

namespace saetrain {

struct NcclOptions {
    // Seconds a collective (or the initialization) may take before the run is declared hung;
    // <= 0 waits for ever. saetrain passes parallel.timeout_s.
    double timeout_seconds = 600;
    // cudaStream_t the gradients are produced on; nullptr: synchronize the device instead.
    void* compute_stream = nullptr;
};

// Collective over every rank of `comm`; `device` is this rank's GPU (its local rank on a
// node). Must be called by all ranks of `comm`.
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm comm, int device,
                                             const NcclOptions& options = {});

}  // namespace saetrain
