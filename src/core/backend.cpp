// Backend's default behaviour where a backend has nothing of its own to add (backend.h), and
// the architectures' own ops as a backend hands them out (arch_ops.h).
#include "saetrain/backend.h"

#include <cstring>
#include <limits>
#include <vector>

#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain {

void Backend::zero_block(float* x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) fill(x + r * ld, cols, 0.0f);
}

void Backend::upload_rows(float* dst, const void* src, DType t, int64_t n) {
    if (n <= 0) return;
    if (t == DType::f32) return upload(dst, src, n * int64_t{sizeof(float)});
    std::vector<float> wide(static_cast<size_t>(n));
    widen_to_f32(t, src, wide.data(), n);
    upload(dst, wide.data(), n * int64_t{sizeof(float)});
}

void Backend::upload_columns(float* dst, const void* src, DType t, int64_t rows, int64_t cols,
                             int64_t stride) {
    if (stride == cols) return upload_rows(dst, src, t, rows * cols);
    const auto size = static_cast<size_t>(dtype_size(t));
    std::vector<char> block(static_cast<size_t>(rows * cols) * size);
    const auto* s = static_cast<const char*>(src);
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(block.data() + static_cast<size_t>(r * cols) * size,
                    s + static_cast<size_t>(r * stride) * size, static_cast<size_t>(cols) * size);
    upload_rows(dst, block.data(), t, rows * cols);
}

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

void Backend::topk_forward_columns(const float* pre, const float* bias, int64_t rows, int64_t n,
                                   const int32_t* cols, int64_t count, int64_t k, int32_t* idx,
                                   float* val, bool relu, float* scratch) {
    std::vector<int32_t> chosen(static_cast<size_t>(count));
    download(chosen.data(), cols, count * static_cast<int64_t>(sizeof(int32_t)));
    std::vector<float> mask(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
    for (int32_t c : chosen) mask[static_cast<size_t>(c)] = 0.0f;
    upload(scratch, mask.data(), n * static_cast<int64_t>(sizeof(float)));
    axpby(scratch, bias, 1.0f, 1.0f, n);
    topk_forward(pre, scratch, rows, n, k, idx, val, relu);
}

// --- an architecture's own ops ------------------------------------------------------------------

ArchOps* Backend::keep_arch_ops(const ArchOpSet& set,
                                const std::function<std::unique_ptr<ArchOps>()>& make) {
    auto it = arch_ops_.find(&set);
    if (it == arch_ops_.end()) it = arch_ops_.emplace(&set, make()).first;
    return it->second.get();
}

// The CPU reference runs wherever pointers are host pointers.
ArchOps* Backend::arch_ops(const ArchOpSet& set) {
    if (!host_memory()) return nullptr;
    return keep_arch_ops(set, [&] { return set.reference(*this); });
}

ArchOps& require_arch_ops(Backend& be, const ArchOpSet& set) {
    ArchOps* ops = be.arch_ops(set);
    if (ops) return *ops;
    std::string names;
    for (const std::string& op : set.ops) names += (names.empty() ? "" : ", ") + op;
    throw Error(fmt::format(
        "sae.arch = {}: the {} backend has no implementation of the {} SAE's ops ({}); train "
        "it with backend: cpu, or on a build whose backend has them",
        set.name, be.name(), set.name, names));
}

}  // namespace saetrain
