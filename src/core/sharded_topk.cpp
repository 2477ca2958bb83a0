// The merge of the latent shards' top-k candidates (sharded_topk.h).
#include "saetrain/sharded_topk.h"

#include <algorithm>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/sae_math.h"

namespace saetrain {

void merge_topk_candidates(const float* cand_val, const int32_t* cand_idx, int64_t latent_shards,
                           int64_t rows, int64_t k, int32_t* idx, float* val, bool relu) {
    // A k-way merge of S sorted lists per row: S is small (the GPUs of a node), so each pick
    // scans the S heads. The order is topk_forward's: larger value first, then the lower id.
    std::vector<int64_t> head(static_cast<size_t>(latent_shards));
    for (int64_t r = 0; r < rows; ++r) {
        std::fill(head.begin(), head.end(), 0);
        for (int64_t j = 0; j < k; ++j) {
            int64_t best = -1;
            float best_v = 0.0f;
            int32_t best_i = 0;
            for (int64_t s = 0; s < latent_shards; ++s) {
                if (head[s] >= k) continue;
                const int64_t at = (s * rows + r) * k + head[s];
                const float v = cand_val[at];
                const int32_t i = cand_idx[at];
                if (best < 0 || v > best_v || (v == best_v && i < best_i))
                    best = s, best_v = v, best_i = i;
            }
            ++head[best];
            idx[r * k + j] = best_i;
            val[r * k + j] = relu ? math::relu(best_v) : best_v;
        }
    }
}

namespace {

// The local selection, its exchange and the merge: the global [rows, k] selection lands in
// scratch.idx and scratch.val (host).
void select_global(Backend& be, Communicator& group, const float* pre, const float* b_enc,
                   int64_t rows, int64_t n_local, int64_t k, int32_t first_latent, int32_t* idx,
                   float* val, bool relu, ShardedTopkScratch& scratch) {
    SAE_ENFORCE(k <= n_local, "sae.k = {} exceeds the {} latents of a latent shard", k, n_local);
    const int64_t count = rows * k, latent_shards = group.size();
    be.topk_forward(pre, b_enc, rows, n_local, k, idx, val, /*relu=*/false);
    be.offset_indices(idx, count, first_latent);
    scratch.val.resize(static_cast<size_t>(count));
    scratch.idx.resize(static_cast<size_t>(count));
    scratch.all_val.resize(static_cast<size_t>(latent_shards * count));
    scratch.all_idx.resize(static_cast<size_t>(latent_shards * count));
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    be.download(scratch.val.data(), val, bytes);
    be.download(scratch.idx.data(), idx, bytes);
    group.allgather(scratch.val.data(), scratch.all_val.data(), bytes);
    group.allgather(scratch.idx.data(), scratch.all_idx.data(), bytes);
    merge_topk_candidates(scratch.all_val.data(), scratch.all_idx.data(), latent_shards, rows, k,
                          scratch.idx.data(), scratch.val.data(), relu);
}

void upload_selection(Backend& be, int32_t* idx, float* val, const ShardedTopkScratch& scratch) {
    const auto bytes = static_cast<int64_t>(scratch.val.size() * sizeof(float));
    be.upload(idx, scratch.idx.data(), bytes);
    be.upload(val, scratch.val.data(), bytes);
}

}  // namespace

void sharded_topk_forward(Backend& be, Communicator& group, const float* pre, const float* b_enc,
                          int64_t rows, int64_t n_local, int64_t k, int32_t first_latent,
                          int32_t* idx, float* val, bool relu, ShardedTopkScratch& scratch) {
    select_global(be, group, pre, b_enc, rows, n_local, k, first_latent, idx, val, relu, scratch);
    upload_selection(be, idx, val, scratch);
}

void keep_own_entries(int32_t* idx, float* val, int64_t count, int64_t first, int64_t n_local) {
    for (int64_t i = 0; i < count; ++i) {
        const int64_t local = int64_t{idx[i]} - first;
        const bool own = local >= 0 && local < n_local;
        idx[i] = own ? static_cast<int32_t>(local) : 0;
        val[i] = own ? val[i] : 0.0f;
    }
}

void sharded_topk_own(Backend& be, const LatentShard& latent_shard, const float* pre,
                      const float* b_enc, int64_t rows, int64_t k, int32_t* idx, float* val,
                      bool relu, ShardedTopkScratch& scratch) {
    select_global(be, *latent_shard.group, pre, b_enc, rows, latent_shard.n_local(), k,
                  static_cast<int32_t>(latent_shard.first()), idx, val, relu, scratch);
    keep_own_entries(scratch.idx.data(), scratch.val.data(), rows * k, latent_shard.first(),
                     latent_shard.n_local());
    upload_selection(be, idx, val, scratch);
}

}  // namespace saetrain
