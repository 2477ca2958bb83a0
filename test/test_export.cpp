// test_export — the safetensors writer/reader and the SAELens / sparsify exports.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "saetrain/checkpoint.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/export.h"
#include "saetrain/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_export") {}
};

using saetrain::testing::error_of;

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// A file with the given JSON header and `data_bytes` zero bytes after it.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
    std::ofstream out(p, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripAndLayout) {
    TempDir tmp;
    const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f, 0.25f, 1e-30f, 7};
    const fs::path p = tmp.path / "t.safetensors";
    safetensors_write(p.string(),
                      {{"b", {4}, b.data()}, {"a", {2, 3}, a.data()}, {"e", {0, 5}, a.data()}},
                      {{"k", "v"}});
    std::map<std::string, std::string> md;
    const auto t = safetensors_read(p.string(), &md);
    ASSERT_EQ(t.size(), 3u);
    EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t.at("a").data, a);
    EXPECT_EQ(t.at("b").data, b);
    EXPECT_TRUE(t.at("e").data.empty());
    EXPECT_EQ(md.at("k"), "v");
    // The format itself, checked on the bytes: header size, JSON padded to 8, tensors in name
    // order right after it.
    const std::string bytes = slurp(p);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes[8], '{');
    ASSERT_EQ(bytes.size(), 8 + n + 4 * (a.size() + b.size()));
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_EQ(header["a"]["dtype"], "F32");
    EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 24}));
    EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({24, 40}));
    float first_of_b = 0;
    std::memcpy(&first_of_b, bytes.data() + 8 + n + 24, 4);
    EXPECT_EQ(first_of_b, -1.5f);
}

TEST(Safetensors, DamagedFilesAreNamedErrors) {
    TempDir tmp;
    const fs::path p = tmp.path / "bad.safetensors";
    auto expect_error = [&](const std::string& want) {
        const std::string e = error_of([&] { safetensors_read(p.string()); });
        EXPECT_NE(e.find(p.string()), std::string::npos) << e;
        EXPECT_NE(e.find(want), std::string::npos) << e;
    };
    std::ofstream(p, std::ios::binary) << "abc";
    expect_error("shorter than");
    write_raw(p, "{}", 0);
    {  // header size larger than the file
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        const uint64_t huge = 1u << 20;
        f.write(reinterpret_cast<const char*>(&huge), 8);
    }
    expect_error("header size");
    write_raw(p, R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4);
    expect_error("only F32");
    write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4);
    expect_error("do not hold");
    write_raw(p,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
              8);
    expect_error("overlaps or leaves a hole");
    write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
    expect_error("after the last tensor");
    write_raw(p, R"({"a":)", 0);
    expect_error("JSON");
}

SaeWeights small_weights(int64_t d, int64_t n) {
    SaeWeights w = SaeWeights::zeros(d, n);
    for (int64_t i = 0; i < d * n; ++i) w.at("W_enc")[i] = 0.5f + static_cast<float>(i);
    for (int64_t i = 0; i < n * d; ++i) w.at("W_dec")[i] = -static_cast<float>(i);
    for (int64_t i = 0; i < n; ++i) w.at("b_enc")[i] = 100.0f + static_cast<float>(i);
    for (int64_t i = 0; i < d; ++i) w.at("b_dec")[i] = 200.0f + static_cast<float>(i);
    return w;
}

SaeMeta meta_for(const std::string& arch, int64_t k) {
    SaeMeta m;
    m.arch = arch, m.k = k, m.step = 7, m.tokens = 700;
    const std::string k_key = arch == "topk" ? ", k: " + std::to_string(k) : "";
    const Config cfg = config_parse("data: {path: some/data}\nsae: {arch: " + arch + k_key +
                                    ", n_latents: 4}\ntrain: {normalize_decoder: false}\n");
    m.config_yaml = config_to_yaml(cfg);
    m.id = sweep_ids(cfg, 3).at(0);
    return m;
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

TEST(Export, SaelensLayoutAndConfig) {
    TempDir tmp;
    const SaeWeights w = small_weights(3, 4);
    ExportSource src{"gpt2", "blocks.6.hook_resid_post", "some/data"};
    const auto files =
        sae_export(w, meta_for("topk", 2), ExportFormat::saelens, (tmp.path / "sl").string(), src);
    EXPECT_EQ(files.size(), 2u);
    const auto cfg = read_json(tmp.path / "sl/cfg.json");
    EXPECT_EQ(cfg["architecture"], "topk");
    EXPECT_EQ(cfg["d_in"], 3);
    EXPECT_EQ(cfg["d_sae"], 4);
    EXPECT_EQ(cfg["k"], 2);
    EXPECT_EQ(cfg["apply_b_dec_to_input"], true);
    EXPECT_EQ(cfg["normalize_activations"], "none");
    EXPECT_EQ(cfg["metadata"]["hook_name"], "blocks.6.hook_resid_post");
    EXPECT_EQ(cfg["metadata"]["model_name"], "gpt2");
    const auto t = safetensors_read((tmp.path / "sl/sae_weights.safetensors").string());
    EXPECT_EQ(t.at("W_enc").shape, (std::vector<int64_t>{3, 4}));  // [d_in, d_sae]
    EXPECT_EQ(t.at("W_enc").data, w.at("W_enc"));
    EXPECT_EQ(t.at("W_dec").shape, (std::vector<int64_t>{4, 3}));  // [d_sae, d_in]
    EXPECT_EQ(t.at("W_dec").data, w.at("W_dec"));
    EXPECT_EQ(t.at("b_enc").data, w.at("b_enc"));
    EXPECT_EQ(t.at("b_dec").data, w.at("b_dec"));

    sae_export(w, meta_for("relu", 0), ExportFormat::saelens, (tmp.path / "relu").string(), {});
    const auto relu = read_json(tmp.path / "relu/cfg.json");
    EXPECT_EQ(relu["architecture"], "standard");
    EXPECT_FALSE(relu.contains("k"));
}

TEST(Export, SparsifyLayoutAndConfig) {
    TempDir tmp;
    const SaeWeights w = small_weights(3, 4);
    sae_export(w, meta_for("topk", 2), ExportFormat::sparsify, (tmp.path / "sp").string(), {});
    const auto cfg = read_json(tmp.path / "sp/cfg.json");
    EXPECT_EQ(cfg["activation"], "topk");
    EXPECT_EQ(cfg["num_latents"], 4);
    EXPECT_EQ(cfg["k"], 2);
    EXPECT_EQ(cfg["d_in"], 3);
    EXPECT_EQ(cfg["normalize_decoder"], false);  // from the SAE's own config
    const auto t = safetensors_read((tmp.path / "sp/sae.safetensors").string());
    const Tensor& enc = t.at("encoder.weight");
    ASSERT_EQ(enc.shape, (std::vector<int64_t>{4, 3}));  // [latents, d_in]
    for (int64_t l = 0; l < 4; ++l)
        for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(enc.data[l * 3 + c], w.at("W_enc")[c * 4 + l]);
    EXPECT_EQ(t.at("encoder.bias").data, w.at("b_enc"));
    EXPECT_EQ(t.at("W_dec").data, w.at("W_dec"));
    EXPECT_EQ(t.at("b_dec").data, w.at("b_dec"));
    // sparsify has no ReLU-L1 SAE: a clear error pointing at the format that has one.
    const std::string e = error_of([&] {
        sae_export(w, meta_for("relu", 0), ExportFormat::sparsify, (tmp.path / "x").string(), {});
    });
    EXPECT_NE(e.find("--format saelens"), std::string::npos) << e;
    EXPECT_NE(
        error_of([] { export_format_parse("hf"); }).find("saelens, sparsify or circuit_tracer"),
        std::string::npos);
}

TEST(Export, CommandLine) {
    TempDir tmp;
    const fs::path sae = tmp.path / "sae" / "topk-x1-k2";
    fs::create_directories(sae);
    SaeMeta meta = meta_for("topk", 2);
    sae_write_h5((sae / "final.h5").string(), small_weights(3, 4), meta);
    const std::string bin = std::string(SAETRAIN_BIN_DIR) + "/sae-export ";
    auto r = saetrain::testing::run_command(bin + sae.string() + " --format saelens --out " +
                                            (tmp.path / "out").string() +
                                            " --model-name gpt2 --hook-name h");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(read_json(tmp.path / "out/cfg.json")["metadata"]["model_name"], "gpt2");
    EXPECT_EQ(safetensors_read((tmp.path / "out/sae_weights.safetensors").string()).size(), 4u);
    r = saetrain::testing::run_command(bin + (tmp.path / "nope.h5").string() +
                                       " --format saelens --out " + (tmp.path / "o2").string());
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("nope.h5"), std::string::npos) << r.out;
    r = saetrain::testing::run_command(bin + sae.string() + " --format onnx --out " +
                                       (tmp.path / "o3").string());
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("saelens, sparsify or circuit_tracer"), std::string::npos) << r.out;
    // Never into a run's directory or below it (circuit-tracer's config.yaml would replace the
    // run's): a run is marked by run.json or its lock file; nothing is written.
    for (const char* mark : {"run.json", ".saetrain.lock"}) {
        const fs::path run = tmp.path / (std::string("run-") + (mark[0] == '.' ? "lock" : "json"));
        fs::create_directories(run / "sae");
        std::ofstream(run / mark) << "{}";
        std::ofstream(run / "config.yaml") << "run: {out_dir: x}\n";
        for (const fs::path& dest : {run, run / "sae" / "exported"}) {
            r = saetrain::testing::run_command(bin + sae.string() + " --format saelens --out " +
                                               dest.string());
            EXPECT_EQ(r.code, 1) << r.out;
            EXPECT_EQ(r.out, "sae-export: error: --out " + dest.string() + ": " + run.string() +
                                 " is a saetrain run's directory (it holds " + mark +
                                 "); an export there could overwrite the run's files: choose a "
                                 "directory outside it, e.g. exports/NAME\n");
            EXPECT_FALSE(fs::exists(run / "cfg.json"));
            EXPECT_FALSE(fs::exists(run / "sae" / "exported"));
        }
    }
}

// Several SAEs (a sweep's sae/*): each into its own directory under --out, named after its SAE
// directory (a checkpoint file: "-checkpoint-<step>" added); two inputs that would share a
// directory, or one that is not an SAE, are refused in one line before anything is written.
TEST(Export, SeveralSaesEachIntoTheirOwnDirectory) {
    TempDir tmp;
    const fs::path a = tmp.path / "run" / "sae" / "topk-x1-k2",
                   b = tmp.path / "run" / "sae" / "topk-x1-k3";
    fs::create_directories(a);
    fs::create_directories(b);
    sae_write_h5((a / "final.h5").string(), small_weights(3, 4), meta_for("topk", 2));
    sae_write_h5((a / "checkpoint-5.h5").string(), small_weights(3, 4), meta_for("topk", 2));
    sae_write_h5((b / "final.h5").string(), small_weights(3, 4), meta_for("topk", 3));
    const std::string bin = std::string(SAETRAIN_BIN_DIR) + "/sae-export ";
    const fs::path out = tmp.path / "exports";
    auto r = saetrain::testing::run_command(bin + a.string() + " " + b.string() + " " +
                                            (a / "checkpoint-5.h5").string() +
                                            " --format saelens --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    for (const auto& [name, k] : std::vector<std::pair<std::string, int>>{
             {"topk-x1-k2", 2}, {"topk-x1-k3", 3}, {"topk-x1-k2-checkpoint-5", 2}}) {
        SCOPED_TRACE(name);
        EXPECT_EQ(read_json(out / name / "cfg.json")["k"], k);
        EXPECT_NE(r.out.find("wrote " + (out / name / "sae_weights.safetensors").string() + "\n"),
                  std::string::npos)
            << r.out;
    }
    // The same SAE directory name from two runs: refused, nothing written.
    const fs::path other = tmp.path / "run2" / "sae" / "topk-x1-k2";
    fs::create_directories(other);
    sae_write_h5((other / "final.h5").string(), small_weights(3, 4), meta_for("topk", 2));
    const fs::path out2 = tmp.path / "exports2";
    r = saetrain::testing::run_command(bin + b.string() + " " + a.string() + " " + other.string() +
                                       " --format sparsify --out " + out2.string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(r.out, "sae-export: error: " + a.string() + " and " + other.string() +
                         " would both be exported to " + (out2 / "topk-x1-k2").string() +
                         "; export them one at a time, each with its own --out\n");
    EXPECT_FALSE(fs::exists(out2));
    // An input that is not an SAE, among good ones: refused before anything is written.
    r = saetrain::testing::run_command(bin + a.string() + " " + (tmp.path / "nope").string() +
                                       " --format saelens --out " + out2.string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(r.out, "sae-export: error: " + (tmp.path / "nope").string() + ": no such SAE file\n");
    EXPECT_FALSE(fs::exists(out2));
}

// A truncated SAE file is named as truncated (not "not an SAE file"), and one holding NaN
// weights is refused naming the tensor, with nothing written.
TEST(Export, TruncatedAndNonFiniteSaesAreRefusedSayingWhy) {
    TempDir tmp;
    const fs::path cut = tmp.path / "cut.h5", nan = tmp.path / "nan.h5";
    sae_write_h5(cut.string(), small_weights(3, 4), meta_for("topk", 2));
    fs::resize_file(cut, fs::file_size(cut) / 2);
    SaeWeights w = small_weights(3, 4);
    w.at("W_dec")[5] = std::numeric_limits<float>::quiet_NaN();
    w.at("b_enc")[0] = std::numeric_limits<float>::infinity();
    sae_write_h5(nan.string(), w, meta_for("topk", 2));
    const std::string bin = std::string(SAETRAIN_BIN_DIR) + "/sae-export ";
    auto r = saetrain::testing::run_command(bin + cut.string() + " --format saelens --out " +
                                            (tmp.path / "o1").string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("file " + cut.string() + ": cannot open as HDF5 (truncated file"),
              std::string::npos)
        << r.out;
    r = saetrain::testing::run_command(bin + nan.string() + " --format sparsify --out " +
                                       (tmp.path / "o2").string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(r.out, "sae-export: error: " + nan.string() +
                         ": W_dec holds 1 non-finite value(s) (NaN/Inf); the SAE diverged or "
                         "the file is damaged: export an earlier checkpoint (sae-inspect shows "
                         "each one)\n");
    EXPECT_FALSE(fs::exists(tmp.path / "o2"));
}

// The exports as the reference safetensors library reads them (tools/check_export.py: names,
// shapes, dtype, and values equal to the source SAE file), with the project's Python
// environment (tools/setup-venv.sh) when it exists. Skipped where Python lacks safetensors,
// numpy or h5py.
TEST(Export, ReferenceLibraryReadsTheExports) {
    const std::string python =
        fs::exists(SAETRAIN_VENV_PYTHON) ? std::string(SAETRAIN_VENV_PYTHON) : "python3";
    if (saetrain::testing::run_command(python + " -c 'import safetensors.numpy, numpy, h5py'")
            .code != 0)
        GTEST_SKIP() << python
                     << " with safetensors, numpy and h5py is not installed (run bash "
                        "tools/setup-venv.sh)";
    TempDir tmp;
    const fs::path h5 = tmp.path / "final.h5";
    sae_write_h5(h5.string(), small_weights(3, 4), meta_for("topk", 2));
    const std::string check = python + " " + SAETRAIN_TEST_DATA + "/../../tools/check_export.py ";
    for (ExportFormat f : {ExportFormat::saelens, ExportFormat::sparsify}) {
        const fs::path dir = tmp.path / (f == ExportFormat::saelens ? "sl" : "sp");
        sae_export(small_weights(3, 4), meta_for("topk", 2), f, dir.string(), {});
        const auto r =
            saetrain::testing::run_command(check + dir.string() + " --sae-file " + h5.string());
        EXPECT_EQ(r.code, 0) << r.out;
        EXPECT_NE(r.out.find(" ok,"), std::string::npos) << r.out;
    }
}

}  // namespace
