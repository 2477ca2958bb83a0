// tensors.cpp — the tensor declarations architectures build on, their layout in the trainer's
// flat buffer, and the activation-scale fold they direct (see arch.h).
#include <set>

#include "saetrain/arch.h"
#include "saetrain/error.h"

namespace saetrain {

std::vector<int64_t> ParamSegment::file_shape() const {
    if (!dims.empty()) return dims;
    if (transposed) return {cols, rows};
    if (cols == 1) return {rows};
    if (rows == 1) return {cols};
    return {rows, cols};
}

std::vector<ParamSegment> sae_tensors(int64_t n, int64_t d) {
    ParamSegment w_enc{"W_enc", n, d, true, true};
    w_enc.transposed = true, w_enc.fold = ScaleFold::times_c;
    ParamSegment w_dec{"W_dec", n, d, true, true};
    w_dec.unit_rows = true, w_dec.fold = ScaleFold::over_c;
    ParamSegment b_enc = latent_vector("b_enc", n);
    ParamSegment b_dec{"b_dec", 1, d, false, false};
    b_dec.fold = ScaleFold::over_c;
    return {w_enc, w_dec, b_enc, b_dec};
}

ParamSegment latent_vector(const std::string& name, int64_t n) {
    return ParamSegment{name, n, 1, true, false};
}

ParamSegment whole_tensor(const std::string& name, int64_t rows, int64_t cols, bool decay) {
    ParamSegment s{name, rows, cols, false, decay};
    s.dims = {rows * cols};
    return s;
}

ParamLayout::ParamLayout(std::vector<ParamSegment> tensors) : segs_(std::move(tensors)) {
    std::set<std::string> names;
    for (ParamSegment& s : segs_) {
        SAE_ENFORCE(!s.name.empty() && names.insert(s.name).second,
                    "an architecture declares the parameter '{}' twice or without a name", s.name);
        SAE_ENFORCE(s.rows > 0 && s.cols > 0,
                    "parameter '{}' is declared [{}, {}]; both must be > 0", s.name, s.rows,
                    s.cols);
        int64_t file = 1;
        for (int64_t x : s.file_shape()) file *= x;
        SAE_ENFORCE(file == s.size(),
                    "parameter '{}' is declared [{}, {}] but its file shape holds {} values",
                    s.name, s.rows, s.cols, file);
        SAE_ENFORCE(!s.transposed || s.dims.empty(),
                    "parameter '{}' is declared transposed and with a file shape; give one",
                    s.name);
        s.offset = total_;
        total_ += s.size();
    }
}

const ParamSegment* ParamLayout::find(const std::string& name) const {
    for (const ParamSegment& s : segs_)
        if (s.name == name) return &s;
    return nullptr;
}

const ParamSegment& ParamLayout::segment(const std::string& name) const {
    const ParamSegment* s = find(name);
    if (!s) throw Error(fmt::format("the SAE has no parameter '{}'", name));
    return *s;
}

SaeWeights fold_activation_scale(const SaeWeights& w, const std::vector<ParamSegment>& declared) {
    SaeWeights out = w;
    const WeightTensor* scale = w.find("activation_scale");
    if (!scale) return out;
    SAE_ENFORCE(scale->data.size() == 1 && scale->data[0] > 0,
                "the SAE's activation_scale must be one positive value");
    const float c = scale->data[0];
    out.erase("activation_scale");
    for (const ParamSegment& s : declared)
        if (WeightTensor* t = out.find(s.name))
            fold_values(s.fold, c, t->data.data(), static_cast<int64_t>(t->data.size()));
    return out;
}

}  // namespace saetrain
