// Backend's default behaviour where a backend has nothing of its own to add (backend.h).
#include "saetrain/backend.h"

#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain {

// A host-memory backend exchanges its buffers through `group` itself. It still takes part in
// the agreement: a CPU rank in a group of GPU ranks (a node without a GPU under backend: auto)
// must refuse with the GPU ranks, in the same collectives, instead of leaving them in NCCL's
// bootstrap.
std::unique_ptr<Communicator> Backend::gradient_comm(std::unique_ptr<Communicator> group,
                                                     int world_rank, const std::string& host,
                                                     double /*timeout_s*/, CommChoice* choice) {
    if (group->size() == 1) {
        if (choice) *choice = CommChoice{};
        return group;
    }
    CommFacts mine = comm_facts();
    mine.world_rank = world_rank;
    mine.host = host;
    CommChoice agreed = comm_agree(*group, mine);
    SAE_ENFORCE(agreed.kind == CommKind::host,
                "backend {} exchanges host memory, but its group agreed on {}", name(),
                comm_kind_name(agreed.kind));
    if (choice) *choice = std::move(agreed);
    return group;
}

}  // namespace saetrain
