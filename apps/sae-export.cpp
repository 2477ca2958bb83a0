// sae-export — writes trained SAEs for SAELens or sparsify, transcoders for circuit-tracer.
//
//   sae-export runs/x/sae/topk-x8-k32/final.h5 --format saelens --out exports/topk-x8-k32
//   sae-export runs/x/sae/topk-x8-k32 --format sparsify --out exports/sparsify/topk-x8-k32
//   sae-export runs/sweep/sae/* --format saelens --out exports/sweep   # one dir per SAE
//   sae-export runs/tc/sae/transcoder-x16-batchtopk-k32 --format circuit_tracer --layer 3
//       --out exports/tc   # layer_3.safetensors + config.yaml (the set of every layer there)
// SAE is an SAE file (final.h5 or checkpoint-<step>.h5) or an SAE directory (its final.h5).
// Several SAEs (a sweep's sae/*) go each into its own directory under --out, named after its
// SAE directory (sae/<id>/ -> OUT/<id>; a checkpoint-<step>.h5 -> OUT/<id>-checkpoint-<step>);
// every input is checked, and two that would share a directory refused, before anything is
// written. The model and hook names come from the training data's shard attributes when the
// shards are still at the path the run used; --model-name / --hook-name set them (for all).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "app_cli.h"              // defines: cli_parse (--version, usage errors)
#include "saetrain/checkpoint.h"  // defines: sae_read_h5, sae_is_checkpoint
#include "saetrain/config.h"      // defines: config_parse (the run's data.path)
#include "saetrain/error.h"
#include "saetrain/export.h"  // defines: sae_export, export_format_parse
#include "saetrain/shards.h"  // defines: dataset_open (model and hook attributes)

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct Input {
    std::string given;  // as on the command line
    std::string path;   // the SAE file: given, or given/final.h5 for a directory
};

// The SAE file a command-line input names, checked before anything is written.
Input resolve_input(const std::string& given) {
    Input in{given, given};
    if (fs::is_directory(given)) in.path = (fs::path(given) / "final.h5").string();
    SAE_ENFORCE(fs::is_regular_file(in.path), "{}: no such SAE file", in.path);
    if (!sae_is_checkpoint(in.path)) {
        sae_read_h5(in.path);  // says why: not HDF5, truncated, a dataset missing or damaged
        throw Error(
            fmt::format("{}: not an SAE file (no W_dec); give final.h5 or a "
                        "checkpoint-<step>.h5 from a run's sae/<id>/ directory",
                        in.path));
    }
    return in;
}

// Throws naming the file and tensor when the weights hold NaN or Inf: an SAE that diverged or
// was damaged would load into SAELens or sparsify and give NaN features without a word.
void require_finite(const SaeWeights& w, const std::string& path) {
    for (const WeightTensor& t : w.tensors) {
        const std::string& name = t.name;
        const auto bad =
            std::count_if(t.data.begin(), t.data.end(), [](float x) { return !std::isfinite(x); });
        SAE_ENFORCE(bad == 0,
                    "{}: {} holds {} non-finite value(s) (NaN/Inf); the SAE diverged or the file "
                    "is damaged: export an earlier checkpoint (sae-inspect shows each one)",
                    path, name, bad);
    }
}

// With several inputs, each SAE's directory under --out: its SAE directory's name (a run's
// sae/<id>/), "-checkpoint-<step>" added for a checkpoint file; another file's name without .h5.
std::string export_name(const Input& in) {
    const fs::path p = fs::absolute(in.path).lexically_normal();
    const std::string file = p.filename().string(), dir = p.parent_path().filename().string();
    if (file == "final.h5") return dir;
    if (file.rfind("checkpoint-", 0) == 0) return dir + "-" + p.stem().string();
    return p.stem().string();
}

// Writes one SAE into `out`; prints what it wrote, and a note when the model or hook is unknown.
void export_one(const Input& in, ExportFormat format, const std::string& out,
                const std::string& model_name, const std::string& hook_name,
                const ExportSource& given) {
    SaeMeta meta;
    const SaeWeights w = sae_read_h5(in.path, &meta);
    require_finite(w, in.path);
    ExportSource src = given;  // the layer and circuit-tracer's hooks
    try {                      // the training data's description, when it is still there
        const Config cfg = config_parse(meta.config_yaml, {}, in.path);
        src.dataset_path = cfg.data.path.front();
        const DatasetInfo data = dataset_open(
            cfg.data.path.front(), input_dataset_names(cfg).front(), s3_settings_from(cfg.data));
        src.model_name = data.model, src.hook_name = data.hook;
    } catch (const Error&) {
    }
    if (!model_name.empty()) src.model_name = model_name;
    if (!hook_name.empty()) src.hook_name = hook_name;
    for (const std::string& p : sae_export(w, meta, format, out, src))
        fmt::print("wrote {}\n", printable(p));
    if (src.model_name.empty() || src.hook_name.empty())
        fmt::print(stderr,
                   "sae-export: note: {}: {} unknown (the shards carry no such attribute or are "
                   "gone); pass --model-name / --hook-name for tools that need them\n",
                   in.given,
                   src.model_name.empty() && src.hook_name.empty() ? "model_name and hook_name"
                   : src.model_name.empty()                        ? "model_name"
                                                                   : "hook_name");
}

// An export never goes into a saetrain run's directory or below it: circuit-tracer's
// config.yaml would replace the run's own, and any file there is the run's to write (its resume
// reads them). A run's directory is one holding run.json or the lock file every run creates.
void refuse_run_directory(const std::string& out) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(out, ec), ec);
    for (; !p.empty(); p = p.parent_path()) {
        for (const char* mark : {"run.json", ".saetrain.lock"}) {
            SAE_ENFORCE(!fs::exists(p / mark, ec),
                        "--out {}: {} is a saetrain run's directory (it holds {}); an export "
                        "there could overwrite the run's files: choose a directory outside it, "
                        "e.g. exports/NAME",
                        out, p.string(), mark);
        }
        if (p == p.parent_path()) break;
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> inputs;
    std::string format, out, model_name, hook_name;
    ExportSource ct;
    CLI::App app{
        "sae-export: write trained SAEs for SAELens or sparsify, transcoders for "
        "circuit-tracer"};
    app.add_option("SAE", inputs,
                   "SAE file (final.h5, checkpoint-<step>.h5) or its directory; several: each "
                   "into its own directory under --out")
        ->required();
    app.add_option("--format", format, "saelens | sparsify | circuit_tracer")->required();
    app.add_option("--out", out,
                   "output directory (created; cfg.json and weights replaced); with several "
                   "SAEs, the directory that holds one directory per SAE")
        ->required();
    app.add_option("--model-name", model_name, "model the activations came from (metadata)");
    app.add_option("--hook-name", hook_name, "hook point, e.g. blocks.8.hook_resid_post");
    app.add_option("--layer", ct.layer,
                   "circuit_tracer: the transcoder's layer (its file is layer_<N>.safetensors)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--input-hook", ct.input_hook,
                   "circuit_tracer: the set's feature_input_hook (TransformerLens name)")
        ->capture_default_str();
    app.add_option("--output-hook", ct.output_hook,
                   "circuit_tracer: the set's feature_output_hook (TransformerLens name)")
        ->capture_default_str();
    if (const int code = cli_parse(app, "sae-export",
                                   "sae-export SAE [SAE ...] --format saelens|sparsify|"
                                   "circuit_tracer --out DIR [--model-name NAME] [--hook-name "
                                   "HOOK] [--layer N]",
                                   argc, argv);
        code >= 0)
        return code;
    try {
        const ExportFormat f = export_format_parse(format);
        SAE_ENFORCE(f != ExportFormat::circuit_tracer || inputs.size() == 1,
                    "--format circuit_tracer exports one transcoder per command (its --layer); "
                    "got {} SAEs",
                    inputs.size());
        // Every input is checked, and every output directory known, before anything is written.
        std::vector<Input> saes;
        for (const std::string& given : inputs) saes.push_back(resolve_input(given));
        std::vector<std::string> outs;
        if (saes.size() == 1) {
            outs.push_back(out);
        } else {
            std::map<std::string, std::string> taken;  // out dir -> the input that takes it
            for (const Input& in : saes) {
                const std::string dir = (fs::path(out) / export_name(in)).string();
                const auto [at, fresh] = taken.emplace(dir, in.given);
                SAE_ENFORCE(fresh,
                            "{} and {} would both be exported to {}; export them one at a time, "
                            "each with its own --out",
                            at->second, in.given, dir);
                outs.push_back(dir);
            }
        }
        refuse_run_directory(out);
        for (size_t i = 0; i < saes.size(); ++i)
            export_one(saes[i], f, outs[i], model_name, hook_name, ct);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sae-export: error: %s\n", printable(e.what()).c_str());
        return 1;
    }
}
