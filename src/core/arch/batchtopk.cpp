// batchtopk.cpp — BatchTopK (Bussmann et al. 2024): the k * B largest activations over the
// whole batch, so tokens share a budget of k per token on average. Training keeps a running
// threshold (the mean over replicas of each batch's smallest selected activation, averaged
// with weight 0.1 per step after the first) that replaces the batch selection at inference:
// there, and in exports, the SAE is a JumpReLU with that one threshold for every latent.
#include <algorithm>
#include <cmath>
#include <functional>

#include "common.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain::arch {
namespace {

// The running threshold's weight per step. SAELens uses 0.01; here the batch threshold (an
// order statistic of k * B values) is nearly noiseless, and 0.01 lags a threshold that falls
// during training: on MiniLM activations (239 steps of 4096 rows, k 32) 0.01 gave an inference
// L0 of 23.6 for the training 32 (held-out FVU 0.1415), 0.1 gave 32.5 (FVU 0.1187).
constexpr double kThresholdRate = 0.1;

class BatchTopkPass final : public SelectionPass {
public:
    BatchTopkPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : SelectionPass(cfg, d, n, be), k_(cfg.k) {}
    void reserve(int64_t rows) override {
        rows_cap_ = std::max(rows_cap_, rows);  // the buffers hold the most rows seen, each width_
        reserve_selection(rows_cap_);
    }
    void forward(PassContext& c, bool training) override {
        encode(c);
        const float* b_enc = c.seg(ParamLayout::kBEnc);
        float t = threshold_;
        if (training) {
            t = c.be.batch_threshold(c.pre, b_enc, c.B, c.n, k_ * c.B);
            if (c.shard) t = threshold_over_shards(c, t, k_ * c.B);
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
        const float* b_enc = c.seg(ParamLayout::kBEnc);
        for (;;) {
            const int64_t widest =
                c.be.select_above(c.pre, b_enc, t, c.B, c.n, width_, idx_.data(), val_.data());
            if (widest <= width_) break;
            width_ = widest;
            reserve(c.B);
        }
    }
    // On a latent shard: the batch threshold over every shard's latents, from this shard's
    // (`mine`, the count-th largest of its own values). Each shard contributes its `count`
    // largest positive values (those >= mine; 0s pad), and the count-th largest of them all is
    // the whole batch's: every value of the global top `count` is among its shard's top
    // `count`. The same float as batch_threshold over all latents; when fewer than `count`
    // values are positive, the smallest positive one; 0 when none is.
    float threshold_over_shards(PassContext& c, float mine, int64_t count) {
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
        all.resize(static_cast<size_t>(count * c.shard->count));
        c.shard->group->allgather(top.data(), all.data(), count * int64_t{sizeof(float)});
        all.erase(std::remove_if(all.begin(), all.end(), [](float v) { return !(v > 0.0f); }),
                  all.end());
        if (all.empty()) return 0.0f;
        if (static_cast<int64_t>(all.size()) < count)
            return *std::min_element(all.begin(), all.end());
        std::nth_element(all.begin(), all.begin() + (count - 1), all.end(), std::greater<float>());
        return all[static_cast<size_t>(count - 1)];
    }

    int64_t k_;
    int64_t rows_cap_ = 0;
    float threshold_ = 0;  // the inference threshold (0: not estimated yet)
    double batch_t_ = 0;   // this step's batch threshold
};

class BatchTopk final : public KSelection {
public:
    const char* name() const override { return "batchtopk"; }
    const char* describe() const override {
        return "the sae.k * batch largest activations of the batch; a learned threshold at "
               "inference; AuxK on dead latents";
    }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        ArchExport e;
        e.saelens_architecture = "jumprelu";
        e.saelens_tensors = saelens_base(w);
        const std::vector<float>& t = extra_tensor(w, "threshold");
        SAE_ENFORCE(t.size() == 1, "a BatchTopK SAE's threshold has {} values, expected 1",
                    t.size());
        e.saelens_tensors.push_back({"threshold",
                                     {w.n_latents},
                                     std::vector<float>(static_cast<size_t>(w.n_latents), t[0])});
        e.sparsify_refusal = "sparsify has no threshold activation for a BatchTopK SAE's inference";
        return e;
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<BatchTopkPass>(cfg, d, n, be);
    }
    bool shardable() const override { return true; }
    // The batch selection has no k limit (batch_threshold, select_above); AuxK's has.
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, 0, d, n);
    }
};

}  // namespace

const Architecture& batchtopk_arch() {
    static const BatchTopk a;
    return a;
}

}  // namespace saetrain::arch
