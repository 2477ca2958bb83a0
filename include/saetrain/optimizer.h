// optimizer.h — an SAE's optimizer: AdamW or schedule-free signum (train.optimizer).
//
// The trainer's step ends clip -> lr -> apply, and the Optimizer owns that sequence and every
// number it keeps: the policy (the step's scalars: Adam's bias corrections, signum's average
// weight), signum's state beyond the buffers (which buffer holds the SAE, the largest lr so far,
// the average's weight sum) and the ops it runs. ParamStore (param_store.h) only places the two
// state buffers beside the parameters (Buffer::opt_m and opt_v: Adam's moments, or signum's
// iterate and average) and says which ranges this rank updates.
//
// Its backend ops are an op set (arch_ops.h) like an architecture's: OptimizerOps, with a CPU
// reference every backend is held to (test_backend_parity) and the CUDA implementation in
// src/cuda/arch_ops.cpp. The contract keeps the gradient's norm and the clip factor where the
// backend computes them until the host asks: grad_sum_squares measures, and the clip factor
// reaches apply inside AdamScalars::grad_scale, so a backend that kept both on the device would
// change only clip()'s read-back (today the step reads the norm on the host to decide the clip
// and to skip a non-finite step).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "saetrain/arch_ops.h"
#include "saetrain/backend.h"  // defines: AdamRange, UnitRows
#include "saetrain/config.h"
#include "saetrain/sae_math.h"  // defines: math::AdamScalars

namespace saetrain {

class ParamStore;

// The optimizer's backend ops, over the flat parameter buffer's ranges.
class OptimizerOps : public ArchOps {
public:
    // The sum of squares of the gradient g[0, count) with the unit rows' radial part projected
    // out. The reference projects g in place; an implementation may instead leave g as it is and
    // project in apply (the CUDA one does: one pass fewer over the decoder's gradient): after
    // this call g is only an input to apply.
    virtual double grad_sum_squares(const float* params, float* grads, int64_t count,
                                    const UnitRows& unit) = 0;
    // The update over every range (s.weight_decay = weight_decay where the range decays, else 0;
    // the range's lr is s.lr times its lr_scale; s.grad_scale carries the clipping and the
    // average over the replicas' rows), the unit rows' gradient projected as in
    // grad_sum_squares (again: a second projection changes nothing but rounding), and the unit
    // rows renormalized after the update (signum: also its iterate's and average's rows).
    virtual void apply(float* params, float* grads, float* m, float* v,
                       const std::vector<AdamRange>& ranges, const UnitRows& unit,
                       math::AdamScalars s, float weight_decay) = 0;
    // One element-wise update of n values (math::optimizer_update: AdamW or signum, as s says).
    virtual void update(float* p, const float* g, float* m, float* v, int64_t n,
                        const math::AdamScalars& s) = 0;
};

// The op set: "optimizer", its ops "optimizer_grad_sum_squares", "optimizer_apply" and "adam".
const ArchOpSet& optimizer_op_set();

// The step's gradient measure: its norm over the replicas' rows and the factor the update
// multiplies the summed gradient by (1 / rows, times the clip).
struct GradClip {
    double grad_norm = 0;
    float grad_scale = 1.0f;
    bool clipped = false;
};

class Optimizer {
public:
    // cfg.optimizer's optimizer ("adam" or "signum": with_optimizer_defaults has resolved
    // "auto") over `store` on `be`, for a run of total_steps steps.
    static std::unique_ptr<Optimizer> make(const SaeConfig& cfg, Backend& be, ParamStore& store,
                                           int64_t total_steps);
    virtual ~Optimizer() = default;
    virtual const char* name() const = 0;

    // clip: the squared norm of the reduced gradient (collective over the latent shards, through
    // the store) over `rows` rows of every replica; clipped to train.grad_clip.
    GradClip clip(double rows);
    // The learning rate of step `step` (0-based) of the schedule.
    double lr(int64_t step) const;
    // apply: update t (1-based) at learning rate lr with the clip's scale, on the ranges this
    // rank updates; every replica's update is visible to all when it returns.
    void apply(const GradClip& c, double lr, int64_t t);

    // The parameter buffer holds the point the next gradient is taken at (signum: it may hold
    // the SAE, the average, after rest()). Called before each step's passes.
    virtual void begin_step() {}
    // The parameter buffer holds the SAE: what evaluation and checkpoints read (signum swaps in
    // its average; Adam's parameters are the SAE).
    virtual void rest() {}
    // The parameters were just set to p (a fresh start): signum starts its iterate and average
    // there.
    virtual void params_set(const std::vector<float>& /*p*/) {}
    // The buffers were just restored from a checkpoint taken after `step` steps (at rest):
    // signum replays its average's weights from the schedule.
    virtual void restored(int64_t /*step*/) {}

    // (make() chooses; the optimizers derive from it.)
    Optimizer(const SaeConfig& cfg, ParamStore& store, OptimizerOps& ops, int64_t total_steps)
        : cfg_(cfg), store_(store), ops_(ops), total_steps_(total_steps) {}

protected:
    // The step's scalars for update t at lr with the clip's scale.
    virtual math::AdamScalars scalars(float grad_scale, double lr, int64_t t) = 0;

    const SaeConfig& cfg_;
    ParamStore& store_;
    OptimizerOps& ops_;
    int64_t total_steps_;
};

}  // namespace saetrain
