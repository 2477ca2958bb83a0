#include "saetrain/layout.h"

#include <fmt/format.h>

#include "saetrain/error.h"

namespace saetrain {

std::string RankLayout::describe() const {
    return fmt::format("{} SAE{} x {} replica{}{}", configs, configs == 1 ? "" : "s", replicas,
                       replicas == 1 ? "" : "s",
                       configs > 1 ? (shared ? ", shared data" : ", disjoint data") : "");
}

RankLayout layout_for(const Config& cfg, int world, int rank) {
    const auto g = static_cast<int>(cfg.sweep.empty() ? 1 : cfg.sweep.size());
    const std::string& mode = cfg.parallel.mode;
    RankLayout l;
    l.configs = g;
    if (mode == "sweep") {
        SAE_ENFORCE(cfg.parallel.replicas == 1,
                    "{}: parallel.replicas = {} needs parallel.mode: hybrid (sweep trains one "
                    "replica per SAE)",
                    cfg.source, cfg.parallel.replicas);
        SAE_ENFORCE(world == g,
                    "{}: the sweep has {} SAE config(s) but the job has {} rank(s); run with {} "
                    "rank(s) (one SAE per rank: mpirun -np {} / srun -n {})",
                    cfg.source, g, world, g, g, g);
        l.replicas = 1;
    } else if (mode == "data_parallel") {
        SAE_ENFORCE(g == 1,
                    "{}: parallel.mode: data_parallel trains one SAE but the config lists {}; use "
                    "parallel.mode: hybrid for several SAEs with replicas",
                    cfg.source, g);
        SAE_ENFORCE(cfg.parallel.replicas == 1 || cfg.parallel.replicas == world,
                    "{}: parallel.replicas = {} but data_parallel uses every rank as a replica "
                    "({} ranks); drop the key or run with {} ranks",
                    cfg.source, cfg.parallel.replicas, world, cfg.parallel.replicas);
        l.replicas = world;
    } else {  // hybrid
        const auto r = static_cast<int>(cfg.parallel.replicas);
        SAE_ENFORCE(
            world == g * r,
            "{}: hybrid mode with {} SAE config(s) x parallel.replicas = {} needs {} ranks, "
            "but the job has {}",
            cfg.source, g, r, g * r, world);
        l.replicas = r;
    }
    SAE_ENFORCE(rank >= 0 && rank < world, "rank {} outside a world of {}", rank, world);
    l.config = rank / l.replicas;
    l.replica = rank % l.replicas;
    l.shared = cfg.parallel.sweep_data == "shared" && g > 1;
    return l;
}

}  // namespace saetrain
