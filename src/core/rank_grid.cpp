#include "saetrain/rank_grid.h"

#include <fmt/format.h>

#include "saetrain/backend.h"
#include "saetrain/error.h"

namespace saetrain {

std::string RankCoords::describe() const {
    return fmt::format("{} SAE{} x {} replica{}{}{}", configs, configs == 1 ? "" : "s", replicas,
                       replicas == 1 ? "" : "s",
                       latent_shards > 1 ? fmt::format(" x {} latent shards", latent_shards) : "",
                       configs > 1 ? (shared_data ? ", shared data" : ", disjoint data") : "");
}

LatentShard GridComms::latent_shard(int64_t n_total) const {
    LatentShard part;
    part.n_total = n_total;
    if (me.latent_shards == 1) return part;
    part.group = latent_shards.get();
    part.backend_group = latent_shards_backend.get();
    part.index = me.latent_shard, part.count = me.latent_shards;
    return part;
}

// --- the shape ----------------------------------------------------------------------------------

RankGrid::RankGrid(int configs, int replicas, int latent_shards, bool shared)
    : configs_(configs),
      replicas_(replicas),
      latent_shards_(latent_shards),
      shared_(shared && configs > 1) {
    SAE_ENFORCE(configs >= 1 && replicas >= 1 && latent_shards >= 1,
                "a rank grid of {} config(s) x {} replica(s) x {} latent shard(s)", configs,
                replicas, latent_shards);
}

RankGrid RankGrid::from_config(const Config& cfg, int world_ranks) {
    const auto g = static_cast<int>(cfg.sweep.empty() ? 1 : cfg.sweep.size());
    const auto S = static_cast<int>(cfg.parallel.latent_shards);
    const std::string& mode = cfg.parallel.mode;
    SAE_ENFORCE(S >= 1 && world_ranks % S == 0,
                "{}: parallel.latent_shards = {} does not divide the job's {} rank(s); run with a "
                "multiple of {} ranks",
                cfg.source, S, world_ranks, S);
    // Every rank count below is in groups of S shards; the messages speak of ranks.
    const int world = world_ranks / S;
    const std::string per = S > 1 ? fmt::format(" x {} latent shards", S) : "";
    int replicas = 1;
    if (mode == "sweep") {
        SAE_ENFORCE(cfg.parallel.replicas == 1,
                    "{}: parallel.replicas = {} needs parallel.mode: hybrid (sweep trains one "
                    "replica per SAE)",
                    cfg.source, cfg.parallel.replicas);
        SAE_ENFORCE(world == g,
                    "{}: the sweep has {} SAE config(s){} but the job has {} rank(s); run with {} "
                    "rank(s) ({}: mpirun -np {} / srun -n {})",
                    cfg.source, g, per, world_ranks, g * S,
                    S > 1 ? fmt::format("{} ranks per SAE", S) : "one SAE per rank", g * S, g * S);
    } else if (mode == "data_parallel") {
        SAE_ENFORCE(g == 1,
                    "{}: parallel.mode: data_parallel trains one SAE but the config lists {}; use "
                    "parallel.mode: hybrid for several SAEs with replicas",
                    cfg.source, g);
        SAE_ENFORCE(cfg.parallel.replicas == 1 || cfg.parallel.replicas == world,
                    "{}: parallel.replicas = {} but data_parallel uses every rank{} as a replica "
                    "({} ranks); drop the key or run with {} ranks",
                    cfg.source, cfg.parallel.replicas, S > 1 ? " group of the latent shards" : "",
                    world_ranks, cfg.parallel.replicas * S);
        replicas = world;
    } else {  // hybrid
        const auto r = static_cast<int>(cfg.parallel.replicas);
        SAE_ENFORCE(world == g * r,
                    "{}: hybrid mode with {} SAE config(s) x parallel.replicas = {}{} needs {} "
                    "ranks, but the job has {}",
                    cfg.source, g, r, per, g * r * S, world_ranks);
        replicas = r;
    }
    return RankGrid(g, replicas, S, cfg.parallel.sweep_data == "shared");
}

// --- coordinates --------------------------------------------------------------------------------

int RankGrid::rank_of(int config, int replica, int latent_shard) const {
    SAE_ENFORCE(config >= 0 && config < configs_ && replica >= 0 && replica < replicas_ &&
                    latent_shard >= 0 && latent_shard < latent_shards_,
                "no rank at config {}, replica {}, latent shard {} of {}", config, replica,
                latent_shard, describe());
    return (config * replicas_ + replica) * latent_shards_ + latent_shard;
}

RankCoords RankGrid::at(int rank) const {
    SAE_ENFORCE(rank >= 0 && rank < size(), "rank {} outside a world of {}", rank, size());
    RankCoords l;
    l.configs = configs_, l.replicas = replicas_, l.latent_shards = latent_shards_;
    l.latent_shard = rank % latent_shards_;
    l.replica = rank / latent_shards_ % replicas_;
    l.config = rank / latent_shards_ / replicas_;
    l.shared_data = shared_;
    return l;
}

std::vector<int> RankGrid::replica_group(int rank) const {
    const RankCoords l = at(rank);
    std::vector<int> out;
    for (int q = 0; q < replicas_; ++q) out.push_back(rank_of(l.config, q, l.latent_shard));
    return out;
}

std::vector<int> RankGrid::latent_shard_group(int rank) const {
    const RankCoords l = at(rank);
    std::vector<int> out;
    for (int s = 0; s < latent_shards_; ++s) out.push_back(rank_of(l.config, l.replica, s));
    return out;
}

std::vector<int> RankGrid::shared_data_group(int rank) const {
    const RankCoords l = at(rank);
    std::vector<int> out;
    if (!shared_) return out;
    for (int c = 0; c < configs_; ++c) out.push_back(rank_of(c, l.replica, l.latent_shard));
    return out;
}

// --- communicators ------------------------------------------------------------------------------

namespace {

// The communicator of one group whose buffers live on the backend: the group's ranks agree on its
// kind (Backend::gradient_comm); its first rank keeps the decision's notes for the job's
// warnings. A refusal goes to `error` (the first one kept) and leaves a null communicator.
std::unique_ptr<Communicator> on_backend(std::unique_ptr<Communicator> group, int world_rank,
                                         const BackendGroups& how, GridComms& out) {
    try {
        CommChoice choice;
        std::unique_ptr<Communicator> comm = how.backend->gradient_comm(
            std::move(group), world_rank, how.host, how.timeout_s, &choice);
        if (comm->rank() == 0)
            out.notes.insert(out.notes.end(), choice.notes.begin(), choice.notes.end());
        return comm;
    } catch (const std::exception& e) {
        if (out.error.empty()) out.error = e.what();
        return nullptr;
    }
}

}  // namespace

GridComms RankGrid::connect(Communicator& world, const BackendGroups& groups) const {
    SAE_ENFORCE(world.size() == size(), "a grid of {} ranks ({}) connected over {} ranks", size(),
                describe(), world.size());
    GridComms c;
    c.me = at(world.rank());
    const RankCoords& l = c.me;
    // Each split's color is its group's first world rank (unique per group), its key the
    // position in the group, so the communicator's rank i is the group's i-th member.
    c.replicas = world.split(rank_of(l.config, 0, l.latent_shard), l.replica);
    std::unique_ptr<Communicator> latent_backend_group;
    if (latent_shards_ > 1) {
        latent_backend_group = world.split(rank_of(l.config, l.replica, 0), l.latent_shard);
        c.latent_shards = world.split(rank_of(l.config, l.replica, 0), l.latent_shard);
    }
    if (shared_) c.shared_data = world.split(rank_of(0, l.replica, l.latent_shard), l.config);
    if (groups.backend) {
        c.replicas = on_backend(std::move(c.replicas), world.rank(), groups, c);
        if (latent_backend_group)
            c.latent_shards_backend =
                on_backend(std::move(latent_backend_group), world.rank(), groups, c);
    } else {
        c.latent_shards_backend = std::move(latent_backend_group);
    }
    return c;
}

}  // namespace saetrain
