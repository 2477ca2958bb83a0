// run_status.h — one run as sae-serve reports it: its state, worked out from what is on disk,
// and its figures (latest metrics per SAE, held-out figures, quality gates, ETA).
//
// Everything comes from files, so a restarted server knows every run again:
//   ROOT/ID/run.json, COMPLETE, summary.csv, config.yaml, metrics.jsonl   (saetrain's)
//   ROOT/.sae-serve/runs/ID/launch.json   how the server launched the run: when, the command, the
//                                         ranks, the wrapper's pid and start time, a stop request
//   ROOT/.sae-serve/runs/ID/exit          the wrapper's record of the command's exit status
//   ROOT/.sae-serve/runs/ID/console.log   the command's output (saetrain's error or stop line)
// A run started by hand (no launch.json) is followed the same way from run.json, its pid
// checked on this host.
//
// States: queued (launched, not training yet), running (while any process of the run is there,
// even after run.json says it ended), stopping (a stop was sent and the process still runs),
// stopped (exit 75: a checkpoint is committed; resume continues it),
// complete, failed (with the exit line: saetrain's error, or how the process ended), and
// unknown (a directory with no run.json and no launch record: a run of an older saetrain, or
// one that never started training).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "saetrain/serve/metrics_tail.h"
#include "saetrain/serve/runs_root.h"

namespace saetrain::serve {

// launch.json.
struct LaunchRecord {
    int64_t launched_ns = 0;  // CLOCK_REALTIME when the server launched it
    int ranks = 1;
    std::vector<std::string> command;
    pid_t wrapper_pid = 0;
    uint64_t wrapper_start = 0;     // process_start_time(wrapper_pid) at the launch
    int64_t stop_requested_ns = 0;  // when a stop was sent for this launch (0: none)
    std::string to_json() const;
    static std::optional<LaunchRecord> from_json(const std::string& text);
};

// What a run's state is worked out from (each read from disk by RunWatch).
struct StateInputs {
    bool launched = false;      // a launch record exists
    bool launch_newer = false;  // ... and it is newer than run.json (or there is no run.json)
    bool wrapper_alive = false;
    std::optional<int> wrapper_exit;
    pid_t wrapper_pid = 0;
    bool stop_requested = false;
    std::optional<std::string> run_json_state;  // running | complete | stopped | failed
    std::optional<int> run_json_exit;
    std::string run_json_message;       // its error message, for failed
    pid_t run_pid = 0;                  // run.json's pid
    std::optional<bool> run_pid_alive;  // a saetrain on this host; nothing: another host
    bool complete_marker = false;
    std::string console_line;  // the launch's saetrain error or stop line, else its last line
};

struct RunState {
    std::string state;
    std::optional<int> exit_code;
    std::string exit_line;
    bool active() const { return state == "queued" || state == "running" || state == "stopping"; }
    bool operator==(const RunState& o) const {
        return state == o.state && exit_code == o.exit_code && exit_line == o.exit_line;
    }
};

// The rules above, as a table a test can check without processes.
RunState state_derive(const StateInputs& in);

// The line of a launch's console output that says how it ended: its first "saetrain: error"
// line after the last launch's start, else its last "saetrain: stopped" line, else its last
// non-empty line that is not the wrapper's own.
std::string console_exit_line(const std::string& console_tail);

class RunWatch {
public:
    RunWatch(const RunsRoot& root, std::string id);
    const std::string& id() const { return id_; }

    struct Changes {
        MetricsTail::Update metrics;
        bool state_changed = false;
    };
    // Reads what changed on disk since the last poll (stat first: unchanged files are not read).
    Changes poll();
    // The files and the state only (not the metrics: what poll reports stays for the next poll).
    void refresh_state();

    const RunState& state() const { return state_; }
    const std::optional<LaunchRecord>& launch() const { return launch_; }
    // Records a launch (or a stop request) in launch.json and takes it into account at once.
    void set_launch(const LaunchRecord& rec);
    // A stop was sent to a run started by hand (kept in memory only).
    void note_stop_requested();
    // run.json's pid when it is a saetrain process running on this host (0 otherwise).
    pid_t local_saetrain_pid() const;
    // The run's resolved config: ROOT/ID/config.yaml, else the one the server launched it with.
    std::string config_text() const;
    // The job size to resume with: the last launch's, else run.json's.
    int ranks() const;

    const MetricsTail* metrics() const { return tail_.get(); }
    // /api/runs's entry, GET /api/runs/ID, and the stream's state message.
    nlohmann::ordered_json summary() const;
    nlohmann::ordered_json detail() const;
    std::string state_message() const;

    // ROOT/.sae-serve/runs/ID (created when missing, mode 0700); throws Error.
    std::string state_dir_path() const;
    int state_dir_fd();

private:
    struct Cached {
        uint64_t ino = 0;
        int64_t size = -1, mtime_ns = 0;
        bool present = false;
    };
    bool refresh(int dir_fd, const std::string& name, Cached& c) const;
    void open_dirs();
    void read_run_json();
    void read_summary();
    void read_launch();
    StateInputs state_inputs();

    const RunsRoot& root_;
    std::string id_;
    Fd dir_;   // ROOT/ID, once it exists
    Fd sdir_;  // ROOT/.sae-serve/runs/ID, once it exists
    std::unique_ptr<MetricsTail> tail_;
    Cached run_json_c_, summary_c_, launch_c_, complete_c_, exit_c_, console_c_;
    nlohmann::ordered_json run_json_;  // null until read
    int64_t run_json_mtime_ns_ = 0;
    std::vector<std::pair<std::string, nlohmann::ordered_json>> summary_;  // sae, row
    std::optional<LaunchRecord> launch_;
    std::optional<int> wrapper_exit_;
    int64_t hand_stop_ns_ = 0;
    RunState state_;
    RunState reported_;  // the state the last poll reported
    std::string console_line_;
};

}  // namespace saetrain::serve
