// gradient_comm.h — how the GPU replicas of one SAE exchange gradients (internal to src/cuda).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "saetrain/comm.h"

namespace saetrain::cuda {

// NCCL when the build has it and each rank of the node has a GPU of its own (NCCL refuses two
// ranks on one device); else MPI itself when it is CUDA-aware; else MPI on host copies of the
// device buffers (cuda_staged_comm.h). `stream`: where the gradients are produced. A group of
// one rank is returned as it is.
std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> replicas,
                                            cudaStream_t stream, int local_rank, int local_size,
                                            double timeout_s);

}  // namespace saetrain::cuda
