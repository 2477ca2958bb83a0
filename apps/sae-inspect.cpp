// sae-inspect — validates and describes a dataset of shards or an SAE checkpoint.
//
//   sae-inspect data/quickstart             # directory, glob or one shard
//   sae-inspect runs/x/sae/topk_k32/final.h5
//   sae-inspect runs/x/sae/topk_k32/checkpoint-500.h5     # also verifies its .state.h5 checksum
//   sae-inspect runs/x/sae/topk_k32/checkpoint-500.manifest.json  # a latent-sharded checkpoint's
//                                                                  # parts, each verified
//   sae-inspect runs/a/sae/id/final.h5 --compare runs/b/sae/id/final.h5   # bitwise equal?
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "app_cli.h"                    // defines: cli_parse (--version, usage errors)
#include "saetrain/checkpoint.h"        // defines: sae_is_checkpoint, sae_read_h5, SaeWeights
#include "saetrain/checkpoint_parts.h"  // defines: CheckpointParts (a checkpoint in parts)
#include "saetrain/error.h"
#include "saetrain/shards.h"       // defines: dataset_open, DatasetInfo
#include "saetrain/train_state.h"  // defines: CheckpointFiles (a checkpoint's checksum)

namespace fs = std::filesystem;

namespace {

void print_sae(const std::string& path) {
    saetrain::SaeMeta meta;
    saetrain::SaeWeights w = saetrain::sae_read_h5(path, &meta);
    double lo = INFINITY, hi = 0, sum = 0;
    const std::vector<float>& w_dec = w.at("W_dec");
    for (int64_t i = 0; i < w.n_latents; ++i) {
        double s = 0;
        for (int64_t j = 0; j < w.d_model; ++j) {
            double v = w_dec[static_cast<size_t>(i * w.d_model + j)];
            s += v * v;
        }
        double n = std::sqrt(s);
        lo = std::min(lo, n);
        hi = std::max(hi, n);
        sum += n;
    }
    // Strings from the file (its id, arch, model and hook attributes) may hold anything.
    fmt::print("SAE {}\n", saetrain::printable(path));
    fmt::print("  arch {}  id {}\n", meta.arch.empty() ? "?" : saetrain::printable(meta.arch),
               meta.id.empty() ? "?" : saetrain::printable(meta.id));
    fmt::print("  d_model {}  n_latents {}  k {}\n", w.d_model, w.n_latents, meta.k);
    fmt::print("  step {}  tokens {}\n", meta.step, meta.tokens);
    fmt::print("  decoder row norm min {:.4f}  mean {:.4f}  max {:.4f}\n", lo,
               sum / static_cast<double>(w.n_latents), hi);
    // A checkpoint's pair: the state file's checksum covers both files' tensors, so this is
    // exactly what resume would accept.
    const fs::path p(path);
    const std::string name = p.filename().string();
    if (name.rfind("checkpoint-", 0) == 0 && name.find(".state.") == std::string::npos) {
        const std::string state =
            saetrain::checkpoint_state_path(p.parent_path().string(), meta.step);
        if (fs::exists(state)) {  // streamed: the moments are never all in memory
            const saetrain::CheckpointFiles files(path, state);
            files.verify();
            fmt::print("  state {}: checksum ok (iteration {})\n", state, files.header().iteration);
        }
    }
}

// A latent-sharded checkpoint: its manifest (or any of its part files, which lead to it), the
// SAE it holds, and each part verified as resume would.
void print_parts(const std::string& path) {
    const fs::path p(path);
    const int64_t step = saetrain::checkpoint_file_step(p.filename().string());
    const std::string manifest =
        step >= 0 ? saetrain::checkpoint_manifest_path(p.parent_path().string(), step) : path;
    const saetrain::CheckpointParts parts(manifest);
    const saetrain::SaeMeta meta = parts.meta();
    const saetrain::TrainState header = parts.header();
    const auto dims = parts.shape("W_dec");
    fmt::print("SAE checkpoint {} in {} parts\n", saetrain::printable(manifest), parts.parts());
    fmt::print("  arch {}  id {}\n", meta.arch.empty() ? "?" : saetrain::printable(meta.arch),
               meta.id.empty() ? "?" : saetrain::printable(meta.id));
    if (dims && dims->size() == 2)
        fmt::print("  d_model {}  n_latents {}  k {}\n", (*dims)[1], (*dims)[0], meta.k);
    fmt::print("  step {}  tokens {}  iteration {}\n", header.step, header.tokens,
               header.iteration);
    for (int64_t k = 0; k < parts.parts(); ++k) {
        parts.verify(k);
        fmt::print("  part {} of {} (latents {}-{}): checksum ok\n", k, parts.parts(),
                   parts.first_latent(k), parts.first_latent(k) + parts.latents(k) - 1);
    }
}

// Bitwise comparison of two SAE files' tensors; the first difference, or "" when identical.
std::string weights_difference(const std::string& a_path, const std::string& b_path) {
    const saetrain::SaeWeights a = saetrain::sae_read_h5(a_path), b = saetrain::sae_read_h5(b_path);
    if (a.d_model != b.d_model || a.n_latents != b.n_latents)
        return fmt::format("shapes differ (d_model {} x {} latents vs {} x {})", a.d_model,
                           a.n_latents, b.d_model, b.n_latents);
    if (a.tensors.size() != b.tensors.size()) return "the SAEs hold different tensors";
    for (size_t t = 0; t < a.tensors.size(); ++t) {
        const std::string& name = a.tensors[t].name;
        if (name != b.tensors[t].name)
            return fmt::format("tensor {} is {} in one and {} in the other", t, name,
                               b.tensors[t].name);
        const std::vector<float>&x = a.tensors[t].data, &y = b.tensors[t].data;
        if (a.tensors[t].shape != b.tensors[t].shape || x.size() != y.size())
            return fmt::format("{}: sizes differ", name);
    }
    // Bits, not values: -0 vs 0 or two NaNs count as different. The first difference, and how
    // far apart the two are: the largest |a - b| over each tensor's largest |a|.
    std::string first;
    double worst = 0;
    std::string worst_name;
    for (size_t t = 0; t < a.tensors.size(); ++t) {
        const std::vector<float>&x = a.tensors[t].data, &y = b.tensors[t].data;
        double top = 0, gap = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            if (std::memcmp(&x[i], &y[i], sizeof(float)) == 0) continue;
            if (first.empty())
                first = fmt::format("{}[{}]: {:.9g} vs {:.9g}", a.tensors[t].name, i, x[i], y[i]);
            gap = std::max(gap, std::fabs(static_cast<double>(x[i]) - y[i]));
        }
        if (first.empty() || gap == 0) continue;
        for (float v : x) top = std::max(top, std::fabs(static_cast<double>(v)));
        const double rel = top > 0 ? gap / top : INFINITY;
        if (!(rel <= worst)) worst = rel, worst_name = a.tensors[t].name;
    }
    if (first.empty()) return "";
    return fmt::format("{}; max relative difference {:.3g} ({}: largest |a - b| over largest |a|)",
                       first, worst, worst_name);
}

void print_dataset(const std::string& path, const std::string& name) {
    saetrain::DatasetInfo info = saetrain::dataset_open(path, name);
    size_t w = 5;
    for (const auto& s : info.shards) w = std::max(w, s.path.size());
    fmt::print("{:<{}}  {:>12}  {:>12}\n", "shard", w, "rows", "first_row");
    for (const auto& s : info.shards)
        fmt::print("{:<{}}  {:>12}  {:>12}\n", saetrain::printable(s.path), w, s.rows, s.first_row);
    double gb = static_cast<double>(info.total_rows) * static_cast<double>(info.d_model) *
                saetrain::dtype_size(info.dtype) / 1e9;
    // A multi-layer paired set's `inputs` or `targets`: [rows, L, d].
    const std::string width = info.layers > 0 ? fmt::format("{} layers x d_model {}", info.layers,
                                                            info.d_model / info.layers)
                                              : fmt::format("d_model {}", info.d_model);
    fmt::print("total: {} shards, {} rows, {}, {}, {:.3f} GB\n", info.shards.size(),
               info.total_rows, width, saetrain::dtype_name(info.dtype), gb);
    fmt::print("model: {}  hook: {}\n", info.model.empty() ? "-" : saetrain::printable(info.model),
               info.hook.empty() ? "-" : saetrain::printable(info.hook));
}

// Without --dataset: the shards' 'activations', or, where they hold none but 'inputs' and
// 'targets' (a multi-layer paired set, tools/extract_activations.py --layer-pairs), both of
// those. Any other failure is the one 'activations' gave.
void print_default_dataset(const std::string& path) {
    try {
        print_dataset(path, "activations");
    } catch (const saetrain::Error& first) {
        saetrain::DatasetInfo inputs;
        try {
            inputs = saetrain::dataset_open(path, "inputs");
            saetrain::dataset_open(path, "targets");
        } catch (const std::exception&) {
            throw first;
        }
        fmt::print("{}: a paired set: its shards hold 'inputs' and 'targets', not 'activations'\n",
                   saetrain::printable(path));
        for (const char* name : {"inputs", "targets"}) {
            fmt::print("\n{}:\n", name);
            print_dataset(path, name);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string path, dataset = "activations";
    CLI::App app{"Validate and describe activation shards or an SAE checkpoint."};
    app.add_option("PATH", path,
                   "dataset directory, glob, shard, SAE .h5 file, or checkpoint manifest")
        ->required();
    auto* dataset_opt = app.add_option("--dataset", dataset,
                                       "dataset name inside each shard (default: activations, "
                                       "or a paired set's inputs and targets)");
    std::string compare;
    app.add_option("--compare", compare,
                   "another SAE file: exit 0 when its tensors are bitwise equal to PATH's, else 1");
    if (const int code = saetrain::cli_parse(
            app, "sae-inspect", "sae-inspect PATH [--dataset NAME] [--compare OTHER_SAE.h5]", argc,
            argv);
        code >= 0)
        return code;
    try {
        if (!compare.empty()) {
            const std::string diff = weights_difference(path, compare);
            if (!diff.empty()) {
                fmt::print("{} and {} differ: {}\n", path, compare, diff);
                return 1;
            }
            fmt::print("{} and {}: weights bitwise identical\n", path, compare);
            return 0;
        }
        const std::string name = fs::path(path).filename().string();
        if (saetrain::checkpoint_file_step(name) >= 0 &&
            (name.find(".part-") != std::string::npos ||
             name.find(".manifest.json") != std::string::npos))
            print_parts(path);
        else if (saetrain::sae_is_checkpoint(path))
            print_sae(path);
        else if (dataset_opt->count() > 0)
            print_dataset(path, dataset);
        else
            print_default_dataset(path);
    } catch (const std::exception& e) {
        fmt::print(stderr, "sae-inspect: error: {}\n", saetrain::printable(e.what()));
        return 1;
    }
    return 0;
}
