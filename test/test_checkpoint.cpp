// test_checkpoint — SAE weights round trip exactly, writes are atomic (no temp left behind,
// overwrite replaces), and bad files are rejected with an error naming them.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "../src/io/h5.h"
#include "../src/io/sae_file.h"
#include "saetrain/checkpoint.h"
#include "saetrain/checkpointer.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/shards.h"
#include "saetrain/synth.h"
#include "saetrain/train_state.h"
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
    SaeWeights w = SaeWeights::zeros(d, n);
    for (auto* v : {&w.at("W_enc"), &w.at("W_dec")}) {
        v->resize(static_cast<size_t>(d * n));
        for (auto& x : *v) x = g(rng);
    }
    w.at("b_enc").resize(static_cast<size_t>(n));
    w.at("b_dec").resize(static_cast<size_t>(d));
    for (auto& x : w.at("b_enc")) x = g(rng);
    for (auto& x : w.at("b_dec")) x = g(rng);
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
    EXPECT_EQ(got.at("W_enc"), w.at("W_enc"));
    EXPECT_EQ(got.at("W_dec"), w.at("W_dec"));
    EXPECT_EQ(got.at("b_enc"), w.at("b_enc"));
    EXPECT_EQ(got.at("b_dec"), w.at("b_dec"));
    EXPECT_EQ(got_meta.arch, "topk");
    EXPECT_EQ(got_meta.id, "topk_k4_x3");
    EXPECT_EQ(got_meta.config_yaml, meta.config_yaml);
    EXPECT_EQ(got_meta.k, 4);
    EXPECT_EQ(got_meta.step, 123);
    EXPECT_EQ(got_meta.tokens, int64_t{1} << 40);
    EXPECT_TRUE(sae_is_checkpoint(path));
    // W_enc [d, n] and W_dec [n, d] are distinct datasets: swapping them would be caught.
    EXPECT_NE(got.at("W_enc"), got.at("W_dec"));
}

// An architecture's own tensors keep their names, order and shapes (a layered model's are not
// 1-D); one whose values do not fill its shape is refused naming it, and nothing is written.
TEST(Checkpoint, ExtraTensorsKeepTheirShapesAndOrder) {
    TempDir tmp;
    SaeWeights w = random_weights(4, 6, 2);
    w.set("W_dec_1", {6, 2, 4}, std::vector<float>(48, 0.25f));
    w.set("b_layers", {2, 3}, {1, 2, 3, 4, 5, 6});
    w.set("threshold", {1}, {0.5f});
    SaeMeta meta;
    meta.arch = "topk";
    const std::string path = tmp / "w.h5";
    sae_write_h5(path, w, meta);
    const SaeWeights got = sae_read_h5(path);
    EXPECT_TRUE(got == w);
    ASSERT_EQ(got.tensors.size(), 7u);
    EXPECT_EQ(got.tensors[4].shape, (std::vector<int64_t>{6, 2, 4}));
    EXPECT_EQ(got.tensors[6].name, "threshold");
    SaeWeights bad = w;
    bad.at("b_layers").pop_back();
    try {
        sae_write_h5(tmp / "bad.h5", bad, meta);
        ADD_FAILURE() << "a tensor that does not fill its shape was written";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'b_layers'"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(tmp / "bad.h5"));
}

// A cross-layer transcoder's encoder is compact, [n, d_l]: written and read back for arch
// "clt" (d 12 = 3 layers of 4, n 24), refused in one line naming W_enc for any other
// architecture, and a CLT file whose W_enc is a dense [d, n] is refused on reading.
TEST(Checkpoint, ACltsCompactEncoderIsItsOwnShape) {
    TempDir tmp;
    SaeWeights w = random_weights(12, 24, 3);
    w.set("W_enc", {24, 4}, std::vector<float>(96, 0.5f));
    SaeMeta meta;
    meta.arch = "clt";
    sae_write_h5(tmp / "clt.h5", w, meta);
    SaeMeta got_meta;
    const SaeWeights got = sae_read_h5(tmp / "clt.h5", &got_meta);
    EXPECT_TRUE(got == w);
    EXPECT_EQ(got_meta.arch, "clt");
    meta.arch = "topk";
    try {
        sae_write_h5(tmp / "topk.h5", w, meta);
        ADD_FAILURE() << "a topk SAE with a [n, d_l] encoder was written";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("W_enc"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(tmp / "topk.h5"));
    // A dense CLT encoder, written as a topk file and relabelled.
    const SaeWeights dense = random_weights(12, 24, 4);
    sae_write_h5(tmp / "dense.h5", dense, meta);
    {
        auto guard = h5::lock();
        const std::string dense_path = tmp / "dense.h5";
        h5::File f(H5Fopen(dense_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
        ASSERT_TRUE(f.valid());
        H5Adelete(f.get(), "arch");
        h5::write_attr_string(f.get(), "arch", "clt");
    }
    const std::string why = error_of(tmp / "dense.h5");
    EXPECT_NE(why.find("a CLT with the dense encoder W_enc [12, 24] of an earlier saetrain"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("[24, d_model / layers]"), std::string::npos) << why;
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
    EXPECT_EQ(got.at("W_dec"), w2.at("W_dec"));
    EXPECT_EQ(got_meta.step, 2);
    EXPECT_EQ(got_meta.arch, "jumprelu");

    // A failed write (inconsistent sizes) leaves the old file and no temp behind.
    SaeWeights bad = random_weights(5, 10, 3);
    bad.at("b_enc").pop_back();
    EXPECT_THROW(sae_write_h5(path, bad, meta), Error);
    EXPECT_EQ(dir_names(tmp.path), std::vector<std::string>{"final.h5"});
    EXPECT_EQ(sae_read_h5(path).at("W_dec"), w2.at("W_dec"));
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
        EXPECT_EQ(sae_read_h5(tmp / "sae/final.h5", &got).at("W_dec"), w.at("W_dec"));
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
    // An architecture's own key (declared beside it) is compared like any other.
    const auto e = config_result_differences(base, yaml({"train.balance_coeff=0.2"}));
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e[0], "train.balance_coeff: 0.1 -> 0.2");

    // A run written before a key existed: absent equals the default, not a change...
    const std::string old = without_key(base, "max_bad_steps");
    ASSERT_NE(old, base) << "the test's key is not in the YAML";
    EXPECT_TRUE(config_result_differences(old, base).empty());
    // ... but a non-default value for it is one.
    EXPECT_EQ(config_result_differences(old, yaml({"train.max_bad_steps=3"})).size(), 1u);
}

// A checkpoint pair read in pieces (CheckpointFiles, a latent shard's resume) gives the blocks
// the pair holds, its header and meta; verify() passes on the pair as written and fails when
// any tensor it covers differs (the weights, an extra tensor, the state) or the pair is mixed.
TEST(Checkpoint, FilesReadInPiecesAndVerifiedInOnePass) {
    TempDir tmp;
    const int64_t d = 6, n = 20;
    SaeWeights w = random_weights(d, n, 3);
    w.set("r_mag", {n}, std::vector<float>(n, 0.5f));
    w.set("threshold", {1}, {0.25f});
    TrainState s;
    s.step = 40, s.tokens = 4000, s.iteration = 41;
    const int64_t params = 2 * d * n + n + d + n + 1;
    for (auto* v : {&s.opt_m, &s.opt_v}) {
        v->resize(static_cast<size_t>(params));
        for (size_t i = 0; i < v->size(); ++i) (*v)[i] = 0.001f * float(i) + (v == &s.opt_v);
    }
    for (int64_t i = 0; i < n; ++i) s.since_fired.push_back(i * 10);
    s.cursors = {1, 77, 2, 5};
    SaeMeta meta{"gated", "g", "sae:\n  arch: gated\n", 0, 40, 4000};
    const std::string wp = tmp / "w.h5", sp = tmp / "w.state.h5";
    sae_write_h5(wp, w, meta);
    train_state_write(sp, w, s);

    CheckpointFiles f(wp, sp);
    EXPECT_NO_THROW(f.verify());
    EXPECT_EQ(f.meta().config_yaml, meta.config_yaml);
    EXPECT_EQ(f.meta().step, 40);
    const TrainState h = f.header();
    EXPECT_EQ(h.cursors, s.cursors);
    EXPECT_EQ(h.iteration, 41);
    EXPECT_EQ(*f.shape("W_enc"), (std::vector<int64_t>{d, n}));
    EXPECT_EQ(*f.shape("adam_v"), (std::vector<int64_t>{params}));
    EXPECT_FALSE(f.shape("log_threshold").has_value());
    // The blocks a shard of latents [5, 15) reads, against the same from memory.
    const TensorsInMemory mem(w, s);
    auto both = [&](const std::string& name, std::vector<int64_t> start,
                    std::vector<int64_t> count) {
        int64_t size = 1;
        for (int64_t c : count) size *= c;
        std::vector<float> a(static_cast<size_t>(size)), b(a.size(), -1.0f);
        f.read(name, start, count, a.data());
        mem.read(name, start, count, b.data());
        EXPECT_EQ(a, b) << name;
        return a;
    };
    const std::vector<float> cols = both("W_enc", {0, 5}, {d, 10});
    EXPECT_EQ(cols[static_cast<size_t>(1 * 10 + 2)], w.at("W_enc")[static_cast<size_t>(1 * n + 7)]);
    both("W_dec", {5, 0}, {10, d});
    both("r_mag", {5}, {10});
    both("adam_v", {d * n + 5 * d}, {10 * d});
    std::vector<int64_t> fired(10);
    f.read("since_fired", 5, 10, fired.data());
    EXPECT_EQ(fired.front(), 50);
    EXPECT_EQ(fired.back(), 140);
    std::vector<float> out(100);
    EXPECT_THROW(f.read("W_dec", {15, 0}, {10, d}, out.data()), Error);  // past the end

    // Anything the checksum covers, changed, is caught.
    // (The state file keeps the checksum of w and s: a changed state value is written over the
    // file's own, as a damaged disk would.)
    auto mismatch = [&](SaeWeights w2, TrainState s2, const char* what) {
        const std::string wp2 = tmp / "w2.h5", sp2 = tmp / "w2.state.h5";
        sae_write_h5(wp2, w2, meta);
        train_state_write(sp2, w, s);
        {
            const hid_t file = H5Fopen(sp2.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
            ASSERT_GE(file, 0);
            for (const auto& [name, v] : {std::pair{"since_fired", &s2.since_fired},
                                          std::pair{"data_cursors", &s2.cursors}}) {
                const hid_t set = H5Dopen2(file, name, H5P_DEFAULT);
                EXPECT_GE(H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v->data()),
                          0);
                H5Dclose(set);
            }
            H5Fclose(file);
        }
        CheckpointFiles g(wp2, sp2);
        try {
            g.verify();
            ADD_FAILURE() << what << ": verify() passed";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << what;
            EXPECT_NE(std::string(e.what()).find(sp2), std::string::npos) << what;
        }
    };
    SaeWeights w2 = w;
    w2.at("W_enc")[static_cast<size_t>(d * n - 1)] += 1e-3f;
    mismatch(w2, s, "the last W_enc value");
    w2 = w;
    w2.at("threshold")[0] = 0.5f;
    mismatch(w2, s, "an extra tensor");
    w2 = w;
    std::swap(w2.tensors[4], w2.tensors[5]);
    mismatch(w2, s, "the extra tensors' order");
    TrainState s2 = s;
    s2.since_fired.back() += 1;
    mismatch(w, s2, "since_fired");
    s2 = s;
    s2.cursors[3] = 6;
    mismatch(w, s2, "a cursor");
}

// The checksum: XXH3-64 (its published value of no input; the same value whatever the pieces the
// bytes come in) in new checkpoints, while a pair written before it (test/data/legacy_fnv, a
// Gated SAE at step 10 with an FNV-1a 64 checksum) still verifies, whole and in pieces, and
// still catches a changed value.
TEST(Checkpoint, NewChecksumsAreXxh3AndOlderFnvCheckpointsStillVerify) {
    EXPECT_EQ(Checksum().text(), "xxh3:2d06800538d394c2");
    const std::string text = "saetrain";
    Checksum whole, pieces;
    whole.add(text.data(), text.size());
    pieces.add(text.data(), 1), pieces.add(text.data() + 1, 0), pieces.add(text.data() + 1, 7);
    EXPECT_EQ(whole.text(), pieces.text());
    EXPECT_EQ(whole.text(), "xxh3:8858ed63f8aaa9f7");

    const std::string dir = std::string(SAETRAIN_TEST_DATA) + "/legacy_fnv";
    const std::string wp = dir + "/checkpoint-10.h5", sp = dir + "/checkpoint-10.state.h5";
    SaeWeights w = sae_read_h5(wp);
    TrainState s;
    ASSERT_NO_THROW(s = train_state_read(sp, w));
    EXPECT_EQ(s.step, 10);
    CheckpointFiles files(wp, sp);
    EXPECT_NO_THROW(files.verify());
    w.at("W_dec")[3] += 1e-3f;
    EXPECT_THROW(train_state_read(sp, w), Error);
    w.at("W_dec")[3] -= 1e-3f;

    // Written again, the same pair holds an XXH3 checksum, and verifies both ways.
    TempDir tmp;
    const std::string wp2 = tmp / "w.h5", sp2 = tmp / "w.state.h5";
    sae_write_h5(wp2, w, SaeMeta{"gated", "g", "", 0, 10, 640});
    train_state_write(sp2, w, s);
    const std::string stored = train_state_checksum(w, s);
    EXPECT_EQ(stored.rfind("xxh3:", 0), 0u) << stored;
    EXPECT_EQ(h5::read_attr_string(h5::open_file(sp2).get(), "checksum"), stored);
    EXPECT_NO_THROW(train_state_read(sp2, w));
    EXPECT_NO_THROW(CheckpointFiles(wp2, sp2).verify());
}
