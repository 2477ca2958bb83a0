// run_dir.h — what saetrain keeps in run.out_dir besides its outputs: the lock that keeps a
// second run out, and the clean-up of what a killed run left behind.
#pragma once

#include <cstdint>
#include <string>

namespace saetrain {

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

// What a killed run can leave behind in out_dir, never read and never removed otherwise:
// temp files of atomic writes (sae/<id>/*.h5.tmp.<pid>, checkpoints/*.commit.tmp), named by pid
// so that every SIGKILL during a write would leave one more; and checkpoint pairs with no commit
// marker (written but not committed, or rotated out while their deletion was deferred, see
// Checkpointer::commit). Only rank 0 calls this, holding out_dir's lock, before the barrier that
// lets anyone write.
void remove_stale_files(const std::string& out_dir);

// On resume, metrics logged after the checkpoint will be logged again: drops the lines of the
// metrics.jsonl at `path` whose step is after `step`.
void drop_metrics_after(const std::string& path, int64_t step);

}  // namespace saetrain
