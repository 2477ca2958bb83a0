// metrics.cpp — MetricsRow's field table and what walks it: metrics.jsonl out and back in; the
// console progress line; summary.csv.
#include "saetrain/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "saetrain/error.h"

namespace saetrain {

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "a");
    SAE_ENFORCE(f_ != nullptr, "cannot open {} for writing: {}", path, std::strerror(errno));
}

MetricsLog::~MetricsLog() {
    if (f_) std::fclose(f_);
}

void MetricsLog::write(const MetricsRow& row) {
    const std::string line = metrics_json(row) + "\n";
    SAE_ENFORCE(std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0,
                "cannot write {}: {}", path_, std::strerror(errno));
}

// ---- the field table ---------------------------------------------------------------------------

namespace {

template <class T>
MetricsField field(const char* name, T MetricsRow::*m, MetricsShown shown = MetricsShown::always) {
    MetricsField f{name};
    if constexpr (std::is_same_v<T, int64_t>)
        f.count = m;
    else
        f.value = m;
    f.shown = shown;
    return f;
}

MetricsField unlogged(MetricsField f) {
    f.logged = false;
    return f;
}

MetricsField event_step(MetricsField f) {
    f.scalar = false;
    return f;
}

}  // namespace

const std::vector<MetricsField>& metrics_fields() {
    using R = MetricsRow;
    using S = MetricsShown;
    static const std::vector<MetricsField> table = {
        event_step(field("step", &R::step)),
        unlogged(field("total_steps", &R::total_steps)),
        field("tokens", &R::tokens),
        field("lr", &R::lr),
        field("loss", &R::loss),
        field("mse", &R::mse),
        field("fvu", &R::fvu),
        field("l0", &R::l0),
        field("l1", &R::l1),
        field("dead_fraction", &R::dead_fraction),
        field("grad_norm", &R::grad_norm),
        field("tokens_per_s", &R::tokens_per_s),
        field("read_MBps", &R::read_MBps),
        field("wait_fraction", &R::wait_fraction),
        field("elapsed_s", &R::elapsed_s),
        unlogged(field("eta_s", &R::eta_s)),
        field("tflops", &R::tflops),
        field("mfu", &R::mfu, S::when_known),  // absent, never a guess, when no peak is known
        field("gpu_mem_peak_GB", &R::gpu_mem_peak_GB, S::when_positive),
        field("host_mem_peak_GB", &R::host_mem_peak_GB, S::when_positive),
        field("cpu_threads", &R::cpu_threads, S::when_positive),
        field("eval_rows", &R::eval_rows, S::when_evaluated),
        field("eval_fvu", &R::eval_fvu, S::when_evaluated),
        field("eval_l0", &R::eval_l0, S::when_evaluated),
        field("eval_dead_fraction", &R::eval_dead_fraction, S::when_evaluated),
        field("eval_dense_fraction", &R::eval_dense_fraction, S::when_evaluated),
    };
    return table;
}

const MetricsField& metrics_field(const std::string& name) {
    for (const MetricsField& f : metrics_fields())
        if (name == f.name) return f;
    throw Error(fmt::format("metrics_field: no MetricsRow field '{}'", name));
}

double MetricsField::get(const MetricsRow& r) const {
    return count ? static_cast<double>(r.*count) : r.*value;
}

void MetricsField::set(MetricsRow& r, double v) const {
    if (count)
        r.*count = static_cast<int64_t>(v);
    else
        r.*value = v;
}

bool MetricsField::shown_in(const MetricsRow& r) const {
    switch (shown) {
        case MetricsShown::always:
            return true;
        case MetricsShown::when_known:
            return get(r) >= 0;
        case MetricsShown::when_positive:
            return get(r) > 0;
        case MetricsShown::when_evaluated:
            return r.eval_rows > 0;
    }
    return true;
}

// ---- metrics.jsonl ------------------------------------------------------------------------------

std::string metrics_json(const MetricsRow& r) {
    nlohmann::ordered_json j;
    j["sae"] = r.sae;
    for (const MetricsField& f : metrics_fields()) {
        if (!f.logged || !f.shown_in(r)) continue;
        if (f.count)
            j[f.name] = r.*f.count;
        else
            j[f.name] = r.*f.value;
    }
    return j.dump();
}

std::optional<MetricsRow> metrics_last_row(const std::string& path, const std::string& sae) {
    std::ifstream in(path);
    std::optional<MetricsRow> last;
    const MetricsRow defaults;  // a key the line lacks keeps its default (mfu: -1, unknown)
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || j.value("sae", std::string()) != sae) continue;
        MetricsRow r;
        r.sae = sae;
        try {  // a field of another type skips the row
            for (const MetricsField& f : metrics_fields()) {
                if (!f.logged) continue;
                if (f.value && j.contains(f.name) && j[f.name].is_null())
                    r.*f.value = std::nan("");  // as metrics_json writes NaN (an undefined fvu)
                else if (f.count)
                    r.*f.count = j.value(f.name, defaults.*f.count);
                else
                    r.*f.value = j.value(f.name, defaults.*f.value);
            }
        } catch (const nlohmann::json::exception&) {
            continue;
        }
        last = r;
    }
    return last;
}

// ---- the console -------------------------------------------------------------------------------

std::string format_count(double x) {
    if (x >= 1e9) return fmt::format("{:.1f}G", x / 1e9);
    if (x >= 1e6) return fmt::format("{:.1f}M", x / 1e6);
    if (x >= 1e3) return fmt::format("{:.1f}K", x / 1e3);
    return fmt::format("{:.0f}", x);
}

std::string format_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const auto t = static_cast<int64_t>(std::llround(s));
    if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
    if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
    return fmt::format("{}s", t);
}

std::string format_tflops(double tflops) { return fmt::format("{:.3g}", tflops); }

std::string format_fvu(double fvu) {
    return std::isnan(fvu) ? std::string("n/a") : fmt::format("{:.4f}", fvu);
}

std::string progress_line(const MetricsRow& r) {
    std::string perf = fmt::format("{} TFLOP/s", format_tflops(r.tflops));
    if (r.mfu >= 0) perf += fmt::format(" | MFU {:.1f}%", 100.0 * r.mfu);
    if (r.gpu_mem_peak_GB > 0) perf += fmt::format(" | GPU mem {:.2f} GB", r.gpu_mem_peak_GB);
    if (r.host_mem_peak_GB > 0) perf += fmt::format(" | host mem {:.2f} GB", r.host_mem_peak_GB);
    std::string line = fmt::format(
        "{} step {}/{} | {} tok/s | mse {:.3e} | fvu {} | l0 {:.1f} | dead {:.1f}% | "
        "wait {:.1f}% | {} | ETA {}",
        r.sae, r.step, r.total_steps, format_count(r.tokens_per_s), r.mse, format_fvu(r.fvu), r.l0,
        100.0 * r.dead_fraction, 100.0 * r.wait_fraction, perf, format_duration(r.eta_s));
    if (r.eval_rows > 0)
        line += fmt::format(
            "\n{} held-out ({} rows): fvu {} | l0 {:.1f} | dead {:.1f}% | "
            "dense {:.1f}%",
            r.sae, r.eval_rows, format_fvu(r.eval_fvu), r.eval_l0, 100.0 * r.eval_dead_fraction,
            100.0 * r.eval_dense_fraction);
    return line;
}

int64_t host_peak_rss_bytes() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("VmHWM:", 0) != 0) continue;
        long long kib = 0;  // "VmHWM:     123456 kB"
        if (std::sscanf(line.c_str() + 6, "%lld", &kib) == 1 && kib > 0) return kib * 1024;
        break;
    }
    return 0;
}

// A CSV cell (RFC 4180): quoted, its quotes doubled, when it holds a comma, a quote or a line
// break (a list-valued key's "[128, 512]").
static std::string csv_cell(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

void summary_write(const std::string& path, const std::vector<std::string>& columns,
                   const std::vector<std::map<std::string, std::string>>& rows) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp);
        SAE_ENFORCE(out.good(), "cannot write {}", tmp);
        for (size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << columns[i];
        out << "\n";
        for (const auto& row : rows) {
            for (size_t i = 0; i < columns.size(); ++i) {
                const auto it = row.find(columns[i]);
                out << (i ? "," : "") << (it == row.end() ? "" : csv_cell(it->second));
            }
            out << "\n";
        }
        out.flush();  // a full disk shows here, not in the destructor's silent close
        SAE_ENFORCE(out.good(), "cannot write {} ({}); is the disk full?", tmp,
                    std::strerror(errno));
    }
    SAE_ENFORCE(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}", tmp,
                path, std::strerror(errno));
}

}  // namespace saetrain
