// stop_signals.h — saetrain's stop signals: SIGTERM (Slurm's time limit), SIGUSR1 (Slurm's
// --signal; what Open MPI's mpirun forwards to every rank) and SIGINT (Ctrl-C) ask the job to
// stop after the current step. The ranks agree at the next iteration (train_loop.h), commit a
// checkpoint and exit 75. A second SIGINT (0.1 s or more after the first: a wrapper such as GNU
// timeout passes the terminal's on, so one Ctrl-C can arrive twice) stops the process at once:
// one line says which committed checkpoint the next run continues from, and the process ends by
// SIGINT (a shell sees 130), abandoning a checkpoint write under way (its temp file is removed at
// the next start).
//
// Everything the handlers do is async-signal-safe: they set atomics and write(2) lines that were
// prepared beforehand; only the step number is formatted in the handler.
#pragma once

#include <cstdint>
#include <string>

namespace saetrain {

// Installs the handlers (after MPI_Init, so they are saetrain's, not the MPI library's).
void stop_signals_install();
// Whether any stop signal has arrived (read once per iteration; the ranks agree on it).
bool stop_signal_received();
// Whether one arrived before training started (stop_signals_training): then no step would be
// lost, and a wait for S3 data during start-up is abandoned (s3_set_stop_check) instead of
// holding the process for the store's retries.
bool stop_signal_before_training();
// This process's rank: rank 0 alone acknowledges a first Ctrl-C (srun sends it to every task).
void stop_signals_set_rank(int rank);
// Training is about to start: a second Ctrl-C from now on names `checkpoints_dir` and the newest
// committed step, `committed` (-1: none yet), updated by stop_signals_committed after each
// commit. Before this call it says that training had not started.
void stop_signals_training(const std::string& checkpoints_dir, int64_t committed);
void stop_signals_committed(int64_t step);

}  // namespace saetrain
