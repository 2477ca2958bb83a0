// arch/batchtopk.h — the BatchTopK SAE's own backend ops (arch_ops.h): one selection over the
// whole batch. The CPU reference is in src/core/arch/batchtopk.cpp, the CUDA implementation in
// src/cuda/arch_ops.cpp (kernels in topk_select.cu).
#pragma once

#include <cstdint>

#include "saetrain/arch_ops.h"

namespace saetrain {

class BatchTopkOps : public ArchOps {
public:
    // The `count`-th largest of the positive values of pre + b_enc over all rows (the smallest
    // positive one when fewer are positive; 0 when none is; count <= 0 counts as 1): the
    // batch's selection threshold.
    virtual float batch_threshold(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                                  int64_t count) = 0;
    // Per row, the latents with v = pre + b_enc > 0 and v >= threshold, in latent order, as
    // `width` (idx, val) pairs padded with (0, 0). Returns the largest count of any row; when
    // it exceeds `width` the rows were cut and the caller retries with a wider buffer.
    virtual int64_t select_above(const float* pre, const float* b_enc, float threshold,
                                 int64_t rows, int64_t n, int64_t width, int32_t* idx,
                                 float* val) = 0;
};

const ArchOpSet& batchtopk_op_set();

}  // namespace saetrain
