// The bench programs' shared timing and reporting (harness.h).
#include "harness.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace saetrain::bench {

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Timing::median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0.0 : s[s.size() / 2];
}
double Timing::min() const {
    return seconds.empty() ? 0.0 : *std::min_element(seconds.begin(), seconds.end());
}
double Timing::total() const { return std::accumulate(seconds.begin(), seconds.end(), 0.0); }

Timing time_calls(int warmup, int reps, const std::function<void()>& sync,
                  const std::function<void()>& run) {
    for (int w = 0; w < warmup; ++w) run();
    if (sync) sync();
    Timing t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        run();
        if (sync) sync();
        t.seconds.push_back(seconds_since(t0));
    }
    return t;
}

double time_span(int warmup, int reps, const std::function<void()>& sync,
                 const std::function<void()>& run) {
    for (int w = 0; w < warmup; ++w) run();
    if (sync) sync();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) run();
    if (sync) sync();
    return seconds_since(t0);
}

std::vector<GemmShape> dense_step_gemms(int64_t batch, int64_t d, int64_t n) {
    return {{false, true, batch, n, d},   // encoder
            {false, false, batch, d, n},  // decoder
            {true, false, n, d, batch},   // dW_dec
            {false, true, batch, n, d},   // dz
            {true, false, n, d, batch}};  // dW_enc
}

double gemm_flops_per_s(Backend& be, const std::vector<GemmShape>& shapes, int reps) {
    int64_t most = 0;
    double flops = 0;
    for (const GemmShape& g : shapes) {
        most = std::max({most, g.m * g.k, g.k * g.n, g.m * g.n});
        flops +=
            2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> host(static_cast<size_t>(most));
    for (float& v : host) v = normal(rng);
    DeviceArray<float> a(be, most), b(be, most), c(be, most);
    be.upload(a.data(), host.data(), a.bytes());
    be.upload(b.data(), host.data(), b.bytes());
    const Timing t = time_calls(
        2, reps, [&] { be.synchronize(); },
        [&] {
            for (const GemmShape& g : shapes)
                be.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(),
                        g.tb ? g.k : g.n, 0.0f, c.data(), g.n);
        });
    return flops / t.median();
}

void Report::add(const std::string& key, double value, const std::string& unit, double limit,
                 const std::string& limit_is) {
    rows_.push_back({key, unit, limit_is, value, limit});
}

void Report::print() const {
    fmt::print("{}\n", title_);
    fmt::print("{:<26} {:>14} {:>14} {:>8}  {}\n", "figure", "value", "limit", "of limit",
               "the limit");
    for (const Row& r : rows_) {
        const bool has = std::isfinite(r.limit) && r.limit > 0;
        fmt::print("{:<26} {:>14} {:>14} {:>8}  {}\n", r.key,
                   fmt::format("{:.4g} {}", r.value, r.unit),
                   has ? fmt::format("{:.4g} {}", r.limit, r.unit) : "-",
                   has ? fmt::format("{:.1f}%", 100.0 * r.value / r.limit) : "-", r.limit_is);
    }
    // Plain decimals (no exponent): bench/*.sh read these with [0-9.]*.
    auto plain = [](double v) {
        std::string t = fmt::format("{:.6f}", v);
        while (t.back() == '0') t.pop_back();
        if (t.back() == '.') t.pop_back();
        return t;
    };
    std::string line = "RESULT";
    for (const Row& r : rows_) line += fmt::format(" {}={}", r.key, plain(r.value));
    fmt::print("{}\n", line);
}

nlohmann::ordered_json Report::json() const {
    nlohmann::ordered_json out;
    out["title"] = title_;
    for (const Row& r : rows_) {
        nlohmann::ordered_json f = {{"value", r.value}, {"unit", r.unit}};
        if (std::isfinite(r.limit) && r.limit > 0)
            f["limit"] = r.limit, f["limit_is"] = r.limit_is, f["fraction"] = r.value / r.limit;
        out[r.key] = f;
    }
    return out;
}

}  // namespace saetrain::bench
