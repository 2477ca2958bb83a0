// cuda_collective_delay.h — a debug mode that makes a collective's missing ordering fail every
// time instead of once in a while (CUDA builds only; docs/cuda.md, "Collectives").
//
// A collective that reads a device buffer before the kernels writing it have finished sums
// stale data only when the race is lost, which on one GPU and small buffers is almost never.
// With SAETRAIN_DEBUG_COLLECTIVE_DELAY_US=N the backend's device communicators (gradient_comm)
// are wrapped so that before each collective on a device buffer, on the stream that produces it:
// the buffer is saved to scratch, overwritten with NaN (all bits set: NaN as float or double,
// -1 as int64), a kernel spins for N microseconds, and the buffer is restored. The host hands
// the collective on only once the NaN is in place. A collective ordered after that stream
// (NCCL's event, the staged copies, the CUDA-aware MPI synchronization) waits for the restore and
// sees the real data; one that is not reads NaN, deterministically, and the result shows it.
#pragma once

#include <cstdint>
#include <memory>

#include "saetrain/comm.h"

namespace saetrain {

// SAETRAIN_DEBUG_COLLECTIVE_DELAY_US as microseconds; 0 when unset or empty. Throws
// saetrain::Error naming the variable when it is not a whole number in [0, 60000000].
int64_t collective_delay_us_from_env();

// Wraps `inner` (a communicator on device buffers) as above; `stream`: the cudaStream_t (as
// void*) that produces the buffers, e.g. cuda_backend_stream(backend). Host buffers pass
// straight through. delay_us > 0.
std::unique_ptr<Communicator> make_cuda_collective_delay_comm(std::unique_ptr<Communicator> inner,
                                                              void* stream, int64_t delay_us);

}  // namespace saetrain
