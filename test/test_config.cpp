// test_config.cpp — the YAML config loader: defaults, every key, every error message, sweeps,
// ids, overrides, round trip through config_to_yaml, data-dependent checks, shipped configs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/schedule.h"

namespace saetrain {
namespace {

namespace fs = std::filesystem;

const std::string kMinimal = "data: {path: data/x}\n";

// The message of the Error that parsing `text` throws ("" when it does not throw).
std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
        config_parse(text, overrides, "cfg.yaml");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

#define EXPECT_HAS(haystack, needle) \
    EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

void expect_same(const SaeConfig& a, const SaeConfig& b) {
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ(a.expansion, b.expansion);
    EXPECT_EQ(a.n_latents, b.n_latents);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.l1_coeff, b.l1_coeff);
    EXPECT_EQ(a.lr, b.lr);
    EXPECT_EQ(a.warmup_steps, b.warmup_steps);
    EXPECT_EQ(a.lr_decay, b.lr_decay);
    EXPECT_EQ(a.lr_min_ratio, b.lr_min_ratio);
    EXPECT_EQ(a.l1_warmup_steps, b.l1_warmup_steps);
    EXPECT_EQ(a.grad_clip, b.grad_clip);
    EXPECT_EQ(a.optimizer, b.optimizer);
    EXPECT_EQ(a.momentum, b.momentum);
    EXPECT_EQ(a.beta1, b.beta1);
    EXPECT_EQ(a.beta2, b.beta2);
    EXPECT_EQ(a.eps, b.eps);
    EXPECT_EQ(a.weight_decay, b.weight_decay);
    EXPECT_EQ(a.normalize_decoder, b.normalize_decoder);
    EXPECT_EQ(a.dead_tokens, b.dead_tokens);
    for (const ArchKeyDecl* k : arch_config_keys())
        EXPECT_TRUE(k->value(a) == k->value(b)) << k->full();
}

void expect_same(const Config& a, const Config& b) {
    EXPECT_EQ(a.run.out_dir, b.run.out_dir);
    EXPECT_EQ(a.run.seed, b.run.seed);
    EXPECT_EQ(a.data.path, b.data.path);
    EXPECT_EQ(a.data.batch_size, b.data.batch_size);
    EXPECT_EQ(a.data.epochs, b.data.epochs);
    EXPECT_EQ(a.data.max_tokens, b.data.max_tokens);
    EXPECT_EQ(a.data.shuffle_buffer_rows, b.data.shuffle_buffer_rows);
    EXPECT_EQ(a.data.dataset, b.data.dataset);
    EXPECT_EQ(a.parallel.mode, b.parallel.mode);
    EXPECT_EQ(a.parallel.sweep_data, b.parallel.sweep_data);
    EXPECT_EQ(a.parallel.replicas, b.parallel.replicas);
    EXPECT_EQ(a.backend, b.backend);
    EXPECT_EQ(a.gpu.gemm, b.gpu.gemm);
    EXPECT_EQ(a.gpu.deterministic, b.gpu.deterministic);
    EXPECT_EQ(a.log.every_steps, b.log.every_steps);
    EXPECT_EQ(a.log.peak_tflops, b.log.peak_tflops);
    EXPECT_EQ(a.checkpoint.every_steps, b.checkpoint.every_steps);
    EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
    expect_same(a.sae, b.sae);
    ASSERT_EQ(a.sweep.size(), b.sweep.size());
    for (size_t i = 0; i < a.sweep.size(); ++i) expect_same(a.sweep[i], b.sweep[i]);
}

// ---- defaults and keys -------------------------------------------------------------------------

TEST(Config, MissingSectionsTakeStructDefaults) {
    const Config c = config_parse(kMinimal);
    Config d;
    d.data.path = {"data/x"};
    d.sweep = {d.sae};
    expect_same(c, d);
    EXPECT_EQ(c.sweep.size(), 1u);
    EXPECT_EQ(c.source, "<string>");
    // Spot-check the documented defaults so a changed default is a visible decision.
    EXPECT_EQ(c.data.batch_size, 4096);
    EXPECT_EQ(c.sae.arch, "topk");
    EXPECT_EQ(c.sae.k, 32);
    EXPECT_DOUBLE_EQ(c.sae.lr, 0);  // the optimizer's own (with_optimizer_defaults)
    EXPECT_EQ(c.sae.optimizer, "auto");
    EXPECT_EQ(c.backend, "auto");
    EXPECT_EQ(c.parallel.mode, "sweep");
    EXPECT_EQ(c.checkpoint.keep, 3);
    EXPECT_EQ(c.log.peak_tflops, 0.0);  // 0: the peak table by GPU name
}

// log.peak_tflops: the per-device peak MFU is reported against, for a GPU missing from the
// table or for the CPU backend (which has none).
TEST(Config, PeakTflopsOverride) {
    const Config c = config_parse("data: {path: d}\nlog: {peak_tflops: 312}\n");
    EXPECT_DOUBLE_EQ(c.log.peak_tflops, 312.0);
    EXPECT_DOUBLE_EQ(config_parse("data: {path: d}\n", {"log.peak_tflops=0.25"}).log.peak_tflops,
                     0.25);
    EXPECT_HAS(config_to_yaml(c), "peak_tflops: 312.0");
    const std::string m = parse_error("data: {path: d}\nlog: {peak_tflops: fast}\n");
    EXPECT_HAS(m, "log.peak_tflops");
    EXPECT_HAS(m, "a number");
}

TEST(Config, EmptySectionsTakeDefaults) {
    const Config c = config_parse("data: {path: d}\nlog:\ntrain: {}\n");
    EXPECT_EQ(c.log.every_steps, 50);
    EXPECT_EQ(c.sae.warmup_steps, 0);  // 0: warmup_fraction of the run
    EXPECT_DOUBLE_EQ(c.sae.warmup_fraction, 0.01);
    EXPECT_DOUBLE_EQ(c.sae.decay_start, 0.8);
    EXPECT_EQ(c.sae.encoder_init, "fitted");
}

TEST(Config, EveryKeyIsParsed) {
    const std::string text = R"(
run: {out_dir: runs/all, seed: 18446744073709551615}
data:
  path: "shards/*.h5"
  batch_size: 128
  epochs: 7
  max_tokens: 1.5e9
  shuffle_buffer_rows: 0
  dataset: acts
  eval_path: held/*.h5
  eval_rows: 77
sae: {arch: relu, expansion: 6, n_latents: 999, k: 17, l1_coeff: 0.25}
train:
  lr: 3e-3
  warmup_steps: 0
  warmup_fraction: 0.05
  lr_decay: linear
  decay_start: 0.5
  encoder_init: transpose
  lr_min_ratio: 0.1
  l1_warmup_steps: 250
  l1_warmup_fraction: 0.3
  grad_clip: 0
  optimizer: signum
  momentum: 0.9
  beta1: 0.8
  beta2: 0.95
  eps: 1.0e-6
  weight_decay: 0.01
  normalize_decoder: false
  dead_tokens: 12345
parallel: {mode: hybrid, sweep_data: disjoint, replicas: 4}
backend: cpu
gpu: {gemm: bf16, deterministic: false}
log: {every_steps: 7, eval_every_steps: 14}
checkpoint: {every_steps: 11, keep: 2}
)";
    const Config c = config_parse(text);
    EXPECT_EQ(c.data.eval_path, "held/*.h5");
    EXPECT_EQ(c.data.eval_rows, 77);
    EXPECT_EQ(c.log.eval_every_steps, 14);
    EXPECT_EQ(c.run.out_dir, "runs/all");
    EXPECT_EQ(c.run.seed, 18446744073709551615ull);
    EXPECT_EQ(c.data.path, StringList{"shards/*.h5"});
    EXPECT_EQ(c.data.batch_size, 128);
    EXPECT_EQ(c.data.epochs, 7);
    EXPECT_EQ(c.data.max_tokens, 1500000000);
    EXPECT_EQ(c.data.shuffle_buffer_rows, 0);
    EXPECT_EQ(c.data.dataset, "acts");
    EXPECT_EQ(c.sae.arch, "relu");
    EXPECT_EQ(c.sae.expansion, 6);
    EXPECT_EQ(c.sae.n_latents, 999);
    EXPECT_EQ(c.sae.k, 17);
    EXPECT_DOUBLE_EQ(c.sae.l1_coeff, 0.25);
    EXPECT_DOUBLE_EQ(c.sae.lr, 3e-3);
    EXPECT_EQ(c.sae.warmup_steps, 0);
    EXPECT_EQ(c.sae.lr_decay, "linear");
    EXPECT_DOUBLE_EQ(c.sae.warmup_fraction, 0.05);
    EXPECT_DOUBLE_EQ(c.sae.decay_start, 0.5);
    EXPECT_EQ(c.sae.encoder_init, "transpose");
    EXPECT_DOUBLE_EQ(c.sae.lr_min_ratio, 0.1);
    EXPECT_EQ(c.sae.l1_warmup_steps, 250);
    EXPECT_DOUBLE_EQ(c.sae.l1_warmup_fraction, 0.3);
    EXPECT_DOUBLE_EQ(c.sae.grad_clip, 0.0);
    EXPECT_EQ(c.sae.optimizer, "signum");
    EXPECT_DOUBLE_EQ(c.sae.momentum, 0.9);
    EXPECT_DOUBLE_EQ(c.sae.beta1, 0.8);
    EXPECT_DOUBLE_EQ(c.sae.beta2, 0.95);
    EXPECT_DOUBLE_EQ(c.sae.eps, 1e-6);
    EXPECT_DOUBLE_EQ(c.sae.weight_decay, 0.01);
    EXPECT_FALSE(c.sae.normalize_decoder);
    EXPECT_EQ(c.sae.dead_tokens, 12345);
    EXPECT_EQ(c.parallel.mode, "hybrid");
    EXPECT_EQ(c.parallel.sweep_data, "disjoint");
    EXPECT_EQ(c.parallel.replicas, 4);
    EXPECT_EQ(c.backend, "cpu");
    EXPECT_EQ(c.gpu.gemm, "bf16");
    EXPECT_FALSE(c.gpu.deterministic);
    EXPECT_EQ(c.log.every_steps, 7);
    EXPECT_EQ(c.checkpoint.every_steps, 11);
    EXPECT_EQ(c.checkpoint.keep, 2);
    ASSERT_EQ(c.sweep.size(), 1u);
    expect_same(c.sweep[0], c.sae);
}

TEST(Config, ArchNamesComeFromTheRegistry) {
    const std::vector<std::string> names = arch_names();
    for (const char* a : {"relu", "topk", "batchtopk", "jumprelu", "gated"}) {
        EXPECT_NE(std::find(names.begin(), names.end(), a), names.end()) << a;
        EXPECT_EQ(config_parse(std::string("data: {path: d}\nsae: {arch: ") + a + "}\n").sae.arch,
                  a);
    }
    EXPECT_EQ(SaeConfig{}.arch, kDefaultArch);
    EXPECT_THROW(arch_get("nope"), Error);
}

// A CLT lists one input and one target set per layer: the lists reach DataConfig and every sweep
// point's layer count, config.yaml writes them back as lists (and a single path as it always
// was), and counts that disagree, lists for other architectures, an empty entry and held-out
// shards of their own are refused naming the key.
TEST(ConfigErrors, CltListsOneInputAndTargetSetPerLayer) {
    const Config c = config_parse(
        "data: {path: [l0/in, l1/in, l2/in], target_path: [l0/out, l1/out, l2/out]}\n"
        "sae: {arch: clt, expansion: 4, k: 8, transcoder_activation: [topk, jumprelu]}\n");
    EXPECT_EQ(c.data.path, (StringList{"l0/in", "l1/in", "l2/in"}));
    EXPECT_EQ(c.data.target_path, (StringList{"l0/out", "l1/out", "l2/out"}));
    ASSERT_EQ(c.sweep.size(), 2u);
    for (const SaeConfig& s : c.sweep) EXPECT_EQ(s.layers, 3);
    EXPECT_TRUE(arch_get("clt").rows().per_layer);
    EXPECT_EQ(sweep_ids(c, 48), (std::vector<std::string>{"clt-x4-k8", "clt-x4-jumprelu-l0_1"}));
    const std::string yaml = config_to_yaml(c);
    EXPECT_HAS(yaml, "path: [l0/in, l1/in, l2/in]");
    EXPECT_EQ(config_parse(yaml).data.target_path, c.data.target_path);
    EXPECT_HAS(config_to_yaml(config_parse("data: {path: one/dir}\n")), "path: one/dir\n");
    EXPECT_EQ(config_parse("data: {path: one/dir}\n").sae.layers, 1);

    EXPECT_HAS(parse_error("data: {path: [a, b], target_path: [c]}\nsae: {arch: clt}\n"),
               "data.target_path lists 1 dataset(s), but data.path lists 2: sae.arch clt reads "
               "one input and one target set per layer");
    EXPECT_HAS(parse_error("data: {path: [a, b], target_path: [c, d]}\nsae: {arch: transcoder}\n"),
               "data.path lists 2 datasets, but sae.arch transcoder reads one; only sae.arch clt");
    EXPECT_HAS(parse_error("data: {path: [a, b]}\nsae: {arch: topk}\n"),
               "data.path lists 2 datasets, but sae.arch topk reads one");
    EXPECT_HAS(parse_error("data: {path: [a, ''], target_path: [c, d]}\nsae: {arch: clt}\n"),
               "data.path is required: a directory or glob of .h5 shards");
    EXPECT_HAS(parse_error("data: {path: [a, b], target_path: [c, d], eval_path: e, "
                           "eval_target_path: f}\nsae: {arch: clt}\n"),
               "data.eval_target_path is set, but sae.arch clt reads its held-out targets from "
               "data.eval_path, one multi-layer paired set");
    // data.eval_path alone is a CLT's held-out set (its layers are checked at start-up).
    EXPECT_EQ(config_parse("data: {path: [a, b], target_path: [c, d], eval_path: e}\n"
                           "sae: {arch: clt}\n")
                  .data.eval_path,
              "e");
    EXPECT_HAS(parse_error("data: {path: [a, b], target_path: [c, d]}\n"
                           "sae: {arch: clt, n_latents: 9}\n"),
               "sae.n_latents = 9 is not a multiple of the CLT's 2 layers");
    // A layer's set listed twice (as written, or the same directory spelled another way).
    EXPECT_HAS(parse_error("data: {path: [a/x, b, ./a/x/], target_path: [c, d, e]}\n"
                           "sae: {arch: clt}\n"),
               "data.path lists './a/x/' for layers 0 and 2: sae.arch clt reads one set per "
               "layer, in layer order; list each layer's once");
    EXPECT_HAS(parse_error("data: {path: [a, b], target_path: ['s3://t/l1/', 's3://t/l1/']}\n"
                           "sae: {arch: clt}\n"),
               "data.target_path lists 's3://t/l1/' for layers 0 and 1");
}

// A transcoder needs its target set, an SAE must not have one, and held-out rows of a transcoder
// need their targets: each refusal names the key.
TEST(ConfigErrors, TranscodersAndTargetSetsGoTogether) {
    EXPECT_HAS(parse_error(kMinimal + "sae: {arch: transcoder}\n"),
               "sae.arch: transcoder reads an MLP's input (data.path) and its output; set "
               "data.target_path");
    EXPECT_HAS(parse_error("data: {path: a, target_path: b}\nsae: {arch: topk}\n"),
               "data.target_path is set, but sae.arch topk reconstructs its input");
    EXPECT_HAS(parse_error("data: {path: a, target_path: b, eval_path: c}\n"
                           "sae: {arch: skip_transcoder}\n"),
               "data.eval_path is set for a transcoder: set data.eval_target_path");
    EXPECT_HAS(parse_error("data: {path: a, eval_target_path: c}\n"),
               "data.eval_target_path needs data.eval_path and data.target_path");
    const Config c = config_parse(
        "data: {path: a, target_path: b, eval_path: c, "
        "eval_target_path: d}\nsae: {arch: transcoder}\n");
    EXPECT_EQ(c.data.target_path, StringList{"b"});
    EXPECT_EQ(c.data.eval_target_path, "d");
    EXPECT_TRUE(arch_get(c.sae.arch).rows().target);
    // The activation: one of three, a sweepable key, and in the SAE's id.
    EXPECT_HAS(parse_error("data: {path: a, target_path: b}\n"
                           "sae: {arch: transcoder, transcoder_activation: relu}\n"),
               "sae.transcoder_activation must be topk, batchtopk or jumprelu (got relu)");
    const Config s = config_parse(
        "data: {path: a, target_path: b}\nsae: {arch: skip_transcoder, expansion: 4, k: 8, "
        "transcoder_activation: [topk, batchtopk, jumprelu]}\n");
    EXPECT_EQ(sweep_ids(s, 16),
              (std::vector<std::string>{"skip_transcoder-x4-k8", "skip_transcoder-x4-batchtopk-k8",
                                        "skip_transcoder-x4-jumprelu-l0_1"}));
}

// ---- unknown keys and suggestions --------------------------------------------------------------

TEST(ConfigErrors, TypoSuggestsNearestKey) {
    const std::string m = parse_error(kMinimal + "sae: {expnasion: 8}\n");
    EXPECT_HAS(m, "cfg.yaml");
    EXPECT_HAS(m, "sae.expnasion");
    EXPECT_HAS(m, "did you mean sae.expansion?");
}

TEST(ConfigErrors, UnknownKeyNamesTheLine) {
    const std::string m = parse_error(kMinimal + "train:\n  lr: 1e-3\n  warmup_stesp: 5\n");
    EXPECT_HAS(m, "cfg.yaml:4:");
    EXPECT_HAS(m, "train.warmup_stesp");
    EXPECT_HAS(m, "did you mean train.warmup_steps?");
}

TEST(ConfigErrors, KeyInWrongSectionSuggestsItsSection) {
    std::string m = parse_error(kMinimal + "train: {k: 64}\n");
    EXPECT_HAS(m, "train.k");
    EXPECT_HAS(m, "did you mean sae.k?");
    m = parse_error(kMinimal + "sae: {lr: 0.1}\n");
    EXPECT_HAS(m, "did you mean train.lr?");
    m = parse_error("data: {path: d, seed: 3}\n");
    EXPECT_HAS(m, "did you mean run.seed?");
}

TEST(ConfigErrors, FarOffKeyListsTheSectionsKeys) {
    const std::string m = parse_error(kMinimal + "checkpoint: {frobnicate: 1}\n");
    EXPECT_HAS(m, "checkpoint.frobnicate");
    EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
    EXPECT_HAS(m, "every_steps, keep");
}

TEST(ConfigErrors, UnknownSection) {
    std::string m = parse_error(kMinimal + "trian: {lr: 1}\n");
    EXPECT_HAS(m, "'trian'");
    EXPECT_HAS(m, "did you mean train?");
    m = parse_error(kMinimal + "lr: 0.1\n");
    EXPECT_HAS(m, "did you mean train.lr?");
}

TEST(ConfigErrors, DuplicateKey) {
    const std::string m = parse_error(kMinimal + "sae:\n  k: 8\n  k: 16\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "twice");
}

TEST(ConfigErrors, SectionMustBeAMapping) {
    EXPECT_HAS(parse_error(kMinimal + "sae: 8\n"), "section 'sae'");
    EXPECT_HAS(parse_error("- a\n- b\n"), "mapping of sections");
}

// ---- types -------------------------------------------------------------------------------------

TEST(ConfigErrors, WrongTypesNameKeyAndExpectedType) {
    std::string m = parse_error(kMinimal + "train: {lr: fast}\n");
    EXPECT_HAS(m, "train.lr");
    EXPECT_HAS(m, "expected a number");
    EXPECT_HAS(m, "'fast'");
    m = parse_error(kMinimal + "sae: {k: 3.5}\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "expected an integer");
    m = parse_error("data: {path: d, batch_size: many}\n");
    EXPECT_HAS(m, "data.batch_size");
    EXPECT_HAS(m, "expected an integer");
    m = parse_error(kMinimal + "train: {normalize_decoder: maybe}\n");
    EXPECT_HAS(m, "train.normalize_decoder");
    EXPECT_HAS(m, "boolean");
    m = parse_error(kMinimal + "run: {seed: -1}\n");
    EXPECT_HAS(m, "run.seed");
    EXPECT_HAS(m, "non-negative integer");
    m = parse_error(kMinimal + "sae: {k: {a: 1}}\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "mapping");
    m = parse_error(kMinimal + "train: {lr: .inf}\n");
    EXPECT_HAS(m, "train.lr");
    m = parse_error(kMinimal + "sae: {k: }\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "no value");
}

// ---- values ------------------------------------------------------------------------------------

struct BadValue {
    std::string yaml;  // appended to a minimal valid config
    std::string key;
    std::string reason;
};

TEST(ConfigErrors, BadValuesNameKeyAndReason) {
    const std::vector<BadValue> cases = {
        {"train: {lr: -1e-3}\n", "train.lr", ">= 0 (0: the optimizer's default)"},
        {"train: {warmup_steps: -1}\n", "train.warmup_steps", ">= 0"},
        {"train: {l1_warmup_steps: -5}\n", "train.l1_warmup_steps", ">= 0"},
        {"data: {path: d, batch_size: 0}\n", "data.batch_size", "in [1, 16777216]"},
        {"data: {path: d, batch_size: 9223372036854775807}\n", "data.batch_size",
         "in [1, 16777216]"},
        {"data: {path: d, epochs: 0}\n", "data.epochs", "data.max_tokens"},
        {"data: {path: d, epochs: 9223372036854775807}\n", "data.epochs", "at most 1000000"},
        {"data: {path: d, max_tokens: -3}\n", "data.max_tokens", "in [0, 9007199254740992]"},
        {"data: {path: d, max_tokens: 9.2e18}\n", "data.max_tokens", "in [0, 9007199254740992]"},
        {"data: {path: d, shuffle_buffer_rows: -1}\n", "data.shuffle_buffer_rows", ">= 0"},
        {"sae: {k: 0}\n", "sae.k", ">= 1"},
        {"sae: {expansion: 0}\n", "sae.expansion", ">= 1"},
        {"sae: {n_latents: -2}\n", "sae.n_latents", ">= 0"},
        {"sae: {l1_coeff: -0.5}\n", "sae.l1_coeff", ">= 0"},
        {"train: {grad_clip: -1}\n", "train.grad_clip", ">= 0"},
        {"train: {beta1: 1.0}\n", "train.beta1", "[0, 1)"},
        {"train: {momentum: 1.0}\n", "train.momentum", "[0, 1)"},
        {"train: {beta1: -0.1}\n", "train.beta1", "[0, 1)"},
        {"train: {beta2: 1}\n", "train.beta2", "[0, 1)"},
        {"train: {eps: 0}\n", "train.eps", "> 0"},
        {"train: {lr_min_ratio: 2}\n", "train.lr_min_ratio", "[0, 1]"},
        {"train: {weight_decay: -1}\n", "train.weight_decay", ">= 0"},
        {"train: {dead_tokens: 0}\n", "train.dead_tokens", ">= 1"},
        {"checkpoint: {keep: 0}\n", "checkpoint.keep", ">= 1"},
        {"checkpoint: {every_steps: 0}\n", "checkpoint.every_steps", ">= 1"},
        {"log: {every_steps: 0}\n", "log.every_steps", ">= 1"},
        {"log: {peak_tflops: -1}\n", "log.peak_tflops", ">= 0"},
        {"parallel: {replicas: 0}\n", "parallel.replicas", ">= 1"},
        {"run: {out_dir: ''}\n", "run.out_dir", "empty"},
    };
    for (const BadValue& c : cases) {
        // Keys in `data` replace the minimal config's data section.
        const std::string text = c.yaml.rfind("data:", 0) == 0 ? c.yaml : kMinimal + c.yaml;
        const std::string m = parse_error(text);
        EXPECT_HAS(m, c.key);
        EXPECT_HAS(m, c.reason);
        EXPECT_HAS(m, "cfg.yaml");
    }
}

TEST(ConfigErrors, BadValueNamesItsLine) {
    const std::string m = parse_error("data:\n  path: d\ntrain:\n  lr: -1\n");
    EXPECT_HAS(m, "cfg.yaml:4:");
    EXPECT_HAS(m, "got -1");
}

TEST(Config, EpochsMayBeZeroWithATokenBudget) {
    const Config c = config_parse("data: {path: d, epochs: 0, max_tokens: 1000000}\n");
    EXPECT_EQ(c.data.epochs, 0);
    EXPECT_EQ(c.data.max_tokens, 1000000);
}

TEST(ConfigErrors, UnknownEnumValuesListTheAllowedOnes) {
    std::string m = parse_error(kMinimal + "sae: {arch: topkk}\n");
    EXPECT_HAS(m, "sae.arch");
    EXPECT_HAS(m, "relu, topk");
    m = parse_error(kMinimal + "sae: {arch: switch, n_experts: 0}\n");
    EXPECT_HAS(m, "sae.n_experts");
    m = parse_error(kMinimal + "train: {lr_decay: exp}\n");
    EXPECT_HAS(m, "train.lr_decay");
    EXPECT_HAS(m, "cosine, linear, constant");
    m = parse_error(kMinimal + "train: {optimizer: sgd}\n");
    EXPECT_HAS(m, "train.optimizer");
    EXPECT_HAS(m, "adam, signum");
    m = parse_error(kMinimal + "parallel: {mode: ddp}\n");
    EXPECT_HAS(m, "parallel.mode");
    EXPECT_HAS(m, "sweep, data_parallel, hybrid");
    m = parse_error(kMinimal + "parallel: {sweep_data: all}\n");
    EXPECT_HAS(m, "parallel.sweep_data");
    EXPECT_HAS(m, "shared, disjoint");
    m = parse_error(kMinimal + "backend: gpu\n");
    EXPECT_HAS(m, "backend");
    EXPECT_HAS(m, "auto, cpu, cuda");
    m = parse_error(kMinimal + "gpu: {gemm: fp16}\n");
    EXPECT_HAS(m, "gpu.gemm");
    EXPECT_HAS(m, "fp32, tf32, bf16");
}

TEST(ConfigErrors, DataPathIsRequired) {
    const std::string want = "data.path is required: a directory or glob of .h5 shards";
    EXPECT_HAS(parse_error(""), want);
    EXPECT_HAS(parse_error("data: {batch_size: 8}\n"), want);
    EXPECT_HAS(parse_error("data: {path: }\n"), want);
}

// ---- sweeps ------------------------------------------------------------------------------------

TEST(ConfigSweep, CartesianProductInKeyOrderLastFastest) {
    // Written in a different order than the struct: sweep order must follow the struct
    // (sae keys first, then train keys), not the file.
    const Config c = config_parse(
        "train: {lr: [1e-3, 2e-3]}\n"
        "sae: {k: [16, 32, 64], expansion: [4, 8]}\n" +
        kMinimal);
    ASSERT_EQ(c.sweep.size(), 12u);
    size_t i = 0;
    for (int64_t e : {4, 8})
        for (int64_t k : {16, 32, 64})
            for (double lr : {1e-3, 2e-3}) {
                EXPECT_EQ(c.sweep[i].expansion, e) << i;
                EXPECT_EQ(c.sweep[i].k, k) << i;
                EXPECT_DOUBLE_EQ(c.sweep[i].lr, lr) << i;
                ++i;
            }
    expect_same(c.sae, c.sweep[0]);
}

TEST(ConfigSweep, SingleElementListIsNotASweepAxis) {
    const Config c = config_parse(kMinimal + "sae: {k: [48]}\n");
    ASSERT_EQ(c.sweep.size(), 1u);
    EXPECT_EQ(c.sae.k, 48);
}

TEST(ConfigSweep, StringAndBoolKeysCanBeSwept) {
    const Config c = config_parse(
        kMinimal + "sae: {arch: [relu, topk]}\ntrain: {normalize_decoder: [true, false]}\n");
    ASSERT_EQ(c.sweep.size(), 4u);
    EXPECT_EQ(c.sweep[0].arch, "relu");
    EXPECT_TRUE(c.sweep[0].normalize_decoder);
    EXPECT_FALSE(c.sweep[1].normalize_decoder);
    EXPECT_EQ(c.sweep[2].arch, "topk");
}

TEST(ConfigSweep, EmptyListIsAnError) {
    const std::string m = parse_error(kMinimal + "sae: {k: []}\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "empty list");
}

TEST(ConfigSweep, ListsOutsideSaeAndTrainAreErrors) {
    std::string m = parse_error("data: {path: d, batch_size: [1024, 2048]}\n");
    EXPECT_HAS(m, "data.batch_size");
    EXPECT_HAS(m, "only sae.* and train.* keys can be swept");
    m = parse_error(kMinimal + "backend: [cpu, cuda]\n");
    EXPECT_HAS(m, "only sae.* and train.* keys can be swept");
}

TEST(ConfigSweep, DuplicateListValueIsAnError) {
    const std::string m = parse_error(kMinimal + "sae: {k: [32, 32]}\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "twice");
}

TEST(ConfigSweep, BadValueInsideAListIsReported) {
    const std::string m = parse_error(kMinimal + "sae: {k: [32, 0]}\n");
    EXPECT_HAS(m, "sae.k");
    EXPECT_HAS(m, "got 0");
    EXPECT_HAS(parse_error(kMinimal + "train: {lr: [1e-3, fast]}\n"), "'fast'");
}

TEST(ConfigSweep, DataParallelCannotSweep) {
    const std::string m =
        parse_error(kMinimal + "sae: {k: [1, 2]}\nparallel: {mode: data_parallel}\n");
    EXPECT_HAS(m, "parallel.mode");
}

// ---- ids ---------------------------------------------------------------------------------------

TEST(ConfigIds, ReadableIds) {
    SaeConfig s;
    s.arch = "topk";
    s.expansion = 8;
    s.k = 32;
    EXPECT_EQ(s.id(768), "topk-x8-k32");
    s.n_latents = 6144;
    EXPECT_EQ(s.id(768), "topk-n6144-k32");
    s = SaeConfig{};
    s.arch = "relu";
    s.expansion = 4;
    s.l1_coeff = 5.0;
    EXPECT_EQ(s.id(768), "relu-x4-l1_5");
    s.l1_coeff = 0.5;
    EXPECT_EQ(s.id(768), "relu-x4-l1_0.5");
    s.l1_coeff = 1e-3;
    EXPECT_EQ(s.id(768), "relu-x4-l1_0.001");
}

TEST(ConfigIds, SweepIdsAreUniqueAndOnlyDisambiguateWhenNeeded) {
    Config c = config_parse(kMinimal + "sae: {expansion: [4, 8], k: [32, 64]}\n");
    EXPECT_EQ(sweep_ids(c, 768), (std::vector<std::string>{"topk-x4-k32", "topk-x4-k64",
                                                           "topk-x8-k32", "topk-x8-k64"}));

    c = config_parse(kMinimal +
                     "sae: {k: [32, 64]}\ntrain: {lr: [1e-3, 4e-4], beta2: [0.99, 0.999]}\n");
    const std::vector<std::string> ids = sweep_ids(c, 768);
    ASSERT_EQ(ids.size(), 8u);
    EXPECT_EQ(ids[0], "topk-x8-k32-lr0.001-beta20.99");
    EXPECT_EQ(ids[3], "topk-x8-k32-lr0.0004-beta20.999");
    EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
}

TEST(ConfigIds, SweepIdsOfTheShippedSweepAreUnique) {
    const Config c =
        config_load(std::string(SAETRAIN_TEST_DATA) + "/../../configs/gpt2-small-sweep.yaml");
    const std::vector<std::string> ids = sweep_ids(c, 768);
    EXPECT_EQ(ids.size(), 8u);
    EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
    EXPECT_EQ(ids.front(), "topk-x4-k32");
    EXPECT_EQ(ids.back(), "topk-x32-k64");
}

TEST(ConfigIds, HandBuiltIdenticalPointsStillGetUniqueIds) {
    Config c;
    c.sweep = {SaeConfig{}, SaeConfig{}};
    const std::vector<std::string> ids = sweep_ids(c, 768);
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_NE(ids[0], ids[1]);
    Config single;
    EXPECT_EQ(sweep_ids(single, 768), (std::vector<std::string>{"topk-x8-k32"}));
}

// ---- overrides ---------------------------------------------------------------------------------

TEST(ConfigOverrides, OverrideBeatsFileAndLaterBeatsEarlier) {
    const Config c = config_parse(kMinimal + "sae: {k: 16}\ntrain: {lr: 1e-3}\n",
                                  {"sae.k=64", "train.lr=2e-3", "train.lr=5e-3",
                                   "log.every_steps=9", "backend=cuda", "data.path=other"});
    EXPECT_EQ(c.sae.k, 64);
    EXPECT_DOUBLE_EQ(c.sae.lr, 5e-3);
    EXPECT_EQ(c.log.every_steps, 9);  // section absent from the file
    EXPECT_EQ(c.backend, "cuda");
    EXPECT_EQ(c.data.path, StringList{"other"});
}

TEST(ConfigOverrides, ListOverrideSweeps) {
    const Config c = config_parse(kMinimal + "sae: {k: 16}\n", {"sae.k=[16,32]"});
    ASSERT_EQ(c.sweep.size(), 2u);
    EXPECT_EQ(c.sweep[0].k, 16);
    EXPECT_EQ(c.sweep[1].k, 32);
    // And a scalar override collapses a sweep from the file.
    const Config d = config_parse(kMinimal + "sae: {k: [8, 16]}\n", {"sae.k=12"});
    ASSERT_EQ(d.sweep.size(), 1u);
    EXPECT_EQ(d.sae.k, 12);
}

TEST(ConfigOverrides, OverrideCanSupplyTheRequiredPath) {
    const Config c = config_parse("", {"data.path=/scratch/acts"});
    EXPECT_EQ(c.data.path, StringList{"/scratch/acts"});
}

TEST(ConfigOverrides, MalformedOverridesNameTheOverride) {
    std::string m = parse_error(kMinimal, {"sae.k"});
    EXPECT_HAS(m, "--set sae.k");
    EXPECT_HAS(m, "section.key=value");
    m = parse_error(kMinimal, {"k=3"});
    EXPECT_HAS(m, "--set k=3");
    EXPECT_HAS(m, "did you mean sae.k?");
    m = parse_error(kMinimal, {"sae.expnasion=4"});
    EXPECT_HAS(m, "--set sae.expnasion=4");
    EXPECT_HAS(m, "did you mean sae.expansion?");
    m = parse_error(kMinimal, {"trian.lr=4"});
    EXPECT_HAS(m, "--set trian.lr=4");
    EXPECT_HAS(m, "did you mean train?");
    m = parse_error(kMinimal, {"sae.k=[1,"});
    EXPECT_HAS(m, "--set sae.k=[1,");
}

TEST(ConfigOverrides, BadOverrideValueNamesTheOverride) {
    std::string m = parse_error(kMinimal, {"train.lr=fast"});
    EXPECT_HAS(m, "--set train.lr=fast");
    EXPECT_HAS(m, "expected a number");
    m = parse_error(kMinimal, {"sae.k=0"});
    EXPECT_HAS(m, "--set sae.k=0");
    EXPECT_HAS(m, "sae.k must be >= 1");
}

// ---- round trip --------------------------------------------------------------------------------

TEST(ConfigYaml, RoundTripReproducesTheConfig) {
    const std::string text = R"(
run: {out_dir: "runs/odd: name", seed: 123}
data: {path: "null", batch_size: 256, epochs: 2, max_tokens: 77, dataset: acts}
sae: {arch: [topk, relu], expansion: [4, 16], k: 24, l1_coeff: [0.1, 3]}
train: {lr: [4e-4, 1e-3], lr_decay: [cosine, constant], eps: 1.0e-7, normalize_decoder: false}
parallel: {mode: hybrid, replicas: 2}
backend: cpu
checkpoint: {keep: 5}
)";
    const Config a = config_parse(text);
    ASSERT_EQ(a.sweep.size(), 32u);
    const std::string yaml = config_to_yaml(a);
    const Config b = config_parse(yaml);
    expect_same(a, b);
    // Every key is written out, defaults included.
    for (const char* key : {"out_dir:", "seed:", "shuffle_buffer_rows:", "n_latents:",
                            "lr_min_ratio:", "weight_decay:", "dead_tokens:", "sweep_data:",
                            "backend:", "every_steps:", "keep:", "peak_tflops:"})
        EXPECT_HAS(yaml, key);
    // And its own output is a fixed point.
    EXPECT_EQ(config_to_yaml(b), yaml);
}

TEST(ConfigYaml, DefaultsRoundTripAndLookLikeNumbers) {
    const Config a = config_parse(kMinimal);
    const std::string yaml = config_to_yaml(a);
    expect_same(a, config_parse(yaml));
    EXPECT_HAS(yaml, "lr: 0.0");
    EXPECT_HAS(yaml, "l1_coeff: 5.0");
    EXPECT_HAS(yaml, "normalize_decoder: true");
    EXPECT_HAS(yaml, "eps: 1.0e-08");  // YAML 1.1 readers (PyYAML) need the dot to see a float
}

// ---- data-dependent checks ---------------------------------------------------------------------

TEST(ConfigForData, KLargerThanLatentsNamesBothNumbersAndTheKey) {
    const Config c = config_parse(kMinimal + "sae: {expansion: 2, k: [8, 64]}\n");
    EXPECT_NO_THROW(config_validate_for_data(c, 64));  // 128 latents
    try {
        config_validate_for_data(c, 16);  // 32 latents: k=64 does not fit
        FAIL() << "expected an error";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_HAS(m, "sae.k = 64");
        EXPECT_HAS(m, "32 latents");
        EXPECT_HAS(m, "sae.expansion");
        EXPECT_HAS(m, "topk-x2-k64");
    }
    const Config n = config_parse(kMinimal + "sae: {n_latents: 40, k: 48}\n");
    try {
        config_validate_for_data(n, 16);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "sae.n_latents");
        EXPECT_HAS(e.what(), "48");
        EXPECT_HAS(e.what(), "40");
    }
    // Switch: the experts divide the latents, and k fits in one expert.
    try {
        config_validate_for_data(
            config_parse(kMinimal + "sae: {arch: switch, n_experts: 5, n_latents: 64}\n"), 16);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "sae.n_experts = 5 does not divide the SAE's 64 latents");
    }
    try {
        config_validate_for_data(
            config_parse(kMinimal + "sae: {arch: switch, n_experts: 8, n_latents: 64, k: 16}\n"),
            16);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "sae.k = 16 exceeds the 8 latents of each of the 8 experts");
    }
    // ReLU SAEs have no k constraint.
    EXPECT_NO_THROW(
        config_validate_for_data(config_parse(kMinimal + "sae: {arch: relu, k: 999}\n"), 4));
    EXPECT_THROW(config_validate_for_data(c, 0), Error);
}

TEST(ConfigForData, ABatchLargerThanTheMachinesMemoryNamesTheKey) {
    // 2^24 rows x d_model 2^20 as float32: 64 TiB for one step, more than any host has.
    const Config c = config_parse("data: {path: d, batch_size: 16777216}\n");
    EXPECT_NO_THROW(config_validate_for_data(c, 4));
    try {
        config_validate_for_data(c, int64_t{1} << 20);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "data.batch_size 16777216 x d_model 1048576 needs 65536.0 GiB");
        EXPECT_HAS(e.what(), "lower data.batch_size");
    }
}

// ---- files -------------------------------------------------------------------------------------

class TempFile {
public:
    explicit TempFile(const std::string& text) {
        path_ = (fs::temp_directory_path() /
                 ("saetrain_test_config_" + std::to_string(getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml"))
                    .string();
        std::ofstream(path_) << text;
    }
    ~TempFile() { std::remove(path_.c_str()); }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

TEST(ConfigFiles, SyntaxErrorNamesFileAndLine) {
    TempFile f("data:\n  path: d\nsae: {k: [1, 2}\n");
    try {
        config_load(f.path());
        FAIL() << "expected an error";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_HAS(m, f.path() + ":3:");
        EXPECT_HAS(m, "YAML syntax error");
    }
}

TEST(ConfigFiles, DeepNestingIsNamedNotABadFile) {
    // yaml-cpp stops at 2000 levels with "bad file"; say what is wrong instead.
    const std::string m =
        parse_error("data: " + std::string(5000, '[') + std::string(5000, ']') + "\n");
    EXPECT_HAS(m, "cfg.yaml:1:");
    EXPECT_HAS(m, "YAML nested too deeply for the parser");
    EXPECT_EQ(m.find("bad file"), std::string::npos) << m;
}

// Only one YAML document: a second one (after '---', or content after '...') is refused naming
// its line, not silently ignored; a leading '---' (after directives and comments), a final '...'
// and '---' inside a scalar's text are one document.
TEST(ConfigFiles, SecondYamlDocumentIsRefused) {
    std::string m = parse_error(kMinimal + "sae: {k: 16}\n---\nsae: {k: 32}\n");
    EXPECT_HAS(m, "cfg.yaml:3: a second YAML document");
    m = parse_error(kMinimal + "sae: {k: 16}\n...\n# end\nsae: {k: 32}\n");
    EXPECT_HAS(m, "cfg.yaml:5: a second YAML document");
    m = parse_error(kMinimal + "sae: {k: 16}\n--- {sae: {k: 32}}\r\n");
    EXPECT_HAS(m, "cfg.yaml:3: a second YAML document");
    EXPECT_EQ(config_parse("%YAML 1.2\n# c\n---\n" + kMinimal + "sae: {k: 16}\n...\n").sae.k, 16);
    EXPECT_EQ(config_parse(kMinimal + "sae: {k: 16, arch: 'topk'}  # --- x\n" +
                           "run: {out_dir: 'a---b'}\n")
                  .sae.k,
              16);
    // Linear in the text: 200,000 lines are checked at once (no document is parsed twice).
    std::string many = kMinimal + "sae: {k: 16}\n";
    for (int i = 0; i < 200000; ++i) many += "# a comment line\n";
    EXPECT_EQ(config_parse(many).sae.k, 16);
}

TEST(ConfigFiles, LoadSetsSourceAndAppliesOverrides) {
    TempFile f(kMinimal + "sae: {k: 16}\n");
    const Config c = config_load(f.path(), {"sae.k=20"});
    EXPECT_EQ(c.source, f.path());
    EXPECT_EQ(c.sae.k, 20);
    EXPECT_HAS(parse_error(kMinimal + "sae: {bogus: 1}\n"), "cfg.yaml:2:");
}

TEST(ConfigFiles, MissingFileIsAnError) {
    try {
        config_load("/nonexistent/dir/cfg.yaml");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "/nonexistent/dir/cfg.yaml");
    }
}

TEST(ConfigFiles, EveryShippedConfigParses) {
    const fs::path dir = fs::path(SAETRAIN_TEST_DATA) / ".." / ".." / "configs";
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    int n = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() != ".yaml") continue;
        ++n;
        SCOPED_TRACE(entry.path().string());
        Config c;
        ASSERT_NO_THROW(c = config_load(entry.path().string()));
        EXPECT_NO_THROW(config_validate_for_data(c, 768));
        expect_same(c, config_parse(config_to_yaml(c)));
    }
    EXPECT_GE(n, 3);
}

// train.optimizer: auto is the architecture's choice only while train.lr is unset: a config
// that gives an lr keeps the Adam that lr was tuned for; lr 0 is the chosen optimizer's own, and
// train.lr_decay: auto its schedule (constant for schedule-free signum, cosine for Adam).
TEST(ConfigDefaults, AutoOptimizerIsTheArchitecturesUnlessAnLrIsGiven) {
    const auto resolved = [](const std::string& train) {
        return config_parse(kMinimal + train, {}, "cfg.yaml")
            .sweep.front()
            .with_optimizer_defaults(384);
    };
    SaeConfig c = resolved("sae: {arch: topk, expansion: 16}\n");
    EXPECT_EQ(c.optimizer, "signum");
    EXPECT_EQ(c.lr_decay, "constant");  // schedule-free: the average does the decaying
    EXPECT_NEAR(c.lr, SaeConfig::kSignumLr * std::sqrt(16384.0 / 6144.0), 1e-12);
    EXPECT_NEAR(c.lr, 0.00604, 1e-5);  // the best of MiniLM x16's lr trials (issue 30)
    c = resolved("sae: {arch: topk, expansion: 16}\ntrain: {lr: 4.0e-4}\n");
    EXPECT_EQ(c.optimizer, "adam");
    EXPECT_DOUBLE_EQ(c.lr, 4e-4);
    EXPECT_EQ(c.lr_decay, "cosine");
    c = resolved("sae: {arch: topk}\ntrain: {lr_decay: linear}\n");  // a given decay stays
    EXPECT_EQ(c.optimizer, "signum");
    EXPECT_EQ(c.lr_decay, "linear");
    c = config_parse("data: {path: data/x, target_path: data/y}\nsae: {arch: transcoder}\n", {},
                     "cfg.yaml")
            .sweep.front()
            .with_optimizer_defaults(384);  // not measured with signum: AdamW
    EXPECT_EQ(c.optimizer, "adam");
    EXPECT_DOUBLE_EQ(c.lr, SaeConfig::kAdamLr);
    c = resolved("sae: {arch: jumprelu, expansion: 16}\n");  // signum at the rule's lr
    EXPECT_EQ(c.optimizer, "signum");
    EXPECT_NEAR(c.lr, 0.00604, 1e-5);
    for (const std::string arch : {"batchtopk", "switch", "relu", "gated", "jumprelu",
                                   "matryoshka_batchtopk, matryoshka_prefixes: [128]"})
        EXPECT_EQ(resolved("sae: {arch: " + arch + "}\n").optimizer, "signum") << arch;
    c = resolved("sae: {arch: topk, n_latents: 65536}\ntrain: {optimizer: signum}\n");
    EXPECT_EQ(c.optimizer, "signum");
    EXPECT_NEAR(c.lr, SaeConfig::kSignumLr / 2, 1e-12);  // 4x the latents: half the lr
    // ReLU twice the rule's lr, Gated 1.5 times, both at most 0.025 (arch/common.h,
    // penalized_signum_lr).
    for (const auto& [arch, factor] :
         {std::pair<std::string, double>{"relu", 2.0}, {"gated", 1.5}}) {
        c = resolved("sae: {arch: " + arch + ", n_latents: 65536}\n");
        EXPECT_NEAR(c.lr, factor / 2 * SaeConfig::kSignumLr, 1e-12) << arch;
        c = resolved("sae: {arch: " + arch + ", expansion: 16}\n");
        EXPECT_NEAR(c.lr, factor * 0.00604, 1e-5) << arch;
        c = resolved("sae: {arch: " + arch + ", n_latents: 128}\n");
        EXPECT_DOUBLE_EQ(c.lr, 0.025) << arch;
    }
    c = resolved("sae: {arch: topk}\ntrain: {optimizer: adam}\n");
    EXPECT_DOUBLE_EQ(c.lr, SaeConfig::kAdamLr);
    // Resolving twice changes nothing (config.yaml records the resolved values).
    const SaeConfig twice = c.with_optimizer_defaults(384);
    EXPECT_EQ(twice.optimizer, c.optimizer);
    EXPECT_EQ(twice.lr, c.lr);
}

// An architecture's own default of a shared key (Architecture::key_defaults): Gated weighs AuxK
// at 1/16 where the others keep the key's 1/32, unless the config sets it; --list-keys says so.
TEST(ConfigDefaults, GatedHasItsOwnAuxKWeightUnlessTheConfigSetsOne) {
    const auto auxk = [](const std::string& sae) {
        const SaeConfig c =
            config_parse(kMinimal + sae, {}, "cfg.yaml").sweep.front().with_optimizer_defaults(384);
        return sae_key_text(Config{}, c, "train.auxk_coeff");
    };
    EXPECT_EQ(auxk("sae: {arch: gated}\n"), "0.0625");
    EXPECT_EQ(auxk("sae: {arch: relu}\n"), "0.03125");
    EXPECT_EQ(auxk("sae: {arch: topk}\n"), "0.03125");
    EXPECT_EQ(auxk("sae: {arch: gated}\ntrain: {auxk_coeff: 0.03125}\n"), "0.03125");
    EXPECT_EQ(auxk("sae: {arch: gated}\ntrain: {auxk_coeff: 0}\n"), "0");
    // A sweep over architectures: each point its own.
    const Config sweep = config_parse(kMinimal + "sae: {arch: [gated, topk]}\n", {}, "cfg.yaml");
    ASSERT_EQ(sweep.sweep.size(), 2u);
    EXPECT_EQ(sae_key_text(sweep, sweep.sweep[0].with_optimizer_defaults(384), "train.auxk_coeff"),
              "0.0625");
    EXPECT_EQ(sae_key_text(sweep, sweep.sweep[1].with_optimizer_defaults(384), "train.auxk_coeff"),
              "0.03125");
    for (const ConfigKeyInfo& k : config_keys())
        if (k.name == "train.auxk_coeff") {
            EXPECT_EQ(k.default_text, "0.03125");
            EXPECT_NE(k.doc.find("(gated: 0.0625)"), std::string::npos) << k.doc;
        }
}

TEST(ConfigFiles, QuickstartHasTheDocumentedValues) {
    const Config c =
        config_load(std::string(SAETRAIN_TEST_DATA) + "/../../configs/quickstart.yaml");
    EXPECT_EQ(c.run.out_dir, "runs/quickstart");
    EXPECT_EQ(c.data.path, StringList{"data/quickstart"});
    EXPECT_EQ(c.data.batch_size, 1024);
    EXPECT_EQ(c.data.epochs, 10);
    EXPECT_EQ(c.sae.arch, "topk");
    EXPECT_EQ(c.sae.expansion, 8);
    EXPECT_EQ(c.sae.k, 8);
    EXPECT_DOUBLE_EQ(c.sae.lr, 2e-3);
    EXPECT_EQ(c.sae.dead_tokens, 100000);
    EXPECT_EQ(c.sweep.size(), 1u);
}

}  // namespace
}  // namespace saetrain

// The LR schedule: warmup over warmup_steps (or warmup_fraction of the run), lr held until
// decay_start of the run, then the decay down to lr * lr_min_ratio at the last step;
// decay_start 0 decays from the end of warmup on.
TEST(Schedule, WarmupHoldThenDecay) {
    using namespace saetrain;
    SaeConfig c;
    c.lr = 1.0;
    c.lr_min_ratio = 0.1;
    c.warmup_fraction = 0.1;
    c.decay_start = 0.5;
    c.lr_decay = "linear";
    const int64_t total = 100;
    EXPECT_EQ(warmup_steps_for(c, total), 10);
    EXPECT_DOUBLE_EQ(lr_at(c, 0, total), 0.1);
    EXPECT_DOUBLE_EQ(lr_at(c, 9, total), 1.0);
    EXPECT_DOUBLE_EQ(lr_at(c, 10, total), 1.0);
    EXPECT_DOUBLE_EQ(lr_at(c, 50, total), 1.0);   // held until half the run
    EXPECT_DOUBLE_EQ(lr_at(c, 75, total), 0.55);  // halfway down the linear decay
    EXPECT_DOUBLE_EQ(lr_at(c, 100, total), 0.1);
    c.warmup_steps = 20;  // a step count wins over the fraction
    EXPECT_EQ(warmup_steps_for(c, total), 20);
    EXPECT_DOUBLE_EQ(lr_at(c, 19, total), 1.0);
    c.warmup_steps = 0, c.warmup_fraction = 0, c.decay_start = 0, c.lr_decay = "cosine";
    EXPECT_DOUBLE_EQ(lr_at(c, 0, total), 1.0);
    EXPECT_NEAR(lr_at(c, 50, total), 0.55, 1e-12);  // cosine from the first step
    c.lr_decay = "constant";
    EXPECT_DOUBLE_EQ(lr_at(c, 99, total), 1.0);
}

// The L1 coefficient ramps from 0 over l1_warmup_fraction of the run, or l1_warmup_steps.
TEST(Schedule, L1WarmupRamp) {
    using namespace saetrain;
    SaeConfig c;
    c.l1_coeff = 4.0;
    c.l1_warmup_fraction = 0.2;
    EXPECT_DOUBLE_EQ(l1_at(c, 0, 100), 0.2);  // step 1 of a 20-step ramp
    EXPECT_DOUBLE_EQ(l1_at(c, 9, 100), 2.0);
    EXPECT_DOUBLE_EQ(l1_at(c, 19, 100), 4.0);
    EXPECT_DOUBLE_EQ(l1_at(c, 80, 100), 4.0);
    c.l1_warmup_steps = 4;
    EXPECT_DOUBLE_EQ(l1_at(c, 1, 100), 2.0);
    c.l1_warmup_steps = 0, c.l1_warmup_fraction = 0;
    EXPECT_DOUBLE_EQ(l1_at(c, 0, 100), 4.0);
}

// cosine_restarts follows PyTorch's CosineAnnealingWarmRestarts from the end of the warmup:
// lr_t = lo + (lr - lo)(1 + cos(pi T_cur / T_i)) / 2, T_i = T_0 T_mult^i.
TEST(Schedule, CosineRestartsLikePyTorch) {
    using namespace saetrain;
    SaeConfig c;
    c.lr = 1.0;
    c.lr_min_ratio = 0.0;
    c.warmup_fraction = 0;
    c.lr_decay = "cosine_restarts";
    c.restart_steps = 10;
    c.restart_mult = 2;
    const int64_t total = 1000;
    EXPECT_DOUBLE_EQ(lr_at(c, 0, total), 1.0);
    EXPECT_NEAR(lr_at(c, 5, total), 0.5, 1e-12);   // halfway through T_0 = 10
    EXPECT_DOUBLE_EQ(lr_at(c, 10, total), 1.0);    // restart
    EXPECT_NEAR(lr_at(c, 20, total), 0.5, 1e-12);  // halfway through T_1 = 20
    EXPECT_DOUBLE_EQ(lr_at(c, 30, total), 1.0);    // restart, T_2 = 40
    EXPECT_NEAR(lr_at(c, 40, total), 0.5 * (1 + std::cos(M_PI * 10 / 40)), 1e-12);
    c.restart_mult = 1;
    EXPECT_DOUBLE_EQ(lr_at(c, 1000010, 2000000), 1.0);  // equal cycles, far into the run
    c.warmup_steps = 4;                                 // the cycles start after the warmup
    EXPECT_DOUBLE_EQ(lr_at(c, 3, total), 1.0);
    EXPECT_DOUBLE_EQ(lr_at(c, 14, total), 1.0);
    c.restart_steps = 0;  // default T_0: a quarter of the run
    EXPECT_EQ(restart_steps_for(c, total), 250);
    EXPECT_THROW(config_parse("data: {path: d}\ntrain: {restart_mult: 0.5}\n"), Error);
}

TEST(Config, NormalizeAndBDecInitReachEverySweepPoint) {
    using namespace saetrain;
    const Config c = config_parse(
        "data: {path: d, normalize: expected_average_only_in}\n"
        "sae: {arch: [topk, jumprelu], b_dec_init: geometric_median}\n");
    ASSERT_EQ(c.sweep.size(), 2u);
    for (const SaeConfig& s : c.sweep) {
        EXPECT_EQ(s.normalize, "expected_average_only_in");
        EXPECT_EQ(s.b_dec_init, "geometric_median");
    }
    EXPECT_EQ(config_parse(config_to_yaml(c)).data.normalize, "expected_average_only_in");
    EXPECT_THROW(config_parse("data: {path: d, normalize: unit}\n"), Error);
    EXPECT_THROW(config_parse("data: {path: d}\nsae: {b_dec_init: median}\n"), Error);
}

// ---- the keys' declarations ---------------------------------------------------------------------

namespace saetrain {
namespace {

// Every key is declared once, with a doc line; the architectures' keys (declared beside them,
// arch.h) join their section's architecture keys where config.yaml always listed them (sae's
// after sae.l1_coeff, train's after train.l0_coeff), so the file, a sweep's order and its ids
// stay as they were; a new architecture's keys follow these.
TEST(ConfigKeys, ArchitectureKeysJoinTheTableWhereTheFileListsThem) {
    std::vector<std::string> names;
    for (const ConfigKeyInfo& k : config_keys()) {
        EXPECT_FALSE(k.doc.empty()) << k.name;
        EXPECT_EQ(k.sweepable, k.name.rfind("sae.", 0) == 0 || k.name.rfind("train.", 0) == 0);
        names.push_back(k.name);
    }
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
    auto at = [&](const std::string& key) {
        return static_cast<size_t>(std::find(names.begin(), names.end(), key) - names.begin());
    };
    for (const ArchKeyDecl* k : arch_config_keys()) {
        const bool sae = k->section() == "sae";
        ASSERT_TRUE(sae || k->section() == "train") << k->full();
        EXPECT_GT(at(k->full()), at(sae ? "sae.l1_coeff" : "train.l0_coeff")) << k->full();
        EXPECT_LT(at(k->full()), at(sae ? "sae.b_dec_init" : "train.decorr_coeff")) << k->full();
    }
    const std::vector<std::string> before = {
        "sae.l1_coeff",           "sae.k_aux",
        "sae.jumprelu_bandwidth", "sae.jumprelu_init_threshold",
        "sae.n_experts",          "sae.b_dec_init",
        "train.l0_coeff",         "train.auxk_coeff",
        "train.balance_coeff",    "train.decorr_coeff"};
    for (size_t i = 1; i < before.size(); ++i)
        EXPECT_LT(at(before[i - 1]), at(before[i])) << before[i - 1] << " before " << before[i];
    // Which architectures read a declared key.
    std::map<std::string, ConfigKeyInfo> info;
    for (const ConfigKeyInfo& k : config_keys()) info[k.name] = k;
    EXPECT_EQ(info["sae.n_experts"].declared_by, "switch");
    EXPECT_EQ(info["train.auxk_coeff"].declared_by,
              "relu, topk, batchtopk, jumprelu, gated, switch, matryoshka_batchtopk, transcoder, "
              "skip_transcoder, clt");
    EXPECT_EQ(info["sae.k"].declared_by, "");
    EXPECT_EQ(info["train.balance_coeff"].default_text, "0.1");
}

// The resume check reads each key's flag from its declaration; a key this version does not
// know counts as changing results.
TEST(ConfigKeys, EachDeclarationSaysWhetherItChangesResults) {
    for (const ConfigKeyInfo& k : config_keys())
        EXPECT_EQ(config_key_changes_results(k.name), k.changes_results) << k.name;
    for (const char* same :
         {"run.out_dir", "log.every_steps", "log.peak_tflops", "checkpoint.every_steps",
          "checkpoint.keep", "data.stage_dir", "data.prefetch_bytes", "backend",
          "parallel.timeout_s", "gpu.gemm", "gpu.deterministic", "data.eval_path",
          "log.eval_every_steps", "parallel.latent_shards"})
        EXPECT_FALSE(config_key_changes_results(same)) << same;
    for (const char* changes : {"train.lr", "sae.k", "sae.n_experts", "train.balance_coeff",
                                "sae.k_aux", "data.read_bytes", "train.no_such_key"})
        EXPECT_TRUE(config_key_changes_results(changes)) << changes;
}

// Architecture keys read through their declaration: the default until set, set as a file's
// value would be (an integer where a number is expected), refused when the type is wrong.
TEST(ConfigKeys, SetTakesAnyKeyAsTheFileWould) {
    SaeConfig c;
    EXPECT_TRUE(config_parse(kMinimal).sae.arch_values.empty());  // every one its default
    c.set("sae.n_experts", 4).set("train.balance_coeff", 1).set("train.lr", 0.5);
    EXPECT_EQ(std::get<int64_t>(c.arch_values.at("sae.n_experts")), 4);
    EXPECT_EQ(std::get<double>(c.arch_values.at("train.balance_coeff")), 1.0);
    EXPECT_EQ(c.lr, 0.5);
    c.set("sae.arch", "switch");
    EXPECT_EQ(c.arch, "switch");
    EXPECT_THROW(c.set("sae.n_experts", 1.5), Error);
    EXPECT_THROW(c.set("sae.arch", "nope"), Error);
    EXPECT_THROW(c.set("sae.no_such_key", 1), Error);
    EXPECT_THROW(c.set("log.every_steps", 1), Error);  // not an SAE's key
    // Parsed, swept and written out like any key.
    const Config p = config_parse(kMinimal + "sae: {arch: switch, n_experts: [2, 4]}\n");
    ASSERT_EQ(p.sweep.size(), 2u);
    EXPECT_EQ(std::get<int64_t>(p.sweep[1].arch_values.at("sae.n_experts")), 4);
    const std::string yaml = config_to_yaml(p);
    EXPECT_HAS(yaml, "n_experts: [2, 4]");
    EXPECT_HAS(yaml, "balance_coeff: 0.1");
    EXPECT_HAS(yaml, "k_aux: 0");
}

}  // namespace
}  // namespace saetrain

TEST(Printable, ControlCharactersBecomeEscapesOnOneLine) {
    using saetrain::printable;
    EXPECT_EQ(printable("runs/a\x1b[31mred\nnext\x7f"), "runs/a\\x1b[31mred\\x0anext\\x7f");
    EXPECT_EQ(printable("caf\xc3\xa9 ok"), "caf\xc3\xa9 ok");  // UTF-8 is kept
}
