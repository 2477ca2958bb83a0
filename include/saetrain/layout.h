// layout.h — which SAE and which replica each rank is, for the three parallel modes.
//
//   sweep          G configs x 1 replica: world = G, one SAE per rank
//   data_parallel  1 config x R replicas: world = R, gradients averaged over all ranks
//   hybrid         G configs x R replicas (parallel.replicas): world = G * R
//
// Ranks are numbered config-major: rank = config * R + replica, so the replicas of one SAE are
// neighbours (on one node when R divides the ranks per node, which keeps their all-reduce
// local). With sweep_data: shared (and G > 1) the G ranks with the same replica index read
// disjoint slices and exchange them so every SAE sees the same stream.
#pragma once

#include <string>

#include "saetrain/config.h"

namespace saetrain {

struct RankLayout {
    int configs = 1, replicas = 1;  // G, R
    int config = 0, replica = 0;    // this rank's SAE (index into cfg.sweep) and replica
    bool shared = false;            // sweep_data: shared with more than one SAE
    std::string describe() const;   // "2 SAEs x 2 replicas, shared data"
};

// Throws Error naming the mode and saying which world sizes would fit.
RankLayout layout_for(const Config& cfg, int world_size, int rank);

}  // namespace saetrain
