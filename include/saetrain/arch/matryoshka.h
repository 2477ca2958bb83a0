// arch/matryoshka.h — the Matryoshka BatchTopK SAE's own backend op (arch_ops.h): a selection
// restricted to a prefix of the dictionary, for the reconstructions of its nested prefixes. The
// CPU reference is in src/core/arch/matryoshka.cpp, the CUDA implementation in
// src/cuda/arch_ops.cpp (kernel in matryoshka.cu).
#pragma once

#include <cstdint>

#include "saetrain/arch_ops.h"

namespace saetrain {

class MatryoshkaOps : public ArchOps {
public:
    // out[i] = val[i] where idx[i] < prefix, else 0, for i < count: the (idx, val) pairs of a
    // selection kept for the latents [0, prefix) only (the sparse ops treat value 0 as absent).
    // On a latent shard the ids are local, and so is `prefix` (clamped to [0, n_local]).
    virtual void prefix_mask(const int32_t* idx, const float* val, int64_t count, int64_t prefix,
                             float* out) = 0;
};

const ArchOpSet& matryoshka_op_set();

}  // namespace saetrain
