// train_state.h — everything exact resume needs beyond an SAE's weights.
//
// A checkpoint at step S of SAE <id> is two files in sae/<id>/, written by replica 0 of the SAE:
//   checkpoint-S.h5        the weights, in the layout of every SAE file (checkpoint.h)
//   checkpoint-S.state.h5  Adam moments, dead-latent counters, every replica's reader cursor,
//                          the loop iteration, and a checksum over both files' tensors
// and the checkpoint only counts once rank 0 has written checkpoints/step-S.commit, after every
// SAE's files were complete (see commit.h). Loading verifies the checksum, so a torn or damaged
// pair is rejected and the previous committed checkpoint is used instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "saetrain/checkpoint.h"

namespace saetrain {

struct TrainState {
    int64_t step = 0, tokens = 0;
    int64_t iteration = 0;              // training-loop iterations done (log/checkpoint cadence)
    std::vector<float> adam_m, adam_v;  // flat, in the trainer's parameter layout
    std::vector<int64_t> since_fired;   // [n_latents] tokens since each latent last fired
    std::vector<int64_t> cursors;       // [replicas x 2]: (epoch, offset) of each replica's reader
};

// FNV-1a 64 over the weights' and the state's tensors, in a fixed order.
uint64_t train_state_checksum(const SaeWeights& w, const TrainState& s);

// Writes `path` atomically (temp file in the same directory, fsync, rename, fsync of the
// directory). `w` is only read to checksum it with the state.
void train_state_write(const std::string& path, const SaeWeights& w, const TrainState& s);
// Reads the state and checks the checksum against `w` (the weights file of the same
// checkpoint); throws Error naming the file on any mismatch or damage.
TrainState train_state_read(const std::string& path, const SaeWeights& w);

class SaeTrainer;

// A latent-sharded trainer's checkpoint pair (state_path empty: only the weights, as final.h5
// with `folded`: fold_activation_scale's), the same files as sae_write_h5 + train_state_write
// of weights() and state(), but streamed from SaeTrainer::stream_weights/stream_state: no rank
// holds the whole SAE. Collective over the trainer's shards; the first shard (`writes`)
// writes both files atomically, the others send their parts. `header`: step, tokens, iteration
// and cursors. A failure is thrown on the writer once every shard has finished the stream.
void write_streamed(const SaeTrainer& t, bool writes, const std::string& weights_path,
                    const std::string& state_path, const SaeMeta& meta, const TrainState& header,
                    bool folded);

// Paths of step S's pair in an SAE directory.
std::string checkpoint_weights_path(const std::string& sae_dir, int64_t step);
std::string checkpoint_state_path(const std::string& sae_dir, int64_t step);

}  // namespace saetrain
