// topk16.h — the exact top-k of a row selected from its 16-bit (bfloat16) pre-activations: the
// host reference of a GEMM that writes bf16 and a top-k that reads 16-bit keys.
//
// Rounding to bf16 is monotone (a <= b implies bf16(a) <= bf16(b)), so a value whose bf16 key is
// below the k-th largest key T has at least k values strictly above it and cannot be in the top
// k. The top k is therefore among the candidates whose keys are at least T (the ties of the
// 16-bit selection), and refining them with their float values gives the exact selection.
//
// When the refined values are recomputed (another summation order than the one whose rounding
// gave the keys) they differ from those values by at most err. Then a value v_i with key B_i lies
// in [lo(B_i), hi(B_i)] (bf16_rounding_bounds) and its refined value is at most hi(B_i) + err,
// while each of the k keys at least T belongs to a refined value of at least lo(T) - err. So
// i can be left out only when hi(B_i) + 2 err < lo(T), and every other index is a candidate.
// The comparison is made in double: hi + 2 err is one rounded addition and lo(T) a double, so
// rounding (monotone) never turns a sum at or above lo(T) into one below it.
//
// Keys must not be NaN (the trainer skips non-finite batches before its top-k).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <vector>

#include "saetrain/sae_math.h"

namespace saetrain::math {

// [lo, hi]: every float x whose bf16 rounding (float_to_bf16_bits) has the value of key b, and
// no float outside. The two zeros are one value (a float comparison ties them), so the bounds of
// either span the floats that round to +0 or to -0. An infinite key's bounds are the finite
// floats that round to it (the floats past FLT_MAX are infinities themselves, left out).
inline void bf16_rounding_bounds(uint16_t b, float& lo, float& hi) {
    const uint32_t m = b & 0x7fffu;  // the magnitude's bits
    if (m == 0) {                    // +-0: |x| up to the tie at 0x8000, which goes to the even 0
        hi = float_from_bits(0x00008000u);
        lo = -hi;
        return;
    }
    const uint32_t u = m << 16;
    const uint32_t odd = m & 1u;
    // Ties go to even: the midpoint below rounds up to an even key, the one above down to it.
    const float mag_lo = float_from_bits(u - 0x8000u + odd);
    const float mag_hi = m == 0x7f80u ? FLT_MAX : float_from_bits(u + 0x7fffu + (1u - odd));
    if (b & 0x8000u) {
        lo = -mag_hi;
        hi = -mag_lo;
    } else {
        lo = mag_lo;
        hi = mag_hi;
    }
}

// The top k of keys[0..n) refined exactly: ids[0..k) and vals[0..k) by value, largest first, ties
// to the lower index, where refine(i) returns index i's float value (within err of the value
// whose bf16 rounding is keys[i]). Returns how many candidates were refined (k <= count <= n).
// k must be in [1, n].
template <class Refine>
int topk_from_bf16_keys(const uint16_t* keys, int n, int k, float err, Refine&& refine, int* ids,
                        float* vals) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = bf16_bits_to_float(keys[i]);
    std::vector<float> sorted = v;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(),
                     [](float a, float b) { return a > b; });
    const float t = sorted[static_cast<size_t>(k - 1)];
    float t_lo, t_hi;
    bf16_rounding_bounds(float_to_bf16_bits(t), t_lo, t_hi);
    std::vector<std::pair<float, int>> cand;
    for (int i = 0; i < n; ++i) {
        float lo, hi;
        bf16_rounding_bounds(keys[i], lo, hi);
        if (static_cast<double>(hi) + 2.0 * static_cast<double>(err) < static_cast<double>(t_lo))
            continue;
        cand.emplace_back(refine(i), i);
    }
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int j = 0; j < k; ++j) {
        ids[j] = cand[static_cast<size_t>(j)].second;
        vals[j] = cand[static_cast<size_t>(j)].first;
    }
    return static_cast<int>(cand.size());
}

}  // namespace saetrain::math
