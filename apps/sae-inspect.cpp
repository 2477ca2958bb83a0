// sae-inspect — validates and describes a dataset of shards or an SAE checkpoint.
//
//   sae-inspect data/quickstart             # directory, glob or one shard
//   sae-inspect runs/x/sae/topk_k32/final.h5
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "saetrain/checkpoint.h"  // defines: sae_is_checkpoint, sae_read_h5, SaeWeights
#include "saetrain/error.h"
#include "saetrain/shards.h"  // defines: dataset_open, DatasetInfo

namespace fs = std::filesystem;

namespace {

void print_sae(const std::string& path) {
    saetrain::SaeMeta meta;
    saetrain::SaeWeights w = saetrain::sae_read_h5(path, &meta);
    double lo = INFINITY, hi = 0, sum = 0;
    for (int64_t i = 0; i < w.n_latents; ++i) {
        double s = 0;
        for (int64_t j = 0; j < w.d_model; ++j) {
            double v = w.w_dec[static_cast<size_t>(i * w.d_model + j)];
            s += v * v;
        }
        double n = std::sqrt(s);
        lo = std::min(lo, n);
        hi = std::max(hi, n);
        sum += n;
    }
    fmt::print("SAE {}\n", path);
    fmt::print("  arch {}  id {}\n", meta.arch.empty() ? "?" : meta.arch,
               meta.id.empty() ? "?" : meta.id);
    fmt::print("  d_model {}  n_latents {}  k {}\n", w.d_model, w.n_latents, meta.k);
    fmt::print("  step {}  tokens {}\n", meta.step, meta.tokens);
    fmt::print("  decoder row norm min {:.4f}  mean {:.4f}  max {:.4f}\n", lo,
               sum / static_cast<double>(w.n_latents), hi);
}

void print_dataset(const std::string& path, const std::string& name) {
    saetrain::DatasetInfo info = saetrain::dataset_open(path, name);
    size_t w = 5;
    for (const auto& s : info.shards) w = std::max(w, s.path.size());
    fmt::print("{:<{}}  {:>12}  {:>12}\n", "shard", w, "rows", "first_row");
    for (const auto& s : info.shards)
        fmt::print("{:<{}}  {:>12}  {:>12}\n", s.path, w, s.rows, s.first_row);
    double gb = static_cast<double>(info.total_rows) * static_cast<double>(info.d_model) *
                saetrain::dtype_size(info.dtype) / 1e9;
    fmt::print("total: {} shards, {} rows, d_model {}, {}, {:.3f} GB\n", info.shards.size(),
               info.total_rows, info.d_model, saetrain::dtype_name(info.dtype), gb);
    fmt::print("model: {}  hook: {}\n", info.model.empty() ? "-" : info.model,
               info.hook.empty() ? "-" : info.hook);
}

}  // namespace

int main(int argc, char** argv) {
    std::string path, dataset = "activations";
    CLI::App app{"Validate and describe activation shards or an SAE checkpoint."};
    app.add_option("path", path, "dataset directory, glob, shard, or SAE .h5 file")->required();
    app.add_option("--dataset", dataset, "dataset name inside each shard")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        if (saetrain::sae_is_checkpoint(path))
            print_sae(path);
        else
            print_dataset(path, dataset);
    } catch (const std::exception& e) {
        fmt::print(stderr, "sae-inspect: error: {}\n", e.what());
        return 1;
    }
    return 0;
}
