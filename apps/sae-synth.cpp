// sae-synth — writes synthetic activation shards with planted ground-truth features.
//
//   sae-synth --out data/quickstart --d-model 64 --features 256 --rows 100000 --shards 4
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "app_cli.h"         // defines: cli_parse (--version, usage errors)
#include "saetrain/dtype.h"  // defines: dtype_size
#include "saetrain/error.h"
#include "saetrain/shards.h"  // defines: dtype_parse, dtype_name
#include "saetrain/synth.h"   // defines: SynthOptions, synth_write

namespace fs = std::filesystem;

int main(int argc, char** argv) {
    saetrain::SynthOptions o;
    std::string dtype = "f32";
    CLI::App app{"Write synthetic activation shards with planted ground-truth features."};
    app.add_option("--out", o.out_dir, "output directory (created)")->required();
    // Every count bounded (a width of 10^10 ended in std::bad_alloc): a usage line names it.
    app.add_option("--d-model", o.d_model, "row width")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
        ->capture_default_str();
    app.add_option("--features", o.n_features, "planted features m")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
        ->capture_default_str();
    app.add_option("--active", o.active_per_row, "expected active features per row")
        ->capture_default_str();
    app.add_option("--rows", o.rows, "total rows over all shards")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
        ->capture_default_str();
    app.add_option("--shards", o.shards, "number of shard files")
        ->check(CLI::Range(int64_t{1}, int64_t{100000}))
        ->capture_default_str();
    app.add_option("--dtype", dtype, "stored element type")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}))
        ->capture_default_str();
    app.add_flag("--chunked", o.chunked, "chunk the datasets by rows (else contiguous)");
    app.add_option("--chunk-rows", o.chunk_rows, "rows per chunk")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
        ->capture_default_str();
    app.add_option("--noise", o.noise_std, "per-dimension Gaussian noise std")
        ->capture_default_str();
    app.add_option("--seed", o.seed, "random seed")->capture_default_str();
    app.add_option("--target", o.target_dir,
                   "also write a paired target set here (transcoders: data.target_path)");
    app.add_option("--min-scale", o.min_scale, "smallest feature magnitude")->capture_default_str();
    app.add_option("--max-scale", o.max_scale, "largest feature magnitude")->capture_default_str();
    app.add_option("--mean-norm", o.mean_norm, "norm of the shared mean vector")
        ->capture_default_str();
    if (const int code = saetrain::cli_parse(
            app, "sae-synth",
            "sae-synth --out DIR [--d-model N] [--features M] [--rows N] [--shards N] "
            "[--dtype f32|f16|bf16] [--chunked] [--seed S] ...",
            argc, argv);
        code >= 0)
        return code;

    try {
        o.dtype = saetrain::dtype_parse(dtype);
        // The shards' bytes against the room where they go: a size the disk cannot hold is one
        // line before anything is written, not an HDF5 failure partway through.
        const double need = static_cast<double>(o.rows) * static_cast<double>(o.d_model) *
                            static_cast<double>(saetrain::dtype_size(o.dtype)) *
                            (o.target_dir.empty() ? 1.0 : 2.0);
        fs::path probe = fs::absolute(o.out_dir);
        while (!probe.empty() && !fs::exists(probe) && probe != probe.root_path())
            probe = probe.parent_path();
        std::error_code ec;
        const fs::space_info room = fs::space(probe, ec);
        SAE_ENFORCE(ec || need <= static_cast<double>(room.available),
                    "--rows {} x --d-model {} of {} need {:.1f} GB{}, but {} has {:.1f} GB free",
                    o.rows, o.d_model, dtype, need / 1e9,
                    o.target_dir.empty() ? "" : " (with --target's pair)", probe.string(),
                    static_cast<double>(room.available) / 1e9);
        saetrain::synth_write(o);
        uintmax_t bytes = 0;
        for (int64_t s = 0; s < o.shards; ++s)
            bytes += fs::file_size(fs::path(o.out_dir) / fmt::format("shard_{:05d}.h5", s));
        fmt::print(
            "wrote {} rows in {} shards to {}: d_model {}, {}{}, {:.1f} MB (+ "
            "ground_truth.h5 with {} features)\n",
            o.rows, o.shards, o.out_dir, o.d_model, saetrain::dtype_name(o.dtype),
            o.chunked ? fmt::format(", chunks of {} rows", o.chunk_rows) : "",
            static_cast<double>(bytes) / 1e6, o.n_features);
    } catch (const std::exception& e) {
        fmt::print(stderr, "sae-synth: error: {}\n", saetrain::printable(e.what()));
        return 1;
    }
    return 0;
}
