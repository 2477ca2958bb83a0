// schedule.h — learning-rate and L1-coefficient schedules as pure functions of the step.
#pragma once

#include <cstdint>

#include "saetrain/config.h"

namespace saetrain {

// Learning rate for 0-based `step` of `total_steps`: linear warmup to cfg.lr over
// warmup_steps_for(cfg, total_steps), cfg.lr until cfg.decay_start of the run, then
// cfg.lr_decay (cosine | linear | constant) down to lr * lr_min_ratio at the last step.
// cosine_restarts instead runs cosine cycles from the end of the warmup (decay_start does not
// apply): T_0 = restart_steps_for steps, each next cycle restart_mult times longer.
double lr_at(const SaeConfig& cfg, int64_t step, int64_t total_steps);
// lr_decay: cosine_restarts: the first cycle's length T_0, cfg.restart_steps when > 0, else a
// quarter of the run.
int64_t restart_steps_for(const SaeConfig& cfg, int64_t total_steps);
// cfg.warmup_steps when > 0, else cfg.warmup_fraction of the run (rounded).
int64_t warmup_steps_for(const SaeConfig& cfg, int64_t total_steps);
// L1 coefficient for `step` of `total_steps`: ramps linearly from 0 over cfg.l1_warmup_steps
// (when > 0, else cfg.l1_warmup_fraction of the run).
double l1_at(const SaeConfig& cfg, int64_t step, int64_t total_steps);
// Any sparsity coefficient (L1, JumpReLU's L0) on the same ramp: coeff times l1_at's fraction.
double sparsity_coeff_at(const SaeConfig& cfg, double coeff, int64_t step, int64_t total_steps);

// The L1 ramp's two settings, all a sparsity coefficient needs of the config.
struct SparsityRamp {
    explicit SparsityRamp(const SaeConfig& cfg)
        : warmup_steps(cfg.l1_warmup_steps), warmup_fraction(cfg.l1_warmup_fraction) {}
    // The ramp's length in steps for a run of `total_steps` (0: no ramp).
    int64_t steps(int64_t total_steps) const;
    // The ramp's fraction at `step` of `total_steps`: (step + 1) / ramp up to 1 (1 without a ramp).
    double fraction(int64_t step, int64_t total_steps) const;
    int64_t warmup_steps;
    double warmup_fraction;
};

}  // namespace saetrain
