// optimizer.cpp — AdamW and schedule-free signum (optimizer.h), and their ops' CPU reference.
#include "saetrain/optimizer.h"

#include <algorithm>
#include <cmath>

#include "saetrain/error.h"
#include "saetrain/param_store.h"
#include "saetrain/schedule.h"  // defines: lr_at

namespace saetrain {
namespace {

// --- the ops' CPU reference (arch_ops.h) --------------------------------------------------------
// On a backend whose memory is the host's: its projection, sums and row norms, and the update
// element by element.
class CpuOptimizerOps final : public OptimizerOps {
public:
    explicit CpuOptimizerOps(Backend& host) : be_(host) {}

    double grad_sum_squares(const float* params, float* grads, int64_t count,
                            const UnitRows& unit) override {
        if (unit.any())
            be_.project_out_parallel(params + unit.offset, grads + unit.offset, unit.rows,
                                     unit.cols);
        return be_.sum_squares(grads, count);
    }

    // The gradient was projected in place by grad_sum_squares (or by the node split's reduce):
    // projecting again here would change nothing but rounding, so this does not.
    void apply(float* params, float* grads, float* m, float* v,
               const std::vector<AdamRange>& ranges, const UnitRows& unit, math::AdamScalars s,
               float weight_decay) override {
        const float lr = s.lr;
        for (const AdamRange& r : ranges) {
            if (r.count == 0) continue;
            s.weight_decay = r.decay ? weight_decay : 0.0f;
            s.lr = lr * r.lr_scale;
            update(params + r.offset, grads + r.offset, m + r.offset, v + r.offset, r.count, s);
        }
        if (!unit.any()) return;
        be_.normalize_rows(params + unit.offset, unit.rows, unit.cols);
        if (!s.signum) return;  // signum: the iterate and the average are unit rows too
        be_.normalize_rows(m + unit.offset, unit.rows, unit.cols);
        be_.normalize_rows(v + unit.offset, unit.rows, unit.cols);
    }

    void update(float* p, const float* g, float* m, float* v, int64_t n,
                const math::AdamScalars& s) override {
        if (s.signum) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) math::signum_update(p[i], m[i], v[i], g[i], s);
            return;
        }
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) math::adam_update(p[i], m[i], v[i], g[i], s);
    }

private:
    Backend& be_;
};

// Every op through a ForwardingBackend's hook.
class ForwardedOptimizerOps final : public OptimizerOps {
public:
    ForwardedOptimizerOps(OptimizerOps& inner, OpHook hook)
        : inner_(inner), hook_(std::move(hook)) {}
    double grad_sum_squares(const float* params, float* grads, int64_t count,
                            const UnitRows& unit) override {
        double r = 0;
        hook_("optimizer_grad_sum_squares",
              [&] { r = inner_.grad_sum_squares(params, grads, count, unit); });
        return r;
    }
    void apply(float* params, float* grads, float* m, float* v,
               const std::vector<AdamRange>& ranges, const UnitRows& unit, math::AdamScalars s,
               float weight_decay) override {
        hook_("optimizer_apply",
              [&] { inner_.apply(params, grads, m, v, ranges, unit, s, weight_decay); });
    }
    void update(float* p, const float* g, float* m, float* v, int64_t n,
                const math::AdamScalars& s) override {
        hook_("adam", [&] { inner_.update(p, g, m, v, n, s); });
    }

private:
    OptimizerOps& inner_;
    OpHook hook_;
};

// --- the optimizers -----------------------------------------------------------------------------

// Adam's scalars for update t (1-based): bias corrections multiplied, not divided
// (math::AdamScalars), lr as float, grad_scale.
math::AdamScalars adam_scalars(const SaeConfig& cfg, float grad_scale, double lr, int64_t t) {
    const float bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, static_cast<double>(t)));
    const float bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, static_cast<double>(t)));
    return {static_cast<float>(lr),
            static_cast<float>(cfg.beta1),
            static_cast<float>(cfg.beta2),
            static_cast<float>(cfg.eps),
            1.0f / bc1,
            1.0f / bc2,
            0.0f,
            grad_scale};
}

// AdamW: the parameters are the SAE; the two buffers are the first and second moments.
class AdamW final : public Optimizer {
public:
    using Optimizer::Optimizer;
    const char* name() const override { return "adam"; }

protected:
    math::AdamScalars scalars(float grad_scale, double lr, int64_t t) override {
        return adam_scalars(cfg_, grad_scale, lr, t);
    }
};

// Schedule-free signum (math::signum_update): the parameter buffer holds the point the gradient
// is taken at while it trains, the second buffer the average, which is the SAE; rest() exchanges
// the two so the parameter buffer holds the SAE, and the next step exchanges them back. The
// average weighs step t's iterate by lr_max_t^2 (the largest lr so far).
class ScheduleFreeSignum final : public Optimizer {
public:
    using Optimizer::Optimizer;
    const char* name() const override { return "signum"; }

    void begin_step() override {
        if (at_rest_) store_.swap(ParamStore::Buffer::params, ParamStore::Buffer::opt_v);
        at_rest_ = false;
    }
    void rest() override {
        if (at_rest_) return;
        store_.swap(ParamStore::Buffer::params, ParamStore::Buffer::opt_v);
        at_rest_ = true;
    }
    void params_set(const std::vector<float>& p) override {
        store_.write(ParamStore::Buffer::opt_m, p);
        store_.write(ParamStore::Buffer::opt_v, p);
        at_rest_ = false;
    }
    // A checkpoint is at rest; every counted step applied one update at its lr.
    void restored(int64_t step) override {
        at_rest_ = true;
        lr_max_ = 0, weight_sum_ = 0;
        for (int64_t t = 0; t < step; ++t) next_average(lr(t));
    }

protected:
    math::AdamScalars scalars(float grad_scale, double lr, int64_t t) override {
        math::AdamScalars s = adam_scalars(cfg_, grad_scale, lr, t);
        s.signum = true;
        s.beta1 = static_cast<float>(cfg_.momentum);
        s.average = next_average(lr);
        return s;
    }

private:
    // The weight of this step's iterate in the average: lr_max^2 over the sum of the weights so
    // far (1 for a first step at lr 0).
    float next_average(double lr) {
        lr_max_ = std::max(lr_max_, lr);
        const double w = lr_max_ * lr_max_;
        weight_sum_ += w;
        return weight_sum_ > 0 ? static_cast<float>(w / weight_sum_) : 1.0f;
    }

    bool at_rest_ = false;  // the parameter buffer holds the average
    double lr_max_ = 0, weight_sum_ = 0;
};

}  // namespace

const ArchOpSet& optimizer_op_set() {
    static const ArchOpSet set{"optimizer",
                               {"optimizer_grad_sum_squares", "optimizer_apply", "adam"},
                               [](Backend& host) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<CpuOptimizerOps>(host);
                               },
                               [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<ForwardedOptimizerOps>(
                                       static_cast<OptimizerOps&>(inner), std::move(hook));
                               }};
    return set;
}

std::unique_ptr<Optimizer> Optimizer::make(const SaeConfig& cfg, Backend& be, ParamStore& store,
                                           int64_t total_steps) {
    OptimizerOps& ops = arch_ops<OptimizerOps>(be, optimizer_op_set());
    if (cfg.optimizer == "signum")
        return std::make_unique<ScheduleFreeSignum>(cfg, store, ops, total_steps);
    SAE_ENFORCE(cfg.optimizer == "adam", "train.optimizer: '{}' is not adam or signum",
                cfg.optimizer);
    return std::make_unique<AdamW>(cfg, store, ops, total_steps);
}

GradClip Optimizer::clip(double rows) {
    const double sum_sq = store_.grad_sum_squares(ops_);
    GradClip c;
    c.grad_scale = static_cast<float>(1.0 / rows);
    c.grad_norm = std::sqrt(sum_sq) / rows;
    if (cfg_.grad_clip > 0 && c.grad_norm > cfg_.grad_clip) {
        c.grad_scale *= static_cast<float>(cfg_.grad_clip / c.grad_norm);
        c.clipped = true;
    }
    return c;
}

double Optimizer::lr(int64_t step) const { return lr_at(cfg_, step, total_steps_); }

void Optimizer::apply(const GradClip& c, double lr, int64_t t) {
    store_.update(ops_, scalars(c.grad_scale, lr, t), static_cast<float>(cfg_.weight_decay));
}

}  // namespace saetrain
