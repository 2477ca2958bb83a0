// checkpoint_parts.h — a latent-sharded SAE's checkpoint, written by every latent shard at once.
//
// At step S of SAE <id> split into N latent shards (parallel.latent_shards = N > 1), latent shard K
// of replica 0 writes its own part in sae/<id>/, no tensor data sent to another rank:
//   checkpoint-S.part-K-of-N.h5        its latents' rows of every per-latent tensor, in the
//                                      layout of an SAE file (checkpoint.h): W_enc [d, n/N] (its
//                                      columns), W_dec [n/N, d], b_enc [n/N], the architecture's
//                                      per-latent parameters; part 0 also every tensor of no
//                                      latent (b_dec, a skip transcoder's W_skip, the
//                                      architecture's buffers, activation_scale)
//   checkpoint-S.part-K-of-N.state.h5  the same rows of adam_m and adam_v (each segment of the
//                                      parameter layout in turn, part 0 also those of no latent),
//                                      since_fired [n/N], the reader cursors, step, tokens,
//                                      iteration
// each file with its own checksum attribute (XXH3-64 over its tensors, the state's header too).
// Once every part is written, latent shard 0 writes
//   checkpoint-S.manifest.json         {"format": "saetrain checkpoint parts", "version": 1,
//                                      step, tokens, iteration, d_model, n_latents, parts,
//                                      "weights": [{name, shape (the whole SAE's), latent_axis
//                                      (-1: part 0 holds it whole), per_latent (elements per
//                                      latent along that axis)}], "moments": [{name, size,
//                                      per_latent}] (adam_m's segments), "files": [{part,
//                                      first_latent, latents, weights: {file, bytes, checksum},
//                                      state: {file, bytes, checksum}}]}
// and the checkpoint counts once rank 0 has written checkpoints/step-S.commit (checkpointer.h).
// An unsharded SAE writes the pair of train_state.h instead.
//
// CheckpointParts reads the parts back as the whole SAE's tensors (a TensorSource): a block of
// latents maps to reads from the parts that hold them, so M latent shards resume from N parts
// for any M; verify(K) checks part K's two files against their checksums and the manifest's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "saetrain/checkpoint.h"   // defines: SaeMeta
#include "saetrain/train_state.h"  // defines: TrainState, TensorSource

namespace saetrain {

class SaeTrainer;

// Paths of step S's part K of N and of its manifest in an SAE directory.
std::string checkpoint_part_path(const std::string& sae_dir, int64_t step, int64_t part,
                                 int64_t parts);
std::string checkpoint_part_state_path(const std::string& sae_dir, int64_t step, int64_t part,
                                       int64_t parts);
std::string checkpoint_manifest_path(const std::string& sae_dir, int64_t step);
// The step of a checkpoint file by its name (the pair, a part or the manifest); -1 for any
// other name, temp files included.
int64_t checkpoint_file_step(const std::string& file_name);

// Collective over the trainer's latent shards (replica 0's of a latent-sharded SAE): each writes
// its part atomically, then the first writes the manifest once every part is written. `header`:
// step, tokens, iteration and cursors. Throws on a latent shard whose part failed, and on the
// first latent shard when any part failed (no manifest then), after the collective.
void write_checkpoint_parts(const SaeTrainer& t, const std::string& sae_dir, const SaeMeta& meta,
                            const TrainState& header);

// A checkpoint's parts opened by their manifest, read in pieces; a part's files are opened when
// first read. Errors name the file.
class CheckpointParts final : public TensorSource {
public:
    explicit CheckpointParts(const std::string& manifest_path);
    ~CheckpointParts() override;
    CheckpointParts(const CheckpointParts&) = delete;
    CheckpointParts& operator=(const CheckpointParts&) = delete;

    SaeMeta meta() const;       // part 0's attributes (step, tokens, config, ...)
    TrainState header() const;  // part 0's step, tokens, iteration and cursors (no tensors)
    int64_t parts() const;
    int64_t first_latent(int64_t part) const;
    int64_t latents(int64_t part) const;
    // Reads part `part`'s two files through and compares each one's checksum with its own
    // attribute and the manifest's (and its size with the manifest's); throws naming the file
    // that is damaged, torn or not the manifest's.
    void verify(int64_t part) const;

    std::optional<std::vector<int64_t>> shape(const std::string& name) const override;
    void read(const std::string& name, const std::vector<int64_t>& start,
              const std::vector<int64_t>& count, float* out) const override;
    void read(const std::string& name, int64_t start, int64_t count, int64_t* out) const override;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace saetrain
