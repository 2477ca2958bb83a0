// sae_tensors.cpp — an SAE's tensors by name, and the activation-scale fold (see sae_tensors.h).
#include "saetrain/sae_tensors.h"

#include <algorithm>

#include "saetrain/error.h"

namespace saetrain {

const WeightTensor* SaeWeights::find(const std::string& name) const {
    for (const WeightTensor& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

WeightTensor* SaeWeights::find(const std::string& name) {
    for (WeightTensor& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

const std::vector<float>& SaeWeights::at(const std::string& name) const {
    const WeightTensor* t = find(name);
    if (!t) throw Error(fmt::format("the SAE has no tensor '{}'", name));
    return t->data;
}

std::vector<float>& SaeWeights::at(const std::string& name) {
    WeightTensor* t = find(name);
    if (!t) throw Error(fmt::format("the SAE has no tensor '{}'", name));
    return t->data;
}

std::vector<float>& SaeWeights::set(const std::string& name, std::vector<int64_t> shape,
                                    std::vector<float> data) {
    WeightTensor* t = find(name);
    if (!t) t = &tensors.emplace_back(WeightTensor{name, {}, {}});
    t->shape = std::move(shape), t->data = std::move(data);
    return t->data;
}

bool SaeWeights::erase(const std::string& name) {
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [&](const WeightTensor& t) { return t.name == name; });
    if (it == tensors.end()) return false;
    tensors.erase(it);
    return true;
}

SaeWeights SaeWeights::zeros(int64_t d, int64_t n) {
    SaeWeights w;
    w.d_model = d, w.n_latents = n;
    const auto N = static_cast<size_t>(n), D = static_cast<size_t>(d);
    w.set("W_enc", {d, n}, std::vector<float>(D * N));
    w.set("W_dec", {n, d}, std::vector<float>(N * D));
    w.set("b_enc", {n}, std::vector<float>(N));
    w.set("b_dec", {d}, std::vector<float>(D));
    return w;
}

std::vector<float> transposed(const float* v, int64_t rows, int64_t cols) {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
    return out;
}

void fold_values(ScaleFold fold, float c, float* v, int64_t count) {
    if (fold == ScaleFold::times_c)
        for (int64_t i = 0; i < count; ++i) v[i] *= c;
    else if (fold == ScaleFold::over_c)
        for (int64_t i = 0; i < count; ++i) v[i] /= c;
}

}  // namespace saetrain
