// checkpoint.h — an SAE's weights on disk (sae/<id>/final.h5 and checkpoints).
//
// Layout of the brief: datasets W_enc [d_model, n], W_dec [n, d_model], b_enc [n],
// b_dec [d_model], and the architecture's own (SaeWeights::extra); attributes arch, id, k,
// d_model, n_latents, step, tokens, config (YAML), extra (the extra datasets' names, comma
// separated; absent when there are none).
// Files are written atomically: a temp file in the same directory, fsync, rename, fsync of the
// directory, so a reader sees either the old file or the whole new one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace saetrain {

struct SaeWeights {
    int64_t d_model = 0, n_latents = 0;
    std::vector<float> w_enc;  // [d_model, n_latents]
    std::vector<float> w_dec;  // [n_latents, d_model]
    std::vector<float> b_enc;  // [n_latents]
    std::vector<float> b_dec;  // [d_model]
    // The architecture's own tensors, 1-D, by name (JumpReLU's log_threshold [n], Gated's r_mag
    // and b_mag [n], BatchTopK's threshold [1]); stored as datasets of those names, listed in
    // the file's `extra` attribute.
    std::vector<std::pair<std::string, std::vector<float>>> extra;
};

struct SaeMeta {
    std::string arch, id, config_yaml;
    int64_t k = 0, step = 0, tokens = 0;
};

// An SAE trained with data.normalize (an `activation_scale` c among its extra tensors: it saw
// c * x) as the same function of the raw activations: W_enc * c, W_dec / c, b_dec / c (the
// pre-activations, and with them every threshold and gate, are unchanged). Returns `w` as it
// is when there is no scale.
SaeWeights fold_activation_scale(const SaeWeights& w);

void sae_write_h5(const std::string& path, const SaeWeights& w, const SaeMeta& meta);
SaeWeights sae_read_h5(const std::string& path, SaeMeta* meta = nullptr);
// Steps of the checkpoint-<step>.h5 files in dir, ascending.
std::vector<int64_t> checkpoint_steps(const std::string& dir);

// True when `path` is a readable HDF5 file holding W_dec (an SAE, not an activation shard).
bool sae_is_checkpoint(const std::string& path);

}  // namespace saetrain
