// List-valued config keys (ConfigValue's IntList, config.h), on the one such key the registry
// has, sae.matryoshka_prefixes: a YAML list is one value and a list of lists a sweep, from the
// file and from --set; config.yaml writes them back so that they parse to the same sweep; the
// resume check names a changed list; sweep ids and summary.csv show them readably.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "saetrain/checkpointer.h"  // defines: config_result_differences
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/metrics.h"  // defines: summary_write

using namespace saetrain;

namespace {

const std::string kBase =
    "data: {path: data/x}\n"
    "sae: {arch: matryoshka_batchtopk, matryoshka_prefixes: [128, 512]}\n";

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
        config_parse(text, overrides, "cfg.yaml");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

IntList prefixes(const SaeConfig& c) {
    return std::get<IntList>(c.arch_values.at("sae.matryoshka_prefixes"));
}

TEST(ConfigLists, AListIsOneValue) {
    const Config c = config_parse(kBase);
    ASSERT_EQ(c.sweep.size(), 1u);
    EXPECT_EQ(prefixes(c.sae), (IntList{128, 512}));
    EXPECT_EQ(sae_key_text(c, c.sae, "sae.matryoshka_prefixes"), "[128, 512]");
    // Block style reads the same; a single scalar is a list of one; nothing is the empty list.
    const Config block = config_parse(
        "data: {path: data/x}\nsae:\n  arch: matryoshka_batchtopk\n  matryoshka_prefixes:\n"
        "    - 128\n    - 512\n");
    EXPECT_EQ(prefixes(block.sae), (IntList{128, 512}));
    EXPECT_EQ(prefixes(config_parse(kBase, {"sae.matryoshka_prefixes=64"}).sae), (IntList{64}));
    const Config none = config_parse("data: {path: data/x}\nsae: {matryoshka_prefixes: }\n");
    EXPECT_EQ(prefixes(none.sae), IntList{});
}

TEST(ConfigLists, AListOfListsIsASweepCrossedWithTheOthers) {
    const Config c = config_parse(
        "data: {path: data/x}\n"
        "sae: {arch: matryoshka_batchtopk, k: [16, 32], matryoshka_prefixes: [[64], [64, 256]]}\n");
    ASSERT_EQ(c.sweep.size(), 4u);
    // Table order, the last key fastest: sae.k before sae.matryoshka_prefixes.
    EXPECT_EQ(c.sweep[0].k, 16);
    EXPECT_EQ(prefixes(c.sweep[0]), (IntList{64}));
    EXPECT_EQ(prefixes(c.sweep[1]), (IntList{64, 256}));
    EXPECT_EQ(c.sweep[2].k, 32);
    EXPECT_EQ(prefixes(c.sweep[3]), (IntList{64, 256}));
}

TEST(ConfigLists, SetOverridesAndSweepsAList) {
    const Config one = config_parse(kBase, {"sae.matryoshka_prefixes=[64,256]"});
    ASSERT_EQ(one.sweep.size(), 1u);
    EXPECT_EQ(prefixes(one.sae), (IntList{64, 256}));
    const Config two = config_parse(kBase, {"sae.matryoshka_prefixes=[[64],[256,1024]]"});
    ASSERT_EQ(two.sweep.size(), 2u);
    EXPECT_EQ(prefixes(two.sweep[1]), (IntList{256, 1024}));
    // SaeConfig::set takes the list as the file would, and refuses a scalar's type.
    SaeConfig s;
    s.set("sae.matryoshka_prefixes", IntList{8, 16});
    EXPECT_EQ(prefixes(s), (IntList{8, 16}));
    EXPECT_THROW(s.set("sae.matryoshka_prefixes", 8), Error);
}

TEST(ConfigLists, BadListsNameTheKeyOnOneLine) {
    auto expect_error = [](const std::string& text, const std::vector<std::string>& ov,
                           const std::string& want) {
        const std::string e = parse_error(text, ov);
        EXPECT_NE(e.find(want), std::string::npos) << "got: " << e;
        EXPECT_NE(e.find("sae.matryoshka_prefixes"), std::string::npos) << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    };
    expect_error(kBase, {"sae.matryoshka_prefixes=[512,128]"},
                 "must list latent counts > 0 in strictly increasing order (got [512, 128])");
    expect_error(kBase, {"sae.matryoshka_prefixes=[128,128]"}, "strictly increasing");
    expect_error(kBase, {"sae.matryoshka_prefixes=[0,128]"}, "(got [0, 128])");
    expect_error(kBase, {"sae.matryoshka_prefixes=[-4]"}, "> 0");
    expect_error(kBase, {"sae.matryoshka_prefixes=[128,abc]"},
                 "expected a list of integers, got 'abc'");
    expect_error(kBase, {"sae.matryoshka_prefixes=[[128],256]"}, "lists only");
    expect_error(kBase, {"sae.matryoshka_prefixes=[[[128]]]"}, "nested deeper");
    expect_error(kBase, {"sae.matryoshka_prefixes=[[128],[128]]"}, "the list has [128] twice");
    expect_error(kBase, {"sae.matryoshka_prefixes={a: 1}"}, "got a mapping");
    expect_error("data: {path: data/x}\nsae: {arch: matryoshka_batchtopk}\n", {},
                 "is required for sae.arch matryoshka_batchtopk");
    // Against the latent count, once d_model is known.
    const Config c = config_parse(kBase, {"sae.expansion=1"});
    try {
        config_validate_for_data(c, 256);
        ADD_FAILURE() << "a prefix above the latents was accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("sae.matryoshka_prefixes: 512 exceeds the SAE's 256 latents"),
                  std::string::npos)
            << m;
    }
    EXPECT_NO_THROW(config_validate_for_data(c, 512));  // the whole dictionary may be listed
}

TEST(ConfigLists, ConfigYamlRoundTripsValuesAndSweeps) {
    for (const std::string& ov : {std::string("sae.matryoshka_prefixes=[128,512]"),
                                  std::string("sae.matryoshka_prefixes=[[64],[64,256],[128]]")}) {
        const Config a = config_parse(kBase, {ov, "sae.k=[16,32]"});
        const std::string yaml = config_to_yaml(a);
        const Config b = config_parse(yaml);
        ASSERT_EQ(a.sweep.size(), b.sweep.size()) << yaml;
        for (size_t i = 0; i < a.sweep.size(); ++i) {
            EXPECT_EQ(prefixes(a.sweep[i]), prefixes(b.sweep[i])) << ov << " point " << i;
            EXPECT_EQ(a.sweep[i].k, b.sweep[i].k);
        }
        EXPECT_EQ(config_to_yaml(b), yaml);
    }
    // One line, flow style: what the resume check's reader of config.yaml expects.
    const std::string yaml = config_to_yaml(config_parse(kBase));
    EXPECT_NE(yaml.find("  matryoshka_prefixes: [128, 512]\n"), std::string::npos) << yaml;
    const std::string defaults = config_to_yaml(config_parse("data: {path: data/x}\n"));
    EXPECT_NE(defaults.find("  matryoshka_prefixes: []\n"), std::string::npos) << defaults;
}

TEST(ConfigLists, ResumeRefusesAChangedListAndNamesIt) {
    const std::string base = config_to_yaml(config_parse(kBase));
    EXPECT_TRUE(config_result_differences(base, base).empty());
    const auto d = config_result_differences(
        base, config_to_yaml(config_parse(kBase, {"sae.matryoshka_prefixes=[128,256]"})));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], "sae.matryoshka_prefixes: [128, 512] -> [128, 256]");
    // A run from before the key existed had the default, the empty list.
    std::string old = base;
    old.erase(old.find("  matryoshka_prefixes: [128, 512]\n"),
              std::string("  matryoshka_prefixes: [128, 512]\n").size());
    const auto e = config_result_differences(old, base);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e[0], "sae.matryoshka_prefixes: [] -> [128, 512]");
}

TEST(ConfigLists, SweepIdsNameTheListAsAPathComponent) {
    const Config c = config_parse(kBase, {"sae.matryoshka_prefixes=[[64],[64,256]]"});
    const std::vector<std::string> ids = sweep_ids(c, 64);
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_EQ(ids[0], "matryoshka_batchtopk-x8-k32-matryoshka_prefixes_64");
    EXPECT_EQ(ids[1], "matryoshka_batchtopk-x8-k32-matryoshka_prefixes_64_256");
}

TEST(ConfigLists, SummaryCsvQuotesACellHoldingCommas) {
    const std::string path =
        (std::filesystem::temp_directory_path() / "saetrain_test_config_lists.csv").string();
    summary_write(path, {"sae", "matryoshka_prefixes", "note"},
                  {{{"sae", "a"}, {"matryoshka_prefixes", "[128, 512]"}, {"note", "say \"hi\""}}});
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), "sae,matryoshka_prefixes,note\na,\"[128, 512]\",\"say \"\"hi\"\"\"\n");
    std::filesystem::remove(path);
}

}  // namespace
