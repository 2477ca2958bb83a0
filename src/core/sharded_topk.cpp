// The merge of the shards' top-k candidates (sharded_topk.h).
#include "saetrain/sharded_topk.h"

#include <algorithm>
#include <vector>

#include "saetrain/sae_math.h"

namespace saetrain {

void merge_topk_candidates(const float* cand_val, const int32_t* cand_idx, int64_t shards,
                           int64_t rows, int64_t k, int32_t* idx, float* val, bool relu) {
    // A k-way merge of S sorted lists per row: S is small (the GPUs of a node), so each pick
    // scans the S heads. The order is topk_forward's: larger value first, then the lower id.
    std::vector<int64_t> head(static_cast<size_t>(shards));
    for (int64_t r = 0; r < rows; ++r) {
        std::fill(head.begin(), head.end(), 0);
        for (int64_t j = 0; j < k; ++j) {
            int64_t best = -1;
            float best_v = 0.0f;
            int32_t best_i = 0;
            for (int64_t s = 0; s < shards; ++s) {
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

}  // namespace saetrain
