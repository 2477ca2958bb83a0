// rank_grid.h — the job's ranks as a grid of SAE configs x replicas x latent shards: every
// rank's coordinates from one formula, and every communicator the run needs from one function,
// made in one fixed order.
//
// The three parallel modes, each with S = parallel.latent_shards latent shards per replica
// (default 1):
//
//   sweep          G configs x 1 replica: world = G * S, one SAE per S ranks
//   data_parallel  1 config x R replicas: world = R * S, gradients averaged over the replicas
//   hybrid         G configs x R replicas (parallel.replicas): world = G * R * S
//
// Ranks are numbered config-major, rank = (config * R + replica) * S + latent_shard
// (RankGrid::rank_of, the one place the formula is written; RankGrid::at inverts it), so the
// latent shards of one replica are neighbours (one node and its NVLink, for their exchange every
// step), and then the replicas of one SAE (on one node when R * S divides the ranks per node,
// which keeps their all-reduce local). The first latent shard of each replica reads its data
// (its shards: data files) and passes every batch to its other latent shards, so disk traffic
// does not grow with S. With sweep_data: shared (and G > 1) the G readers with the same replica
// index read disjoint slices and exchange them so every SAE sees the same stream of rows.
//
// The groups, each a communicator whose rank i is the i-th member named here:
//
//   replicas       same config and latent shard, by replica: the SAE's gradients (backend
//                  buffers)
//   latent_shards  same config and replica, by latent shard: the sharded top-k (host buffers)
//                  and, through a second communicator of the same ranks (latent_shards_backend),
//                  the partial reconstructions (backend buffers; NCCL on GPUs)          [S > 1]
//   shared_data    same replica and latent shard, by config: the shared sweep's all-gather
//                  (only the first latent shards' streams carry rows)   [shared data, G > 1]
//
// Which rows a rank reads (its slice, its shuffle seed, its share of the held-out rows) follows
// from its coordinates in data_split.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "saetrain/comm.h"          // defines: Communicator
#include "saetrain/config.h"        // defines: Config
#include "saetrain/sharded_topk.h"  // defines: LatentShard

namespace saetrain {

class Backend;

// One rank's place in the grid, with the grid's shape.
struct RankCoords {
    int configs = 1, replicas = 1, latent_shards = 1;  // G, R, S
    int config = 0, replica = 0, latent_shard = 0;  // this rank's SAE (index into cfg.sweep), ...
    bool shared_data = false;                       // sweep_data: shared with more than one SAE
    // The ranks that read data (each replica's first latent shard): this rank's index among them,
    // or -1 when it receives its batches from its replica's first latent shard; and their count.
    int reader() const { return latent_shard == 0 ? config * replicas + replica : -1; }
    int readers() const { return configs * replicas; }
    std::string describe() const;  // "2 SAEs x 2 replicas x 2 latent shards, shared data"
};

// How the groups whose buffers live on a backend get their communicators: the arguments of
// Backend::gradient_comm (every rank of a group agrees on one kind, comm_choice.h).
struct BackendGroups {
    Backend* backend = nullptr;  // null: the groups keep the host communicators as split
    std::string host;            // this rank's node (NodePlacement::host), for the agreement
    double timeout_s = 0;        // parallel.timeout_s: NCCL's waits
};

// The communicators of one rank (RankGrid::connect). Null where the grid has no such group.
struct GridComms {
    RankCoords me;
    std::unique_ptr<Communicator> replicas;       // the gradients' group (Backend::gradient_comm)
    std::unique_ptr<Communicator> latent_shards;  // host buffers                  (null: S = 1)
    std::unique_ptr<Communicator> latent_shards_backend;  // backend buffers        (null: S = 1)
    std::unique_ptr<Communicator> shared_data;            // the shared stream  (null: not shared)
    // Why a backend group's ranks could not agree on a communicator (the first refusal, the
    // same line on every rank of that group), else empty; its communicator is then null. The
    // caller agrees over the world before using any (every rank made the same calls).
    std::string error;
    // The agreements' notes worth a warning, kept by each group's first rank (comm_job_warnings).
    std::vector<std::string> notes;
    // This rank's part of its SAE for the trainer: count 1 (the whole SAE) when S = 1.
    LatentShard latent_shard(int64_t n_total) const;
};

class RankGrid {
public:
    RankGrid() = default;  // one rank
    // An explicit shape (tests, benchmarks): configs x replicas x latent shards ranks.
    RankGrid(int configs, int replicas, int latent_shards, bool shared_data);
    // The grid the config asks for on `world_size` ranks. Throws Error naming the mode and
    // saying which world sizes would fit.
    static RankGrid from_config(const Config& cfg, int world_size);

    int configs() const { return configs_; }
    int replicas() const { return replicas_; }
    int latent_shards() const { return latent_shards_; }
    bool shared_data() const { return shared_; }
    int size() const { return configs_ * replicas_ * latent_shards_; }

    // The formula: the world rank at these coordinates.
    int rank_of(int config, int replica, int latent_shard) const;
    // Its inverse: the coordinates of world rank `rank`, with the grid's shape.
    RankCoords at(int rank) const;
    std::string describe() const { return at(0).describe(); }

    // Each group of `rank` as world ranks, in the group's rank order (what connect builds).
    std::vector<int> replica_group(int rank) const;
    std::vector<int> latent_shard_group(int rank) const;
    std::vector<int> shared_data_group(int rank) const;  // empty when the grid has no shared stream

    // Every communicator of this rank, collective over `world` (this grid's size; its ranks are
    // the grid's). Every rank makes the same calls in this order, whatever fails:
    //   1. world.split: the replicas
    //   2. world.split twice, when S > 1: the latent shards (backend buffers, then host buffers)
    //   3. world.split, with shared data: shared_data
    //   4. with a backend: gradient_comm on the replicas (collective over them), then, when
    //      S > 1, on the latent shards' first split (collective over the latent shards)
    // Without a backend (`groups.backend` null) the backend groups stay host communicators.
    // A group that cannot agree leaves GridComms::error set (no throw: the others still make
    // theirs); the split failing throws.
    GridComms connect(Communicator& world, const BackendGroups& groups = {}) const;

private:
    int configs_ = 1, replicas_ = 1, latent_shards_ = 1;
    bool shared_ = false;
};

}  // namespace saetrain
