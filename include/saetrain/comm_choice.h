// comm_choice.h — which communicator a group of ranks exchanges backend buffers through, agreed
// by every rank of the group before any communicator is made.
//
// A group (the replicas of one SAE, the latent shards of one replica) must use ONE kind of
// communicator: a group in which some ranks enter NCCL's bootstrap and others MPI's split hangs.
// So the decision is not made per rank or per node: every rank states its facts (its host, its
// GPU's UUID, whether its build has NCCL and its MPI reads device memory), one all-gather over
// the group's host communicator gives every rank everyone's facts, every rank applies the same
// rule (comm_choose) to the same data, and an all-reduce checks that they all decided the same
// before anything is created. GPU sharing is read from device UUIDs, not from counting visible
// devices: under Slurm's per-task binding each rank sees one device, yet no GPU is shared.
//
// Pure host code (no CUDA, no MPI): the rule is tested on the CPU with faked facts
// (test_comm_choice), the agreement under mpirun (test_mpi).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace saetrain {

class Communicator;

// What a group's buffers go through, best first.
enum class CommKind : int {
    host = 0,        // CPU backends: MPI on host memory, as it is
    mpi_staged = 1,  // GPUs: MPI on host copies of the device buffers (cuda_staged_comm.h)
    mpi_device = 2,  // GPUs: CUDA-aware MPI on the device buffers, after the producing stream
    nccl = 3,        // GPUs: NCCL (one distinct GPU per rank of the group)
};
// "host", "mpi_staged", "mpi_device", "nccl".
const char* comm_kind_name(CommKind kind);
// What the kind means for a user: "MPI staged through host memory", "NCCL", ...
const char* comm_kind_phrase(CommKind kind);

// One rank's facts. The backend gives the device's (Backend::comm_facts); the caller adds where
// the rank runs.
struct CommFacts {
    int world_rank = 0;           // the rank in MPI_COMM_WORLD (what messages name)
    std::string host;             // MPI_Get_processor_name
    std::string device_uuid;      // the GPU's 16-byte UUID (cudaDeviceProp::uuid); empty: no GPU
    int device = -1;              // the GPU's ordinal as this rank sees it (messages only)
    bool nccl = false;            // the build has NCCL
    bool mpi_cuda_aware = false;  // the MPI library reads and writes device memory
};

struct CommChoice {
    CommKind kind = CommKind::host;
    // Why a GPU group does not get NCCL, one line each, naming world ranks (e.g. "ranks 0,1
    // share GPU 0 (GPU-8c1f0a2e) on node n1: gradients go through MPI staged through host
    // memory"); empty when nothing is worth a warning.
    std::vector<std::string> notes;
};

// The rule, on every rank's facts in group order. NCCL when every rank has a GPU and NCCL and no
// two ranks have the same GPU (same host and UUID: NCCL refuses a duplicate GPU within one
// communicator); else CUDA-aware MPI when every rank's MPI is; else MPI staged through host
// memory. All ranks without a GPU: host. Throws saetrain::Error when the group mixes ranks with
// and without a GPU (naming both sets of ranks and their hosts).
CommChoice comm_choose(const std::vector<CommFacts>& ranks);

// "GPU-8c1f0a2e": the first 4 bytes of a UUID in nvidia-smi's notation (enough to tell a node's
// GPUs apart; nvidia-smi -L prints the whole one); "no GPU" when empty.
std::string comm_uuid_text(const std::string& uuid);
// "ranks 0,1,4-7" / "rank 3": world ranks, ascending, runs of three or more as ranges.
std::string comm_rank_list(std::vector<int> ranks);

// The GPUs that several ranks share (same host and UUID), one line each: "ranks 0,1 share GPU 0
// (GPU-8c1f0a2e) on node n1". In order of the first rank of each.
std::vector<std::string> comm_gpu_tenants(const std::vector<CommFacts>& ranks);

// --- collective (over any Communicator on host memory) --------------------------------------
// Every rank's facts, in group order: one all-gather.
std::vector<CommFacts> comm_gather_facts(Communicator& group, const CommFacts& mine);

// Checks that every rank of `group` decided `mine` (an all-reduce of the kind's min and max);
// `facts` names the ranks (comm_gather_facts). `refusal`: why this rank decided nothing
// (comm_choose threw), else empty. Returns when all agree on a kind; throws saetrain::Error with
// the same line on every rank when all refused (the refusal) or when they differ (naming which
// ranks decided what).
void comm_check_agreement(Communicator& group, CommKind mine, const std::string& refusal,
                          const std::vector<CommFacts>& facts);

// The whole agreement: gather the facts, choose, check. Collective over `group`; every rank gets
// the same CommChoice or the same saetrain::Error.
CommChoice comm_agree(Communicator& group, const CommFacts& mine);

// --- what rank 0 prints ------------------------------------------------------------------------
// The warnings for the job, each once: the groups' notes (their first rank's choice.notes,
// gathered from the whole world), then every GPU that several ranks of `world` share and that no
// note already names (e.g. ranks of different SAEs on one GPU: "...: they take turns on it").
std::vector<std::string> comm_warnings(const std::vector<CommFacts>& world,
                                       const std::vector<std::string>& group_notes);
// Collective over `world`: gathers every rank's facts and notes (a group's first rank passes its
// choice's notes, the others none) and returns comm_warnings of them, the same on every rank, so
// that rank 0 alone prints them: one line per fact however many groups saw it.
std::vector<std::string> comm_job_warnings(Communicator& world, const CommFacts& mine,
                                           const std::vector<std::string>& notes);

}  // namespace saetrain
