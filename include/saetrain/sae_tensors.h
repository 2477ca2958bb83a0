// sae_tensors.h — an SAE's tensors as the core library hands them out and takes them back.
//
// SaeWeights is the whole SAE in the layout of its files, tensor by tensor (checkpoint.h writes
// and reads it, export.h converts it, an Architecture reads its own tensors in it by name).
// CheckpointPart is one trainer's share of a checkpoint in the trainer's own flat layout
// (SaeTrainer::restore installs it; trainer_io.h reads it from the files). The activation-scale
// fold (data.normalize) is defined here once, for whole weights and for the chunks a latent-sharded
// writer gathers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace saetrain {

// A tensor kept by name: an architecture's state outside the optimizer (BatchTopK's inference
// threshold).
using NamedTensor = std::pair<std::string, std::vector<float>>;

// One tensor of an SAE in the layout of its files.
struct WeightTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
    bool operator==(const WeightTensor& o) const {
        return name == o.name && shape == o.shape && data == o.data;
    }
};

// A whole SAE as its files hold it: the tensors its architecture declares (Architecture::
// tensors; an SAE's W_enc [d_model, n_latents], W_dec [n_latents, d_model], b_enc [n_latents],
// b_dec [d_model], then its own, such as JumpReLU's log_threshold [n]), then the state its pass
// keeps (BatchTopK's threshold [1]) and, when the SAE was trained on scaled activations,
// activation_scale [1]; by name, in file order.
struct SaeWeights {
    int64_t d_model = 0, n_latents = 0;
    std::vector<WeightTensor> tensors;

    const WeightTensor* find(const std::string& name) const;
    WeightTensor* find(const std::string& name);
    bool has(const std::string& name) const { return find(name) != nullptr; }
    // The values of the tensor called `name`; throws Error naming it when there is none.
    const std::vector<float>& at(const std::string& name) const;
    std::vector<float>& at(const std::string& name);
    // Sets the tensor called `name` (appended when there is none) and returns its values.
    std::vector<float>& set(const std::string& name, std::vector<int64_t> shape,
                            std::vector<float> data);
    // Removes the tensor called `name`; false when there was none.
    bool erase(const std::string& name);
    bool operator==(const SaeWeights& o) const {
        return d_model == o.d_model && n_latents == o.n_latents && tensors == o.tensors;
    }
    // An SAE's four tensors at zero.
    static SaeWeights zeros(int64_t d_model, int64_t n_latents);
};

// One trainer's part of a checkpoint, ready for SaeTrainer::restore: its latents (all of them
// without latent sharding) in its flat parameter layout (arch.h's ParamLayout).
struct CheckpointPart {
    std::vector<float> params, opt_m, opt_v;  // this latent shard's flat layout
    std::vector<int64_t> since_fired;         // this latent shard's latents
    std::vector<NamedTensor> buffers;         // the architecture's (BatchTopK's threshold)
    float input_scale = 1.0f;
};

// rows x cols values, row-major, as [cols, rows] (W_enc's latent rows as its file's [d, n], and
// back).
std::vector<float> transposed(const float* v, int64_t rows, int64_t cols);

// --- data.normalize's scale, folded into the weights -------------------------------------------
// An SAE trained with data.normalize saw c * x (c: its `activation_scale`). The same function of
// the raw activations has every tensor that reads the centred input (W_enc, Switch's W_router)
// times c and every tensor in the input's units (W_dec, b_dec) divided by c; the rest (b_enc,
// thresholds, gates, b_router) stay as they are, because the pre-activations do not change.
// Each declared tensor says which (ParamSegment::fold, arch.h: fold_activation_scale).
enum class ScaleFold { keep, times_c, over_c };
// v[0, count) folded by c as `fold` says: each value once, v * c or v / c.
void fold_values(ScaleFold fold, float c, float* v, int64_t count);

}  // namespace saetrain
