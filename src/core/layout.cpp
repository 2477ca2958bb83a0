#include "saetrain/layout.h"

#include <fmt/format.h>

#include "saetrain/error.h"

namespace saetrain {

std::string RankLayout::describe() const {
    return fmt::format("{} SAE{} x {} replica{}{}{}", configs, configs == 1 ? "" : "s", replicas,
                       replicas == 1 ? "" : "s",
                       shards > 1 ? fmt::format(" x {} latent shards", shards) : "",
                       configs > 1 ? (shared ? ", shared data" : ", disjoint data") : "");
}

RankLayout layout_for(const Config& cfg, int world_ranks, int rank) {
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
    RankLayout l;
    l.configs = g;
    l.shards = S;
    if (mode == "sweep") {
        SAE_ENFORCE(cfg.parallel.replicas == 1,
                    "{}: parallel.replicas = {} needs parallel.mode: hybrid (sweep trains one "
                    "replica per SAE)",
                    cfg.source, cfg.parallel.replicas);
        SAE_ENFORCE(world == g,
                    "{}: the sweep has {} SAE config(s){} but the job has {} rank(s); run with {} "
                    "rank(s) (one SAE per rank{}: mpirun -np {} / srun -n {})",
                    cfg.source, g, per, world_ranks, g * S, g * S, S > 1 ? " per shard" : "", g * S,
                    g * S);
        l.replicas = 1;
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
        l.replicas = world;
    } else {  // hybrid
        const auto r = static_cast<int>(cfg.parallel.replicas);
        SAE_ENFORCE(world == g * r,
                    "{}: hybrid mode with {} SAE config(s) x parallel.replicas = {}{} needs {} "
                    "ranks, but the job has {}",
                    cfg.source, g, r, per, g * r * S, world_ranks);
        l.replicas = r;
    }
    SAE_ENFORCE(rank >= 0 && rank < world_ranks, "rank {} outside a world of {}", rank,
                world_ranks);
    l.shard = rank % S;
    l.config = rank / S / l.replicas;
    l.replica = rank / S % l.replicas;
    l.shared = cfg.parallel.sweep_data == "shared" && g > 1;
    return l;
}

}  // namespace saetrain
