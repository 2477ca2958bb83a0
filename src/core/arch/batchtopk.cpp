// batchtopk.cpp — BatchTopK (Bussmann et al. 2024): the k * B largest activations over the
// whole batch, so tokens share a budget of k per token on average. Training keeps a running
// threshold (the mean over replicas of each batch's smallest selected activation, averaged
// with weight 0.1 per step after the first) that replaces the batch selection at inference:
// there, and in exports, the SAE is a JumpReLU with that one threshold for every latent. Its own
// ops (arch/batchtopk.h): the batch threshold and the selection above it, with their CPU
// reference here.
#include "saetrain/arch/batchtopk.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "batchtopk_pass.h"
#include "common.h"
#include "saetrain/comm.h"
#include "saetrain/error.h"

namespace saetrain::arch {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
class CpuBatchTopkOps final : public BatchTopkOps {
public:
    float batch_threshold(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                          int64_t count) override {
        // The count-th largest positive value of pre + b_enc, exactly. A sample of the rows
        // gives a guess t_s that about twice `count` values reach; one pass collects the values
        // >= t_s (blocks of 16 below it are skipped with one vectorized test), and when there
        // are at least `count` of them the answer is among them (nth_element). Otherwise the
        // guess was too high and the pass repeats with every positive value.
        if (rows <= 0 || n <= 0) return 0.0f;
        count = std::max<int64_t>(count, 1);  // as the CUDA kernel: the largest value
        const int64_t stride = std::max<int64_t>(1, std::min<int64_t>(16, rows / 64));
        std::vector<float> sample;
        for (int64_t r = 0; r < rows; r += stride)
            for (int64_t i = 0; i < n; ++i) {
                const float v = pre[r * n + i] + b_enc[i];
                if (v > 0.0f) sample.push_back(v);
            }
        const int64_t sampled_rows = (rows + stride - 1) / stride;
        const auto want_s =
            static_cast<int64_t>(2.0 * static_cast<double>(count) *
                                     static_cast<double>(sampled_rows) / static_cast<double>(rows) +
                                 64);
        float guess = 0.0f;  // 0: every positive value is a candidate
        if (want_s < static_cast<int64_t>(sample.size())) {
            std::nth_element(sample.begin(), sample.begin() + want_s, sample.end(),
                             std::greater<float>());
            guess = sample[static_cast<size_t>(want_s)];
        }
        for (;;) {
            std::vector<float> cand = collect_at_least(pre, b_enc, rows, n, guess);
            const auto have = static_cast<int64_t>(cand.size());
            if (have >= count || guess == 0.0f) {
                if (have == 0) return 0.0f;
                const int64_t want = std::min(count, have);
                std::nth_element(cand.begin(), cand.begin() + (want - 1), cand.end(),
                                 std::greater<float>());
                return cand[static_cast<size_t>(want - 1)];
            }
            guess = 0.0f;
        }
    }

    int64_t select_above(const float* pre, const float* b_enc, float threshold, int64_t rows,
                         int64_t n, int64_t width, int32_t* idx, float* val) override {
        // v > 0 and v >= threshold as one comparison: v >= max(threshold, the least positive).
        const float t = std::max(threshold, std::numeric_limits<float>::denorm_min());
        int64_t widest = 0;
#pragma omp parallel for schedule(static) reduction(max : widest)
        for (int64_t r = 0; r < rows; ++r) {
            const float* p = pre + r * n;
            int64_t c = 0;
            auto keep = [&](int64_t i) {
                const float v = p[i] + b_enc[i];
                if (!(v >= t)) return;
                if (c < width) idx[r * width + c] = static_cast<int32_t>(i), val[r * width + c] = v;
                ++c;
            };
            constexpr int64_t kBlock = 16;
            int64_t i = 0;
            for (; i + kBlock <= n; i += kBlock) {
                int any = 0;
                for (int64_t j = 0; j < kBlock; ++j) any |= (p[i + j] + b_enc[i + j]) >= t;
                if (!any) continue;
                for (int64_t j = 0; j < kBlock; ++j) keep(i + j);
            }
            for (; i < n; ++i) keep(i);
            for (int64_t j = c; j < width; ++j) idx[r * width + j] = 0, val[r * width + j] = 0.0f;
            widest = std::max(widest, c);
        }
        return widest;
    }

private:
    // Every value of pre + b_enc that is positive and >= t, in no particular order.
    static std::vector<float> collect_at_least(const float* pre, const float* b_enc, int64_t rows,
                                               int64_t n, float t) {
        t = std::max(t, std::numeric_limits<float>::denorm_min());
        std::vector<float> all;
#pragma omp parallel
        {
            std::vector<float> mine;
            constexpr int64_t kBlock = 16;
#pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < rows; ++r) {
                const float* p = pre + r * n;
                int64_t i = 0;
                for (; i + kBlock <= n; i += kBlock) {
                    int any = 0;
                    for (int64_t j = 0; j < kBlock; ++j) any |= (p[i + j] + b_enc[i + j]) >= t;
                    if (!any) continue;
                    for (int64_t j = 0; j < kBlock; ++j)
                        if (p[i + j] + b_enc[i + j] >= t) mine.push_back(p[i + j] + b_enc[i + j]);
                }
                for (; i < n; ++i)
                    if (p[i] + b_enc[i] >= t) mine.push_back(p[i] + b_enc[i]);
            }
#pragma omp critical
            all.insert(all.end(), mine.begin(), mine.end());
        }
        return all;
    }
};

// Every op through a ForwardingBackend's hook.
class ForwardedBatchTopkOps final : public BatchTopkOps {
public:
    ForwardedBatchTopkOps(BatchTopkOps& inner, OpHook hook)
        : inner_(inner), hook_(std::move(hook)) {}
    float batch_threshold(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                          int64_t count) override {
        float t = 0;
        hook_("batch_threshold", [&] { t = inner_.batch_threshold(pre, b_enc, rows, n, count); });
        return t;
    }
    int64_t select_above(const float* pre, const float* b_enc, float threshold, int64_t rows,
                         int64_t n, int64_t width, int32_t* idx, float* val) override {
        int64_t widest = 0;
        hook_("select_above", [&] {
            widest = inner_.select_above(pre, b_enc, threshold, rows, n, width, idx, val);
        });
        return widest;
    }

private:
    BatchTopkOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------

class BatchTopk final : public KSelection {
public:
    const char* name() const override { return "batchtopk"; }
    const char* describe() const override {
        return "the sae.k * batch largest activations of the batch; a learned threshold at "
               "inference; AuxK on dead latents";
    }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        return batchtopk_export(w);
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<BatchTopkPass>(cfg, d, n, be);
    }
    const char* default_optimizer() const override { return "signum"; }
    bool latent_shardable() const override { return true; }
    std::vector<const ArchOpSet*> op_sets() const override { return {&batchtopk_op_set()}; }
    // The batch selection has no k limit (batch_threshold, select_above); AuxK's has.
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, 0, d, n);
    }
};

}  // namespace

ArchExport batchtopk_export(const SaeWeights& w) {
    ArchExport e;
    e.saelens_architecture = "jumprelu";
    e.saelens_tensors = saelens_base(w);
    const std::vector<float>& t = extra_tensor(w, "threshold");
    SAE_ENFORCE(t.size() == 1, "a BatchTopK SAE's threshold has {} values, expected 1", t.size());
    e.saelens_tensors.push_back(
        {"threshold", {w.n_latents}, std::vector<float>(static_cast<size_t>(w.n_latents), t[0])});
    e.sparsify_refusal = "sparsify has no threshold activation for a BatchTopK SAE's inference";
    return e;
}

const Architecture& batchtopk_arch() {
    static const BatchTopk a;
    return a;
}

}  // namespace saetrain::arch

const saetrain::ArchOpSet& saetrain::batchtopk_op_set() {
    static const ArchOpSet set{"batchtopk",
                               {"batch_threshold", "select_above"},
                               [](Backend&) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::CpuBatchTopkOps>();
                               },
                               [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::ForwardedBatchTopkOps>(
                                       static_cast<BatchTopkOps&>(inner), std::move(hook));
                               }};
    return set;
}
