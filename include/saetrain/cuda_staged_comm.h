// cuda_staged_comm.h — an MPI Communicator made safe for GPU buffers (CUDA builds only).
//
// The trainer hands its communicator device pointers (the gradients) as well as host pointers
// (metric sums). NCCL takes both; MPI without CUDA support would read a device pointer as host
// memory and crash or corrupt. make_cuda_staged_comm stages every device buffer through host
// memory: download on `stream` (the one the buffer was written on), the inner collective on the
// host copy, upload back. Host buffers pass straight through. Used where a group cannot have
// NCCL (a build without it, ranks sharing a GPU: NCCL refuses two ranks on one device) and its
// MPI is not CUDA-aware on every rank (comm_choice.h decides, for the whole group).
//
// With CUDA-aware MPI (mpi_cuda_aware() in mpi_world.h) the device buffers go to MPI as they are,
// but MPI reads them from the host thread, ordered after nothing on the GPU: a gradient still
// being written by a kernel would be summed half-written, silently. make_cuda_ordered_comm
// waits for `stream` before every collective that touches device memory.
#pragma once

#include <memory>

#include "saetrain/comm.h"

namespace saetrain {

// `stream`: the cudaStream_t (as void*) that produces and consumes the device buffers, e.g.
// cuda_backend_stream(backend); nullptr synchronizes the whole device instead.
std::unique_ptr<Communicator> make_cuda_staged_comm(std::unique_ptr<Communicator> host_comm,
                                                    void* stream);

// `device_comm`: an MPI Communicator whose library reads and writes device memory. Each
// collective on a device buffer first synchronizes `stream` (nullptr: the whole device), so MPI
// reads what the kernels queued before it wrote; MPI's collectives are blocking, so its writes
// are in place when the call returns and later kernels see them.
std::unique_ptr<Communicator> make_cuda_ordered_comm(std::unique_ptr<Communicator> device_comm,
                                                     void* stream);

// Whether p is device (or managed) memory of the current CUDA context; false for host memory,
// null, and on machines without a device.
bool cuda_is_device_pointer(const void* p);

}  // namespace saetrain
