// checkpoint.h — an SAE's weights on disk (sae/<id>/final.h5 and checkpoints).
//
// Layout of the brief (SaeWeights, sae_tensors.h): datasets W_enc [d_model, n] (a cross-layer
// transcoder's compact [n, d_model / layers]), W_dec [n, d_model], b_enc [n], b_dec [d_model],
// and the architecture's own (SaeWeights::extra); attributes arch, id,
// k, d_model, n_latents, step, tokens, config (YAML), extra (the extra datasets' names, comma
// separated; absent when there are none).
// Files are written atomically: a temp file in the same directory, fsync, rename, fsync of the
// directory, so a reader sees either the old file or the whole new one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/sae_tensors.h"  // defines: SaeWeights, fold_activation_scale

namespace saetrain {

struct SaeMeta {
    std::string arch, id, config_yaml;
    int64_t k = 0, step = 0, tokens = 0;
};

void sae_write_h5(const std::string& path, const SaeWeights& w, const SaeMeta& meta);
SaeWeights sae_read_h5(const std::string& path, SaeMeta* meta = nullptr);
// Steps of the checkpoint-<step>.h5 files in dir, ascending.
std::vector<int64_t> checkpoint_steps(const std::string& dir);

// True when `path` is a readable HDF5 file holding W_dec (an SAE, not an activation shard).
bool sae_is_checkpoint(const std::string& path);

}  // namespace saetrain
