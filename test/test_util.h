// test_util.h — helpers shared by the test programs: a private temp directory, running a
// command line the way a user would, the message of an expected saetrain::Error, and seeded
// random inputs.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "saetrain/error.h"

namespace saetrain::testing {

// n draws of N(0, scale^2) from a seeded generator: the same values on every run.
inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
}

// A fresh directory under the system temp dir, removed with everything in it. The pid and a
// random suffix keep concurrent runs of the suites (several build trees, CI) apart.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& prefix = "saetrain_test") {
        std::random_device rd;
        path = std::filesystem::temp_directory_path() /
               (prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct CommandResult {
    int code;         // exit status; -1 when killed by a signal or not started
    std::string out;  // stdout and stderr, merged
};

// Runs `cmd` through the shell, stderr merged into stdout.
inline CommandResult run_command(const std::string& cmd) {
    std::array<char, 4096> buf{};
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return {-1, "popen failed"};
    while (fgets(buf.data(), static_cast<int>(buf.size()), p)) out += buf.data();
    const int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Message of the saetrain::Error thrown by f, or "" (and a test failure) when none is thrown.
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected saetrain::Error";
    return "";
}

}  // namespace saetrain::testing
