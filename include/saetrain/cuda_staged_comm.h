// cuda_staged_comm.h — a host Communicator (MPI) made safe for GPU buffers (CUDA builds only).
//
// The trainer hands its communicator device pointers (the gradients) as well as host pointers
// (metric sums). NCCL takes both; MPI without CUDA support would read a device pointer as host
// memory and crash or corrupt. This wrapper stages every device buffer through host memory:
// download on `stream` (the one the buffer was written on), the inner collective on the host
// copy, upload back. Host buffers pass straight through. Used where NCCL is not built, or
// where ranks share a GPU (NCCL refuses two ranks on one device); not needed when the MPI
// library is CUDA-aware (mpi_cuda_aware() in mpi_world.h).
#pragma once

#include <memory>

#include "saetrain/comm.h"

namespace saetrain {

// `stream`: the cudaStream_t (as void*) that produces and consumes the device buffers, e.g.
// cuda_backend_stream(backend); nullptr synchronizes the whole device instead.
std::unique_ptr<Communicator> make_cuda_staged_comm(std::unique_ptr<Communicator> host_comm,
                                                    void* stream);

// Whether p is device (or managed) memory of the current CUDA context; false for host memory,
// null, and on machines without a device.
bool cuda_is_device_pointer(const void* p);

}  // namespace saetrain
