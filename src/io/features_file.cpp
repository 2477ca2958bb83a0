#include "saetrain/features_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "atomic_file.h"
#include "h5.h"
#include "saetrain/error.h"

namespace saetrain {

namespace {

void write_typed(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                 const void* data, const std::vector<hsize_t>& dims) {
    h5::Space s(
        SAE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
    h5::Dataset d(SAE_H5_CHECK(
        H5Dcreate2(loc, name.c_str(), file_type, s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    SAE_ENFORCE(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
                "file {}: writing dataset '{}' failed ({}); is the disk full?", h5::file_name(loc),
                name, h5::last_error());
}

void write_file(const std::string& path, const FeaturesFile& f) {
    const FeatureStats& st = *f.stats;
    const auto n = static_cast<hsize_t>(st.n()), top = static_cast<hsize_t>(st.top());
    h5::File file = h5::create_file(path);
    const hid_t h = file.get();
    std::vector<double> freq(n);
    std::vector<float> mean(n);
    for (hsize_t i = 0; i < n; ++i) {
        const auto c = static_cast<double>(st.fire_count()[i]);
        freq[i] = st.rows() > 0 ? c / static_cast<double>(st.rows()) : 0.0;
        mean[i] = c > 0 ? static_cast<float>(st.sum_act()[i] / c) : 0.0f;
    }
    write_typed(h, "frequency", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, freq.data(), {n});
    write_typed(h, "fire_count", H5T_STD_I64LE, H5T_NATIVE_INT64, st.fire_count().data(), {n});
    h5::write_f32(h, "mean_act", mean.data(), {n});
    const std::vector<float> mx = st.max_act();
    h5::write_f32(h, "max_act", mx.data(), {n});
    const std::vector<float> edges = feature_hist_edges();
    h5::write_f32(h, "hist_edges", edges.data(), {edges.size()});
    write_typed(h, "hist", H5T_STD_I64LE, H5T_NATIVE_INT64, st.hist().data(),
                {n, static_cast<hsize_t>(kHistBins)});
    write_typed(h, "top_rows", H5T_STD_I64LE, H5T_NATIVE_INT64, f.top_rows.data(), {n, top});
    h5::write_f32(h, "top_acts", f.top_acts.data(), {n, top});
    if (!f.context_tokens.empty())
        write_typed(h, "top_context_tokens", H5T_STD_I32LE, H5T_NATIVE_INT32,
                    f.context_tokens.data(), {n, top, static_cast<hsize_t>(2 * f.context + 1)});
    if (!f.top_window_acts.empty())
        h5::write_f32(h, "top_context_acts", f.top_window_acts.data(),
                      {n, top, static_cast<hsize_t>(2 * f.context + 1)});
    if (st.samples() > 0) {
        const auto m = static_cast<hsize_t>(st.samples());
        const auto w = static_cast<hsize_t>(2 * f.context + 1);
        write_typed(h, "sample_rows", H5T_STD_I64LE, H5T_NATIVE_INT64, f.sample_rows.data(),
                    {n, m});
        h5::write_f32(h, "sample_acts", f.sample_acts.data(), {n, m});
        h5::write_f32(h, "sample_context_acts", f.sample_window_acts.data(), {n, m, w});
        if (!f.sample_context_tokens.empty())
            write_typed(h, "sample_context_tokens", H5T_STD_I32LE, H5T_NATIVE_INT32,
                        f.sample_context_tokens.data(), {n, m, w});
    }
    if (f.neighbours > 0) {
        const auto m = static_cast<hsize_t>(f.neighbours);
        write_typed(h, "neighbours", H5T_STD_I32LE, H5T_NATIVE_INT32, f.neighbour_idx.data(),
                    {n, m});
        h5::write_f32(h, "neighbour_cosine", f.neighbour_cos.data(), {n, m});
    }
    if (f.logits > 0) {
        const auto m = static_cast<hsize_t>(f.logits);
        write_typed(h, "logit_pos_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, f.logit_pos_ids.data(),
                    {n, m});
        h5::write_f32(h, "logit_pos_values", f.logit_pos_values.data(), {n, m});
        write_typed(h, "logit_neg_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, f.logit_neg_ids.data(),
                    {n, m});
        h5::write_f32(h, "logit_neg_values", f.logit_neg_values.data(), {n, m});
    }
    h5::write_attr_string(h, "logits", f.logits_source);
    h5::write_attr_string(h, "format", "saetrain-features 1");
    h5::write_attr_string(h, "sae", f.sae);
    h5::write_attr_string(h, "sae_id", f.sae_id);
    h5::write_attr_string(h, "arch", f.arch);
    h5::write_attr_string(h, "data", f.data);
    h5::write_attr_string(h, "dataset", f.dataset);
    h5::write_attr_string(h, "contexts", f.contexts);
    h5::write_attr_int64(h, "d_model", f.d_model);
    h5::write_attr_int64(h, "n_latents", st.n());
    h5::write_attr_int64(h, "rows", st.rows());
    h5::write_attr_int64(h, "ranks", f.ranks);
    h5::write_attr_int64(h, "top", st.top());
    h5::write_attr_int64(h, "samples", st.samples());
    h5::write_attr_int64(h, "context", f.context);
    SAE_ENFORCE(file.close() >= 0, "file {}: closing failed ({}); is the disk full?", path,
                h5::last_error());
}

}  // namespace

Unembedding unembedding_read(const std::string& path, int64_t d) {
    auto guard = h5::lock();
    h5::File f = h5::open_file(path);
    SAE_ENFORCE(h5::link_exists(f.get(), "W_U", path),
                "{}: no dataset 'W_U' (an unembedding [vocab, d_model], as "
                "tools/extract_activations.py --unembedding writes it)",
                path);
    std::vector<hsize_t> dims;
    Unembedding u;
    dims = h5::dataset_dims(h5::open_dataset(f.get(), "W_U", path).get());
    SAE_ENFORCE(dims.size() == 2 && dims[0] >= 1 && dims[1] == static_cast<hsize_t>(d),
                "{}: W_U is [{}]; expected [vocab, {}] (the SAE's d_model)", path,
                fmt::join(dims, ", "), d);
    constexpr hsize_t kMaxVocab = hsize_t{1} << 24;
    SAE_ENFORCE(dims[0] <= kMaxVocab,
                "{}: W_U claims {} tokens, more than the {} a vocabulary "
                "may hold here",
                path, dims[0], kMaxVocab);
    u.w = h5::read_f32(f.get(), "W_U", path, &dims);
    u.vocab = static_cast<int64_t>(dims[0]);
    for (size_t i = 0; i < u.w.size(); ++i)
        SAE_ENFORCE(std::isfinite(u.w[i]), "{}: W_U[{}, {}] is {}, not a finite number", path,
                    i / static_cast<size_t>(d), i % static_cast<size_t>(d), u.w[i]);
    return u;
}

void features_write_h5(const std::string& path, const FeaturesFile& f) {
    SAE_ENFORCE(f.stats != nullptr, "features_write_h5: no statistics");
    atomic_write(path, [&](const std::string& tmp) { write_file(tmp, f); });
}

}  // namespace saetrain
