// The GPU groups' communicator: NCCL, CUDA-aware MPI or staged MPI, agreed by the whole group
// (gradient_comm.h).
#include "gradient_comm.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "saetrain/cuda_collective_delay.h"  // defines: make_cuda_collective_delay_comm
#include "saetrain/cuda_staged_comm.h"  // defines: make_cuda_staged_comm, make_cuda_ordered_comm
#include "saetrain/error.h"
#include "saetrain/mpi_world.h"  // defines: mpi_comm_handle
#if SAETRAIN_HAVE_NCCL
#include "saetrain/nccl_comm.h"  // defines: make_nccl_comm
#endif

namespace saetrain::cuda {

std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> group,
                                            cudaStream_t stream, const CommFacts& mine,
                                            double timeout_s, CommChoice* choice) {
    if (group->size() == 1) {
        if (choice) *choice = CommChoice{};
        return group;
    }
    // A malformed value (on some nodes only, perhaps: the launcher may not forward it) is a
    // refusal inside the agreement, so the other ranks are not left in the next set-up call.
    int64_t delay_us = 0;
    std::string refusal;
    try {
        delay_us = collective_delay_us_from_env();
    } catch (const Error& e) {
        refusal = e.what();
    }
    // comm_agree, with this rank's refusal: the same kind on every rank, or the same
    // saetrain::Error on every rank, so nothing below is entered by only part of the group.
    const std::vector<CommFacts> facts = comm_gather_facts(*group, mine);
    CommChoice agreed;
    try {
        if (refusal.empty()) agreed = comm_choose(facts);
    } catch (const Error& e) {
        refusal = e.what();
    }
    comm_check_agreement(*group, agreed.kind, refusal, facts);
    // Each kind orders its reads of a device buffer after the kernels queued on `stream`:
    std::unique_ptr<Communicator> out;
    switch (agreed.kind) {
        case CommKind::nccl: {
#if SAETRAIN_HAVE_NCCL
            // NcclComm records an event on `stream` and makes its own stream wait for it before
            // each collective, and makes `stream` wait for the collective's end (nccl_comm.h).
            NcclOptions o;
            o.compute_stream = stream;
            o.timeout_seconds = timeout_s;
            out = make_nccl_comm(mpi_comm_handle(*group), mine.device, o);
            break;
#else
            (void)timeout_s;
            throw Error("the group chose NCCL but this build has none (a rank said it had)");
#endif
        }
        case CommKind::mpi_device:
            // CUDA-aware MPI reads device memory from the host thread: the wrapper synchronizes
            // `stream` before each collective on a device buffer.
            out = make_cuda_ordered_comm(std::move(group), stream);
            break;
        case CommKind::mpi_staged:
            // The downloads and uploads are queued on `stream` and waited for.
            out = make_cuda_staged_comm(std::move(group), stream);
            break;
        case CommKind::host:
            throw Error("a group of GPU ranks chose host buffers (comm_choose never does)");
    }
    if (delay_us > 0) {
        out = make_cuda_collective_delay_comm(std::move(out), stream, delay_us);
        agreed.notes.push_back(fmt::format(
            "SAETRAIN_DEBUG_COLLECTIVE_DELAY_US={}: every collective on device memory is queued "
            "behind NaN poison and a {} us spin (a debug mode: an unordered collective sums NaN; "
            "slow)",
            delay_us, delay_us));
    }
    if (choice) *choice = std::move(agreed);
    return out;
}

}  // namespace saetrain::cuda
