// features_file.h — DIR/features.h5, sae-features' machine-readable output.
//
// Datasets (n latents, N = top, W = context rows each side, M = neighbours):
//   frequency [n] f64        rows the latent fired on / rows read
//   fire_count [n] i64       rows it fired on (a non-zero activation)
//   mean_act [n] f32         its mean activation over those rows (0: never fired)
//   max_act [n] f32          its largest activation (0: never fired)
//   hist [n, B] i64          its non-zero activations per log-spaced bin; hist_edges [B + 1] f32
//   top_rows [n, N] i64      global row indices into the dataset (its rows in shard order) of
//                            its N largest activations, largest first (ties: lower row first),
//                            -1 past its firings; top_acts [n, N] f32 those activations (0 past)
//   top_context_tokens [n, N, 2W + 1] i32  the token ids of each top row's window, the row at
//                            index W, -1 outside its context or past its firings; only when
//                            every shard carries token_ids and positions
//   top_context_acts [n, N, 2W + 1] f32  the latent's activation on each row of the window (0
//                            outside the data set or past its firings; rows of another context
//                            are the rows the dataset holds there, as top_context_tokens marks)
//   sample_rows [n, S] i64, sample_acts [n, S] f32, sample_context_tokens [n, S, 2W + 1] i32,
//   sample_context_acts [n, S, 2W + 1] f32  the same of a uniform sample of S of its firings
//                            (the S of smallest feature_sample_key), in decreasing activation:
//                            examples from across its activations, not only its largest
//   neighbours [n, M] i32, neighbour_cosine [n, M] f32  the latents whose decoder rows have the
//                            largest cosine with its own, in decreasing cosine
//   logit_pos_ids [n, T] i32, logit_pos_values [n, T] f32  the T tokens whose unembedding rows
//                            have the largest dot product with its decoder row (the logits it
//                            promotes), decreasing; logit_neg_ids, logit_neg_values the T
//                            smallest (those it suppresses), increasing; only with an
//                            unembedding (decoder_logits)
// Attributes: format ("saetrain-features 1"), sae, sae_id, arch, d_model, n_latents, rows,
// ranks, data (the shards' directory or glob, absolute), dataset, top, context, contexts
// ("token_ids": the windows are there; else why not), logits (the unembedding file the logit
// tables come from, or "none: " and why there are none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "saetrain/features.h"  // defines: FeatureStats

namespace saetrain {

struct FeaturesFile {
    std::string sae, sae_id, arch, data, dataset;
    int64_t d_model = 0, ranks = 1, context = 0;
    std::string contexts;  // "token_ids", or why there are no windows
    const FeatureStats* stats = nullptr;
    std::vector<int64_t> top_rows;
    std::vector<float> top_acts;
    std::vector<int32_t> context_tokens;  // empty: none
    std::vector<float> top_window_acts;   // [n, top, 2 context + 1]
    // The uniform sample of each latent's firings, in decreasing activation: as the top rows.
    std::vector<int64_t> sample_rows;
    std::vector<float> sample_acts, sample_window_acts;
    std::vector<int32_t> sample_context_tokens;
    int64_t neighbours = 0;
    std::vector<int32_t> neighbour_idx;
    std::vector<float> neighbour_cos;
    int64_t logits = 0;  // T; 0: no logit tables
    std::string logits_source;
    std::vector<int32_t> logit_pos_ids, logit_neg_ids;
    std::vector<float> logit_pos_values, logit_neg_values;
};

// An unembedding matrix as tools/extract_activations.py --unembedding writes it: the file's
// dataset W_U [vocab, d] (a token's row: its direction in the residual stream).
struct Unembedding {
    std::vector<float> w;  // [vocab, d]
    int64_t vocab = 0;
};
// Reads `path`'s W_U, which must be [vocab, d] with vocab >= 1 and every value finite; throws
// Error naming the file and what is wrong.
Unembedding unembedding_read(const std::string& path, int64_t d);

// Writes `f` to `path` atomically (readers see the old file or the whole new one). Throws Error
// naming the file when it cannot be written.
void features_write_h5(const std::string& path, const FeaturesFile& f);

}  // namespace saetrain
