// arch/jumprelu.h — the JumpReLU SAE's own backend ops (arch_ops.h): z = v * H(v - theta),
// v = pre + b_enc, theta = exp(log_threshold), and its straight-through backward. The CPU
// reference is in src/core/arch/jumprelu.cpp, the CUDA implementation in src/cuda/arch_ops.cpp
// (kernels in kernels.cu).
#pragma once

#include <cstdint>

#include "saetrain/arch_ops.h"

namespace saetrain {

// jumprelu_backward's arguments (math::jumprelu_grad).
struct JumpReluBackward {
    const float* v = nullptr;              // [rows, n] pre + b_enc (jumprelu_forward's)
    const float* log_threshold = nullptr;  // [n]
    float bandwidth = 0;                   // the kernel width (0: the threshold; sae_math.h)
    float l0 = 0;                          // the L0 penalty's coefficient
    int64_t rows = 0, n = 0;
    float* dz_to_dpre = nullptr;      // [rows, n] dL/dz in, dL/dpre out
    float* db_enc = nullptr;          // [n] column sums of dpre
    float* dlog_threshold = nullptr;  // [n]
    int32_t* fires = nullptr;         // [n]
    float* stats = nullptr;           // adds L0
    // The penalties on the decoder rows' norms (`norms` [n], null: neither): the column sums of
    // their dL/d||W_dec_i|| go into norm_grad [n].
    //  - tanh_scale > 0: the tanh penalty (sae.jumprelu_sparsity_loss_mode: tanh) in place of the
    //    L0 term, l0 * tanh(tanh_scale z norms_i) per activation (math::tanh_penalty_grad), its
    //    dL/dz added to dz before the straight-through backward; the tanh values' sum is added
    //    to stats[kStatL1].
    //  - dead_mask ([n], 1 for a dead latent; null: off): the pre-activation loss pre_act *
    //    relu(theta - v) norms_i on the dead latents (math::pre_act_grad); the sum of
    //    relu(theta - v) norms_i is added to stats[kStatAux].
    const float* norms = nullptr;
    float tanh_scale = 0;
    float* norm_grad = nullptr;
    const float* dead_mask = nullptr;
    float pre_act = 0;
};

class JumpReluOps : public ArchOps {
public:
    // pre becomes v in place (the backward needs it); z [rows, n].
    virtual void jumprelu_forward(float* pre_to_v, const float* b_enc, const float* log_threshold,
                                  int64_t rows, int64_t n, float* z) = 0;
    // dz -> dpre in place (math::jumprelu_grad, with the L0 penalty l0 * sum H(v - theta), or
    // the tanh penalty when a.norms is set); column sums of dpre into db_enc, d/dlog_threshold
    // into dlog_threshold, firing counts into fires; adds L0 to stats.
    virtual void jumprelu_backward(const JumpReluBackward& a) = 0;
};

const ArchOpSet& jumprelu_op_set();

}  // namespace saetrain
