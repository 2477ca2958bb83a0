#include "saetrain/export.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "atomic_file.h"
#include "saetrain/arch.h"
#include "saetrain/build_config.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/safetensors.h"

namespace fs = std::filesystem;

namespace saetrain {
namespace {

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
    atomic_write(path, [&](const std::string& tmp) {
        std::ofstream out(tmp);
        out << j.dump(2) << "\n";
        out.flush();
        SAE_ENFORCE(out.good(), "cannot write {}", tmp);
    });
}

// The SAE's own training settings from the run config stored in its file (the sweep point
// whose id matches), or the defaults when the file predates that or does not say.
SaeConfig sae_config_of(const SaeMeta& meta, int64_t d_model) {
    try {
        const Config cfg = config_parse(meta.config_yaml, {}, "the SAE file's config");
        const std::vector<std::string> ids = sweep_ids(cfg, d_model);
        for (size_t i = 0; i < ids.size() && i < cfg.sweep.size(); ++i)
            if (ids[i] == meta.id) return cfg.sweep[i];
        return cfg.sae;
    } catch (const Error&) {
        return SaeConfig{};
    }
}

std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
    std::vector<float> t(a.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
    return t;
}

}  // namespace

ExportFormat export_format_parse(const std::string& s) {
    if (s == "saelens") return ExportFormat::saelens;
    if (s == "sparsify") return ExportFormat::sparsify;
    throw Error(fmt::format("unknown export format '{}': use saelens or sparsify", s));
}

std::vector<std::string> sae_export(const SaeWeights& w_in, const SaeMeta& meta,
                                    ExportFormat format, const std::string& dir,
                                    const ExportSource& source) {
    const SaeWeights w = fold_activation_scale(w_in);  // exports take raw activations
    const int64_t d = w.d_model, n = w.n_latents;
    const Architecture* arch = arch_find(meta.arch);
    SAE_ENFORCE(arch != nullptr, "cannot export '{}': unknown architecture '{}' (known: {})",
                meta.id, meta.arch, fmt::join(arch_names(), ", "));
    const SaeConfig sc = sae_config_of(meta, d);
    const ArchExport ex = arch->export_fields(w, sc);
    fs::create_directories(dir);
    const std::map<std::string, std::string> st_meta = {
        {"format", "pt"}, {"saetrain_version", SAETRAIN_VERSION}, {"saetrain_id", meta.id}};
    std::vector<std::string> written;
    if (format == ExportFormat::saelens) {
        SAE_ENFORCE(ex.saelens_refusal.empty(), "cannot export '{}' with --format saelens: {}",
                    meta.id, ex.saelens_refusal);
        const std::string weights = (fs::path(dir) / "sae_weights.safetensors").string();
        std::vector<TensorView> tensors;
        for (const ExportTensor& t : ex.saelens_tensors)
            tensors.push_back({t.name, t.shape, t.data.data()});
        safetensors_write(weights, tensors, st_meta);
        nlohmann::ordered_json cfg;
        cfg["architecture"] = ex.saelens_architecture;
        cfg["d_in"] = d;
        cfg["d_sae"] = n;
        cfg["dtype"] = "float32";
        cfg["device"] = "cpu";
        cfg["apply_b_dec_to_input"] = true;
        cfg["normalize_activations"] = "none";
        cfg["reshape_activations"] = "none";
        for (const auto& [key, value] : ex.saelens_cfg) cfg[key] = nlohmann::json::parse(value);
        nlohmann::ordered_json md;
        // The layout this file follows (SAELens reads older layouts through a converter).
        md["sae_lens_version"] = "6.0.0";
        md["sae_lens_training_version"] = nullptr;
        md["model_name"] = source.model_name;
        md["hook_name"] = source.hook_name;
        md["hook_head_index"] = nullptr;
        md["dataset_path"] = source.dataset_path;
        md["saetrain_version"] = SAETRAIN_VERSION;
        md["saetrain_id"] = meta.id;
        md["saetrain_step"] = meta.step;
        md["saetrain_tokens"] = meta.tokens;
        cfg["metadata"] = md;
        const std::string cfg_path = (fs::path(dir) / "cfg.json").string();
        write_json(cfg_path, cfg);
        written = {cfg_path, weights};
    } else {
        SAE_ENFORCE(!ex.sparsify_activation.empty(), "{}: export '{}' with --format saelens",
                    ex.sparsify_refusal, meta.id);
        const std::vector<float> enc = transpose(w.w_enc, d, n);  // [d, n] -> [n, d]
        const std::string weights = (fs::path(dir) / "sae.safetensors").string();
        std::vector<TensorView> tensors = {{"encoder.weight", {n, d}, enc.data()},
                                           {"encoder.bias", {n}, w.b_enc.data()},
                                           {"W_dec", {n, d}, w.w_dec.data()},
                                           {"b_dec", {d}, w.b_dec.data()}};
        const bool skip = !ex.sparsify_w_skip.empty();
        if (skip) tensors.push_back({"W_skip", {d, d}, ex.sparsify_w_skip.data()});
        safetensors_write(weights, tensors, st_meta);
        nlohmann::ordered_json cfg;
        cfg["activation"] = ex.sparsify_activation;
        cfg["expansion_factor"] = n % d == 0 ? n / d : 0;
        cfg["normalize_decoder"] = sc.normalize_decoder;
        cfg["num_latents"] = n;
        cfg["k"] = ex.sparsify_k;
        cfg["multi_topk"] = false;
        cfg["skip_connection"] = skip;
        cfg["transcode"] = ex.sparsify_transcode;
        cfg["d_in"] = d;
        const std::string cfg_path = (fs::path(dir) / "cfg.json").string();
        write_json(cfg_path, cfg);
        written = {cfg_path, weights};
    }
    return written;
}

}  // namespace saetrain
