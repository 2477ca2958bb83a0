// The communicator decision of a group of ranks, and its agreement (comm_choice.h).
#include "saetrain/comm_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain {
namespace {

// A GPU several ranks use: one host, one UUID.
struct GpuTenants {
    std::string host, uuid;
    int device = -1;
    std::vector<int> ranks;  // world ranks
};

// Every GPU with more than one rank on it, in order of its first rank.
std::vector<GpuTenants> gpu_tenants(const std::vector<CommFacts>& ranks) {
    std::vector<GpuTenants> gpus;
    for (const CommFacts& f : ranks) {
        if (f.device_uuid.empty()) continue;
        auto same = [&](const GpuTenants& g) {
            return g.host == f.host && g.uuid == f.device_uuid;
        };
        auto it = std::find_if(gpus.begin(), gpus.end(), same);
        if (it == gpus.end()) {
            gpus.push_back({f.host, f.device_uuid, f.device, {}});
            it = gpus.end() - 1;
        }
        it->ranks.push_back(f.world_rank);
    }
    gpus.erase(std::remove_if(gpus.begin(), gpus.end(),
                              [](const GpuTenants& g) { return g.ranks.size() < 2; }),
               gpus.end());
    return gpus;
}

std::string describe(const GpuTenants& g) {
    return fmt::format("{} share GPU {} ({}) on node {}", comm_rank_list(g.ranks), g.device,
                       comm_uuid_text(g.uuid), g.host);
}

// "node n1" / "nodes n1,n2": the distinct hosts of `ranks` (world ranks), in order.
std::string hosts_of(const std::vector<CommFacts>& facts, const std::vector<int>& ranks) {
    std::vector<std::string> hosts;
    for (const CommFacts& f : facts)
        if (std::find(ranks.begin(), ranks.end(), f.world_rank) != ranks.end() &&
            std::find(hosts.begin(), hosts.end(), f.host) == hosts.end())
            hosts.push_back(f.host);
    return fmt::format("{} {}", hosts.size() == 1 ? "node" : "nodes", fmt::join(hosts, ","));
}

// The all-gathered form of CommFacts: fixed size, no pointers. 256 bytes hold any
// MPI_Get_processor_name (MPI_MAX_PROCESSOR_NAME is 256 in Open MPI and MPICH, NUL included).
struct PackedFacts {
    int32_t world_rank = 0;
    int32_t device = -1;
    uint8_t uuid_bytes = 0;  // 0 (no GPU) or 16
    uint8_t nccl = 0;
    uint8_t mpi_cuda_aware = 0;
    uint8_t pad = 0;
    char uuid[16] = {};
    char host[256] = {};
};

PackedFacts pack(const CommFacts& f) {
    SAE_ENFORCE(f.device_uuid.size() <= sizeof(PackedFacts::uuid),
                "a device UUID of {} bytes (at most 16)", f.device_uuid.size());
    PackedFacts p;
    p.world_rank = f.world_rank;
    p.device = f.device;
    p.uuid_bytes = static_cast<uint8_t>(f.device_uuid.size());
    p.nccl = f.nccl ? 1 : 0;
    p.mpi_cuda_aware = f.mpi_cuda_aware ? 1 : 0;
    std::memcpy(p.uuid, f.device_uuid.data(), f.device_uuid.size());
    std::memcpy(p.host, f.host.data(), std::min(f.host.size(), sizeof(p.host) - 1));
    return p;
}

CommFacts unpack(const PackedFacts& p) {
    CommFacts f;
    f.world_rank = p.world_rank;
    f.device = p.device;
    f.device_uuid.assign(p.uuid, std::min<size_t>(p.uuid_bytes, sizeof(p.uuid)));
    f.nccl = p.nccl != 0;
    f.mpi_cuda_aware = p.mpi_cuda_aware != 0;
    f.host.assign(p.host, strnlen(p.host, sizeof(p.host)));
    return f;
}

// Every rank's lines, on every rank, in rank order (two all-gathers: lengths, then the text).
std::vector<std::string> allgather_lines(Communicator& comm, const std::vector<std::string>& mine) {
    std::string text;
    for (const std::string& l : mine) text += l + '\n';
    const auto size = static_cast<size_t>(comm.size());
    int64_t len = static_cast<int64_t>(text.size());
    std::vector<int64_t> lens(size);
    comm.allgather(&len, lens.data(), sizeof(len));
    const int64_t width = *std::max_element(lens.begin(), lens.end());
    std::vector<std::string> out;
    if (width == 0) return out;
    text.resize(static_cast<size_t>(width));
    std::string all(static_cast<size_t>(width) * size, '\0');
    comm.allgather(text.data(), all.data(), width);
    for (size_t r = 0; r < size; ++r) {
        const std::string one = all.substr(r * static_cast<size_t>(width), lens[r]);
        for (size_t at = 0, nl; (nl = one.find('\n', at)) != std::string::npos; at = nl + 1)
            out.push_back(one.substr(at, nl - at));
    }
    return out;
}

}  // namespace

const char* comm_kind_name(CommKind kind) {
    switch (kind) {
        case CommKind::host:
            return "host";
        case CommKind::mpi_staged:
            return "mpi_staged";
        case CommKind::mpi_device:
            return "mpi_device";
        case CommKind::nccl:
            return "nccl";
    }
    return "unknown";
}

const char* comm_kind_phrase(CommKind kind) {
    switch (kind) {
        case CommKind::host:
            return "MPI on host memory";
        case CommKind::mpi_staged:
            return "MPI staged through host memory";
        case CommKind::mpi_device:
            return "CUDA-aware MPI on device memory";
        case CommKind::nccl:
            return "NCCL";
    }
    return "unknown";
}

std::string comm_uuid_text(const std::string& uuid) {
    if (uuid.empty()) return "no GPU";
    std::string hex = "GPU-";
    for (size_t i = 0; i < std::min<size_t>(uuid.size(), 4); ++i)
        hex += fmt::format("{:02x}", static_cast<unsigned char>(uuid[i]));
    return hex;
}

std::string comm_rank_list(std::vector<int> ranks) {
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    std::string out;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        if (!out.empty()) out += ",";
        if (j >= i + 2)
            out += fmt::format("{}-{}", ranks[i], ranks[j]);
        else
            for (size_t q = i; q <= j; ++q) out += fmt::format("{}{}", q > i ? "," : "", ranks[q]);
        i = j + 1;
    }
    return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

std::vector<std::string> comm_gpu_tenants(const std::vector<CommFacts>& ranks) {
    std::vector<std::string> lines;
    for (const GpuTenants& g : gpu_tenants(ranks)) lines.push_back(describe(g));
    return lines;
}

CommChoice comm_choose(const std::vector<CommFacts>& ranks) {
    SAE_ENFORCE(!ranks.empty(), "comm_choose: a group of no ranks");
    std::vector<int> gpu, cpu, no_nccl, aware, unaware;
    for (const CommFacts& f : ranks) {
        (f.device_uuid.empty() ? cpu : gpu).push_back(f.world_rank);
        if (!f.nccl) no_nccl.push_back(f.world_rank);
        (f.mpi_cuda_aware ? aware : unaware).push_back(f.world_rank);
    }
    CommChoice choice;
    if (gpu.empty()) return choice;  // CPU ranks: MPI on host memory, as before
    SAE_ENFORCE(cpu.empty(),
                "one group of ranks mixes backends: {} ({}) on the CPU, {} ({}) on GPUs; the "
                "replicas and latent shards of an SAE exchange buffers through one kind of "
                "communicator, so give every rank a GPU (check CUDA_VISIBLE_DEVICES and the job's "
                "GPU request) or set backend: cpu",
                comm_rank_list(cpu), hosts_of(ranks, cpu), comm_rank_list(gpu),
                hosts_of(ranks, gpu));
    const std::vector<GpuTenants> crowded = gpu_tenants(ranks);
    if (crowded.empty() && no_nccl.empty()) {
        choice.kind = CommKind::nccl;
        return choice;
    }
    choice.kind = unaware.empty() ? CommKind::mpi_device : CommKind::mpi_staged;
    const std::string through =
        fmt::format("gradients go through {}", comm_kind_phrase(choice.kind));
    for (const GpuTenants& g : crowded)
        choice.notes.push_back(
            fmt::format("{}: {} (NCCL refuses two ranks on one GPU)", describe(g), through));
    if (!no_nccl.empty())
        choice.notes.push_back(fmt::format("saetrain on {} was built without NCCL: {}",
                                           comm_rank_list(no_nccl), through));
    if (!aware.empty() && !unaware.empty())
        choice.notes.push_back(fmt::format("MPI reads device memory on {} but not on {}: {}",
                                           comm_rank_list(aware), comm_rank_list(unaware),
                                           through));
    return choice;
}

std::vector<CommFacts> comm_gather_facts(Communicator& group, const CommFacts& mine) {
    const PackedFacts p = pack(mine);
    std::vector<PackedFacts> all(static_cast<size_t>(group.size()));
    group.allgather(&p, all.data(), sizeof(PackedFacts));
    std::vector<CommFacts> facts;
    facts.reserve(all.size());
    for (const PackedFacts& q : all) facts.push_back(unpack(q));
    return facts;
}

void comm_check_agreement(Communicator& group, CommKind mine, const std::string& refusal,
                          const std::vector<CommFacts>& facts) {
    SAE_ENFORCE(static_cast<int>(facts.size()) == group.size(),
                "comm_check_agreement: {} ranks' facts for a group of {}", facts.size(),
                group.size());
    // -1: this rank refused the group. max(code) and max(-code) give the max and the min.
    int64_t code = refusal.empty() ? static_cast<int64_t>(mine) : -1;
    int64_t range[2] = {code, -code};
    group.allreduce_max(range, 2);
    if (range[0] == -range[1]) {
        if (code < 0) throw Error(refusal);  // every rank refused, for the same reason
        return;
    }
    // They differ: name who decided what (every rank gets the same list, so the same line).
    std::vector<int64_t> codes(facts.size());
    group.allgather(&code, codes.data(), sizeof(code));
    std::map<int64_t, std::vector<int>> by_code;
    for (size_t r = 0; r < facts.size(); ++r) by_code[codes[r]].push_back(facts[r].world_rank);
    std::vector<std::string> parts;
    for (const auto& [c, ranks] : by_code)
        parts.push_back(c < 0 ? fmt::format("{} refused the group", comm_rank_list(ranks))
                              : fmt::format("{} chose {}", comm_rank_list(ranks),
                                            comm_kind_name(static_cast<CommKind>(c))));
    throw Error(fmt::format(
        "the ranks of one group decided different communicators from the same facts ({}); they "
        "would hang in different set-up calls, so the run stops here: run one saetrain build "
        "with the same settings on every rank",
        fmt::join(parts, "; ")));
}

CommChoice comm_agree(Communicator& group, const CommFacts& mine) {
    const std::vector<CommFacts> facts = comm_gather_facts(group, mine);
    CommChoice choice;
    std::string refusal;
    try {
        choice = comm_choose(facts);
    } catch (const Error& e) {
        refusal = e.what();
    }
    comm_check_agreement(group, choice.kind, refusal, facts);
    return choice;
}

std::vector<std::string> comm_warnings(const std::vector<CommFacts>& world,
                                       const std::vector<std::string>& group_notes) {
    std::vector<std::string> out;
    for (const std::string& n : group_notes)
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    for (const GpuTenants& g : gpu_tenants(world)) {
        const std::string line = describe(g);
        const bool named = std::any_of(out.begin(), out.end(), [&](const std::string& n) {
            return n.compare(0, line.size() + 1, line + ":") == 0;
        });
        if (!named)
            out.push_back(line +
                          ": they take turns on it (each runs slower than on a GPU of its own)");
    }
    return out;
}

std::vector<std::string> comm_job_warnings(Communicator& world, const CommFacts& mine,
                                           const std::vector<std::string>& notes) {
    const std::vector<CommFacts> facts = comm_gather_facts(world, mine);
    return comm_warnings(facts, allgather_lines(world, notes));
}

}  // namespace saetrain
