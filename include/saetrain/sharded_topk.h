// sharded_topk.h — the exact top-k of a latent-sharded SAE (issue 15's building block).
//
// With the latents split into S contiguous shards, each shard selects the top k of its own
// latents per row (topk_forward with relu = false, ids offset to the SAE's), the candidates are
// all-gathered over the shard group, and every shard merges them here into the same global
// selection. It equals the unsharded topk_forward exactly: every member of the global top k is
// in its own shard's top k, ties go to the lower latent id in both (a shard's lower local index
// is the lower global id, the shards being contiguous), and the ReLU is applied after the
// selection, as the unsharded kernel does.
#pragma once

#include <cstdint>
#include <vector>

namespace saetrain {

class Backend;
class Communicator;

// cand_val, cand_idx: [shards][rows][k] as an all-gather lays them out, each shard's row sorted
// best first (topk_forward's order: value descending, then id ascending), ids global. Writes
// [rows][k] into idx and val, best first, the values ReLU'd when `relu` (0 where it cut).
// Every shard must hold at least k latents.
void merge_topk_candidates(const float* cand_val, const int32_t* cand_idx, int64_t shards,
                           int64_t rows, int64_t k, int32_t* idx, float* val, bool relu);

// Host buffers sharded_topk_forward reuses from step to step.
struct ShardedTopkScratch {
    std::vector<float> val, all_val;
    std::vector<int32_t> idx, all_idx;
};

// One latent shard's part of the sharded TopK, called by every rank of `group` (the latent
// shards of one replica, in latent order): the local selection over this shard's `n_local`
// latents (pre [rows, n_local] and b_enc [n_local] in backend memory), its ids offset by
// `first_latent`, all-gathered over the group and merged, so that every shard ends with the
// same [rows, k] (idx, val) in backend memory, equal to topk_forward over all the latents.
void sharded_topk_forward(Backend& be, Communicator& group, const float* pre, const float* b_enc,
                          int64_t rows, int64_t n_local, int64_t k, int32_t first_latent,
                          int32_t* idx, float* val, bool relu, ShardedTopkScratch& scratch);

}  // namespace saetrain
