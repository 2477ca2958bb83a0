// sae-serve — a REST + WebSocket service over a directory of saetrain runs: watch every run live
// (the page at /, or any WebSocket client), launch configs, stop and resume runs.
//
//   sae-serve --root RUNS_DIR [--host 127.0.0.1] [--port 8765] [--token-file FILE] ...
//
// Reads top-down: parse the command line, fill in the programs it launches, serve (server.h).
// `sae-serve --run-wrapper DIR -- COMMAND...` is the wrapper every launched run runs under
// (launcher.h); users never type it.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "app_cli.h"                  // defines: cli_parse (--version, usage errors: exit 2)
#include "saetrain/error.h"           // defines: saetrain::Error, printable
#include "saetrain/serve/launcher.h"  // defines: wrapper_main, signal_from_name
#include "saetrain/serve/server.h"    // defines: ServeOptions, serve_run

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

std::string self_path() {
    char buf[PATH_MAX] = {};
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "sae-serve";
}

int cores() {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 4 && std::strcmp(argv[1], "--run-wrapper") == 0 && std::strcmp(argv[3], "--") == 0)
        return serve::wrapper_main(argv[2], std::vector<std::string>(argv + 4, argv + argc));

    serve::ServeOptions opt;
    opt.self = self_path();
    const fs::path bin = fs::path(opt.self).parent_path();
    opt.max_ranks = cores();
    std::string stop_signal = "USR1";
    CLI::App app{"sae-serve: watch, launch, stop and resume saetrain runs over HTTP and WebSocket"};
    app.add_option("--root", opt.root, "the runs root: every directory in it is a run (its id)")
        ->required();
    app.add_option("--host", opt.host,
                   "the address to listen on (another than 127.0.0.1 lets "
                   "other machines connect: prefer an SSH tunnel)")
        ->capture_default_str();
    app.add_option("--port", opt.port, "the port (0: any free one, printed)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    app.add_option("--token-file", opt.token_file,
                   "the bearer token's file (default RUNS_DIR/.sae-serve/token, made with mode "
                   "0600 at the first start)");
    app.add_option("--launcher", opt.launcher,
                   "how runs are launched: a command template with {ranks} (and optionally "
                   "{saetrain}, {config}), e.g. \"srun -n {ranks}\" (default: \"mpirun "
                   "--oversubscribe -np {ranks}\" for more than one rank, saetrain alone for one)");
    app.add_option("--max-ranks", opt.max_ranks,
                   "the most ranks a launched run may have (default: this machine's cores)")
        ->check(CLI::PositiveNumber);
    app.add_option("--max-body", opt.max_body,
                   "the largest request body, a config, in bytes (larger: 413)")
        ->check(CLI::Range(size_t{1024}, size_t{64} << 20))
        ->capture_default_str();
    app.add_option("--max-clients", opt.max_clients,
                   "open connections at once, HTTP and WebSocket (more are closed)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--stop-signal", stop_signal,
                   "what POST /api/runs/ID/stop sends: USR1 (saetrain's stop request, which "
                   "mpirun and srun pass on to every rank) or TERM, INT")
        ->capture_default_str();
    app.add_option("--saetrain", opt.saetrain,
                   "the saetrain binary runs are launched with (default: the one beside "
                   "sae-serve)");
    app.add_option("--sae-report", opt.sae_report,
                   "sae-report, which makes a run's report page (default: the one beside "
                   "sae-serve)");
    if (const int code = cli_parse(app, "sae-serve",
                                   "sae-serve --root RUNS_DIR [--host 127.0.0.1] [--port 8765] "
                                   "[--token-file FILE] [--launcher TEMPLATE] [--max-ranks N]",
                                   argc, argv);
        code >= 0)
        return code;
    try {
        opt.stop_signal = serve::signal_from_name(stop_signal);
        if (opt.saetrain.empty()) opt.saetrain = (bin / "saetrain").string();
        if (opt.sae_report.empty()) opt.sae_report = (bin / "sae-report").string();
        opt.saetrain = fs::absolute(opt.saetrain).string();
        opt.sae_report = fs::absolute(opt.sae_report).string();
        SAE_ENFORCE(::access(opt.saetrain.c_str(), X_OK) == 0,
                    "--saetrain {}: not an executable file", printable(opt.saetrain));
        opt.cwd = fs::current_path().string();
        // Fails at once on a bad template rather than at the first launch.
        serve::launch_command(opt.launcher, opt.saetrain, "CONFIG", 2, {});
        if (opt.host != "127.0.0.1" && opt.host != "::1")
            std::fprintf(stderr,
                         "sae-serve: warning: listening on %s: whoever reaches it and holds the "
                         "token can launch runs, and HTTP is not encrypted; an SSH tunnel to "
                         "127.0.0.1 is safer (docs/serve.md)\n",
                         printable(opt.host).c_str());
        return serve::serve_run(opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sae-serve: error: %s\n", printable(e.what()).c_str());
        return 1;
    }
}
