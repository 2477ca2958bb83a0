// server.h — sae-serve: a REST + WebSocket service over a runs root (Boost.Beast on one Asio
// thread).
//
//   GET  /                               the live page (page.html, self-contained)
//   GET  /api/runs                       every run: state, progress, ETA
//   GET  /api/runs/ID                    one run: resolved config, state and exit line, latest
//                                        metrics, held-out figures and quality gates per SAE
//   GET  /api/runs/ID/metrics?since=S    metrics.jsonl's lines of the complete steps after S
//   WS   /api/runs/ID/stream?since=S     the same, then every new step and state change live
//   POST /api/runs?ranks=N[&id=ID][&overwrite=1]   launch the YAML config in the body
//   POST /api/runs/ID/stop               stop signal: a checkpoint, exit 75
//   POST /api/runs/ID/resume[?ranks=N]   launch a stopped or failed run again
//   GET  /runs/ID/report/[FILE]          the run's sae-report page (made when missing,
//                                        ?refresh=1 makes it again)
// Every request needs the token (auth.h); every error is a status and {"error": "one line"}.
// The run directories are only read (polled every `poll_s`), never locked or written, so the
// server neither waits on nor slows a run; runs are launched detached (launcher.h) and
// outlive it.
#pragma once

#include <csignal>
#include <cstddef>
#include <string>

namespace saetrain::serve {

struct ServeOptions {
    std::string root;                // the runs root
    std::string host = "127.0.0.1";  // the address to listen on
    int port = 8765;                 // 0: any free port (printed)
    std::string token_file;          // "": ROOT/.sae-serve/token
    std::string saetrain;            // the saetrain binary runs are launched with
    std::string self;                // this program (the run wrapper)
    std::string sae_report;          // tools/sae-report, for /runs/ID/report/
    std::string launcher;            // launcher.h's template ("": the default)
    int max_ranks = 1;               // the most ranks a launched run may have
    size_t max_body = 256 << 10;     // request body (a config) limit in bytes
    int max_clients = 256;           // open connections (HTTP and WebSocket) at once
    int stop_signal = SIGUSR1;       // what POST .../stop sends
    double poll_s = 0.25;            // how often the run directories are read
    std::string cwd;                 // the launched commands' working directory
};

// Serves until SIGINT or SIGTERM; returns the exit code. Prints one line when listening:
// "sae-serve: listening on http://HOST:PORT/ (runs root ROOT, token in FILE)". Throws Error
// for a start-up failure (root, token, address in use, a second server on the root).
int serve_run(const ServeOptions& opt);

}  // namespace saetrain::serve
