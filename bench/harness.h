// harness.h — what every throughput program in bench/ shares: timing with warm-up, repetitions
// and synchronization; the GEMM rate that bounds a training step; and one way to print figures
// beside their limits (a fixed-width table with a units row, a JSON twin, and `RESULT key=value`
// lines for the scripts in bench/).
//
// A figure is only worth printing beside the limit it is measured against in the same run
// (sgemm, raw reads, the rate of one rank, a roofline): Report keeps the two together.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "saetrain/backend.h"

namespace saetrain::bench {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// Seconds of `reps` timed calls of `run`, after `warmup` untimed ones. `sync` (a backend's
// synchronize, a barrier; may be empty) runs before each clock read, so device work and other
// ranks finish inside the call that queued them.
struct Timing {
    std::vector<double> seconds;  // one per timed call, in call order
    double median() const;
    double min() const;
    double total() const;
};
Timing time_calls(int warmup, int reps, const std::function<void()>& sync,
                  const std::function<void()>& run);
// One span over `reps` calls after `warmup` (for steps that feed each other, a stream of
// batches, where a per-call clock read would add a synchronization the real loop does not
// have): total seconds of the span.
double time_span(int warmup, int reps, const std::function<void()>& sync,
                 const std::function<void()>& run);

// A row-major GEMM shape as Backend::gemm takes it.
struct GemmShape {
    bool ta, tb;
    int64_t m, n, k;
};
// The five GEMM shapes of a dense SAE step (encoder, decoder, dW_dec, dz, dW_enc).
std::vector<GemmShape> dense_step_gemms(int64_t batch, int64_t d, int64_t n);
// FLOP/s of the backend's GEMM on these shapes, as the trainer calls it (random operands in the
// backend's memory, never zeros: they can run faster than real data), median of `reps`.
double gemm_flops_per_s(Backend& be, const std::vector<GemmShape>& shapes, int reps);

// Figures beside their limits. add() a figure with its unit, and the limit it is measured
// against in this run (NaN: none) with what that limit is; print() writes the table (name,
// figure, limit, % of the limit, what the limit is) and RESULT lines; json() is its twin.
class Report {
public:
    explicit Report(std::string title) : title_(std::move(title)) {}
    void add(const std::string& key, double value, const std::string& unit,
             double limit = std::nan(""), const std::string& limit_is = "");
    void print() const;
    nlohmann::ordered_json json() const;

private:
    struct Row {
        std::string key, unit, limit_is;
        double value, limit;
    };
    std::string title_;
    std::vector<Row> rows_;
};

}  // namespace saetrain::bench
