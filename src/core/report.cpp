#include "saetrain/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

namespace saetrain {
namespace {

// MetricsRow <-> a fixed block of doubles, so one all-gather moves every rank's row.
constexpr int kFields = 20;

std::vector<double> pack(const MetricsRow& m, int config, int replica) {
    return {double(config),
            double(replica),
            double(m.step),
            double(m.total_steps),
            double(m.tokens),
            m.lr,
            m.loss,
            m.mse,
            m.fvu,
            m.l0,
            m.l1,
            m.dead_fraction,
            m.grad_norm,
            m.tokens_per_s,
            m.read_MBps,
            m.wait_fraction,
            m.elapsed_s,
            m.eta_s,
            0.0,
            0.0};
}

MetricsRow unpack(const double* v, const std::string& id) {
    MetricsRow m;
    m.sae = id;
    m.step = static_cast<int64_t>(v[2]);
    m.total_steps = static_cast<int64_t>(v[3]);
    m.tokens = static_cast<int64_t>(v[4]);
    m.lr = v[5], m.loss = v[6], m.mse = v[7], m.fvu = v[8], m.l0 = v[9], m.l1 = v[10];
    m.dead_fraction = v[11], m.grad_norm = v[12], m.tokens_per_s = v[13], m.read_MBps = v[14];
    m.wait_fraction = v[15], m.elapsed_s = v[16], m.eta_s = v[17];
    return m;
}

std::string fmt_g(double v) { return fmt::format("{:.6g}", v); }

}  // namespace

RunReporter::RunReporter(Communicator& world, const RankLayout& layout,
                         std::vector<std::string> ids, const std::string& metrics_path)
    : world_(world), layout_(layout), ids_(std::move(ids)) {
    if (world_.rank() == 0 && !metrics_path.empty())
        log_ = std::make_unique<MetricsLog>(metrics_path);
}

RunReporter::~RunReporter() = default;

void RunReporter::gather(const MetricsRow& mine) {
    const std::vector<double> v = pack(mine, layout_.config, layout_.replica);
    std::vector<double> all(static_cast<size_t>(kFields * world_.size()));
    world_.allgather(v.data(), all.data(), kFields * static_cast<int64_t>(sizeof(double)));
    if (world_.rank() != 0) return;
    double read_all = 0, wait_sum = 0;
    std::vector<MetricsRow> rows;
    for (int p = 0; p < world_.size(); ++p) {
        const double* b = all.data() + static_cast<size_t>(p) * kFields;
        read_all += b[14], wait_sum += b[15];
        if (static_cast<int>(b[1]) == 0) rows.push_back(unpack(b, ids_[static_cast<size_t>(b[0])]));
    }
    for (const MetricsRow& m : rows) {
        if (log_) log_->write(m);
        fmt::print("{}\n", progress_line(m));
    }
    if (rows.size() > 1 || world_.size() > 1) {
        double tok = 0;
        for (const MetricsRow& m : rows) tok += m.tokens_per_s;
        fmt::print(
            "all {} SAE(s) on {} rank(s) | {} tok/s trained | read {:.1f} MB/s | wait {:.1f}%\n",
            rows.size(), world_.size(), format_count(tok), read_all,
            100.0 * wait_sum / world_.size());
    }
    std::fflush(stdout);
}

std::vector<SaeSummary> RunReporter::finish(
    const SaeSummary& mine, const std::string& summary_path,
    const std::vector<std::string>& config_column_names,
    const std::vector<std::map<std::string, std::string>>& config_columns) {
    std::vector<double> v = pack(mine.last, layout_.config, layout_.replica);
    v[18] = mine.feature_recovery;
    v.push_back(double(mine.steps));
    v.push_back(double(mine.tokens));
    v.push_back(mine.tokens_per_s);
    v.push_back(mine.wait_fraction);
    const int f = kFields + 4;
    std::vector<double> all(static_cast<size_t>(f * world_.size()));
    world_.allgather(v.data(), all.data(), f * static_cast<int64_t>(sizeof(double)));
    std::vector<SaeSummary> out;
    if (world_.rank() != 0) return out;
    for (int p = 0; p < world_.size(); ++p) {
        const double* b = all.data() + static_cast<size_t>(p) * f;
        if (static_cast<int>(b[1]) != 0) continue;
        SaeSummary s;
        s.config = static_cast<int>(b[0]);
        s.last = unpack(b, ids_[static_cast<size_t>(b[0])]);
        s.feature_recovery = b[18];
        s.steps = static_cast<int64_t>(b[kFields]);
        s.tokens = static_cast<int64_t>(b[kFields + 1]);
        s.tokens_per_s = b[kFields + 2];
        s.wait_fraction = b[kFields + 3];
        out.push_back(s);
    }
    std::sort(out.begin(), out.end(),
              [](const SaeSummary& a, const SaeSummary& b) { return a.last.l0 < b.last.l0; });
    const bool any_recovery = std::any_of(
        out.begin(), out.end(), [](const SaeSummary& s) { return s.feature_recovery >= 0; });
    if (!summary_path.empty()) {
        std::vector<std::string> cols = {"sae"};
        cols.insert(cols.end(), config_column_names.begin(), config_column_names.end());
        for (const char* c : {"steps", "tokens", "mse", "fvu", "l0", "dead_fraction",
                              "tokens_per_s", "wait_fraction"})
            cols.push_back(c);
        if (any_recovery) cols.push_back("feature_recovery");
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
            if (s.feature_recovery >= 0) r["feature_recovery"] = fmt_g(s.feature_recovery);
            rows.push_back(std::move(r));
        }
        summary_write(summary_path, cols, rows);
    }
    fmt::print("\n{:<28} {:>8} {:>10} {:>8} {:>8} {:>7} {:>10}{}\n", "sae (sorted by l0)", "steps",
               "fvu", "l0", "dead %", "wait %", "tok/s", any_recovery ? "   recovery" : "");
    for (const SaeSummary& s : out)
        fmt::print("{:<28} {:>8} {:>10.4f} {:>8.1f} {:>8.1f} {:>7.1f} {:>10}{}\n", s.last.sae,
                   s.steps, s.last.fvu, s.last.l0, 100 * s.last.dead_fraction,
                   100 * s.wait_fraction, format_count(s.tokens_per_s),
                   s.feature_recovery >= 0 ? fmt::format("   {:>8.3f}", s.feature_recovery) : "");
    std::fflush(stdout);
    return out;
}

}  // namespace saetrain
