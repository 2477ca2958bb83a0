// app_cli.h — what every program's command line shares (saetrain, sae-synth, sae-inspect,
// sae-export, sae-perfmodel, sae-iobench): --version, and usage errors that read the same way.
//
// A usage error (no arguments, an unknown option, a bad option value) prints two lines on
// stderr, "PROGRAM: error: WHAT" and "usage: PROGRAM ...", and exits 2 (as getopt-based tools
// and Python's argparse do), so a script can tell it from a failed run (1) or a stopped one (75).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace saetrain {

constexpr int kExitUsage = 2;

// "PROGRAM VERSION (git COMMIT)" and "build: TYPE, CUDA on|off, NCCL on|off, native on|off": the
// project version (CMake), the commit the tree was configured at, and the build's options.
std::string version_text(const std::string& program);

// Adds --version to `app` and parses argv. Returns -1 when the program goes on (0 with
// SAETRAIN_PARSE_ONLY=1 in the environment: the line parsed, nothing runs); otherwise the
// exit code, after printing what it was asked for: --help or --version on stdout (0), nothing
// more after an option whose callback did the work and threw CLI::Success (0), or a usage
// error on stderr (kExitUsage) with `usage`, the one-line synopsis after "usage: ".
int cli_parse(CLI::App& app, const std::string& program, const std::string& usage, int argc,
              char** argv);

}  // namespace saetrain
