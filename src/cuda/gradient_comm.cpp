// The GPU replicas' gradient communicator: NCCL, CUDA-aware MPI or staged MPI (gradient_comm.h).
#include "gradient_comm.h"

#include "saetrain/cuda_device.h"       // defines: cuda_device_count
#include "saetrain/cuda_staged_comm.h"  // defines: make_cuda_staged_comm
#include "saetrain/mpi_world.h"         // defines: mpi_comm_handle, mpi_cuda_aware
#if SAETRAIN_HAVE_NCCL
#include "saetrain/nccl_comm.h"  // defines: make_nccl_comm
#endif

namespace saetrain::cuda {

std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> replicas,
                                            cudaStream_t stream, int local_rank, int local_size,
                                            double timeout_s) {
    if (replicas->size() == 1) return replicas;
#if SAETRAIN_HAVE_NCCL
    const int devices = cuda_device_count();
    if (local_size <= devices) {
        NcclOptions o;
        o.compute_stream = stream;
        o.timeout_seconds = timeout_s;
        return make_nccl_comm(mpi_comm_handle(*replicas), local_rank % devices, o);
    }
#else
    (void)local_rank, (void)local_size, (void)timeout_s;
#endif
    if (mpi_cuda_aware()) return replicas;
    return make_cuda_staged_comm(std::move(replicas), stream);
}

}  // namespace saetrain::cuda
