// arch/relu.h — the ReLU SAE's own backend ops (arch_ops.h): its activation and its backward.
// The CPU reference is in src/core/arch/relu.cpp, the CUDA implementation in src/cuda/arch_ops.cpp.
#pragma once

#include <cstdint>

#include "saetrain/arch_ops.h"

namespace saetrain {

class ReluOps : public ArchOps {
public:
    // ReLU encoder activation in place: z = relu(pre + b_enc) [rows, n].
    virtual void relu_forward(float* pre_to_z, const float* b_enc, int64_t rows, int64_t n) = 0;
    // dz -> dpre in place: dpre = (z > 0) * (dz + l1 * norm_i). Writes column sums of dpre
    // into db_enc[n] and of z into z_col_sum[n], per-latent firing counts into fires[n], and
    // adds l1 sums and L0 to stats.
    virtual void relu_backward(const float* z, float* dz_to_dpre, const float* dec_norms, float l1,
                               int64_t rows, int64_t n, float* db_enc, float* z_col_sum,
                               int32_t* fires, float* stats) = 0;
};

const ArchOpSet& relu_op_set();

}  // namespace saetrain
