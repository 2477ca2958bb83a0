// layout.h — which SAE, which replica and which latent shard each rank is, for the three
// parallel modes, each with S = parallel.latent_shards shards per replica (default 1):
//
//   sweep          G configs x 1 replica: world = G * S, one SAE per S ranks
//   data_parallel  1 config x R replicas: world = R * S, gradients averaged over the replicas
//   hybrid         G configs x R replicas (parallel.replicas): world = G * R * S
//
// Ranks are numbered config-major: rank = (config * R + replica) * S + shard, so the shards of
// one replica are neighbours (one node and its NVLink, for their exchange every step), and
// then the replicas of one SAE (on one node when R * S divides the ranks per node, which keeps
// their all-reduce local). The first shard of each replica reads its data and passes every
// batch to its other shards, so disk traffic does not grow with S. With sweep_data: shared
// (and G > 1) the G readers with the same replica index read disjoint slices and exchange them
// so every SAE sees the same stream.
#pragma once

#include <string>

#include "saetrain/config.h"

namespace saetrain {

struct RankLayout {
    int configs = 1, replicas = 1, shards = 1;  // G, R, S
    int config = 0, replica = 0, shard = 0;     // this rank's SAE (index into cfg.sweep), ...
    bool shared = false;                        // sweep_data: shared with more than one SAE
    // The ranks that read data (each replica's first shard): this rank's index among them, or
    // -1 when it receives its batches from its replica's first shard; and their count.
    int reader() const { return shard == 0 ? config * replicas + replica : -1; }
    int readers() const { return configs * replicas; }
    std::string describe() const;  // "2 SAEs x 2 replicas x 2 latent shards, shared data"
};

// Throws Error naming the mode and saying which world sizes would fit.
RankLayout layout_for(const Config& cfg, int world_size, int rank);

}  // namespace saetrain
