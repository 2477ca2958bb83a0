// batchtopk_pass.h — the BatchTopK training pass (batchtopk.cpp), shared with the architectures
// that train its selection with a loss of their own (Matryoshka BatchTopK, matryoshka.cpp).
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "saetrain/arch/batchtopk.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain::arch {

// The running threshold's weight per step. SAELens uses 0.01; here the batch threshold (an
// order statistic of k * B values) is nearly noiseless, and 0.01 lags a threshold that falls
// during training, leaving the inference L0 well below the training k (docs/architectures.md,
// BatchTopK, has the run).
inline constexpr double kThresholdRate = 0.1;

class BatchTopkPass : public SelectionPass {
public:
    BatchTopkPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : SelectionPass(cfg, d, n, be),
          ops_(arch_ops<BatchTopkOps>(be, batchtopk_op_set())),
          k_(cfg.k) {}
    void reserve(int64_t rows) override {
        rows_cap_ = std::max(rows_cap_, rows);  // the buffers hold the most rows seen, each width_
        reserve_selection(rows_cap_);
    }
    void forward(PassContext& c, bool training) override {
        encode(c);
        const float* b_enc = c.seg("b_enc");
        float t = threshold_;
        if (training) {
            t = ops_.batch_threshold(c.pre, b_enc, c.B, c.n, k_ * c.B);
            if (c.latent_shard) t = threshold_over_latent_shards(c, t, k_ * c.B);
            batch_t_ = t;
        }
        select_above(c, t);
        decode_selection(c);
    }
    std::vector<double> step_sums() const override { return {batch_t_, 1.0}; }
    void after_step(const std::vector<double>& sums) override {
        if (sums.size() != 2 || !(sums[1] > 0)) return;
        const double t = sums[0] / sums[1];
        // Kept as the float it is saved as, so a resumed run continues from the same value.
        threshold_ = static_cast<float>(
            threshold_ > 0 ? (1 - kThresholdRate) * threshold_ + kThresholdRate * t : t);
    }
    std::vector<NamedTensor> buffers() const override { return {{"threshold", {threshold_}}}; }
    void set_buffer(const std::string& name, const std::vector<float>& v) override {
        SAE_ENFORCE(name == "threshold" && v.size() == 1,
                    "a BatchTopK SAE keeps one 'threshold' value, not '{}' of {} values", name,
                    v.size());
        threshold_ = v[0];
    }

private:
    // The selection of pre + b_enc >= t. Rows keep different counts: the buffer is as wide as
    // the widest row seen so far (its padding has value 0 and costs the sparse kernels a
    // skipped entry).
    void select_above(PassContext& c, float t) {
        const float* b_enc = c.seg("b_enc");
        for (;;) {
            const int64_t widest =
                ops_.select_above(c.pre, b_enc, t, c.B, c.n, width_, idx_.data(), val_.data());
            if (widest <= width_) break;
            width_ = widest;
            reserve(c.B);
        }
    }
    // On a latent shard: the batch threshold over every latent shard's latents, from this latent
    // shard's
    // (`mine`, the count-th largest of its own values). Each latent shard contributes its `count`
    // largest positive values (those >= mine; 0s pad), and the count-th largest of them all is
    // the whole batch's: every value of the global top `count` is among its latent shard's top
    // `count`. The same float as batch_threshold over all latents; when fewer than `count`
    // values are positive, the smallest positive one; 0 when none is.
    float threshold_over_latent_shards(PassContext& c, float mine, int64_t count) {
        count = std::max<int64_t>(count, 1);
        select_above(c, mine);
        std::vector<float>& top = scratch_.val;
        top.resize(static_cast<size_t>(c.B * width_));
        c.be.download(top.data(), val_.data(), c.B * width_ * int64_t{sizeof(float)});
        top.erase(std::remove_if(top.begin(), top.end(), [](float v) { return !(v > 0.0f); }),
                  top.end());
        if (static_cast<int64_t>(top.size()) > count) {
            std::nth_element(top.begin(), top.begin() + count, top.end(), std::greater<float>());
            top.resize(static_cast<size_t>(count));
        }
        top.resize(static_cast<size_t>(count), 0.0f);
        std::vector<float>& all = scratch_.all_val;
        all.resize(static_cast<size_t>(count * c.latent_shard->count));
        c.latent_shard->group->allgather(top.data(), all.data(), count * int64_t{sizeof(float)});
        all.erase(std::remove_if(all.begin(), all.end(), [](float v) { return !(v > 0.0f); }),
                  all.end());
        if (all.empty()) return 0.0f;
        if (static_cast<int64_t>(all.size()) < count)
            return *std::min_element(all.begin(), all.end());
        std::nth_element(all.begin(), all.begin() + (count - 1), all.end(), std::greater<float>());
        return all[static_cast<size_t>(count - 1)];
    }

    BatchTopkOps& ops_;
    int64_t k_;
    int64_t rows_cap_ = 0;
    float threshold_ = 0;  // the inference threshold (0: not estimated yet)
    double batch_t_ = 0;   // this step's batch threshold
};

// BatchTopK's export (a JumpReLU with its one threshold for every latent), which Matryoshka
// BatchTopK shares.
ArchExport batchtopk_export(const SaeWeights& w);

}  // namespace saetrain::arch
