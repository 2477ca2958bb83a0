// report.cpp — RunReporter: every rank's MetricsRow all-gathered as doubles (the field table
// of metrics.h), rank 0's log lines and console, and finish()'s summary.csv and tables.
#include "saetrain/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

namespace saetrain {
namespace {

// ---- the all-gather blocks ---------------------------------------------------------------------
// One rank's block: who it is, its device's peak, then every MetricsRow field in table order
// (metrics_fields()), so one all-gather of doubles moves every rank's row; finish() appends the
// whole-run figures (summary_pack).
enum Slot : int {
    kConfig = 0,
    kReplica,
    kPeakFlops,  // this rank's device peak (0: unknown); MFU divides by the replicas' sum
    kRow         // the first MetricsRow field
};

std::vector<double> pack(const MetricsRow& m, int config, int replica, double peak_flops) {
    std::vector<double> v = {double(config), double(replica), peak_flops};
    for (const MetricsField& f : metrics_fields()) v.push_back(f.get(m));
    return v;
}

MetricsRow unpack(const double* v, const std::string& id) {
    MetricsRow m;
    m.sae = id;
    const std::vector<MetricsField>& fields = metrics_fields();
    for (size_t i = 0; i < fields.size(); ++i) fields[i].set(m, v[kRow + i]);
    return m;
}

// One rank's block as rank 0 reads it; `rest`: what follows the row (finish()'s figures).
struct RankBlock {
    int config = 0, replica = 0;
    double peak_flops = 0;
    MetricsRow row;
    std::vector<double> rest;
};

std::vector<RankBlock> all_gather_blocks(Communicator& world, const std::vector<double>& mine,
                                         const std::vector<std::string>& ids) {
    const size_t stride = mine.size();
    std::vector<double> all(stride * static_cast<size_t>(world.size()));
    world.allgather(mine.data(), all.data(), static_cast<int64_t>(stride * sizeof(double)));
    std::vector<RankBlock> blocks;
    if (world.rank() != 0) return blocks;
    const double* b = all.data();
    for (int p = 0; p < world.size(); ++p, b += stride) {
        RankBlock r;
        r.config = static_cast<int>(b[kConfig]), r.replica = static_cast<int>(b[kReplica]);
        r.peak_flops = b[kPeakFlops];
        r.row = unpack(b, ids[static_cast<size_t>(r.config)]);
        r.rest.assign(b + kRow + metrics_fields().size(), b + stride);
        blocks.push_back(std::move(r));
    }
    return blocks;
}

// `mine` from every rank (the ranks' strings may differ in length), on rank 0; empty elsewhere.
std::vector<std::string> gather_strings(Communicator& world, const std::string& mine) {
    const int64_t n = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(static_cast<size_t>(world.size()));
    world.allgather(&n, sizes.data(), sizeof(int64_t));
    const int64_t width = *std::max_element(sizes.begin(), sizes.end());
    std::string padded = mine;
    padded.resize(static_cast<size_t>(width));
    std::string all(static_cast<size_t>(width * world.size()), '\0');
    if (width > 0) world.allgather(padded.data(), all.data(), width);  // every rank knows width
    std::vector<std::string> out;
    if (world.rank() != 0) return out;
    for (int p = 0; p < world.size(); ++p)
        out.push_back(all.substr(static_cast<size_t>(p * width), sizes[static_cast<size_t>(p)]));
    return out;
}

// Named figures as bytes for gather_strings: each name, a NUL, the double's 8 bytes.
std::string figures_encode(const std::vector<std::pair<std::string, double>>& figures) {
    std::string out;
    for (const auto& [name, value] : figures) {
        out += name;
        out.push_back('\0');
        out.append(reinterpret_cast<const char*>(&value), sizeof(double));
    }
    return out;
}

std::vector<std::pair<std::string, double>> figures_decode(const std::string& bytes) {
    std::vector<std::pair<std::string, double>> figures;
    for (size_t at = 0; at < bytes.size();) {
        const size_t end = bytes.find('\0', at);
        double value = 0;
        std::memcpy(&value, bytes.data() + end + 1, sizeof(double));
        figures.emplace_back(bytes.substr(at, end - at), value);
        at = end + 1 + sizeof(double);
    }
    return figures;
}

// ---- combining replicas ------------------------------------------------------------------------

// The replica a rank's block reports as: its own, or -1 on a latent shard other than the
// first (the same SAE's figures again; its block still counts for the MFU and memory).
int row_replica(const RankCoords& l) { return l.latent_shard == 0 ? l.replica : -1; }

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

std::map<int, ConfigTotals> config_totals(const std::vector<RankBlock>& blocks) {
    std::map<int, ConfigTotals> t;
    for (const RankBlock& b : blocks) {
        ConfigTotals& c = t[b.config];
        c.peak_flops += b.peak_flops;
        c.peak_known = c.peak_known && b.peak_flops > 0;
        c.gpu_mem = std::max(c.gpu_mem, b.row.gpu_mem_peak_GB);
        c.host_mem = std::max(c.host_mem, b.row.host_mem_peak_GB);
    }
    return t;
}

// An SAE's row: its replica 0's, with the MFU and memory high-water marks of all its replicas.
MetricsRow sae_row(const RankBlock& replica0, const ConfigTotals& t) {
    MetricsRow m = replica0.row;
    m.mfu = t.mfu(m.tflops);
    m.gpu_mem_peak_GB = t.gpu_mem, m.host_mem_peak_GB = t.host_mem;
    return m;
}

// The line below each interval's rows for a sweep or several ranks: token rate and TFLOP/s
// over the SAEs, read bandwidth and waiting over the ranks, MFU over every device.
void print_all_line(const std::vector<RankBlock>& blocks, const std::vector<MetricsRow>& rows) {
    double read_all = 0, wait_sum = 0, peak_all = 0, gpu_max = 0, host_max = 0;
    bool peak_known = true;
    for (const RankBlock& b : blocks) {
        read_all += b.row.read_MBps, wait_sum += b.row.wait_fraction, peak_all += b.peak_flops;
        peak_known = peak_known && b.peak_flops > 0;
        gpu_max = std::max(gpu_max, b.row.gpu_mem_peak_GB);
        host_max = std::max(host_max, b.row.host_mem_peak_GB);
    }
    double tok = 0, tflops = 0;
    for (const MetricsRow& m : rows) tok += m.tokens_per_s, tflops += m.tflops;
    std::string perf = fmt::format("{} TFLOP/s", format_tflops(tflops));
    if (peak_known && peak_all > 0)
        perf += fmt::format(" | MFU {:.1f}%", 100.0 * tflops * 1e12 / peak_all);
    if (gpu_max > 0) perf += fmt::format(" | GPU mem max {:.2f} GB", gpu_max);
    if (host_max > 0) perf += fmt::format(" | host mem max {:.2f} GB", host_max);
    const int ranks = static_cast<int>(blocks.size());
    fmt::print(
        "all {} SAE(s) on {} rank(s) | {} tok/s trained | {} | read {:.1f} MB/s | wait "
        "{:.1f}%\n",
        rows.size(), ranks, format_count(tok), perf, read_all, 100.0 * wait_sum / ranks);
}

// ---- the summary -------------------------------------------------------------------------------

// SaeSummary's whole-run figures after the row block; summary_unpack reads them in this order.
std::vector<double> summary_pack(const SaeSummary& s) {
    const QualityGates& g = s.gates;
    return {s.feature_recovery,
            double(s.steps),
            double(s.tokens),
            s.tokens_per_s,
            s.wait_fraction,
            s.tflops,
            g.measured ? (g.held_out ? 2.0 : 1.0) : 0.0,  // on the end of training or held-out
            g.rel_recon_err,
            g.zeros_frac,
            g.decorr_rms,
            g.dead_fraction,
            g.dense_fraction,
            g.no_variance ? 1.0 : 0.0};
}

void summary_unpack(SaeSummary& s, const double* x) {
    QualityGates& g = s.gates;
    s.feature_recovery = x[0];
    s.steps = static_cast<int64_t>(x[1]), s.tokens = static_cast<int64_t>(x[2]);
    s.tokens_per_s = x[3], s.wait_fraction = x[4], s.tflops = x[5];
    g.measured = x[6] > 0, g.held_out = x[6] > 1;
    g.rel_recon_err = x[7], g.zeros_frac = x[8], g.decorr_rms = x[9];
    g.dead_fraction = x[10], g.dense_fraction = x[11];
    g.no_variance = x[12] > 0;
}

std::string fmt_g(double v) { return fmt::format("{:.6g}", v); }

// A summary.csv column: its cell for one SAE ("" leaves it empty), and whether it is written
// when every cell is empty (otherwise it is left out, as mfu is when no peak is known).
struct Column {
    std::string name;
    std::function<std::string(const SaeSummary&)> cell;
    bool always = true;
    // Also written when this holds for an SAE, its cell empty (an undefined figure).
    std::function<bool(const SaeSummary&)> measured = nullptr;
};

// The final interval's value of a MetricsRow field, shown as metrics.jsonl shows it (an
// undefined one, NaN and null there, as an empty cell: a missing figure, in a column that is
// there when the field was measured).
Column last_interval(const char* name, bool always = true) {
    const MetricsField& f = metrics_field(name);
    return {name,
            [&f](const SaeSummary& s) {
                if (!f.shown_in(s.last) || std::isnan(f.get(s.last))) return std::string();
                return f.count ? std::to_string(s.last.*f.count) : fmt_g(s.last.*f.value);
            },
            always, [&f](const SaeSummary& s) { return f.shown_in(s.last); }};
}

std::vector<Column> summary_columns(const std::vector<SaeSummary>& sorted) {
    auto gate = [](const char* name, double QualityGates::*m) {
        return Column{name, [m](const SaeSummary& s) {
                          return s.gates.measured ? fmt_g(s.gates.*m) : std::string();
                      }};
    };
    std::vector<Column> cols = {
        {"steps", [](const SaeSummary& s) { return std::to_string(s.steps); }},
        {"tokens", [](const SaeSummary& s) { return std::to_string(s.tokens); }},
        last_interval("mse"),
        last_interval("fvu"),
        last_interval("l0"),
        last_interval("dead_fraction"),
        {"tokens_per_s", [](const SaeSummary& s) { return fmt_g(s.tokens_per_s); }},
        {"wait_fraction", [](const SaeSummary& s) { return fmt_g(s.wait_fraction); }},
        {"tflops", [](const SaeSummary& s) { return fmt_g(s.tflops); }},
        {"mfu", [](const SaeSummary& s) { return s.mfu >= 0 ? fmt_g(s.mfu) : ""; }, false},
        last_interval("gpu_mem_peak_GB", false),
        last_interval("host_mem_peak_GB"),
        {"feature_recovery",
         [](const SaeSummary& s) {
             return s.feature_recovery >= 0 ? fmt_g(s.feature_recovery) : "";
         },
         false},
        last_interval("eval_rows", false),
        last_interval("eval_fvu", false),
        last_interval("eval_l0", false),
        last_interval("eval_dead_fraction", false),
        last_interval("eval_dense_fraction", false),
        // The failing gates as the console's gates table words them ("" when all pass).
        {"gates_failed",
         [](const SaeSummary& s) { return s.gates.measured ? s.gates.failures() : ""; }},
        gate("rel_recon_err", &QualityGates::rel_recon_err),
        gate("zeros_frac", &QualityGates::zeros_frac),
        gate("decorr_rms", &QualityGates::decorr_rms),
        gate("gates_dead_fraction", &QualityGates::dead_fraction),
        gate("gates_dense_fraction", &QualityGates::dense_fraction),
        {"gates_on",
         [](const SaeSummary& s) {
             return s.gates.measured ? (s.gates.held_out ? "held-out" : "training") : "";
         }},
        {"gates",
         [](const SaeSummary& s) {
             return s.gates.measured ? (s.gates.pass() ? "PASS" : "FAIL") : "";
         }},
    };
    // The architectures' figures, each name once, in the order the SAEs name them.
    std::vector<std::string> figures;
    for (const SaeSummary& s : sorted)
        for (const auto& fig : s.arch_figures)
            if (std::find(figures.begin(), figures.end(), fig.first) == figures.end())
                figures.push_back(fig.first);
    for (const std::string& name : figures)
        cols.push_back({name,
                        [name](const SaeSummary& s) {
                            for (const auto& [n, v] : s.arch_figures)
                                if (n == name) return fmt_g(v);
                            return std::string();
                        },
                        false});
    return cols;
}

void summary_csv_write(const std::string& path, const std::vector<SaeSummary>& sorted,
                       const std::vector<std::string>& config_column_names,
                       const std::vector<std::map<std::string, std::string>>& config_columns) {
    std::vector<std::string> names = {"sae"};
    names.insert(names.end(), config_column_names.begin(), config_column_names.end());
    std::vector<std::map<std::string, std::string>> rows;
    for (const SaeSummary& s : sorted) {
        std::map<std::string, std::string> r;
        if (s.config < static_cast<int>(config_columns.size()))
            r = config_columns[static_cast<size_t>(s.config)];
        r["sae"] = s.last.sae;
        rows.push_back(std::move(r));
    }
    for (const Column& c : summary_columns(sorted)) {
        bool any = false;
        for (size_t i = 0; i < sorted.size(); ++i) {
            std::string cell = c.cell(sorted[i]);
            any = any || (c.measured && c.measured(sorted[i]));
            if (cell.empty()) continue;
            any = true;
            rows[i][c.name] = std::move(cell);
        }
        if (any || c.always) names.push_back(c.name);
    }
    summary_write(path, names, rows);
}

// ---- the console tables ------------------------------------------------------------------------

// Once per SAE and set of rows (training, held-out), the first time its FVU is undefined.
void warn_if_no_variance(const MetricsRow& m, std::set<std::string>& warned) {
    for (const auto& [fvu, rows] : {std::pair{m.fvu, "training batches"},
                                    std::pair{m.eval_rows > 0 ? m.eval_fvu : 0.0, "held-out rows"}})
        if (std::isnan(fvu) && warned.insert(m.sae + "/" + rows).second)
            fmt::print(stderr,
                       "saetrain: warning: {}: the {} have (near) zero variance, so FVU is "
                       "undefined (null in metrics.jsonl, n/a here) and the quality gates fail; "
                       "check the data (sae-inspect)\n",
                       m.sae, rows);
}

bool any_of(const std::vector<SaeSummary>& out, const std::function<bool(const SaeSummary&)>& p) {
    return std::any_of(out.begin(), out.end(), p);
}

// Memory per SAE: the device's on GPUs, else the process's resident set on the host. The
// first fvu is the last log interval's training batches; the held-out block is the
// evaluation at the end (data.eval_path / data.eval_rows).
void print_sweep_table(const std::vector<SaeSummary>& out) {
    const bool any_recovery =
        any_of(out, [](const SaeSummary& s) { return s.feature_recovery >= 0; });
    const bool any_mfu = any_of(out, [](const SaeSummary& s) { return s.mfu >= 0; });
    const bool any_gpu =
        any_of(out, [](const SaeSummary& s) { return s.last.gpu_mem_peak_GB > 0; });
    const bool any_eval = any_of(out, [](const SaeSummary& s) { return s.last.eval_rows > 0; });
    fmt::print("\n{:<28} {:>8} {:>10} {:>8} {:>8} {:>7} {:>10} {:>9}{} {:>11}{}{}\n",
               "sae (sorted by l0)", "steps", "train fvu", "l0", "dead %", "wait %", "tok/s",
               "TFLOP/s", any_mfu ? fmt::format(" {:>6}", "MFU %") : "",
               any_gpu ? "GPU mem GB" : "host mem GB", any_recovery ? "   recovery" : "",
               any_eval ? "   held-out fvu       l0  dead %  dense %" : "");
    for (const SaeSummary& s : out) {
        const double mem = any_gpu ? s.last.gpu_mem_peak_GB : s.last.host_mem_peak_GB;
        std::string held_out;
        if (any_eval && s.last.eval_rows > 0)
            held_out = fmt::format(
                "   {:>12} {:>8.1f} {:>7.1f} {:>8.1f}", format_fvu(s.last.eval_fvu), s.last.eval_l0,
                100 * s.last.eval_dead_fraction, 100 * s.last.eval_dense_fraction);
        fmt::print("{:<28} {:>8} {:>10} {:>8.1f} {:>8.1f} {:>7.1f} {:>10} {:>9}{} {:>11}{}{}\n",
                   s.last.sae, s.steps, format_fvu(s.last.fvu), s.last.l0,
                   100 * s.last.dead_fraction, 100 * s.wait_fraction, format_count(s.tokens_per_s),
                   format_tflops(s.tflops),
                   any_mfu ? fmt::format(" {:>6}", s.mfu >= 0 ? fmt::format("{:.1f}", 100 * s.mfu)
                                                              : std::string("-"))
                           : "",
                   mem > 0 ? fmt::format("{:.2f}", mem) : "-",
                   s.feature_recovery >= 0 ? fmt::format("   {:>8.3f}", s.feature_recovery) : "",
                   held_out);
    }
}

// The quality gates (quality.h), one line per SAE.
void print_gates_table(const std::vector<SaeSummary>& out) {
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
}

// How the console labels an architecture's figures. A figure not listed prints under its own
// name, so a new architecture's figures need no entry here to be shown.
struct FigureLabel {
    std::string name;
    std::string title;   // the table's, when this figure is a table's first
    std::string header;  // the column's
    int width;
    double scale;  // 100: printed as a percentage
    int decimals;
};
const FigureLabel kFigureLabels[] = {
    // Switch: how evenly the router spread the tokens (a uniform load is 1 / n_experts).
    {"expert_load_min", "experts (last 10% of steps)", "min token share", 16, 1, 4},
    {"expert_load_max", "experts (last 10% of steps)", "max token share", 16, 1, 4},
    {"expert_dead_max", "experts (last 10% of steps)", "most dead in one, %", 22, 100, 1},
};

FigureLabel figure_label(const std::string& name) {
    for (const FigureLabel& l : kFigureLabels)
        if (name == l.name) return l;
    // A layered model's held-out figures per layer (outputs.cpp): eval_<what>_layer<l>.
    const std::string title = "held-out, per layer";
    for (const auto& [what, header, scale, decimals] :
         {std::tuple{"fvu", "fvu", 1.0, 4}, {"l0", "l0", 1.0, 1}, {"dead", "dead %", 100.0, 1}}) {
        const std::string prefix = fmt::format("eval_{}_layer", what);
        if (name.rfind(prefix, 0) == 0)
            return {name, title, fmt::format("{} {}", header, name.substr(prefix.size())),
                    9,    scale, decimals};
    }
    const int width = std::max<int>(16, static_cast<int>(name.size()));
    return {name, "architecture figures (last 10% of steps)", name, width, 1, 4};
}

// One table per set of figure names (one per architecture that has figures).
void print_figure_tables(const std::vector<SaeSummary>& out) {
    std::vector<std::vector<std::string>> printed;
    for (const SaeSummary& first : out) {
        std::vector<std::string> names;
        for (const auto& fig : first.arch_figures) names.push_back(fig.first);
        if (names.empty() || std::find(printed.begin(), printed.end(), names) != printed.end())
            continue;
        printed.push_back(names);
        std::string line = fmt::format("\n{:<28}", figure_label(names[0]).title);
        for (const std::string& n : names) {
            const FigureLabel l = figure_label(n);
            line += fmt::format(" {:>{}}", l.header, l.width);
        }
        fmt::print("{}\n", line);
        for (const SaeSummary& s : out) {
            if (s.arch_figures.size() != names.size() ||
                !std::equal(names.begin(), names.end(), s.arch_figures.begin(),
                            [](const std::string& n, const auto& fig) { return n == fig.first; }))
                continue;
            line = fmt::format("{:<28}", s.last.sae);
            for (const auto& [n, v] : s.arch_figures) {
                const FigureLabel l = figure_label(n);
                line += fmt::format(" {:>{}.{}f}", l.scale * v, l.width, l.decimals);
            }
            fmt::print("{}\n", line);
        }
    }
}

}  // namespace

RunReporter::RunReporter(Communicator& world, const RankCoords& coords,
                         std::vector<std::string> ids, const std::string& metrics_path,
                         double peak_flops, const std::string& tb_dir, int64_t resumed_step)
    : world_(world), coords_(coords), ids_(std::move(ids)), peak_flops_(peak_flops) {
    if (world_.rank() != 0) return;
    if (!metrics_path.empty()) log_ = std::make_unique<MetricsLog>(metrics_path);
    if (tb_dir.empty()) return;
    if (resumed_step >= 0) tensorboard_split_legacy(tb_dir, ids_);  // an earlier version's run
    for (const std::string& id : ids_)
        tb_[id] = std::make_unique<TensorBoardWriter>(tb_dir + "/" + id, resumed_step);
}

void RunReporter::write_config_text(
    const std::string& config_yaml, const std::vector<std::string>& config_column_names,
    const std::vector<std::map<std::string, std::string>>& config_columns, int64_t step) {
    for (size_t c = 0; c < ids_.size(); ++c) {
        const auto it = tb_.find(ids_[c]);
        if (it == tb_.end()) continue;
        std::string md = fmt::format("**{}** (SAE {} of {})\n\n| key | value |\n|---|---|\n",
                                     ids_[c], c + 1, ids_.size());
        if (c < config_columns.size())
            for (const std::string& name : config_column_names) {
                const auto v = config_columns[c].find(name);
                if (v != config_columns[c].end() && !v->second.empty())
                    md += fmt::format("| {} | {} |\n", name, v->second);
            }
        md += "\nThe resolved config (config.yaml):\n\n```yaml\n" + config_yaml + "```\n";
        it->second->write_text(step, "config", md);
    }
}

RunReporter::~RunReporter() = default;

void RunReporter::gather(const MetricsRow& mine) {
    const std::vector<RankBlock> blocks = all_gather_blocks(
        world_, pack(mine, coords_.config, row_replica(coords_), peak_flops_), ids_);
    if (world_.rank() != 0) return;
    const std::map<int, ConfigTotals> totals = config_totals(blocks);
    std::vector<MetricsRow> rows;
    for (const RankBlock& b : blocks)
        if (b.replica == 0) rows.push_back(sae_row(b, totals.at(b.config)));
    const auto t0 = std::chrono::steady_clock::now();
    for (const MetricsRow& m : rows) {
        if (log_) log_->write(m);
        if (const auto it = tb_.find(m.sae); it != tb_.end())
            it->second->write(m.step, tensorboard_scalars(m));
    }
    log_write_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const MetricsRow& m : rows) {
        warn_if_no_variance(m, warned_no_variance_);
        fmt::print("{}\n", progress_line(m));
    }
    if (rows.size() > 1 || world_.size() > 1) print_all_line(blocks, rows);
    std::fflush(stdout);
}

std::vector<SaeSummary> RunReporter::finish(
    const SaeSummary& mine, const std::string& summary_path,
    const std::vector<std::string>& config_column_names,
    const std::vector<std::map<std::string, std::string>>& config_columns) {
    std::vector<double> v = pack(mine.last, coords_.config, row_replica(coords_), peak_flops_);
    const std::vector<double> whole_run = summary_pack(mine);
    v.insert(v.end(), whole_run.begin(), whole_run.end());
    const std::vector<RankBlock> blocks = all_gather_blocks(world_, v, ids_);
    const std::vector<std::string> figures =
        gather_strings(world_, figures_encode(mine.arch_figures));
    std::vector<SaeSummary> out;
    if (world_.rank() != 0) return out;
    const std::map<int, ConfigTotals> totals = config_totals(blocks);
    for (size_t p = 0; p < blocks.size(); ++p) {
        const RankBlock& b = blocks[p];
        if (b.replica != 0) continue;
        SaeSummary s;
        s.config = b.config;
        s.last = sae_row(b, totals.at(b.config));
        summary_unpack(s, b.rest.data());
        s.mfu = totals.at(b.config).mfu(s.tflops);
        s.arch_figures = figures_decode(figures[p]);
        out.push_back(s);
    }
    std::sort(out.begin(), out.end(),
              [](const SaeSummary& a, const SaeSummary& b) { return a.last.l0 < b.last.l0; });
    if (!summary_path.empty())
        summary_csv_write(summary_path, out, config_column_names, config_columns);
    print_sweep_table(out);
    print_gates_table(out);
    print_figure_tables(out);
    std::fflush(stdout);
    return out;
}

}  // namespace saetrain
