// sae_tensors.cpp — the activation-scale fold (see sae_tensors.h).
#include "saetrain/sae_tensors.h"

#include <algorithm>

#include "saetrain/error.h"

namespace saetrain {

ScaleFold activation_scale_fold(const std::string& tensor) {
    // Switch's router reads the centred input as W_enc does.
    if (tensor == "W_enc" || tensor == "W_router") return ScaleFold::times_c;
    if (tensor == "W_dec" || tensor == "b_dec") return ScaleFold::over_c;
    return ScaleFold::keep;
}

void fold_values(ScaleFold fold, float c, float* v, int64_t count) {
    if (fold == ScaleFold::times_c)
        for (int64_t i = 0; i < count; ++i) v[i] *= c;
    else if (fold == ScaleFold::over_c)
        for (int64_t i = 0; i < count; ++i) v[i] /= c;
}

SaeWeights fold_activation_scale(const SaeWeights& w) {
    SaeWeights out = w;
    auto it = std::find_if(out.extra.begin(), out.extra.end(),
                           [](const auto& e) { return e.first == "activation_scale"; });
    if (it == out.extra.end()) return out;
    SAE_ENFORCE(it->second.size() == 1 && it->second[0] > 0,
                "the SAE's activation_scale must be one positive value");
    const float c = it->second[0];
    out.extra.erase(it);
    auto fold = [c](const std::string& name, std::vector<float>& v) {
        fold_values(activation_scale_fold(name), c, v.data(), static_cast<int64_t>(v.size()));
    };
    fold("W_enc", out.w_enc);
    fold("W_dec", out.w_dec);
    fold("b_enc", out.b_enc);
    fold("b_dec", out.b_dec);
    for (auto& [name, v] : out.extra) fold(name, v);
    return out;
}

}  // namespace saetrain
