#include "saetrain/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace saetrain {
namespace {

// MetricsRow <-> a fixed block of doubles, so one all-gather moves every rank's row.
enum Field : int {
    kConfig = 0,
    kReplica,
    kStep,
    kTotalSteps,
    kTokens,
    kLr,
    kLoss,
    kMse,
    kFvu,
    kL0,
    kL1,
    kDead,
    kGradNorm,
    kTokensPerS,
    kReadMBps,
    kWait,
    kElapsed,
    kEta,
    kTflops,
    kGpuMem,
    kHostMem,
    kPeakFlops,  // this rank's device peak (0: unknown); MFU divides by the replicas' sum
    kRecovery,   // finish() only
    kEvalRows,
    kEvalFvu,
    kEvalL0,
    kEvalDead,
    kEvalDense,
    kFields
};

std::vector<double> pack(const MetricsRow& m, int config, int replica, double peak_flops) {
    std::vector<double> v(kFields, 0.0);
    v[kConfig] = config, v[kReplica] = replica;
    v[kStep] = double(m.step), v[kTotalSteps] = double(m.total_steps);
    v[kTokens] = double(m.tokens);
    v[kLr] = m.lr, v[kLoss] = m.loss, v[kMse] = m.mse, v[kFvu] = m.fvu, v[kL0] = m.l0;
    v[kL1] = m.l1, v[kDead] = m.dead_fraction, v[kGradNorm] = m.grad_norm;
    v[kTokensPerS] = m.tokens_per_s, v[kReadMBps] = m.read_MBps, v[kWait] = m.wait_fraction;
    v[kElapsed] = m.elapsed_s, v[kEta] = m.eta_s, v[kTflops] = m.tflops;
    v[kGpuMem] = m.gpu_mem_peak_GB, v[kHostMem] = m.host_mem_peak_GB, v[kPeakFlops] = peak_flops;
    v[kEvalRows] = double(m.eval_rows), v[kEvalFvu] = m.eval_fvu, v[kEvalL0] = m.eval_l0;
    v[kEvalDead] = m.eval_dead_fraction, v[kEvalDense] = m.eval_dense_fraction;
    return v;
}

MetricsRow unpack(const double* v, const std::string& id) {
    MetricsRow m;
    m.sae = id;
    m.step = static_cast<int64_t>(v[kStep]);
    m.total_steps = static_cast<int64_t>(v[kTotalSteps]);
    m.tokens = static_cast<int64_t>(v[kTokens]);
    m.lr = v[kLr], m.loss = v[kLoss], m.mse = v[kMse], m.fvu = v[kFvu], m.l0 = v[kL0];
    m.l1 = v[kL1], m.dead_fraction = v[kDead], m.grad_norm = v[kGradNorm];
    m.tokens_per_s = v[kTokensPerS], m.read_MBps = v[kReadMBps], m.wait_fraction = v[kWait];
    m.elapsed_s = v[kElapsed], m.eta_s = v[kEta], m.tflops = v[kTflops];
    m.gpu_mem_peak_GB = v[kGpuMem], m.host_mem_peak_GB = v[kHostMem];
    m.eval_rows = static_cast<int64_t>(v[kEvalRows]), m.eval_fvu = v[kEvalFvu];
    m.eval_l0 = v[kEvalL0], m.eval_dead_fraction = v[kEvalDead];
    m.eval_dense_fraction = v[kEvalDense];
    return m;
}

// What replicas of one SAE share: the sum of their devices' peaks (0 if any is unknown) and
// the largest memory high-water marks.
struct ConfigTotals {
    double peak_flops = 0;
    bool peak_known = true;
    double gpu_mem = 0, host_mem = 0;
    double mfu(double tflops) const {
        return peak_known && peak_flops > 0 ? tflops * 1e12 / peak_flops : -1.0;
    }
};

std::map<int, ConfigTotals> config_totals(const std::vector<double>& all, int ranks, int stride) {
    std::map<int, ConfigTotals> t;
    for (int p = 0; p < ranks; ++p) {
        const double* b = all.data() + static_cast<size_t>(p) * static_cast<size_t>(stride);
        ConfigTotals& c = t[static_cast<int>(b[kConfig])];
        c.peak_flops += b[kPeakFlops];
        c.peak_known = c.peak_known && b[kPeakFlops] > 0;
        c.gpu_mem = std::max(c.gpu_mem, b[kGpuMem]);
        c.host_mem = std::max(c.host_mem, b[kHostMem]);
    }
    return t;
}

std::string fmt_g(double v) { return fmt::format("{:.6g}", v); }

}  // namespace

RunReporter::RunReporter(Communicator& world, const RankLayout& layout,
                         std::vector<std::string> ids, const std::string& metrics_path,
                         double peak_flops, const std::string& tb_dir, int64_t resumed_step)
    : world_(world), layout_(layout), ids_(std::move(ids)), peak_flops_(peak_flops) {
    if (world_.rank() != 0) return;
    if (!metrics_path.empty()) log_ = std::make_unique<MetricsLog>(metrics_path);
    if (!tb_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(tb_dir, resumed_step);
}

RunReporter::~RunReporter() = default;

void RunReporter::gather(const MetricsRow& mine) {
    const std::vector<double> v = pack(mine, layout_.config, layout_.replica, peak_flops_);
    std::vector<double> all(static_cast<size_t>(kFields * world_.size()));
    world_.allgather(v.data(), all.data(), kFields * static_cast<int64_t>(sizeof(double)));
    if (world_.rank() != 0) return;
    const std::map<int, ConfigTotals> totals = config_totals(all, world_.size(), kFields);
    double read_all = 0, wait_sum = 0, peak_all = 0, gpu_max = 0, host_max = 0;
    bool peak_known = true;
    std::vector<MetricsRow> rows;
    for (int p = 0; p < world_.size(); ++p) {
        const double* b = all.data() + static_cast<size_t>(p) * kFields;
        read_all += b[kReadMBps], wait_sum += b[kWait], peak_all += b[kPeakFlops];
        peak_known = peak_known && b[kPeakFlops] > 0;
        gpu_max = std::max(gpu_max, b[kGpuMem]), host_max = std::max(host_max, b[kHostMem]);
        if (static_cast<int>(b[kReplica]) != 0) continue;
        MetricsRow m = unpack(b, ids_[static_cast<size_t>(b[kConfig])]);
        const ConfigTotals& t = totals.at(static_cast<int>(b[kConfig]));
        m.mfu = t.mfu(m.tflops);
        m.gpu_mem_peak_GB = t.gpu_mem, m.host_mem_peak_GB = t.host_mem;
        rows.push_back(m);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const MetricsRow& m : rows) {
        if (log_) log_->write(m);
        if (tb_) tb_->write(m.step, tensorboard_scalars(m));
    }
    log_write_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const MetricsRow& m : rows) fmt::print("{}\n", progress_line(m));
    if (rows.size() > 1 || world_.size() > 1) {
        double tok = 0, tflops = 0;
        for (const MetricsRow& m : rows) tok += m.tokens_per_s, tflops += m.tflops;
        std::string perf = fmt::format("{} TFLOP/s", format_tflops(tflops));
        if (peak_known && peak_all > 0)
            perf += fmt::format(" | MFU {:.1f}%", 100.0 * tflops * 1e12 / peak_all);
        if (gpu_max > 0) perf += fmt::format(" | GPU mem max {:.2f} GB", gpu_max);
        if (host_max > 0) perf += fmt::format(" | host mem max {:.2f} GB", host_max);
        fmt::print(
            "all {} SAE(s) on {} rank(s) | {} tok/s trained | {} | read {:.1f} MB/s | wait "
            "{:.1f}%\n",
            rows.size(), world_.size(), format_count(tok), perf, read_all,
            100.0 * wait_sum / world_.size());
    }
    std::fflush(stdout);
}

std::vector<SaeSummary> RunReporter::finish(
    const SaeSummary& mine, const std::string& summary_path,
    const std::vector<std::string>& config_column_names,
    const std::vector<std::map<std::string, std::string>>& config_columns) {
    // The row block, then the whole-run figures.
    enum : int {
        kSteps = kFields,
        kTokensAll,
        kRate,
        kWaitAll,
        kTflopsAll,
        kGatesMeasured,  // 0: none, 1: on the end of training, 2: on the held-out rows
        kRelErr,
        kZeros,
        kDecorr,
        kGateDead,
        kGateDense,
        kLoadMin,
        kLoadMax,
        kExpertDead,
        kStride
    };
    std::vector<double> v = pack(mine.last, layout_.config, layout_.replica, peak_flops_);
    v[kRecovery] = mine.feature_recovery;
    v.push_back(double(mine.steps));
    v.push_back(double(mine.tokens));
    v.push_back(mine.tokens_per_s);
    v.push_back(mine.wait_fraction);
    v.push_back(mine.tflops);
    const QualityGates& g = mine.gates;
    v.push_back(g.measured ? (g.held_out ? 2.0 : 1.0) : 0.0);
    for (double x :
         {g.rel_recon_err, g.zeros_frac, g.decorr_rms, g.dead_fraction, g.dense_fraction})
        v.push_back(x);
    for (double x : {mine.expert_load_min, mine.expert_load_max, mine.expert_dead_max})
        v.push_back(x);
    std::vector<double> all(static_cast<size_t>(kStride * world_.size()));
    world_.allgather(v.data(), all.data(), kStride * static_cast<int64_t>(sizeof(double)));
    std::vector<SaeSummary> out;
    if (world_.rank() != 0) return out;
    const std::map<int, ConfigTotals> totals = config_totals(all, world_.size(), kStride);
    for (int p = 0; p < world_.size(); ++p) {
        const double* b = all.data() + static_cast<size_t>(p) * kStride;
        if (static_cast<int>(b[kReplica]) != 0) continue;
        SaeSummary s;
        s.config = static_cast<int>(b[kConfig]);
        s.last = unpack(b, ids_[static_cast<size_t>(b[kConfig])]);
        const ConfigTotals& t = totals.at(s.config);
        s.last.mfu = t.mfu(s.last.tflops);
        s.last.gpu_mem_peak_GB = t.gpu_mem, s.last.host_mem_peak_GB = t.host_mem;
        s.feature_recovery = b[kRecovery];
        s.steps = static_cast<int64_t>(b[kSteps]);
        s.tokens = static_cast<int64_t>(b[kTokensAll]);
        s.tokens_per_s = b[kRate];
        s.wait_fraction = b[kWaitAll];
        s.tflops = b[kTflopsAll];
        s.mfu = t.mfu(s.tflops);
        s.gates.measured = b[kGatesMeasured] > 0, s.gates.held_out = b[kGatesMeasured] > 1;
        s.gates.rel_recon_err = b[kRelErr], s.gates.zeros_frac = b[kZeros];
        s.gates.decorr_rms = b[kDecorr], s.gates.dead_fraction = b[kGateDead];
        s.gates.dense_fraction = b[kGateDense];
        s.expert_load_min = b[kLoadMin], s.expert_load_max = b[kLoadMax];
        s.expert_dead_max = b[kExpertDead];
        out.push_back(s);
    }
    std::sort(out.begin(), out.end(),
              [](const SaeSummary& a, const SaeSummary& b) { return a.last.l0 < b.last.l0; });
    auto any = [&](auto pred) { return std::any_of(out.begin(), out.end(), pred); };
    const bool any_recovery = any([](const SaeSummary& s) { return s.feature_recovery >= 0; });
    const bool any_mfu = any([](const SaeSummary& s) { return s.mfu >= 0; });
    const bool any_gpu = any([](const SaeSummary& s) { return s.last.gpu_mem_peak_GB > 0; });
    const bool any_eval = any([](const SaeSummary& s) { return s.last.eval_rows > 0; });
    const bool any_experts = any([](const SaeSummary& s) { return s.expert_load_max >= 0; });
    if (!summary_path.empty()) {
        std::vector<std::string> cols = {"sae"};
        cols.insert(cols.end(), config_column_names.begin(), config_column_names.end());
        for (const char* c : {"steps", "tokens", "mse", "fvu", "l0", "dead_fraction",
                              "tokens_per_s", "wait_fraction", "tflops"})
            cols.push_back(c);
        if (any_mfu) cols.push_back("mfu");
        if (any_gpu) cols.push_back("gpu_mem_peak_GB");
        cols.push_back("host_mem_peak_GB");
        if (any_recovery) cols.push_back("feature_recovery");
        if (any_eval)
            for (const char* c :
                 {"eval_rows", "eval_fvu", "eval_l0", "eval_dead_fraction", "eval_dense_fraction"})
                cols.push_back(c);
        for (const char* c : {"rel_recon_err", "zeros_frac", "decorr_rms", "gates_dead_fraction",
                              "gates_dense_fraction", "gates_on", "gates"})
            cols.push_back(c);
        if (any_experts)
            for (const char* c : {"expert_load_min", "expert_load_max", "expert_dead_max"})
                cols.push_back(c);
        std::vector<std::map<std::string, std::string>> rows;
        for (const SaeSummary& s : out) {
            std::map<std::string, std::string> r;
            if (s.config < static_cast<int>(config_columns.size()))
                r = config_columns[static_cast<size_t>(s.config)];
            r["sae"] = s.last.sae;
            r["steps"] = std::to_string(s.steps);
            r["tokens"] = std::to_string(s.tokens);
            r["mse"] = fmt_g(s.last.mse);
            r["fvu"] = fmt_g(s.last.fvu);
            r["l0"] = fmt_g(s.last.l0);
            r["dead_fraction"] = fmt_g(s.last.dead_fraction);
            r["tokens_per_s"] = fmt_g(s.tokens_per_s);
            r["wait_fraction"] = fmt_g(s.wait_fraction);
            r["tflops"] = fmt_g(s.tflops);
            if (s.mfu >= 0) r["mfu"] = fmt_g(s.mfu);  // empty cell: no peak known
            if (s.last.gpu_mem_peak_GB > 0) r["gpu_mem_peak_GB"] = fmt_g(s.last.gpu_mem_peak_GB);
            if (s.last.host_mem_peak_GB > 0) r["host_mem_peak_GB"] = fmt_g(s.last.host_mem_peak_GB);
            if (s.feature_recovery >= 0) r["feature_recovery"] = fmt_g(s.feature_recovery);
            if (s.last.eval_rows > 0) {
                r["eval_rows"] = std::to_string(s.last.eval_rows);
                r["eval_fvu"] = fmt_g(s.last.eval_fvu);
                r["eval_l0"] = fmt_g(s.last.eval_l0);
                r["eval_dead_fraction"] = fmt_g(s.last.eval_dead_fraction);
                r["eval_dense_fraction"] = fmt_g(s.last.eval_dense_fraction);
            }
            if (s.gates.measured) {
                r["rel_recon_err"] = fmt_g(s.gates.rel_recon_err);
                r["zeros_frac"] = fmt_g(s.gates.zeros_frac);
                r["decorr_rms"] = fmt_g(s.gates.decorr_rms);
                r["gates_dead_fraction"] = fmt_g(s.gates.dead_fraction);
                r["gates_dense_fraction"] = fmt_g(s.gates.dense_fraction);
                r["gates_on"] = s.gates.held_out ? "held-out" : "training";
            }
            r["gates"] = s.gates.measured ? (s.gates.pass() ? "PASS" : "FAIL") : "";
            if (s.expert_load_max >= 0) {
                r["expert_load_min"] = fmt_g(s.expert_load_min);
                r["expert_load_max"] = fmt_g(s.expert_load_max);
                r["expert_dead_max"] = fmt_g(s.expert_dead_max);
            }
            rows.push_back(std::move(r));
        }
        summary_write(summary_path, cols, rows);
    }
    // Memory per SAE: the device's on GPUs, else the process's resident set on the host. The
    // first fvu is the last log interval's training batches; the held-out block is the
    // evaluation at the end (data.eval_path / data.eval_rows).
    fmt::print("\n{:<28} {:>8} {:>10} {:>8} {:>8} {:>7} {:>10} {:>9}{} {:>11}{}{}\n",
               "sae (sorted by l0)", "steps", "train fvu", "l0", "dead %", "wait %", "tok/s",
               "TFLOP/s", any_mfu ? fmt::format(" {:>6}", "MFU %") : "",
               any_gpu ? "GPU mem GB" : "host mem GB", any_recovery ? "   recovery" : "",
               any_eval ? "   held-out fvu       l0  dead %  dense %" : "");
    for (const SaeSummary& s : out) {
        const double mem = any_gpu ? s.last.gpu_mem_peak_GB : s.last.host_mem_peak_GB;
        std::string held_out;
        if (any_eval && s.last.eval_rows > 0)
            held_out = fmt::format("   {:>12.4f} {:>8.1f} {:>7.1f} {:>8.1f}", s.last.eval_fvu,
                                   s.last.eval_l0, 100 * s.last.eval_dead_fraction,
                                   100 * s.last.eval_dense_fraction);
        fmt::print("{:<28} {:>8} {:>10.4f} {:>8.1f} {:>8.1f} {:>7.1f} {:>10} {:>9}{} {:>11}{}{}\n",
                   s.last.sae, s.steps, s.last.fvu, s.last.l0, 100 * s.last.dead_fraction,
                   100 * s.wait_fraction, format_count(s.tokens_per_s), format_tflops(s.tflops),
                   any_mfu ? fmt::format(" {:>6}", s.mfu >= 0 ? fmt::format("{:.1f}", 100 * s.mfu)
                                                              : std::string("-"))
                           : "",
                   mem > 0 ? fmt::format("{:.2f}", mem) : "-",
                   s.feature_recovery >= 0 ? fmt::format("   {:>8.3f}", s.feature_recovery) : "",
                   held_out);
    }
    // The quality gates (quality.h), one line per SAE.
    fmt::print("\n{:<28} {:>9} {:>14} {:>11} {:>11} {:>7} {:>8}  {}\n", "quality gates", "on",
               "rel_recon_err", "zeros_frac", "decorr_rms", "dead %", "dense %", "gates");
    fmt::print("{:<28} {:>9} {:>14} {:>11} {:>11} {:>7} {:>8}\n", "(pass)", "",
               fmt::format("< {:g}", QualityGates::kMaxRelReconErr),
               fmt::format("> {:g}", QualityGates::kMinZerosFrac),
               fmt::format("< {:g}", QualityGates::kMaxDecorrRms),
               fmt::format("< {:g}", 100 * QualityGates::kMaxDeadFraction),
               fmt::format("< {:g}", 100 * QualityGates::kMaxDenseFraction));
    for (const SaeSummary& s : out) {
        const QualityGates& q = s.gates;
        if (!q.measured) {
            fmt::print("{:<28} {:>9}  not measured (no steps in this process)\n", s.last.sae, "-");
            continue;
        }
        const std::string why = q.failures();
        fmt::print("{:<28} {:>9} {:>14.4f} {:>11.4f} {:>11.3f} {:>7.1f} {:>8.1f}  {}\n", s.last.sae,
                   q.held_out ? "held-out" : "training", q.rel_recon_err, q.zeros_frac,
                   q.decorr_rms, 100 * q.dead_fraction, 100 * q.dense_fraction,
                   why.empty() ? "PASS" : "FAIL: " + why);
    }
    // Switch SAEs: how evenly the router spread the tokens (a uniform load is 1 / n_experts).
    if (any_experts) {
        fmt::print("\n{:<28} {:>16} {:>16} {:>22}\n", "experts (last 10% of steps)",
                   "min token share", "max token share", "most dead in one, %");
        for (const SaeSummary& s : out)
            if (s.expert_load_max >= 0)
                fmt::print("{:<28} {:>16.4f} {:>16.4f} {:>22.1f}\n", s.last.sae, s.expert_load_min,
                           s.expert_load_max, 100 * s.expert_dead_max);
    }
    std::fflush(stdout);
    return out;
}

}  // namespace saetrain
