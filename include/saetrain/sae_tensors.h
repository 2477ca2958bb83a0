// sae_tensors.h — an SAE's tensors as the core library hands them out and takes them back.
//
// SaeWeights is the whole SAE in the layout of its files (checkpoint.h writes and reads it,
// export.h converts it, an Architecture names its own fields in it). CheckpointPart is one
// trainer's share of a checkpoint in the trainer's own flat layout (SaeTrainer::restore installs
// it; trainer_io.h reads it from the files). The activation-scale fold (data.normalize) is
// defined here once, for whole weights and for the chunks a latent-sharded writer gathers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace saetrain {

// A tensor kept by name: an architecture's state outside the optimizer (BatchTopK's inference
// threshold), or one of an SAE's extra parameters.
using NamedTensor = std::pair<std::string, std::vector<float>>;

struct SaeWeights {
    int64_t d_model = 0, n_latents = 0;
    std::vector<float> w_enc;  // [d_model, n_latents]
    std::vector<float> w_dec;  // [n_latents, d_model]
    std::vector<float> b_enc;  // [n_latents]
    std::vector<float> b_dec;  // [d_model]
    // The architecture's own tensors, 1-D, by name (JumpReLU's log_threshold [n], Gated's r_mag
    // and b_mag [n], BatchTopK's threshold [1]); stored as datasets of those names, listed in
    // the file's `extra` attribute.
    std::vector<NamedTensor> extra;
};

// One trainer's part of a checkpoint, ready for SaeTrainer::restore: its latents (all of them
// without latent sharding) in its flat parameter layout (arch.h's ParamLayout).
struct CheckpointPart {
    std::vector<float> params, opt_m, opt_v;  // this latent shard's flat layout
    std::vector<int64_t> since_fired;         // this latent shard's latents
    std::vector<NamedTensor> buffers;         // the architecture's (BatchTopK's threshold)
    float input_scale = 1.0f;
};

// --- data.normalize's scale, folded into the weights -------------------------------------------
// An SAE trained with data.normalize saw c * x (c: its `activation_scale`). The same function of
// the raw activations has every tensor that reads the centred input (W_enc, Switch's W_router)
// times c and every tensor in the input's units (W_dec, b_dec) divided by c; the rest (b_enc,
// thresholds, gates, b_router) stay as they are, because the pre-activations do not change.
enum class ScaleFold { keep, times_c, over_c };
ScaleFold activation_scale_fold(const std::string& tensor);
// v[0, count) folded by c as `fold` says: each value once, v * c or v / c.
void fold_values(ScaleFold fold, float c, float* v, int64_t count);

// `w` as the same function of the raw activations (the rule above, for every tensor), its
// activation_scale removed; `w` as it is when it has none.
SaeWeights fold_activation_scale(const SaeWeights& w);

}  // namespace saetrain
