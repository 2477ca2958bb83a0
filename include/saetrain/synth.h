// synth.h — synthetic activation shards with planted ground-truth features.
//
// Each row is a sparse non-negative combination of m planted unit-norm features in d_model
// dimensions, plus Gaussian noise and a non-zero mean: x = mu + sum_i a_i f_i + eps. A feature
// is active with probability active_per_row / m, its magnitude drawn log-uniformly from
// [min_scale, max_scale]. An SAE that learns the data should recover the features as decoder
// rows, which is what the end-to-end test and the quickstart check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "saetrain/shards.h"

namespace saetrain {

struct SynthOptions {
    std::string out_dir;
    int64_t d_model = 64;
    int64_t n_features = 256;     // m planted features
    double active_per_row = 4.0;  // expected active features per row
    double min_scale = 0.5, max_scale = 2.0;
    double noise_std = 0.02;  // per-dimension Gaussian noise
    double mean_norm = 1.0;   // norm of the shared mean vector mu
    int64_t rows = 100000;    // total rows over all shards
    int64_t shards = 4;
    DType dtype = DType::f32;
    bool chunked = false;  // chunked by rows (else contiguous)
    int64_t chunk_rows = 1024;
    uint64_t seed = 0;
    // Non-empty: also a paired target set here (a transcoder's data), row for row with out_dir:
    // each target row is the same codes through a second set of planted features, with its own
    // mean and noise; both sets carry token_ids (the global row index) and ground_truth.h5.
    std::string target_dir;
};

// Writes shard_00000.h5 ... and ground_truth.h5 (dataset `features` [m, d_model], `mean`
// [d_model]) into out_dir, creating it. Deterministic for a given seed.
void synth_write(const SynthOptions& opt);

// Reads ground_truth.h5's `features` [m, d_model] (row-major); sets m and d.
std::vector<float> synth_read_features(const std::string& path, int64_t* m, int64_t* d);

// Mean over true features of the best cosine similarity to any row of `dec` [n, d].
double feature_recovery(const float* truth, int64_t m, const float* dec, int64_t n, int64_t d);

}  // namespace saetrain
