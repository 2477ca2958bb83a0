#include "saetrain/schedule.h"

#include <algorithm>
#include <cmath>

namespace saetrain {

int64_t warmup_steps_for(const SaeConfig& cfg, int64_t total_steps) {
    if (cfg.warmup_steps > 0) return cfg.warmup_steps;
    return std::llround(cfg.warmup_fraction *
                        static_cast<double>(std::max<int64_t>(total_steps, 0)));
}

int64_t restart_steps_for(const SaeConfig& cfg, int64_t total_steps) {
    if (cfg.restart_steps > 0) return cfg.restart_steps;
    return std::max<int64_t>(
        1, std::llround(0.25 * static_cast<double>(std::max<int64_t>(total_steps, 0))));
}

double lr_at(const SaeConfig& cfg, int64_t step, int64_t total_steps) {
    const int64_t warmup = warmup_steps_for(cfg, total_steps);
    if (warmup > 0 && step < warmup)
        return cfg.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    const double lo = cfg.lr * cfg.lr_min_ratio;
    if (cfg.lr_decay == "cosine_restarts") {
        // PyTorch's CosineAnnealingWarmRestarts from the end of the warmup: cycles of T_0,
        // T_0 * T_mult, T_0 * T_mult^2, ... steps, each a cosine from lr down to lo.
        int64_t t_cur = step - std::max<int64_t>(warmup, 0),
                t_i = restart_steps_for(cfg, total_steps);
        if (cfg.restart_mult == 1.0) t_cur %= t_i;  // equal cycles (the loop would take long)
        while (t_cur >= t_i) {
            t_cur -= t_i;
            t_i = std::max<int64_t>(1, std::llround(static_cast<double>(t_i) * cfg.restart_mult));
        }
        return lo +
               (cfg.lr - lo) * 0.5 *
                   (1.0 + std::cos(M_PI * static_cast<double>(t_cur) / static_cast<double>(t_i)));
    }
    const auto hold_until =
        std::max<int64_t>(warmup, std::llround(cfg.decay_start * static_cast<double>(total_steps)));
    const int64_t decay_steps = std::max<int64_t>(1, total_steps - hold_until);
    const double t = std::clamp(
        static_cast<double>(step - hold_until) / static_cast<double>(decay_steps), 0.0, 1.0);
    if (cfg.lr_decay == "cosine") return lo + (cfg.lr - lo) * 0.5 * (1.0 + std::cos(M_PI * t));
    if (cfg.lr_decay == "linear") return cfg.lr + (lo - cfg.lr) * t;
    return cfg.lr;  // constant
}

double l1_at(const SaeConfig& cfg, int64_t step, int64_t total_steps) {
    return sparsity_coeff_at(cfg, cfg.l1_coeff, step, total_steps);
}

double sparsity_coeff_at(const SaeConfig& cfg, double coeff, int64_t step, int64_t total_steps) {
    return coeff * SparsityRamp(cfg).fraction(step, total_steps);
}

int64_t SparsityRamp::steps(int64_t total_steps) const {
    return warmup_steps > 0 ? warmup_steps
                            : std::llround(warmup_fraction *
                                           static_cast<double>(std::max<int64_t>(total_steps, 0)));
}

double SparsityRamp::fraction(int64_t step, int64_t total_steps) const {
    const int64_t ramp = steps(total_steps);
    if (ramp <= 0) return 1.0;
    return std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(ramp));
}

}  // namespace saetrain
