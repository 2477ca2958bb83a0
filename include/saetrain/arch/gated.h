// arch/gated.h — the Gated SAE's own backend ops (arch_ops.h): gate g = pre + b_gate, magnitude
// m = pre * exp(r_mag) + b_mag. The CPU reference is in src/core/arch/gated.cpp, the CUDA
// implementation in src/cuda/arch_ops.cpp (kernels in kernels.cu).
#pragma once

#include <cstdint>

#include "saetrain/arch_ops.h"

namespace saetrain {

// gated_backward's arguments (math::gated_grad).
struct GatedBackward {
    const float* pre = nullptr;        // [rows, n]
    const float* b_gate = nullptr;     // [n]
    const float* r_mag = nullptr;      // [n]
    const float* b_mag = nullptr;      // [n]
    const float* dec_norms = nullptr;  // [n] ||W_dec_i|| (the L1 term's weights)
    float l1 = 0;
    int64_t rows = 0, n = 0;
    float* dz_to_dpre = nullptr;    // [rows, n] dL/dz in, dL/dpre out
    const float* dgate = nullptr;   // [rows, n] dL/d relu(g) from the auxiliary reconstruction
    float* db_gate = nullptr;       // [n] column sums ...
    float* dr_mag = nullptr;        // [n]
    float* db_mag = nullptr;        // [n]
    float* dpre_col_sum = nullptr;  // [n]
    float* gate_col_sum = nullptr;  // [n] of relu(g)
    int32_t* fires = nullptr;       // [n]
    float* stats = nullptr;         // adds L1 (sum relu(g) * norm) and L0
};

class GatedOps : public ArchOps {
public:
    // z = H(g) * relu(m) [rows, n]; gate = relu(g) [rows, n] (the gate path's activations).
    virtual void gated_forward(const float* pre, const float* b_gate, const float* r_mag,
                               const float* b_mag, int64_t rows, int64_t n, float* z,
                               float* gate) = 0;
    // With dz = dL/dz in place and dgate = dL/d relu(g) from the auxiliary reconstruction:
    // writes dpre in place of dz (math::gated_grad; the L1 term l1 * norm_i * relu(g)), the
    // column sums db_gate, db_mag, dr_mag, dpre_col_sum, gate_col_sum (of relu(g)), firing
    // counts; adds L1 (sum relu(g) * norm) and L0 to stats.
    virtual void gated_backward(const GatedBackward& a) = 0;
};

const ArchOpSet& gated_op_set();

}  // namespace saetrain
