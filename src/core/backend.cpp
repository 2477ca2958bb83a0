// Backend's default behaviour where a backend has nothing of its own to add (backend.h).
#include "saetrain/backend.h"

#include "saetrain/comm.h"

namespace saetrain {

std::unique_ptr<Communicator> Backend::gradient_comm(std::unique_ptr<Communicator> replicas,
                                                     int /*local_rank*/, int /*local_size*/,
                                                     double /*timeout_s*/) {
    return replicas;
}

}  // namespace saetrain
