// launcher.h — how sae-serve starts, stops and outlives a run.
//
// A run is started as `LAUNCHER SAETRAIN CONFIG [--overwrite]` under a small wrapper: the
// sae-serve binary itself in its wrapper mode (`sae-serve --run-wrapper STATE_DIR -- ARGV...`,
// wrapper_main), started by launch_spawn in a session of its own (setsid: a Ctrl-C or a hang-up
// of the server's terminal reaches no run), its output appended to STATE_DIR/console.log, its
// working directory the server's. The wrapper forks the launcher, passes on the stop signals it
// receives (SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP) to it, waits for it and writes its exit
// status to STATE_DIR/exit (JSON, atomically), then exits with the same code. So a run never
// depends on the server: killing sae-serve leaves the wrapper and the run going, and a run that
// ends while no server is up leaves its exit status on disk for the next one.
//
// The launcher is a template (launch_command): words split at spaces (no shell), `{ranks}`
// replaced by the job size, `{saetrain}` and `{config}` by the binary and the config; without
// `{config}` the binary and the config are appended. The default is `mpirun --oversubscribe -np
// {ranks}` for more than one rank and none (saetrain alone) for one. The process is also given
// SAETRAIN=<binary> in its environment, which the slurm/ scripts use.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace saetrain::serve {

constexpr char kDefaultMultiRankLauncher[] = "mpirun --oversubscribe -np {ranks}";

// The command line of a run. `tmpl`: the launcher template ("" : the default above);
// `extra`: arguments after the config (--overwrite). Throws Error on a template with an unknown
// {placeholder}.
std::vector<std::string> launch_command(const std::string& tmpl, const std::string& saetrain,
                                        const std::string& config, int ranks,
                                        const std::vector<std::string>& extra);

// Starts `self --run-wrapper state_dir -- argv...` in a new session with `cwd` as its working
// directory, stdin from /dev/null, stdout and stderr appended to state_dir/console.log, no other
// descriptor of the server, default signal dispositions, and the server's environment plus
// `env` ("NAME=value"). Returns the wrapper's pid; throws Error naming the command on failure.
pid_t launch_spawn(const std::string& self, const std::string& state_dir,
                   const std::vector<std::string>& argv, const std::string& cwd,
                   const std::vector<std::string>& env);

// The wrapper (see above). Returns its exit code: the launcher's, or 128 + the signal that
// ended it, or 127 when it could not be started.
int wrapper_main(const std::string& state_dir, const std::vector<std::string>& argv);

// What the wrapper wrote to state_dir/exit: the launcher's exit code (128 + signal when a
// signal ended it); nothing when the file is missing or unreadable.
std::optional<int> wrapper_exit_code(int state_dir_fd);

// A process's start time (clock ticks after boot, /proc/PID/stat field 22): with the pid it names
// one process, never a later one that reuses the pid. 0 when there is no such process.
uint64_t process_start_time(pid_t pid);
// Whether `pid` runs and is not a zombie, and (when start_time > 0) is the process started then.
bool process_alive(pid_t pid, uint64_t start_time);
// /proc/PID/comm ("" when gone).
std::string process_name(pid_t pid);
// Whether `pid` holds an flock on the file `name` in the directory `dir_fd` (a symlink there is
// not followed), by /proc/locks: what proves a process is the run of a directory (saetrain's rank
// 0 holds its .saetrain.lock for the whole run), where a pid written in a file proves nothing.
bool process_holds_flock(pid_t pid, int dir_fd, const std::string& name);
// The same over /proc/locks's text (for the tests).
bool locks_text_has_flock(const std::string& locks, pid_t pid, dev_t dev, ino_t ino);

// "SIGTERM" for a name such as "TERM" or "SIGTERM" (or a number); throws Error otherwise.
int signal_from_name(const std::string& name);
// "SIGKILL" for 9, "signal 64" for one without a name here.
std::string signal_name(int sig);

}  // namespace saetrain::serve
