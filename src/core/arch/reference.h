// reference.h — what the architectures' CPU references (arch_ops.h) share: the column blocks
// their reductions are split into, as the CPU backend splits its own (cpu_backend.cpp).
//
// Reductions are split into fixed column blocks and summed in block order, so results do not
// depend on the thread count or scheduling (exact resume and replica equality rely on it).
#pragma once

#include <cstdint>
#include <vector>

#include "saetrain/backend.h"  // defines: kStatL1, kStatL0

namespace saetrain::arch {

constexpr int64_t kColBlock = 256;  // columns per reduction block: 1 KiB of floats per row

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The L1 (activation column sums times decoder norms) and L0 (fire counts) statistics of the
// column blocks of ReLU and Gated backward passes: summed per block in parallel, added to the
// statistics in block order, so the result does not depend on the thread count.
class BlockL1L0 {
public:
    explicit BlockL1L0(int64_t n) : l1_(ceil_div(n, kColBlock)), l0_(l1_.size()) {}
    int64_t blocks() const { return static_cast<int64_t>(l1_.size()); }
    // Block b's w columns: act [w] their activation sums, norms [w] their decoder norms, fired [w]
    // their fire counts.
    void set(int64_t b, int64_t w, const float* act, const float* norms, const float* fired) {
        double s1 = 0, f = 0;
        for (int64_t c = 0; c < w; ++c) {
            s1 += double(act[c]) * norms[c];
            f += fired[c];
        }
        l1_[b] = s1, l0_[b] = f;
    }
    void add_to(float* stats) const {
        for (size_t b = 0; b < l1_.size(); ++b) {
            stats[kStatL1] += static_cast<float>(l1_[b]);
            stats[kStatL0] += static_cast<float>(l0_[b]);
        }
    }

private:
    std::vector<double> l1_, l0_;
};

}  // namespace saetrain::arch
