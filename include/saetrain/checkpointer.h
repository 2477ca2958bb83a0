// checkpointer.h — committed checkpoints for a run of many ranks, and resume from them.
//
// Every checkpoint.every_steps iterations (and at a stop or the end) each SAE's replica 0 writes
// its pair of files (train_state.h) on a background thread while training continues (at most one
// write is in flight); a latent-sharded SAE's latent shards of replica 0 each write their own part
// at once, on the training thread, and the first then the manifest (checkpoint_parts.h). The
// training loop asks every iteration, in its per-iteration agreement, whether any rank's write is
// still under way; at the first iteration at which none is, every rank calls commit_when_written:
// all ranks agree the writes succeeded, and only then rank 0 writes checkpoints/step-S.commit. So a
// checkpoint is committed within a step of its write finishing, and a hard kill loses at most one
// checkpoint.every_steps interval (plus the write's time). A checkpoint still uncommitted at the
// next save, or at finish, is waited for and committed there (every rank, the same point). Resume
// considers committed steps only, newest first, and uses the first one that verifies and that
// every rank could read: a torn or damaged checkpoint falls back to the one before. Replica 0 of
// each latent shard reads only its latents (from the parts, whatever latent shard count wrote
// them, or from the pair) and broadcasts them to the other replicas, so the files are read once
// however many replicas resume, and no rank holds more than its own latents. Each part is
// verified by the replica-0 rank whose latents include its first one (a pair by the SAE's first
// writer, in one sequential pass). The newest checkpoint.keep committed checkpoints are kept;
// the SAE's first writer deletes every file of a step rotated out.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "saetrain/checkpoint.h"  // defines: SaeMeta
#include "saetrain/comm.h"
#include "saetrain/trainer.h"

namespace saetrain {

struct ResumePoint {
    int64_t step = 0, iteration = 0;
    int64_t epoch = 0, offset = 0;  // this rank's reader cursor
};

class Checkpointer {
public:
    // world: every rank; replicas: this SAE's replicas (replica 0 writes); sae_dir: out/sae/<id>;
    // shard: this rank's latent shard (each latent shard of replica 0 writes its part; latent
    // shard 0 the manifest, and it rotates the SAE's files).
    Checkpointer(Communicator& world, Communicator& replicas, std::string out_dir,
                 std::string sae_dir, SaeMeta meta, int64_t keep, int shard = 0);
    ~Checkpointer();
    Checkpointer(const Checkpointer&) = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;

    // Collective over the world. Commits the previous checkpoint if it is still pending (waiting
    // for its write; every rank agrees it succeeded), then snapshots the trainer and writes this
    // one (in the background unless `wait`, which also commits it before returning).
    void save(SaeTrainer& trainer, int64_t iteration, int64_t epoch, int64_t offset, bool wait);
    // Collective: waits for the write in flight and commits it.
    void finish();
    // Whether this rank's write of the pending checkpoint is still under way (false when nothing
    // is pending, when it has finished, and on a rank that writes nothing). Local, no collective.
    bool write_in_flight() const;
    // Collective over the world, called by every rank at the same point with the same
    // `in_flight_anywhere` (an agreement over write_in_flight(), e.g. the training loop's
    // per-iteration all-reduce): when no rank's write is in flight, commits the pending checkpoint
    // as save() would. Nothing pending, or a write still under way somewhere: nothing, no
    // collective (every rank knows the same: save() is collective).
    void commit_when_written(bool in_flight_anywhere);
    // The newest committed step, or -1 when none is (this rank's view; every rank's agrees after
    // each commit).
    int64_t newest_committed() const { return committed_.empty() ? -1 : committed_.back(); }
    // Called on this rank after every commit, with the step committed.
    void on_commit(std::function<void(int64_t)> f) { on_commit_ = std::move(f); }

    // Committed steps in out_dir, newest first (rank-local file listing).
    static std::vector<int64_t> committed_steps(const std::string& out_dir);
    // Collective. Restores `trainer` from the newest committed checkpoint every rank can load;
    // nullopt when there is none. `config_yaml` is the current resolved config: a checkpoint
    // written under a config that differs in keys that change the result is refused with the
    // keys listed, unless allow_config_change.
    std::optional<ResumePoint> resume(SaeTrainer& trainer, const std::string& config_yaml,
                                      bool allow_config_change);
    // After a resume that found nothing: why this rank could not use the newest committed
    // checkpoint ("" when it could, or when there was none).
    const std::string& newest_failure() const { return newest_failure_; }

private:
    void join_and_commit();
    void commit(int64_t step, int64_t iteration);
    void remove_files(const std::vector<int64_t>& steps) const;  // this SAE's files at `steps`
    // resume's pieces, collective: whether any rank failed to load the checkpoint at `step`
    // (`error` non-empty here; the lowest such rank prints a warning), and the refusal of a
    // checkpoint written under a config that changes the result.
    bool agree_failed(const std::string& error, int64_t step);
    void check_resumable(const std::string& old_yaml, const std::string& config_yaml,
                         bool allow_config_change, int64_t step);

    Communicator& world_;
    Communicator& replicas_;
    bool writes_;  // replica 0, latent shard 0: this rank writes the SAE's files
    std::string out_dir_, sae_dir_;
    SaeMeta meta_;
    int64_t keep_;
    std::thread writer_;
    std::atomic<bool> writing_{false};  // writer_ is writing the pending checkpoint's files
    std::exception_ptr write_error_;
    int64_t pending_step_ = -1, pending_iteration_ = 0;
    std::vector<int64_t> committed_;  // ascending
    std::vector<int64_t> doomed_;     // rotated out; files deleted at the next commit (rank != 0)
    std::function<void(int64_t)> on_commit_;
    std::string newest_failure_;
};

// Keys whose values differ between two resolved configs (YAML from config_to_yaml), ignoring
// those that cannot change the trained weights (logging, checkpoint cadence, staging: each key's
// declaration says, config_key_changes_results in config.h).
std::vector<std::string> config_result_differences(const std::string& old_yaml,
                                                   const std::string& new_yaml);

// A digest of the same keys' values ("xxh3:" and 16 hex digits): equal for two configs whose
// result-changing keys agree as written. COMPLETE carries the finished run's (run_dir.h).
std::string config_result_digest(const std::string& yaml);

}  // namespace saetrain
