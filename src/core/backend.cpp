// Backend's default behaviour where a backend has nothing of its own to add (backend.h).
#include "saetrain/backend.h"

#include <vector>

#include "saetrain/comm.h"

namespace saetrain {

void Backend::upload_rows(float* dst, const void* src, DType t, int64_t n) {
    if (n <= 0) return;
    if (t == DType::f32) return upload(dst, src, n * int64_t{sizeof(float)});
    std::vector<float> wide(static_cast<size_t>(n));
    widen_to_f32(t, src, wide.data(), n);
    upload(dst, wide.data(), n * int64_t{sizeof(float)});
}

std::unique_ptr<Communicator> Backend::gradient_comm(std::unique_ptr<Communicator> replicas,
                                                     int /*local_rank*/, int /*local_size*/,
                                                     double /*timeout_s*/) {
    return replicas;
}

}  // namespace saetrain
