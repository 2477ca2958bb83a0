// metrics.h — what a run reports: metrics.jsonl lines, the console progress line, summary.csv.
//
// One MetricsRow per SAE per log interval. Rates are over the interval, fvu over the interval
// (sum of squared errors / sum of squared deviations from each batch's mean).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace saetrain {

struct MetricsRow {
    std::string sae;  // SAE id
    int64_t step = 0, total_steps = 0, tokens = 0;
    double lr = 0, loss = 0, mse = 0, fvu = 0, l0 = 0, l1 = 0, dead_fraction = 0;
    double grad_norm = 0, tokens_per_s = 0, read_MBps = 0, wait_fraction = 0;
    double elapsed_s = 0, eta_s = 0;
};

// Appends one JSON object per line; flushed after each write so a killed run keeps its log.
class MetricsLog {
public:
    explicit MetricsLog(const std::string& path);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;
    void write(const MetricsRow& row);

private:
    std::FILE* f_ = nullptr;
    std::string path_;
};

std::string metrics_json(const MetricsRow& row);
// "step 150/1000 | 12.3K tok/s | mse 1.2e-02 | fvu 0.045 | l0 32.0 | dead 0.0% | ETA 1m23s"
std::string progress_line(const MetricsRow& row);
std::string format_duration(double seconds);
std::string format_count(double x);  // 12345 -> "12.3K"

// summary.csv: one row per SAE, columns in the given order (values already formatted).
void summary_write(const std::string& path, const std::vector<std::string>& columns,
                   const std::vector<std::map<std::string, std::string>>& rows);

}  // namespace saetrain
