// gradient_comm.h — how a group of GPU ranks (the replicas of one SAE, the latent shards of one
// replica) exchanges device buffers (internal to src/cuda).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "saetrain/comm.h"
#include "saetrain/comm_choice.h"

namespace saetrain::cuda {

// Collective over `group` (MPI on host memory): the ranks agree on one kind (comm_agree over
// every rank's facts, `mine` being this rank's) before any of them makes a communicator, then
// each makes it: NCCL on `mine.device`; CUDA-aware MPI ordered after `stream`
// (make_cuda_ordered_comm); MPI staged through host copies on `stream`. `stream`: where the
// buffers are produced (the backend's). With SAETRAIN_DEBUG_COLLECTIVE_DELAY_US set, wrapped in
// the delay mode (cuda_collective_delay.h). A group of one is returned as it is. `choice` (may be
// null) receives the decision and its notes.
std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> group,
                                            cudaStream_t stream, const CommFacts& mine,
                                            double timeout_s, CommChoice* choice);

}  // namespace saetrain::cuda
