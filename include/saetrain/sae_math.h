// sae_math.h — per-element math shared by the CPU and CUDA backends and the shard readers.
//
// Every function here is `__host__ __device__` under nvcc and plain inline otherwise, so the
// CPU tests exercise exactly the code the GPU kernels run: activation functions and their
// gradients, Adam's update of one element, fp16/bf16 widening and rounding (the project's one
// copy of each element conversion).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SAE_HD __host__ __device__ __forceinline__
#else
#define SAE_HD inline
#endif

namespace saetrain::math {

SAE_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

// d loss / d pre for z = relu(pre) with the (decoder-norm weighted) L1 term l1 * w * z.
SAE_HD float relu_l1_grad(float z, float dz, float l1_times_norm) {
    return z > 0.0f ? dz + l1_times_norm : 0.0f;
}

// JumpReLU (Rajamanoharan et al. 2024): z = v * H(v - theta). Its step has no derivative, so
// training uses the straight-through pseudo-derivatives with the rectangle kernel
// K(u) = 1 for |u| < 1/2 of bandwidth eps:
//   dz/dv = H(v - theta),  dz/dtheta := -(theta/eps) K((v - theta)/eps),
//   d H(v - theta)/dv = 0, d H(v - theta)/dtheta := -(1/eps) K((v - theta)/eps).
SAE_HD float rectangle(float u) { return (u > -0.5f && u < 0.5f) ? 1.0f : 0.0f; }
SAE_HD float jumprelu(float v, float theta) { return v > theta ? v : 0.0f; }
// For one element with dL/dz = dz and the penalty l0 * H(v - theta): dL/dv and dL/dtheta.
// The kernel's width at threshold theta: sae.jumprelu_bandwidth when > 0, else 2 theta (0: a
// width in the threshold's own units, the same on activations of any scale; the window is then
// (0, 2 theta)). On planted features at sae.target_l0 (469 steps, the thresholds' lr 10x) widths
// of 0.5, 1 and 2 theta recovered 0.85, 0.90 and 0.97 of the features at the target L0; the
// absolute 0.001, 0.80.
SAE_HD float jumprelu_width(float bandwidth, float theta) {
    return bandwidth > 0.0f ? bandwidth : 2.0f * theta;
}
SAE_HD void jumprelu_grad(float v, float theta, float bandwidth, float dz, float l0, float& dv,
                          float& dtheta) {
    dv = v > theta ? dz : 0.0f;
    const float k = rectangle((v - theta) / bandwidth) / bandwidth;
    dtheta = -k * (theta * dz + l0);
}
// The tanh sparsity penalty (Ameisen et al. 2025, the cross-layer transcoders of circuit
// tracing): lambda * tanh(c z ||W_dec_i||) per activation z of latent i, with ||W_dec_i|| its
// decoder row's norm (a CLT's: over every layer it writes to). Returns the tanh; adds to dz
// the penalty's dL/dz and sets dnorm to its dL/d||W_dec_i||.
SAE_HD float tanh_penalty_grad(float z, float norm, float c, float lambda, float& dz,
                               float& dnorm) {
    const float t = tanhf(c * z * norm);
    const float s = lambda * c * (1.0f - t * t);
    dz += s * norm;
    dnorm = s * z;
    return t;
}
// Anthropic's pre-activation loss on a dead latent (SAELens's calculate_pre_act_loss): coeff *
// relu(theta - v) ||W_dec_i||, pulling a latent that never fires back towards its threshold.
// Adds its dL/dv and dL/dtheta, sets dnorm to its dL/d||W_dec_i||; returns relu(theta - v)
// ||W_dec_i|| (the loss without coeff).
SAE_HD float pre_act_grad(float v, float theta, float norm, float coeff, float& dv, float& dtheta,
                          float& dnorm) {
    const float u = theta - v;
    if (!(u > 0.0f)) {
        dnorm = 0.0f;
        return 0.0f;
    }
    dv -= coeff * norm;
    dtheta += coeff * norm;
    dnorm = coeff * u;
    return u * norm;
}

// Gated SAE (Rajamanoharan et al. 2024): one encoder direction, two paths. Gate g = pre +
// b_gate, magnitude m = pre * exp(r_mag) + b_mag, z = H(g) * relu(m).
SAE_HD float gated(float g, float m) { return g > 0.0f ? relu(m) : 0.0f; }
// For one element: dL/dz = dz, dL/d relu(g) = dgate (the auxiliary reconstruction) plus the L1
// term l1_norm (l1 * ||W_dec_i||) on relu(g). Returns dL/dg and dL/dm; dL/dpre is
// dg + dm * exp(r_mag).
SAE_HD void gated_grad(float g, float m, float dz, float dgate, float l1_norm, float& dg,
                       float& dm) {
    dm = (g > 0.0f && m > 0.0f) ? dz : 0.0f;
    dg = g > 0.0f ? dgate + l1_norm : 0.0f;
}

struct AdamScalars {
    float lr;  // this step's learning rate
    float beta1, beta2, eps;
    float inv_bias_corr1;  // 1 / (1 - beta1^t): multiplied, not divided (a division per
    float inv_bias_corr2;  // element and two per step made Adam compute-bound on the CPU)
    float weight_decay;    // decoupled (AdamW), already multiplied by nothing: p -= lr * wd * p
    float grad_scale;      // multiplies the gradient first (clipping, replica averaging)
    // train.optimizer: signum. Then the step is signum_update, beta1 is train.momentum and
    // `average` the new iterate's weight in the average this step.
    bool signum = false;
    float average = 0.0f;
};

// One element of Adam(W). Written so CPU and GPU round identically for the same inputs when
// the compiler does not contract to FMA differently (tests compare with a tolerance anyway).
SAE_HD void adam_update(float& p, float& m, float& v, float g, const AdamScalars& s) {
    g *= s.grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    const float m_hat = m * s.inv_bias_corr1;
    const float v_hat = v * s.inv_bias_corr2;
    p -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * p);
}

// One element of schedule-free sign descent (Defazio et al. 2024, "The Road Less Scheduled",
// around sign SGD; sparsify's default optimizer). Three points per parameter: p = y, where the
// gradient g was taken; m = z, the sign-descent iterate; v = x, the weighted average of the
// iterates, which is the SAE. Decoupled weight decay is taken at y. The gradient's scale
// (grad_scale > 0) does not change its sign.
SAE_HD void signum_update(float& p, float& m, float& v, float g, const AdamScalars& s) {
    const float sign = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
    m -= s.lr * (sign + s.weight_decay * p);
    v += s.average * (m - v);
    p = s.beta1 * v + (1.0f - s.beta1) * m;
}

// The optimizer's step on one element: Adam(W) or signum, as `s` says.
SAE_HD void optimizer_update(float& p, float& m, float& v, float g, const AdamScalars& s) {
    if (s.signum)
        signum_update(p, m, v, g, s);
    else
        adam_update(p, m, v, g, s);
}

// The bits of a float and back (memcpy: defined behaviour, compiled to a register move).
SAE_HD float float_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
SAE_HD uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

// bfloat16 is the high half of a float.
SAE_HD float bf16_bits_to_float(uint16_t b) {
    return float_from_bits(static_cast<uint32_t>(b) << 16);
}

// Float to bf16 bits, rounded to nearest (ties to even), as the GPU's bf16 GEMM operands are:
// values past the largest bf16 become infinities, NaNs stay (quiet) NaNs.
SAE_HD uint16_t float_to_bf16_bits(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

// IEEE half (fp16) bits to float, exactly (every half is a float): normals, subnormals, zeros,
// infinities and NaNs (payload kept). The one fp16 widening of the project: the GPU's widen
// kernel, the shard readers' conversion (beside F16C where the CPU has it) and the tests use it.
// Branch-free, so that the readers' conversion loop vectorises: exponent and mantissa move into
// place and are rebiased; inf/nan get the rest of the float exponent range; a subnormal half
// is renormalised by one float subtraction of two normal floats, which is exact.
SAE_HD float fp16_bits_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
    const uint32_t e = o & 0x0f800000u;
    o += 0x38000000u;                          // rebias 15 -> 127
    o += e == 0x0f800000u ? 0x38000000u : 0u;  // inf/nan: exponent 255
    // 2^-14 * 1.m - 2^-14 = 2^-14 * 0.m, the subnormal's value.
    const float sub = float_from_bits(o + 0x00800000u) - float_from_bits(0x38800000u);
    return float_from_bits((e == 0 ? float_bits(sub) : o) | sign);
}

// Float to fp16 bits, rounded to nearest (ties to even): values from 65520 up become
// infinities, values below half the smallest subnormal zeros; NaNs stay (quiet) NaNs. What
// sae-synth writes float16 shards with.
SAE_HD uint16_t float_to_fp16_bits(float f) {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or nan; keep nan a (quiet) nan whatever its payload
        const uint32_t nan = ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0;
        return static_cast<uint16_t>(sign | 0x7c00u | nan);
    }
    // 65520 = 0x477ff000 is halfway between 65504 (max half) and 2^16; the tie goes to the
    // even 2^16, which is infinity, so everything from there up overflows.
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if (ax < 0x38800000u) {  // below 2^-14, the smallest normal half: subnormal or zero
        // 2^-25 (0x33000000) is half the smallest subnormal; the tie rounds to even zero.
        if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);
        const uint32_t e = ax >> 23;                      // 102..112
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;  // value = m * 2^(e-150)
        const uint32_t shift = 126u - e;                  // in units of 2^-24: m >> shift
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u))) ++r;  // may carry into 0x400: ok
        return static_cast<uint16_t>(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10);  // rebias exponent 127 -> 15, keep 10 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // carry may bump the exponent
    return static_cast<uint16_t>(sign | r);
}

// A uint32 whose unsigned order is the float order of x (a < b  <=>  key(a) < key(b)), used
// for radix selection in the GPU top-k. -0 maps to the key of +0 so that, as in a float
// comparison, they tie (and the lower index wins).
SAE_HD uint32_t float_order_key(float x) {
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
SAE_HD float float_from_order_key(uint32_t k) {
    const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

}  // namespace saetrain::math
