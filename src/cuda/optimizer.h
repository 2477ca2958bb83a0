// optimizer.h — the optimizer step on the GPU in two passes (internal to src/cuda): the
// gradient's sum of squares with the decoder rows' radial part projected out (for clipping),
// then one fused pass of AdamW that also projects the decoder rows' gradient and renormalizes
// the rows. See Backend::optimizer_grad_sum_squares / optimizer_apply for the contract.
//
// Bytes per step (d 768 x 24,576 latents, fp32 weights and moments): the sum reads the gradient
// and the decoder weights once (226 MB); the update reads p, g, m, v and writes p, m, v
// (28 B per parameter, 1.06 GB), the decoder rows' projection and renormalization riding along
// in registers and L2. The separate passes it replaces (projection, sum of squares, Adam,
// renormalization) moved ~1.5 GB.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels.h"  // defines: Workspace
#include "saetrain/backend.h"

namespace saetrain::cuda {

// Blocks until the sum is on the host. Leaves g unchanged (the projection is applied again by
// optimizer_apply, from the same weights).
double optimizer_grad_sum_squares(cudaStream_t s, Workspace& ws, const float* params,
                                  const float* grads, int64_t count, const UnitRows& unit);

// AdamW over the ranges; a range that covers the unit rows (it must cover exactly them) is
// updated row by row with the gradient projected and the row renormalized after the update.
void optimizer_apply(cudaStream_t s, float* params, const float* grads, float* m, float* v,
                     const std::vector<AdamRange>& ranges, const UnitRows& unit,
                     math::AdamScalars scalars, float weight_decay);

}  // namespace saetrain::cuda
