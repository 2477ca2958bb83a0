// train_state.h — everything exact resume needs beyond an SAE's weights.
//
// A checkpoint at step S of an unsharded SAE <id> is two files in sae/<id>/, written by replica 0:
//   checkpoint-S.h5        the weights, in the layout of every SAE file (checkpoint.h)
//   checkpoint-S.state.h5  Adam moments, dead-latent counters, every replica's reader cursor,
//                          the loop iteration, and a checksum over both files' tensors
// (a latent-sharded SAE writes one part per latent shard and a manifest instead,
// checkpoint_parts.h; its pairs written before the parts still load), and the checkpoint only
// counts once rank 0 has written checkpoints/step-S.commit, after every SAE's files were complete
// (see checkpointer.h). Loading verifies the checksum, so a torn or damaged pair is rejected and
// the previous committed checkpoint is used instead.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "saetrain/checkpoint.h"

namespace saetrain {

struct TrainState {
    int64_t step = 0, tokens = 0;
    int64_t iteration = 0;  // training-loop iterations done (log/checkpoint cadence)
    // The optimizer's two buffers, flat, in the trainer's parameter layout (in the file:
    // adam_m and adam_v, whichever optimizer wrote them).
    std::vector<float> opt_m, opt_v;
    std::vector<int64_t> since_fired;  // [n_latents] tokens since each latent last fired
    std::vector<int64_t> cursors;      // [replicas x 2]: (epoch, offset) of each replica's reader
};

// The checksum a state file stores: XXH3-64 over the weights' and the state's tensors, in a
// fixed order ("xxh3:" and 16 hex digits; files written before it hold FNV-1a 64, which
// train_state_read still verifies).
std::string train_state_checksum(const SaeWeights& w, const TrainState& s);

// Writes `path` atomically (temp file in the same directory, fsync, rename, fsync of the
// directory). `w` is only read to checksum it with the state.
void train_state_write(const std::string& path, const SaeWeights& w, const TrainState& s);
// Reads the state and checks the checksum against `w` (the weights file of the same
// checkpoint); throws Error naming the file on any mismatch or damage.
TrainState train_state_read(const std::string& path, const SaeWeights& w);

class SaeTrainer;

// A latent-sharded trainer's whole SAE in one file or pair: final.h5 (state_path empty, `folded`:
// fold_activation_scale's), or the pair its checkpoints were before the parts; the same files as
// sae_write_h5 + train_state_write of trainer_weights() and trainer_state(), but gathered from
// trainer_gather_weights/state (trainer_io.h): no rank holds the whole SAE. Collective over the
// trainer's latent shards; the first latent shard
// (`writes`) writes both files atomically, the others send their parts. `header`: step, tokens,
// iteration and cursors. A failure is thrown on the writer once every latent shard has finished the
// gather.
void write_gathered(const SaeTrainer& t, bool writes, const std::string& weights_path,
                    const std::string& state_path, const SaeMeta& meta, const TrainState& header,
                    bool folded);

// Pieces of a checkpoint's tensors, by the names trainer_weight_tensors() and
// trainer_state_tensors() give them, in the whole SAE's file shapes: what trainer_read_part
// (trainer_io.h) reads its latents from. In memory (the whole SAE: TensorsInMemory), from a pair,
// block by block (CheckpointFiles, below), or from a latent-sharded checkpoint's parts
// (CheckpointParts, checkpoint_parts.h), so a latent shard reads only its latents.
class TensorSource {
public:
    virtual ~TensorSource() = default;
    // The tensor's shape; nullopt when the checkpoint has no tensor of that name.
    virtual std::optional<std::vector<int64_t>> shape(const std::string& name) const = 0;
    // The block [start, start + count) of each dimension, row-major, into `out`.
    virtual void read(const std::string& name, const std::vector<int64_t>& start,
                      const std::vector<int64_t>& count, float* out) const = 0;
    virtual void read(const std::string& name, int64_t start, int64_t count,
                      int64_t* out) const = 0;  // since_fired
};

// A whole SAE's weights and state as a TensorSource (they must outlive it).
class TensorsInMemory final : public TensorSource {
public:
    TensorsInMemory(const SaeWeights& w, const TrainState& s) : w_(w), s_(s) {}
    std::optional<std::vector<int64_t>> shape(const std::string& name) const override;
    void read(const std::string& name, const std::vector<int64_t>& start,
              const std::vector<int64_t>& count, float* out) const override;
    void read(const std::string& name, int64_t start, int64_t count, int64_t* out) const override;

private:
    const std::vector<float>* find(const std::string& name) const;
    const SaeWeights& w_;
    const TrainState& s_;
};

// A checkpoint pair opened to be read in pieces: a latent shard's resume reads only its rows
// (trainer_read_part), and one rank checks the checksum in one pass, chunk by chunk, so no
// rank holds the whole SAE. Errors name the file.
class CheckpointFiles final : public TensorSource {
public:
    CheckpointFiles(std::string weights_path, std::string state_path);
    ~CheckpointFiles() override;
    CheckpointFiles(const CheckpointFiles&) = delete;
    CheckpointFiles& operator=(const CheckpointFiles&) = delete;

    // The weights file's attributes (step, tokens, config, ...).
    SaeMeta meta() const;
    // step, tokens, iteration and the reader cursors (no tensors).
    TrainState header() const;
    // Reads both files through in checksum order and compares the state file's checksum;
    // throws when the pair is damaged or does not belong together.
    void verify() const;

    std::optional<std::vector<int64_t>> shape(const std::string& name) const override;
    void read(const std::string& name, const std::vector<int64_t>& start,
              const std::vector<int64_t>& count, float* out) const override;
    void read(const std::string& name, int64_t start, int64_t count, int64_t* out) const override;

private:
    struct Files;
    std::string weights_path_, state_path_;
    std::unique_ptr<Files> files_;
};

// Paths of step S's pair in an SAE directory.
std::string checkpoint_weights_path(const std::string& sae_dir, int64_t step);
std::string checkpoint_state_path(const std::string& sae_dir, int64_t step);

}  // namespace saetrain
