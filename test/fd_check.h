// fd_check.h — an SAE trainer's gradients against central differences of a reference loss
// (test_arch, test_switch): the loss in double precision on the flat parameters, given the
// parameters it holds fixed (`frozen`: stop-gradient terms such as AuxK's target).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "saetrain/trainer.h"

namespace saetrain::testing {

using RefLoss =
    std::function<double(const std::vector<double>& p, const std::vector<double>& frozen)>;

// Checks every gradient the trainer computes on x (rows rows) against central differences of
// `loss`, skipping kinks (a ReLU at 0, a selection change); `skip` marks the parameters whose
// gradient is not a derivative of the loss (straight-through terms, checked elsewhere);
// `checked_one(i, fd)` sees each parameter that was compared. `what` names the SAE in messages.
// `y`: a transcoder's targets (null: an SAE's).
inline void check_fd(SaeTrainer& tr, const std::vector<float>& x, int64_t rows, const RefLoss& loss,
                     const std::string& what, const std::function<bool(size_t)>& skip = {},
                     const std::function<void(size_t, double)>& checked_one = {},
                     const std::vector<float>* y = nullptr) {
    const StepResult r = tr.compute_gradients(x.data(), rows, 0, y ? y->data() : nullptr);
    const std::vector<float> g = tr.grads_host();
    const std::vector<float> pf = tr.params_host();
    std::vector<double> pd(pf.begin(), pf.end());
    const std::vector<double> frozen = pd;
    const double l0 = loss(pd, frozen);
    EXPECT_NEAR(r.loss, l0, 1e-4 * std::abs(l0)) << what << ": trainer loss vs reference";
    const double h = 1e-5;
    int checked = 0, kinks = 0;
    double worst = 0;
    for (size_t i = 0; i < pd.size(); ++i) {
        if (skip && skip(i)) continue;
        const double keep = pd[i];
        pd[i] = keep + h;
        const double lp = loss(pd, frozen);
        pd[i] = keep - h;
        const double lm = loss(pd, frozen);
        pd[i] = keep;
        const double right = (lp - l0) / h, left = (l0 - lm) / h;
        if (std::abs(right - left) > 1e-3 * (1 + std::abs(right))) {
            ++kinks;
            continue;
        }
        const double fd = (lp - lm) / (2 * h);
        const double err = std::abs(g[i] - fd) / (1e-3 + std::abs(fd));
        worst = std::max(worst, err);
        EXPECT_LT(err, 2e-3) << what << " parameter " << i << ": analytic " << g[i] << " vs fd "
                             << fd;
        ++checked;
        if (checked_one) checked_one(i, fd);
    }
    EXPECT_LT(kinks, static_cast<int>(pd.size() / 20)) << "too many kinks to trust the check";
    EXPECT_GT(checked, static_cast<int>(pd.size() / 2));
    std::printf("%s: %d gradients checked, %d kinks skipped, worst rel err %.2e\n", what.c_str(),
                checked, kinks, worst);
}

}  // namespace saetrain::testing
