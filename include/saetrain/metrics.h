// metrics.h — what a run reports: metrics.jsonl lines, the console progress line, summary.csv.
//
// One MetricsRow per SAE per log interval. Rates are over the interval, fvu over the interval
// (sum of squared errors / sum of squared deviations from each batch's mean). fvu and eval_fvu
// are NaN (undefined) on rows of no variance (fvu_from_sums, quality.h): null in metrics.jsonl,
// an empty cell in summary.csv, "n/a" on the console.
//
// Throughput as a benchmark reports it: tflops = model FLOPs per token (sae_flops_per_token,
// perfmodel.h) x tokens/s, for the SAE over all its replicas; mfu = tflops / the summed peak
// of the devices it ran on, only when that peak is known (the table by GPU name, or
// log.peak_tflops). Memory high-water marks are the largest over the SAE's replicas: the
// device's for GPU backends, the process's peak resident set on the host always.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace saetrain {

struct MetricsRow {
    std::string sae;  // SAE id
    int64_t step = 0, total_steps = 0, tokens = 0;
    double lr = 0, loss = 0, mse = 0, fvu = 0, l0 = 0, l1 = 0, dead_fraction = 0;
    double grad_norm = 0, tokens_per_s = 0, read_MBps = 0, wait_fraction = 0;
    double elapsed_s = 0, eta_s = 0;
    double tflops = 0;            // achieved model TFLOP/s (see above)
    double mfu = -1;              // fraction of peak; < 0: no peak known, not reported
    double gpu_mem_peak_GB = 0;   // device memory high-water mark, 1e9 bytes; 0: not on a GPU
    double host_mem_peak_GB = 0;  // peak RSS of the process, 1e9 bytes; 0: unknown
    double cpu_threads = 0;       // CPU threads of the rank's steps, mean over the interval
    // The SAE on the held-out rows at this step (SaeTrainer::evaluate); eval_rows 0: not
    // evaluated at this step. fvu above is the training batches' (each against its own mean).
    int64_t eval_rows = 0;
    double eval_fvu = 0, eval_l0 = 0, eval_dead_fraction = 0, eval_dense_fraction = 0;
};

// ---- the field table ---------------------------------------------------------------------------
// Every number of a MetricsRow, in struct order, described once: metrics.jsonl writes and reads
// the logged ones in this order (after "sae"), TensorBoard takes the same ones but the step as
// scalars, the report's all-gather packs all of them, and summary.csv formats them from here.
// `sae` is the one string and is handled beside the table.
enum class MetricsShown {
    always,
    when_known,     // value >= 0 (mfu: < 0 means no peak is known)
    when_positive,  // value > 0 (memory high-water marks: 0 means not measured)
    when_evaluated  // eval_rows > 0 (the held-out figures of an evaluation step)
};

struct MetricsField {
    const char* name;                      // the metrics.jsonl key and summary.csv column
    int64_t MetricsRow::*count = nullptr;  // an integer member, or
    double MetricsRow::*value = nullptr;   // a real one (exactly one is set)
    MetricsShown shown = MetricsShown::always;
    bool logged = true;  // in metrics.jsonl; false: only gathered (total_steps, eta_s)
    bool scalar = true;  // a TensorBoard scalar when logged; false: the step, which is the event's

    double get(const MetricsRow& r) const;  // an integer as a double (exact below 2^53)
    void set(MetricsRow& r, double v) const;
    bool shown_in(const MetricsRow& r) const;
};

const std::vector<MetricsField>& metrics_fields();
const MetricsField& metrics_field(const std::string& name);  // throws Error for an unknown name

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
// The last row metrics_json wrote for SAE `sae` in the metrics.jsonl at `path`, or nullopt (no
// file, no row for it). Lines that are not such rows are skipped.
std::optional<MetricsRow> metrics_last_row(const std::string& path, const std::string& sae);
// "<sae> step 150/1000 | 12.3K tok/s | mse 1.2e-02 | fvu 0.045 | l0 32.0 | dead 0.0% |
//  wait 0.0% | 0.19 TFLOP/s [| MFU 12.0%] [| GPU mem 3.20 GB] | host mem 0.50 GB | ETA 1m23s"
// and, on a step with a held-out evaluation, a second line
// "<sae> held-out (65536 rows): fvu 0.051 | l0 31.8 | dead 0.2% | dense 0.0%"
std::string progress_line(const MetricsRow& row);
std::string format_duration(double seconds);
std::string format_count(double x);   // 12345 -> "12.3K"
std::string format_tflops(double x);  // 3 significant digits: "0.194", "412"
std::string format_fvu(double x);     // 4 decimals, "n/a" when undefined (NaN)
// Peak resident set size of this process (VmHWM in /proc/self/status), bytes; 0 where that
// cannot be read.
int64_t host_peak_rss_bytes();

// summary.csv: one row per SAE, columns in the given order (values already formatted).
void summary_write(const std::string& path, const std::vector<std::string>& columns,
                   const std::vector<std::map<std::string, std::string>>& rows);

}  // namespace saetrain
