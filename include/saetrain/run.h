// run.h — a training run, as saetrain runs it: start up (the config, the datasets as rank 0
// validated them, the rank grid, the backend, the rows this rank reads), connect (the grid's
// communicators and the stream of batches), open run.out_dir, resume or start fresh, train, and
// write the outputs (sae/<id>/final.h5, summary.csv, COMPLETE). Every rank calls it; only rank 0
// writes the run's files and the console. apps/saetrain.cpp parses the command line, starts MPI
// and calls it; docs/architecture.md follows a batch through the layers below.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "saetrain/comm.h"
#include "saetrain/run_dir.h"

namespace saetrain {

// Exit codes (docs/commands.md, "Signals and exit codes"): 0 done, 1 error, 2 usage error, 75
// stopped by SIGTERM, SIGUSR1 or Ctrl-C after committing a checkpoint (EX_TEMPFAIL: run the same
// command again, or let Slurm's --requeue do it); a second Ctrl-C ends the process by SIGINT (130).
constexpr int kExitStopped = 75;

// What the command line asks of a run.
struct RunRequest {
    std::string config;             // the YAML file
    std::vector<std::string> sets;  // --set section.key=value overrides, in order
    bool overwrite = false;         // start over instead of resuming
    bool allow_config_change = false;
    int threads = 0;  // CPU threads per rank (0: the rank's cores / ranks on its node)
    // Every step on `threads`, even while other processes take the rank's cores (by default a
    // rank runs on the cores they leave it: cores.h, CoreShare).
    bool fixed_threads = false;
};

// Trains the run on every rank of `world` (MPI started, stop signals installed) and returns the
// exit code. Errors of start-up are agreed: the lowest failing rank prints its line and every
// rank returns 1. A failure after start-up throws (the caller aborts the job). `state`: set on
// rank 0 once training starts (out_dir/run.json); the caller records the exit in it.
int run_training(const RunRequest& request, Communicator& world,
                 std::unique_ptr<RunStateFile>& state);

// --dry-run: reads the config with its --set overrides, checks every key and value and the job
// size (`ranks`, 0: the one the config asks for), and says what a run would train, without MPI,
// data or out_dir. Returns 0, or 1 with the error line a run would print.
int run_dry(const RunRequest& request, int ranks);

}  // namespace saetrain
