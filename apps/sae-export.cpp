// sae-export — writes a trained SAE for SAELens or sparsify.
//
//   sae-export runs/x/sae/topk-x8-k32/final.h5 --format saelens --out exports/topk-x8-k32
//   sae-export runs/x/sae/topk-x8-k32 --format sparsify --out exports/sparsify/topk-x8-k32
// CHECKPOINT is an SAE file (final.h5 or checkpoint-<step>.h5) or an SAE directory (its
// final.h5). The model and hook names come from the training data's shard attributes when the
// shards are still at the path the run used; --model-name / --hook-name set them.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "saetrain/checkpoint.h"  // defines: sae_read_h5, sae_is_checkpoint
#include "saetrain/config.h"      // defines: config_parse (the run's data.path)
#include "saetrain/error.h"
#include "saetrain/export.h"  // defines: sae_export, export_format_parse
#include "saetrain/shards.h"  // defines: dataset_open (model and hook attributes)

namespace fs = std::filesystem;
using namespace saetrain;

int main(int argc, char** argv) {
    std::string checkpoint, format, out, model_name, hook_name;
    CLI::App app{"sae-export: write a trained SAE for SAELens or sparsify"};
    app.add_option("checkpoint", checkpoint,
                   "SAE file (final.h5, checkpoint-<step>.h5) or its directory")
        ->required();
    app.add_option("--format", format, "saelens | sparsify")->required();
    app.add_option("--out", out, "output directory (created; cfg.json and weights replaced)")
        ->required();
    app.add_option("--model-name", model_name, "model the activations came from (metadata)");
    app.add_option("--hook-name", hook_name, "hook point, e.g. blocks.8.hook_resid_post");
    CLI11_PARSE(app, argc, argv);
    try {
        const ExportFormat f = export_format_parse(format);
        std::string path = checkpoint;
        if (fs::is_directory(path)) path = (fs::path(path) / "final.h5").string();
        SAE_ENFORCE(fs::is_regular_file(path), "{}: no such SAE file", path);
        SAE_ENFORCE(sae_is_checkpoint(path),
                    "{}: not an SAE file (no W_dec); give final.h5 or a "
                    "checkpoint-<step>.h5 from a run's sae/<id>/ directory",
                    path);
        SaeMeta meta;
        const SaeWeights w = sae_read_h5(path, &meta);
        ExportSource src;
        try {  // the training data's description, when it is still there
            const Config cfg = config_parse(meta.config_yaml, {}, path);
            src.dataset_path = cfg.data.path;
            const DatasetInfo data = dataset_open(cfg.data.path, cfg.data.dataset);
            src.model_name = data.model, src.hook_name = data.hook;
        } catch (const Error&) {
        }
        if (!model_name.empty()) src.model_name = model_name;
        if (!hook_name.empty()) src.hook_name = hook_name;
        for (const std::string& p : sae_export(w, meta, f, out, src)) fmt::print("wrote {}\n", p);
        if (src.model_name.empty() || src.hook_name.empty())
            fmt::print(stderr,
                       "sae-export: note: {} unknown (the shards carry no such attribute or are "
                       "gone); pass --model-name / --hook-name for tools that need them\n",
                       src.model_name.empty() && src.hook_name.empty() ? "model_name and hook_name"
                       : src.model_name.empty()                        ? "model_name"
                                                                       : "hook_name");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sae-export: error: %s\n", e.what());
        return 1;
    }
}
