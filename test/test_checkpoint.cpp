// test_checkpoint — SAE weights round trip exactly, writes are atomic (no temp left behind,
// overwrite replaces), and bad files are rejected with an error naming them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "saetrain/checkpoint.h"
#include "saetrain/checkpointer.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/shards.h"
#include "saetrain/synth.h"
#include "shard_oracle.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_test_ckpt") {}
};

SaeWeights random_weights(int64_t d, int64_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g;
    SaeWeights w;
    w.d_model = d;
    w.n_latents = n;
    for (auto* v : {&w.w_enc, &w.w_dec}) {
        v->resize(static_cast<size_t>(d * n));
        for (auto& x : *v) x = g(rng);
    }
    w.b_enc.resize(static_cast<size_t>(n));
    w.b_dec.resize(static_cast<size_t>(d));
    for (auto& x : w.b_enc) x = g(rng);
    for (auto& x : w.b_dec) x = g(rng);
    return w;
}

std::vector<std::string> dir_names(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    return names;
}

std::string error_of(const std::string& path) {
    try {
        sae_read_h5(path);
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected saetrain::Error reading " << path;
    return "";
}

}  // namespace

TEST(Checkpoint, RoundTripIsExact) {
    TempDir tmp;
    SaeWeights w = random_weights(8, 24, 1);
    SaeMeta meta;
    meta.arch = "topk";
    meta.id = "topk_k4_x3";
    meta.config_yaml = "sae:\n  arch: topk\n  k: 4\n";
    meta.k = 4;
    meta.step = 123;
    meta.tokens = int64_t{1} << 40;
    // Parent directories are created.
    std::string path = tmp / "run/sae/topk_k4_x3/final.h5";
    sae_write_h5(path, w, meta);
    SaeMeta got_meta;
    SaeWeights got = sae_read_h5(path, &got_meta);
    EXPECT_EQ(got.d_model, 8);
    EXPECT_EQ(got.n_latents, 24);
    EXPECT_EQ(got.w_enc, w.w_enc);
    EXPECT_EQ(got.w_dec, w.w_dec);
    EXPECT_EQ(got.b_enc, w.b_enc);
    EXPECT_EQ(got.b_dec, w.b_dec);
    EXPECT_EQ(got_meta.arch, "topk");
    EXPECT_EQ(got_meta.id, "topk_k4_x3");
    EXPECT_EQ(got_meta.config_yaml, meta.config_yaml);
    EXPECT_EQ(got_meta.k, 4);
    EXPECT_EQ(got_meta.step, 123);
    EXPECT_EQ(got_meta.tokens, int64_t{1} << 40);
    EXPECT_TRUE(sae_is_checkpoint(path));
    // W_enc [d, n] and W_dec [n, d] are distinct datasets: swapping them would be caught.
    EXPECT_NE(got.w_enc, got.w_dec);
}

TEST(Checkpoint, NoTempFileLeftAndOverwriteReplaces) {
    TempDir tmp;
    std::string path = tmp / "final.h5";
    SaeMeta meta;
    meta.arch = "relu";
    meta.step = 1;
    sae_write_h5(path, random_weights(4, 6, 1), meta);
    EXPECT_EQ(dir_names(tmp.path), std::vector<std::string>{"final.h5"});

    SaeWeights w2 = random_weights(5, 10, 2);  // different shapes too
    meta.step = 2;
    meta.arch = "jumprelu";
    sae_write_h5(path, w2, meta);
    EXPECT_EQ(dir_names(tmp.path), std::vector<std::string>{"final.h5"});
    SaeMeta got_meta;
    SaeWeights got = sae_read_h5(path, &got_meta);
    EXPECT_EQ(got.d_model, 5);
    EXPECT_EQ(got.n_latents, 10);
    EXPECT_EQ(got.w_dec, w2.w_dec);
    EXPECT_EQ(got_meta.step, 2);
    EXPECT_EQ(got_meta.arch, "jumprelu");

    // A failed write (inconsistent sizes) leaves the old file and no temp behind.
    SaeWeights bad = random_weights(5, 10, 3);
    bad.b_enc.pop_back();
    EXPECT_THROW(sae_write_h5(path, bad, meta), Error);
    EXPECT_EQ(dir_names(tmp.path), std::vector<std::string>{"final.h5"});
    EXPECT_EQ(sae_read_h5(path).w_dec, w2.w_dec);
}

TEST(Checkpoint, NonSaeFilesAreNamedInErrors) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp / "data";
    o.rows = 10;
    o.shards = 1;
    synth_write(o);
    std::string shard = tmp / "data/shard_00000.h5";
    std::string msg = error_of(shard);
    EXPECT_NE(msg.find(shard), std::string::npos) << msg;
    EXPECT_NE(msg.find("W_enc"), std::string::npos) << msg;
    EXPECT_FALSE(sae_is_checkpoint(shard));

    std::string text = tmp / "notes.h5";
    std::ofstream(text) << "hello\n";
    msg = error_of(text);
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
    EXPECT_FALSE(sae_is_checkpoint(text));

    std::string missing = tmp / "missing.h5";
    msg = error_of(missing);
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_FALSE(sae_is_checkpoint(missing));
}

// The trainer writes checkpoints while a background thread streams shards; the io layer's
// HDF5 lock must keep both correct (serial HDF5 builds are not thread-safe on their own).
TEST(Checkpoint, WriteWhileAnotherThreadReadsShards) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp / "data";
    o.d_model = 32;
    o.rows = 4000;
    o.shards = 4;
    o.dtype = DType::f16;
    o.chunked = true;
    o.chunk_rows = 128;
    synth_write(o);
    DatasetInfo info = dataset_open(o.out_dir);
    const std::vector<float> ref =
        saetrain::testing::oracle_rows(info, RowRange{0, info.total_rows});
    bool reads_ok = true;
    std::thread reader([&] {
        for (int pass = 0; pass < 20; ++pass) {
            // The io layer's reads (its layout probes are HDF5 calls, under its lock).
            const std::vector<float> buf = read_rows(info, RowRange{0, info.total_rows});
            reads_ok = reads_ok && buf == ref;
        }
    });
    SaeMeta meta;
    for (int i = 0; i < 20; ++i) {
        SaeWeights w = random_weights(16, 32, static_cast<unsigned>(i));
        meta.step = i;
        sae_write_h5(tmp / "sae/final.h5", w, meta);
        SaeMeta got;
        EXPECT_EQ(sae_read_h5(tmp / "sae/final.h5", &got).w_dec, w.w_dec);
        EXPECT_EQ(got.step, i);
    }
    reader.join();
    EXPECT_TRUE(reads_ok);
}

namespace {

// Drops the line of `key` (indented, inside its section) from a config_to_yaml text.
std::string without_key(const std::string& yaml, const std::string& key) {
    std::string out;
    std::istringstream in(yaml);
    for (std::string line; std::getline(in, line);)
        if (line.rfind("  " + key + ":", 0) != 0) out += line + "\n";
    return out;
}

}  // namespace

// Resume compares the checkpoint's config with the new one on the keys that change the result.
TEST(Checkpoint, ConfigDifferencesIgnoreHarmlessKeysAndNewDefaults) {
    auto yaml = [](const std::vector<std::string>& sets) {
        return config_to_yaml(config_parse("data: {path: data}\n", sets));
    };
    const std::string base = yaml({});
    EXPECT_TRUE(config_result_differences(base, base).empty());
    EXPECT_TRUE(config_result_differences(base, yaml({"log.every_steps=7", "log.peak_tflops=989",
                                                      "parallel.timeout_s=30"}))
                    .empty());
    // Like the backend itself, GPU numerics may change between a run and its resumption.
    EXPECT_TRUE(config_result_differences(base, yaml({"gpu.gemm=bf16", "gpu.deterministic=false"}))
                    .empty());

    const auto d = config_result_differences(base, yaml({"train.lr=0.0008"}));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_NE(d[0].find("train.lr"), std::string::npos) << d[0];

    // A run written before a key existed: absent equals the default, not a change...
    const std::string old = without_key(base, "max_bad_steps");
    ASSERT_NE(old, base) << "the test's key is not in the YAML";
    EXPECT_TRUE(config_result_differences(old, base).empty());
    // ... but a non-default value for it is one.
    EXPECT_EQ(config_result_differences(old, yaml({"train.max_bad_steps=3"})).size(), 1u);
}
