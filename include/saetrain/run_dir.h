// run_dir.h — what saetrain keeps in run.out_dir besides its outputs: the lock that keeps a
// second run out, the clean-up of what a killed run left behind, and run.json, the record of
// whether the run is still going and how it ended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/config.h"

namespace saetrain {

// Refuses an out_dir that saetrain must not write into, before anything is created there: the
// root or the home directory (whatever --overwrite says), a path that is not a directory, and a
// non-empty directory that no saetrain run made (it has neither the lock file every run creates
// first nor run.json): its files are someone's, and a run would remove or overwrite some
// (config.yaml, sae/, tb/, ...). Throws Error naming out_dir and one of the foreign entries.
void check_out_dir_is_ours(const std::string& out_dir);

// An advisory lock on out_dir (flock on out_dir/.saetrain.lock), held by rank 0 for the whole
// run: a second run on the same out_dir refuses to start, and a run that was killed leaves no
// lock behind (the kernel drops it with the process), only the file, which blocks nothing.
// Creates out_dir; throws Error naming it when it cannot be created, locked, or is in use.
class OutDirLock {
public:
    explicit OutDirLock(const std::string& out_dir);
    ~OutDirLock();
    OutDirLock(const OutDirLock&) = delete;
    OutDirLock& operator=(const OutDirLock&) = delete;

private:
    int fd_ = -1;
};

// out_dir/config.yaml (the resolved config), written atomically: a temp file renamed onto it,
// so a symlink planted at that name is replaced, never written through.
void write_run_config(const std::string& out_dir, const std::string& yaml);

// What a killed run can leave behind in out_dir, never read and never removed otherwise:
// temp files of atomic writes (sae/<id>/*.h5.tmp.<pid>, checkpoints/*.commit.tmp, and in out_dir
// itself config.yaml, run.json, COMPLETE and summary.csv's .tmp.<pid>), named by pid
// so that every SIGKILL during a write would leave one more; and checkpoint files (pairs, parts
// and manifests, checkpoint_file_step) with no commit marker (written but not committed, or rotated
// out while their deletion was deferred, see Checkpointer::commit). Only rank 0 calls this, holding
// out_dir's lock, before the barrier that lets anyone write.
void remove_stale_files(const std::string& out_dir);

// On resume, metrics logged after the checkpoint will be logged again: drops the lines of the
// metrics.jsonl at `path` whose step is after `step`.
void drop_metrics_after(const std::string& path, int64_t step);

// out_dir/COMPLETE, the last file a finished run writes (rank 0, atomically, after summary.csv
// and every final.h5), says which run finished:
//   {"format": "saetrain-complete-1", "steps": 1000, "total_steps": 1000,
//    "config_digest": "xxh3:..."}
// steps: the optimizer steps applied (those of the final checkpoint), total_steps: the run's
// planned steps, config_digest: config_result_digest (checkpointer.h) of the config it trained,
// which is out_dir/config.yaml.
void write_complete_marker(const std::string& out_dir, int64_t steps, int64_t total_steps,
                           const std::string& config_yaml);

// The config.yaml of the finished run out_dir holds, when out_dir/COMPLETE is that run's marker:
// a regular file that parses as write_complete_marker's, whose digest is that of
// out_dir/config.yaml and whose step count is the newest committed checkpoint's (when any is
// committed). Otherwise nothing, and `why_not` says why, e.g. "its config_digest xxh3:... is
// not that of .../config.yaml (another run's marker)". A marker of the old format (the step
// count alone) carries no identity and is not taken as one either.
std::optional<std::string> finished_run_config(const std::string& out_dir, std::string* why_not);

// What run.json says about the run besides its state: written when training starts.
struct RunRecord {
    std::string version;  // SAETRAIN_VERSION
    std::string backend;  // rank 0's backend name
    int ranks = 1, hosts = 1;
    int64_t total_steps = 0;         // optimizer steps of the whole run
    int64_t tokens_per_step = 0;     // data.batch_size x replicas: the rows of one SAE's step
    int64_t resumed_from_step = -1;  // < 0: a fresh start
    std::vector<std::pair<std::string, SaeConfig>> saes;  // id, sweep point
};

// out_dir/run.json, written by rank 0 (atomically): when training starts,
//   {"state": "running", "exit_code": null, "pid", "host", "started" (UTC, ISO 8601),
//    "version", "backend", "ranks", "hosts", "total_steps", "tokens_per_step",
//    "resumed_from_step", "saes": {id: {"arch", "lr": the resolved schedule of lr_at
//    (schedule.h): lr, warmup_steps, lr_decay, decay_start, lr_min_ratio, restart_steps,
//    restart_mult}}}
// and again when the process ends: "state" complete (exit 0), stopped (75: a signal, resumable)
// or failed (any other code, with "message": the error line), "exit_code" and "ended". A
// process killed outright (SIGKILL, node loss, a job aborted for another rank's failure) leaves
// "running" with a pid that is gone: sae-report tells the two apart on the host that ran it.
class RunStateFile {
public:
    RunStateFile(std::string out_dir, const RunRecord& record);
    // Records the exit; never throws (the process is ending: a write error is only printed).
    void end(int exit_code, const std::string& message = "") noexcept;

private:
    void write() const;
    std::string path_;
    std::string json_;  // the record, as serialized nlohmann::json text
};

}  // namespace saetrain
