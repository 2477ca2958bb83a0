// test_fuzz_regressions — every fuzz corpus input and every minimized crash found by the fuzzers
// (test/fuzz/corpus/<target>/, test/fuzz/regressions/<target>/) replayed through the same
// entry points as the libFuzzer targets (test/fuzz/fuzz_entry.h), in the normal build: each
// input must be accepted or rejected with a saetrain::Error, never crash or throw anything
// else. A finding's file under regressions/ fails here until the library is fixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_entry.h"  // defines: config_one, shard_one, checkpoint_one, safetensors_one

namespace fs = std::filesystem;
using saetrain::fuzz::Outcome;

namespace {

using Entry = Outcome (*)(const uint8_t*, size_t);

std::vector<fs::path> inputs_of(const std::string& target) {
    std::vector<fs::path> files;
    for (const char* kind : {"corpus", "regressions"}) {
        const fs::path dir = fs::path(SAETRAIN_FUZZ_DIR) / kind / target;
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        for (const auto& e : fs::directory_iterator(dir))
            if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    return files;
}

void replay(const std::string& target, Entry entry) {
    const std::vector<fs::path> files = inputs_of(target);
    ASSERT_FALSE(files.empty()) << "no inputs for " << target << " under " << SAETRAIN_FUZZ_DIR;
    int accepted = 0, rejected = 0;
    for (const fs::path& p : files) {
        SCOPED_TRACE(p.string());
        std::ifstream in(p, std::ios::binary);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
        try {
            const Outcome o = entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
            (o == Outcome::accepted ? accepted : rejected)++;
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not a saetrain::Error: " << e.what();
        } catch (...) {
            ADD_FAILURE() << "threw something that is not a std::exception";
        }
    }
    std::printf("%s: %zu inputs, %d accepted, %d rejected with saetrain::Error\n", target.c_str(),
                files.size(), accepted, rejected);
}

}  // namespace

TEST(FuzzRegressions, Config) { replay("config", saetrain::fuzz::config_one); }
TEST(FuzzRegressions, Shard) { replay("shard", saetrain::fuzz::shard_one); }
TEST(FuzzRegressions, Checkpoint) { replay("checkpoint", saetrain::fuzz::checkpoint_one); }
TEST(FuzzRegressions, Safetensors) { replay("safetensors", saetrain::fuzz::safetensors_one); }
