// sharded_topk.h — the exact top-k of a latent-sharded SAE.
//
// With the latents split into S contiguous latent shards, each latent shard selects the top k of
// its own latents per row (topk_forward with relu = false, ids offset to the SAE's), the candidates
// are all-gathered over the latent shard group, and every latent shard merges them here into the
// same global selection. It equals the unsharded topk_forward exactly: every member of the global
// top k is in its own latent shard's top k, ties go to the lower latent id in both (a latent
// shard's lower local index is the lower global id, the latent shards being contiguous), and the
// ReLU is applied after the selection, as the unsharded kernel does.
#pragma once

#include <cstdint>
#include <vector>

namespace saetrain {

class Backend;
class Communicator;

// This rank's part of a latent-sharded SAE (parallel.latent_shards = S > 1): latent shard `index`
// of the S latent shards of one replica holds the contiguous latents [first(), first() +
// n_local()).
struct LatentShard {
    Communicator* group = nullptr;          // the S latent shards, in latent order; host buffers
    Communicator* backend_group = nullptr;  // the same ranks, for backend buffers (NCCL on GPUs)
    int64_t index = 0, count = 1;           // this latent shard, and S
    int64_t n_total = 0;                    // the SAE's latents; S divides them
    int64_t n_local() const { return n_total / count; }
    int64_t first() const { return index * n_local(); }
};

// cand_val, cand_idx: [latent shards][rows][k] as an all-gather lays them out, each latent shard's
// row sorted best first (topk_forward's order: value descending, then id ascending), ids global.
// Writes [rows][k] into idx and val, best first, the values ReLU'd when `relu` (0 where it cut).
// Every latent shard must hold at least k latents.
void merge_topk_candidates(const float* cand_val, const int32_t* cand_idx, int64_t latent_shards,
                           int64_t rows, int64_t k, int32_t* idx, float* val, bool relu);

// Host buffers sharded_topk_forward reuses from step to step.
struct ShardedTopkScratch {
    std::vector<float> val, all_val;
    std::vector<int32_t> idx, all_idx;
};

// One latent shard's part of the sharded TopK, called by every rank of `group` (the latent
// shards of one replica, in latent order): the local selection over this latent shard's
// `n_local` latents (pre [rows, n_local] and b_enc [n_local] in backend memory), its ids offset by
// `first_latent`, all-gathered over the group and merged, so that every latent shard ends with the
// same [rows, k] (idx, val) in backend memory, equal to topk_forward over all the latents.
void sharded_topk_forward(Backend& be, Communicator& group, const float* pre, const float* b_enc,
                          int64_t rows, int64_t n_local, int64_t k, int32_t first_latent,
                          int32_t* idx, float* val, bool relu, ShardedTopkScratch& scratch);

// Keeps the entries of a global selection [count] that fall in [first, first + n_local), their
// ids made local (minus first); every other entry becomes (0, 0.0f), which the decoder and
// topk_backward treat as absent.
void keep_own_entries(int32_t* idx, float* val, int64_t count, int64_t first, int64_t n_local);

// What a latent shard's pass uses: the global selection of sharded_topk_forward over `latent
// shard`'s group, then keep_own_entries, so that the latent shard decodes and back-propagates its
// own latents only (local ids into its parameter segments).
void sharded_topk_own(Backend& be, const LatentShard& latent_shard, const float* pre,
                      const float* b_enc, int64_t rows, int64_t k, int32_t* idx, float* val,
                      bool relu, ShardedTopkScratch& scratch);

}  // namespace saetrain
