// arch/switch.h — the Switch SAE's own backend ops (arch_ops.h): the tokens of each expert as
// one block of rows, and back. The CPU reference is in src/core/arch/switch.cpp, the CUDA
// implementation in src/cuda/arch_ops.cpp (kernels in switch.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "saetrain/arch_ops.h"

namespace saetrain {

class Communicator;

class SwitchOps : public ArchOps {
public:
    // dst[i, :] = beta * dst[i, :] + scale[i] * src[rows_of[i], :] (scale null: 1; beta 0
    // overwrites). rows_of is a permutation of the rows (or its inverse).
    virtual void gather_rows(float* dst, const float* src, const int32_t* rows_of,
                             const float* scale, float beta, int64_t rows, int64_t cols) = 0;
    // dst[i, :] = src[rows_of[i], :] for [rows, width] latent ids.
    virtual void gather_index_rows(int32_t* dst, const int32_t* src, const int32_t* rows_of,
                                   int64_t rows, int64_t width) = 0;
    // out[i] = a[i, :] . b[i, :].
    virtual void row_dots(const float* a, const float* b, int64_t rows, int64_t cols,
                          float* out) = 0;
};

const ArchOpSet& switch_op_set();

// The router's start under sae.router_init: kmeans. Spherical k-means of the directions of the
// rows xc [rows, d] (x - b_dec) over all replicas' rows, from `centroids` (E unit rows of d),
// with a bias per expert that balances the assignment: row r goes to argmax_e xc_r . c_e + b_e
// (the router's own argmax, ties to the lower index), and the biases are moved until every
// expert has about rows / E of them. The sums are all-reduced over `replicas`, so every replica
// gets the same result.
struct RouterClusters {
    std::vector<double> centroids;  // [E, d], unit rows
    std::vector<double> bias;       // [E], in units of xc . c
    std::vector<int64_t> counts;    // [E], all replicas' rows routed to each by the result
    int iterations = 0;             // Lloyd iterations run
};
RouterClusters balanced_router_clusters(const float* xc, int64_t rows, int64_t d,
                                        std::vector<double> centroids, Communicator& replicas);

}  // namespace saetrain
