#include "saetrain/export.h"

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
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
    atomic_write_text(path, j.dump(2) + "\n");
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

// The keys every circuit-tracer config.yaml starts with, in an open map: its kind, the model,
// the scan name (the model's with "-saetrain-<what>", or "saetrain") and the hooks.
void circuit_tracer_config(YAML::Emitter& y, const char* kind, const char* what,
                           const ExportSource& source) {
    y << YAML::BeginMap;
    y << YAML::Key << "model_kind" << YAML::Value << kind;
    y << YAML::Key << "model_name" << YAML::Value << source.model_name;
    y << YAML::Key << "scan" << YAML::Value
      << (source.model_name.empty() ? std::string("saetrain")
                                    : source.model_name + "-saetrain-" + what);
    y << YAML::Key << "feature_input_hook" << YAML::Value << source.input_hook;
    y << YAML::Key << "feature_output_hook" << YAML::Value << source.output_hook;
}

// circuit-tracer's single-layer transcoder (circuit_tracer.transcoder.single_layer_transcoder,
// load_relu_transcoder): layer_<L>.safetensors with W_enc [n, d] (pre = x W_enc^T + b_enc),
// b_enc [n], W_dec [n, d], b_dec [d], activation_function.threshold [n] (a JumpReLU) and
// W_skip [d, d] (x W_skip^T) when it has one; and config.yaml, its transcoder-set config, listing
// every layer_<L>.safetensors in the directory (one export per layer fills it).
std::vector<std::string> circuit_tracer_export(const SaeWeights& w, const SaeMeta& meta,
                                               const ArchExport& ex, const std::string& dir,
                                               const ExportSource& source) {
    SAE_ENFORCE(ex.transcode,
                "cannot export '{}' with --format circuit_tracer: circuit-tracer loads "
                "transcoders, and this is an SAE of its input; export it with --format saelens",
                meta.id);
    SAE_ENFORCE(!ex.circuit_tracer_threshold.empty(),
                "cannot export '{}' with --format circuit_tracer: {}", meta.id,
                ex.circuit_tracer_refusal);
    SAE_ENFORCE(source.layer >= 0,
                "--format circuit_tracer needs the transcoder's layer: pass --layer N for '{}'",
                meta.id);
    const int64_t d = w.d_model, n = w.n_latents;
    const std::vector<float> enc = transposed(w.at("W_enc").data(), d, n);  // [d, n] -> [n, d]
    const std::string weights =
        (fs::path(dir) / fmt::format("layer_{}.safetensors", source.layer)).string();
    std::vector<TensorView> tensors = {
        {"W_enc", {n, d}, enc.data()},
        {"b_enc", {n}, w.at("b_enc").data()},
        {"W_dec", {n, d}, w.at("W_dec").data()},
        {"b_dec", {d}, w.at("b_dec").data()},
        {"activation_function.threshold", {n}, ex.circuit_tracer_threshold.data()}};
    if (!ex.w_skip.empty()) tensors.push_back({"W_skip", {d, d}, ex.w_skip.data()});
    safetensors_write(weights, tensors,
                      {{"format", "pt"},
                       {"saetrain_version", SAETRAIN_VERSION},
                       {"saetrain_id", meta.id},
                       {"saetrain_layer", std::to_string(source.layer)}});
    // The set: every layer file here, in layer order (circuit-tracer wants layers 0..L-1).
    std::map<int64_t, std::string> layers;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        int64_t layer = -1;
        char tail = 0;
        if (std::sscanf(name.c_str(), "layer_%" SCNd64 ".safetensor%c", &layer, &tail) == 2 &&
            tail == 's' && name == fmt::format("layer_{}.safetensors", layer))
            layers[layer] = fs::absolute(e.path()).lexically_normal().string();
    }
    YAML::Emitter y;
    circuit_tracer_config(y, "transcoder_set", "transcoders", source);
    y << YAML::Key << "transcoders" << YAML::Value << YAML::BeginSeq;
    for (const auto& [layer, path] : layers) y << path;
    y << YAML::EndSeq << YAML::EndMap;
    const std::string cfg_path = (fs::path(dir) / "config.yaml").string();
    atomic_write_text(cfg_path,
                      std::string("# circuit-tracer's transcoder set, written by saetrain's "
                                  "sae-export: one\n# layer_<L>.safetensors per layer "
                                  "(load_transcoder_set needs layers 0..L-1).\n") +
                          y.c_str() + "\n");
    return {weights, cfg_path};
}

// circuit-tracer's cross-layer transcoder (circuit_tracer.transcoder.cross_layer_transcoder,
// load_clt): per layer l, W_enc_l.safetensors with W_enc_l [F, d_l], b_enc_l [F], b_dec_l [d_l]
// and threshold_l [F], and W_dec_l.safetensors with W_dec_l [F, L - l, d_l]; config.yaml names
// the kind and the hooks (model_kind: cross_layer_transcoder).
std::vector<std::string> circuit_tracer_clt_export(
    const SaeMeta& meta, const ArchExport& ex, const std::string& dir, const ExportSource& source,
    const std::map<std::string, std::string>& st_meta) {
    SAE_ENFORCE(source.layer < 0,
                "cannot export '{}' with --layer {}: a cross-layer transcoder spans every layer "
                "(0..{}); leave --layer out",
                meta.id, source.layer, ex.clt_layers.size() - 1);
    const auto L = static_cast<int64_t>(ex.clt_layers.size());
    const int64_t F = ex.clt_features, dl = ex.clt_width;
    std::vector<std::string> written;
    for (int64_t l = 0; l < L; ++l) {
        const ArchExport::CltLayer& c = ex.clt_layers[static_cast<size_t>(l)];
        const std::string enc = (fs::path(dir) / fmt::format("W_enc_{}.safetensors", l)).string();
        safetensors_write(enc,
                          {{fmt::format("W_enc_{}", l), {F, dl}, c.w_enc.data()},
                           {fmt::format("b_enc_{}", l), {F}, c.b_enc.data()},
                           {fmt::format("b_dec_{}", l), {dl}, c.b_dec.data()},
                           {fmt::format("threshold_{}", l), {F}, c.threshold.data()}},
                          st_meta);
        const std::string dec = (fs::path(dir) / fmt::format("W_dec_{}.safetensors", l)).string();
        safetensors_write(dec, {{fmt::format("W_dec_{}", l), {F, L - l, dl}, c.w_dec.data()}},
                          st_meta);
        written.push_back(enc), written.push_back(dec);
    }
    YAML::Emitter y;
    circuit_tracer_config(y, "cross_layer_transcoder", "clt", source);
    y << YAML::EndMap;
    const std::string cfg_path = (fs::path(dir) / "config.yaml").string();
    atomic_write_text(cfg_path,
                      std::string("# circuit-tracer's cross-layer transcoder, written by "
                                  "saetrain's sae-export: load this directory with\n# "
                                  "circuit_tracer.transcoder.cross_layer_transcoder.load_clt("
                                  "DIR, feature_input_hook, feature_output_hook).\n") +
                          y.c_str() + "\n");
    written.push_back(cfg_path);
    return written;
}

}  // namespace

ExportFormat export_format_parse(const std::string& s) {
    if (s == "saelens") return ExportFormat::saelens;
    if (s == "sparsify") return ExportFormat::sparsify;
    if (s == "circuit_tracer") return ExportFormat::circuit_tracer;
    throw Error(
        fmt::format("unknown export format '{}': use saelens, sparsify or circuit_tracer", s));
}

std::vector<std::string> sae_export(const SaeWeights& w_in, const SaeMeta& meta,
                                    ExportFormat format, const std::string& dir,
                                    const ExportSource& source) {
    const int64_t d = w_in.d_model, n = w_in.n_latents;
    const Architecture* arch = arch_find(meta.arch);
    SAE_ENFORCE(arch != nullptr, "cannot export '{}': unknown architecture '{}' (known: {})",
                meta.id, meta.arch, fmt::join(arch_names(), ", "));
    const SaeConfig sc = sae_config_of(meta, d);
    // Exports take raw activations.
    const SaeWeights w = fold_activation_scale(w_in, arch->tensors(sc, n, d));
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
    } else if (format == ExportFormat::sparsify) {
        SAE_ENFORCE(!ex.sparsify_activation.empty() || ex.transcode,
                    "{}: export '{}' with --format saelens", ex.sparsify_refusal, meta.id);
        SAE_ENFORCE(!ex.sparsify_activation.empty(),
                    "cannot export '{}' with --format sparsify: {}", meta.id, ex.sparsify_refusal);
        const std::vector<float> enc = transposed(w.at("W_enc").data(), d, n);  // [d, n] -> [n, d]
        const std::string weights = (fs::path(dir) / "sae.safetensors").string();
        std::vector<TensorView> tensors = {{"encoder.weight", {n, d}, enc.data()},
                                           {"encoder.bias", {n}, w.at("b_enc").data()},
                                           {"W_dec", {n, d}, w.at("W_dec").data()},
                                           {"b_dec", {d}, w.at("b_dec").data()}};
        const bool skip = !ex.w_skip.empty();
        if (skip) tensors.push_back({"W_skip", {d, d}, ex.w_skip.data()});
        safetensors_write(weights, tensors, st_meta);
        nlohmann::ordered_json cfg;
        cfg["activation"] = ex.sparsify_activation;
        cfg["expansion_factor"] = n % d == 0 ? n / d : 0;
        cfg["normalize_decoder"] = sc.normalize_decoder;
        cfg["num_latents"] = n;
        cfg["k"] = ex.sparsify_k;
        cfg["multi_topk"] = false;
        cfg["skip_connection"] = skip;
        cfg["transcode"] = ex.transcode;
        cfg["d_in"] = d;
        const std::string cfg_path = (fs::path(dir) / "cfg.json").string();
        write_json(cfg_path, cfg);
        written = {cfg_path, weights};
    } else {
        written = ex.clt_layers.empty() ? circuit_tracer_export(w, meta, ex, dir, source)
                                        : circuit_tracer_clt_export(meta, ex, dir, source, st_meta);
    }
    return written;
}

}  // namespace saetrain
