// run_parts.h — the pieces of a training run (run.h) that its source files share: what a rank
// sets up (Setup), what connects it to the others (Connections), and the steps run_training
// calls in order. Private to src/run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "saetrain/backend.h"        // defines: Backend
#include "saetrain/checkpoint.h"     // defines: SaeMeta
#include "saetrain/config.h"         // defines: Config
#include "saetrain/data_split.h"     // defines: DataSplit
#include "saetrain/dtype.h"          // defines: dtype_size
#include "saetrain/fault.h"          // defines: Fault
#include "saetrain/loader.h"         // defines: ShardBatchSource
#include "saetrain/mpi_world.h"      // defines: NodePlacement
#include "saetrain/rank_grid.h"      // defines: RankGrid, GridComms
#include "saetrain/report.h"         // defines: SaeSummary
#include "saetrain/run.h"            // defines: RunRequest
#include "saetrain/run_dir.h"        // defines: OutDirLock, RunRecord
#include "saetrain/shards.h"         // defines: DatasetInfo
#include "saetrain/shared_source.h"  // defines: SharedBatchSource, BroadcastBatchSource
#include "saetrain/train_loop.h"     // defines: SaeTrainer, LoopResult

namespace saetrain::run_parts {

namespace fs = std::filesystem;

struct Setup {
    std::unique_ptr<OutDirLock> lock;  // rank 0: held until the process ends
    Config cfg;
    RankGrid grid;      // the job's configs x replicas x latent shards
    RankCoords coords;  // this rank's place in it
    DatasetInfo data;   // data.path (a CLT's: its first layer's)
    // Transcoders: data.target_path, read row for row beside `data` (else empty: no shards).
    DatasetInfo target;
    // A CLT's other layers' inputs and targets (data.path[1:] and data.target_path[1:]; empty
    // otherwise), read row for row beside `data` and `target`.
    std::vector<DatasetInfo> more_inputs, more_targets;
    DataSplit split;  // the rows this rank reads and holds out
    std::vector<std::string> ids;
    std::unique_ptr<Backend> backend;
    std::string backend_note;
    std::unique_ptr<ShardBatchSource> local;  // this rank's slice (null: a latent shard > 0)
    // Held-out rows: this replica's share of them, [split.eval_mine.size(), d_model], on its
    // first latent shard (empty elsewhere).
    std::vector<float> eval_x;
    // The datasets a row is read from: data, and the target for a transcoder; a CLT's rows are
    // every layer's input, then every layer's target.
    std::vector<DatasetInfo> parts() const {
        if (target.shards.empty()) return {data};
        std::vector<DatasetInfo> p = {data};
        p.insert(p.end(), more_inputs.begin(), more_inputs.end());
        p.push_back(target);
        p.insert(p.end(), more_targets.begin(), more_targets.end());
        return p;
    }
    // The SAEs' d_model: the input's width (a CLT's: its layers' widths summed).
    int64_t model_d() const {
        return data.d_model * (1 + static_cast<int64_t>(more_inputs.size()));
    }
    // Values in one row as read: the parts' widths summed.
    int64_t row_width() const {
        int64_t w = 0;
        for (const DatasetInfo& p : parts()) w += p.d_model;
        return w;
    }
    // Bytes of one row as stored (every part's values at its type).
    int64_t row_bytes() const {
        int64_t b = 0;
        for (const DatasetInfo& p : parts()) b += p.d_model * dtype_size(p.dtype);
        return b;
    }
    // The reader's shuffle buffer in rows: data.shuffle_buffer_rows, or as many rows as
    // data.shuffle_buffer_bytes holds (at least one).
    int64_t shuffle_rows() const {
        const int64_t bytes = cfg.data.shuffle_buffer_bytes;
        return bytes > 0 ? std::max<int64_t>(1, bytes / std::max<int64_t>(row_bytes(), 1))
                         : cfg.data.shuffle_buffer_rows;
    }
    int64_t eval_rows() const { return split.eval_all.size(); }  // 0: no evaluation
    int threads = 1;
    bool resume = false;    // out_dir has committed checkpoints
    bool complete = false;  // out_dir holds a finished run
    const SaeConfig& sae() const { return cfg.sweep[static_cast<size_t>(coords.config)]; }
    const std::string& id() const { return ids[static_cast<size_t>(coords.config)]; }
    fs::path out() const { return cfg.run.out_dir; }
    // Where this rank's reader is (nowhere on a latent shard that receives its batches).
    ReaderCursor cursor() const { return local ? local->cursor() : ReaderCursor{}; }
};

struct Connections {
    GridComms groups;          // the replicas (gradients), the latent shards, the shared stream
    LatentShard latent_shard;  // this rank's part of the SAE (count 1: all)
    std::unique_ptr<SharedBatchSource> shared;
    std::unique_ptr<BroadcastBatchSource> from_reader;  // latent shards: the first one reads
    BatchSource* source = nullptr;                      // where this rank's batches come from
    int64_t steps = 0;                                  // optimizer steps of the run
    Communicator& grads() { return *groups.replicas; }  // the replicas of this rank's SAE
};

// --- start-up and connect (startup.cpp) ----------------------------------------------------------
// Every rank reads the config; rank 0 alone lists and validates the shards and broadcasts what
// it found (one metadata pass over a parallel file system per job, not one per rank); then
// every rank sets up locally (its loader opens only the shards of its own slice). Returns
// nothing when any rank failed (the lowest failing rank has said why).
std::optional<Setup> start_up(const RunRequest& request, Communicator& world,
                              const NodePlacement& place, Fault& fault);
// Every communicator of this rank (RankGrid::connect: each group on the backend agrees on its
// kind, comm_choice.h; then the job agrees that every group got one), where its batches come
// from, and the run's length. Nothing when a group could not agree (the lowest failing rank said
// why).
std::optional<Connections> connect(Setup& s, Communicator& world, const NodePlacement& place);
// One line per node: ranks, cores, threads (`adapts`: fewer while other processes take the
// cores, CoreShare). Returns the number of nodes (on rank 0).
int print_placement(Communicator& world, const NodePlacement& place, int threads, bool adapts);
// What `--overwrite` would delete in `out`, for the refusals that offer it: "--overwrite would
// delete its N committed checkpoint(s) (the newest at step S), its final weights and its metrics
// to start over".
std::string overwrite_deletes(const fs::path& out);

// --- run.out_dir and the outputs (outputs.cpp) ---------------------------------------------------
// A fresh start removes only what saetrain writes; anything else stays (rank 0).
void prepare_out_dir(const Setup& s);
// The run's data, its steps and the warnings its length calls for (rank 0).
void print_banner(const Setup& s, int world_size, int64_t steps);
// What a checkpoint or final.h5 says of the SAE.
SaeMeta sae_meta(const Setup& s, const SaeTrainer& t);
// This rank's SAE as the summary reports it. The quality gates: on the held-out rows when there
// are any, else the end of training.
SaeSummary summarize(const Setup& s, const LoopResult& res, SaeTrainer& trainer);
// sae/<id>/final.h5 on the raw activations (data.normalize's scale folded into the weights),
// its feature-density histogram, and the recovery of planted features when the data has them
// (the decoder's: a transcoder's are the target's).
void write_sae(const Setup& s, SaeTrainer& trainer, SaeSummary& mine);
// summary.csv's config columns: arch, n_latents, the keys any architecture reads (blank in the
// rows of architectures that do not read them: the same columns in every run), lr.
void config_columns(const Setup& s, std::vector<std::string>& names,
                    std::vector<std::map<std::string, std::string>>& rows);
// run.json's record of this run (run_dir.h): written by rank 0 once training is about to start.
RunRecord run_record(const Setup& s, int ranks, int hosts, int64_t steps, int64_t resumed_step);

}  // namespace saetrain::run_parts
