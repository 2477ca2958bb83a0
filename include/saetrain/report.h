// report.h — rank 0's view of a run: every SAE's metrics gathered, one log, one console.
//
// Every rank calls gather() at the same log iterations with its own MetricsRow; rank 0 keeps
// the row of replica 0 of each SAE (replicas report identical, already all-reduced metrics),
// appends them to metrics.jsonl and to each SAE's TensorBoard run (tb/<id>/, tensorboard.h)
// and prints one compact block for the whole sweep, plus the aggregate token rate, TFLOP/s
// (and MFU) and the read bandwidth summed over all ranks.
// Replicas differ in two things, which rank 0 combines: their devices' peaks (summed, for the
// SAE's MFU) and their memory high-water marks (the largest is the SAE's). finish() gathers
// the final results and writes summary.csv and the sweep table sorted by l0.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/comm.h"
#include "saetrain/metrics.h"
#include "saetrain/quality.h"
#include "saetrain/rank_grid.h"
#include "saetrain/tensorboard.h"

namespace saetrain {

struct SaeSummary {
    int config = 0;   // index into the sweep
    MetricsRow last;  // the final interval's metrics
    int64_t steps = 0, tokens = 0;
    double tokens_per_s = 0, wait_fraction = 0;
    double tflops = 0;             // whole run, model FLOPs (metrics.h)
    double mfu = -1;               // whole run; < 0: no peak known (set by finish on rank 0)
    double feature_recovery = -1;  // < 0: no ground truth
    QualityGates gates;            // the end-of-run quality gates (quality.h); density unused
    // The architecture's own figures over the last tenth of the steps (ArchPass::summarize,
    // e.g. Switch's expert_load_min, expert_load_max, expert_dead_max), in its order; empty for
    // architectures with none. Each becomes a summary.csv column and a console column.
    std::vector<std::pair<std::string, double>> arch_figures;
};

class RunReporter {
public:
    // ids: one per SAE (config index order). metrics_path: "" to keep no log (tests).
    // peak_flops: this rank's device peak FLOP/s for MFU (mfu_peak, perfmodel.h); 0: unknown,
    // and then no MFU is reported for the SAEs this rank trains. tb_dir: the TensorBoard
    // directory ("" for none), one run tb_dir/<id>/ per SAE; resumed_step: the step a resumed
    // run continues from (its older events are kept up to it), < 0 for a fresh run.
    RunReporter(Communicator& world, const RankCoords& coords, std::vector<std::string> ids,
                const std::string& metrics_path, double peak_flops = 0,
                const std::string& tb_dir = "", int64_t resumed_step = -1);
    ~RunReporter();
    // Rank 0 (a no-op elsewhere, not collective): each SAE's TensorBoard text summary "config"
    // at `step`: its row of `config_columns` (as finish() takes them) and the resolved
    // config.yaml.
    void write_config_text(const std::string& config_yaml,
                           const std::vector<std::string>& config_column_names,
                           const std::vector<std::map<std::string, std::string>>& config_columns,
                           int64_t step);
    // Collective over the world.
    void gather(const MetricsRow& mine);
    // Collective. Rank 0 writes summary.csv at summary_path (if not empty) and prints the table;
    // returns every SAE's summary on rank 0 (empty elsewhere). config_columns[c] holds columns
    // describing SAE c (arch, n_latents, ...), written in config_column_names order after "sae".
    std::vector<SaeSummary> finish(
        const SaeSummary& mine, const std::string& summary_path,
        const std::vector<std::string>& config_column_names,
        const std::vector<std::map<std::string, std::string>>& config_columns);
    // Seconds rank 0 spent writing metrics.jsonl and the TensorBoard file (the overhead of
    // logging, beside the step time).
    double log_write_seconds() const { return log_write_s_; }

private:
    Communicator& world_;
    RankCoords coords_;
    std::vector<std::string> ids_;
    double peak_flops_ = 0;
    std::unique_ptr<MetricsLog> log_;
    std::map<std::string, std::unique_ptr<TensorBoardWriter>> tb_;  // by SAE id
    double log_write_s_ = 0;
    std::set<std::string> warned_no_variance_;  // "<id>/<rows>": warned of an undefined FVU
};

}  // namespace saetrain
