// trainer_io.h — a trainer's SAE as the tensors of its checkpoint files, and back.
//
// The file layout (checkpoint.h, train_state.h) is io's: W_enc [d, n] is the transpose of the
// trainer's latent-major buffer, the architecture's parameters and buffers are named extra
// tensors, data.normalize's scale is a tensor of its own or folded into the weights
// (sae_tensors.h), the optimizer state is flat in the whole SAE's layout. The trainer hands out
// its ParamStore (host copies and the latent shards' gathers) and takes back a CheckpointPart
// (SaeTrainer::restore); everything between the two layouts is here.
//
// Latent sharding: no rank holds the whole SAE. Checkpoints are written by every latent shard
// from its own buffers (checkpoint_parts.h); final.h5 is the whole SAE's tensors gathered in
// file order, chunk by chunk, to the first latent shard (trainer_gather_weights/state;
// write_gathered in train_state.h writes the gather). Each latent shard reads back only its
// latents (trainer_read_part from a TensorSource: the parts, or a pair), whatever latent shard
// count wrote them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "saetrain/checkpoint.h"   // defines: SaeWeights, SaeMeta
#include "saetrain/train_state.h"  // defines: TrainState, TensorSource
#include "saetrain/trainer.h"      // defines: SaeTrainer

namespace saetrain {

// A piece of one of the whole SAE's tensors, as trainer_gather_weights/state hand them out:
// elements [offset, offset + count) of tensor `tensor` (an index into the list of
// trainer_weight_tensors or trainer_state_tensors), in its flat file order; f32 or i64 is set.
struct TensorChunk {
    int tensor = 0;
    int64_t offset = 0, count = 0;
    const float* f32 = nullptr;
    const int64_t* i64 = nullptr;
};
struct TensorInfo {
    std::string name;
    std::vector<int64_t> shape;
    bool i64 = false;
};
using ChunkSink = std::function<void(const TensorChunk&)>;

// The whole SAE in the file layout (W_enc [d, n]), with the architecture's buffers and (with
// data.normalize) its activation_scale among the extra tensors. On a latent shard: collective
// over the latent shards, the first latent shard gets the whole SAE and the others empty weights
// (n_latents 0).
SaeWeights trainer_weights(const SaeTrainer& t);
// Optimizer state and counters for a checkpoint (cursors and iteration are the caller's);
// gathered like trainer_weights.
TrainState trainer_state(const SaeTrainer& t);

// Latent sharding without a whole copy anywhere: the whole SAE's tensors in file order
// (trainer_weights' and trainer_state's, the same values), gathered chunk by chunk (at most
// 64 MiB each) to `sink` on the first latent shard, each tensor's chunks in order; collective over
// the latent shards (the others pass an empty sink). `folded`: as
// fold_activation_scale(trainer_weights()) (for final.h5). The tensors, in order:
std::vector<TensorInfo> trainer_weight_tensors(const SaeTrainer& t, bool folded);
std::vector<TensorInfo> trainer_state_tensors(const SaeTrainer& t);  // adam_m, adam_v, since_fired
void trainer_gather_weights(const SaeTrainer& t, bool folded, const ChunkSink& sink);
void trainer_gather_state(const SaeTrainer& t, const ChunkSink& sink);

// This trainer's latents of a checkpoint (throws on a checkpoint of another SAE; not
// collective), for SaeTrainer::restore: a latent shard reads only its part of the files, and
// every rank can agree the reads succeeded before anything changes.
CheckpointPart trainer_read_part(const SaeTrainer& t, const TensorSource& src);
// Continues from a checkpoint: weights in the file layout, and its state, of the whole SAE (a
// latent shard takes its latents: the checkpoint may come from any latent shard count). Collective
// over the replicas, as SaeTrainer::restore. Bitwise: the next step is the one the uninterrupted
// run would have taken.
void trainer_restore(SaeTrainer& t, const SaeWeights& w, const TrainState& s);

}  // namespace saetrain
