#include "saetrain/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

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

std::string metrics_json(const MetricsRow& r) {
    nlohmann::ordered_json j;
    j["sae"] = r.sae;
    j["step"] = r.step;
    j["tokens"] = r.tokens;
    j["lr"] = r.lr;
    j["loss"] = r.loss;
    j["mse"] = r.mse;
    j["fvu"] = r.fvu;
    j["l0"] = r.l0;
    j["l1"] = r.l1;
    j["dead_fraction"] = r.dead_fraction;
    j["grad_norm"] = r.grad_norm;
    j["tokens_per_s"] = r.tokens_per_s;
    j["read_MBps"] = r.read_MBps;
    j["wait_fraction"] = r.wait_fraction;
    j["elapsed_s"] = r.elapsed_s;
    j["tflops"] = r.tflops;
    if (r.mfu >= 0) j["mfu"] = r.mfu;  // absent, never a guess, when no peak is known
    if (r.gpu_mem_peak_GB > 0) j["gpu_mem_peak_GB"] = r.gpu_mem_peak_GB;
    if (r.host_mem_peak_GB > 0) j["host_mem_peak_GB"] = r.host_mem_peak_GB;
    if (r.eval_rows > 0) {
        j["eval_rows"] = r.eval_rows;
        j["eval_fvu"] = r.eval_fvu;
        j["eval_l0"] = r.eval_l0;
        j["eval_dead_fraction"] = r.eval_dead_fraction;
        j["eval_dense_fraction"] = r.eval_dense_fraction;
    }
    return j.dump();
}

std::optional<MetricsRow> metrics_last_row(const std::string& path, const std::string& sae) {
    std::ifstream in(path);
    std::optional<MetricsRow> last;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || j.value("sae", std::string()) != sae) continue;
        MetricsRow r;
        r.sae = sae;
        try {  // a field of another type (null for NaN) skips the row
            r.step = j.value("step", int64_t{0}), r.tokens = j.value("tokens", int64_t{0});
            r.lr = j.value("lr", 0.0), r.loss = j.value("loss", 0.0), r.mse = j.value("mse", 0.0);
            r.fvu = j.value("fvu", 0.0), r.l0 = j.value("l0", 0.0), r.l1 = j.value("l1", 0.0);
            r.dead_fraction = j.value("dead_fraction", 0.0),
            r.grad_norm = j.value("grad_norm", 0.0);
            r.tokens_per_s = j.value("tokens_per_s", 0.0), r.read_MBps = j.value("read_MBps", 0.0);
            r.wait_fraction = j.value("wait_fraction", 0.0),
            r.elapsed_s = j.value("elapsed_s", 0.0);
            r.tflops = j.value("tflops", 0.0), r.mfu = j.value("mfu", -1.0);
            r.gpu_mem_peak_GB = j.value("gpu_mem_peak_GB", 0.0);
            r.host_mem_peak_GB = j.value("host_mem_peak_GB", 0.0);
            r.eval_rows = j.value("eval_rows", int64_t{0});
            r.eval_fvu = j.value("eval_fvu", 0.0), r.eval_l0 = j.value("eval_l0", 0.0);
            r.eval_dead_fraction = j.value("eval_dead_fraction", 0.0);
            r.eval_dense_fraction = j.value("eval_dense_fraction", 0.0);
        } catch (const nlohmann::json::exception&) {
            continue;
        }
        last = r;
    }
    return last;
}

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

std::string progress_line(const MetricsRow& r) {
    std::string perf = fmt::format("{} TFLOP/s", format_tflops(r.tflops));
    if (r.mfu >= 0) perf += fmt::format(" | MFU {:.1f}%", 100.0 * r.mfu);
    if (r.gpu_mem_peak_GB > 0) perf += fmt::format(" | GPU mem {:.2f} GB", r.gpu_mem_peak_GB);
    if (r.host_mem_peak_GB > 0) perf += fmt::format(" | host mem {:.2f} GB", r.host_mem_peak_GB);
    std::string line = fmt::format(
        "{} step {}/{} | {} tok/s | mse {:.3e} | fvu {:.4f} | l0 {:.1f} | dead {:.1f}% | "
        "wait {:.1f}% | {} | ETA {}",
        r.sae, r.step, r.total_steps, format_count(r.tokens_per_s), r.mse, r.fvu, r.l0,
        100.0 * r.dead_fraction, 100.0 * r.wait_fraction, perf, format_duration(r.eta_s));
    if (r.eval_rows > 0)
        line += fmt::format(
            "\n{} held-out ({} rows): fvu {:.4f} | l0 {:.1f} | dead {:.1f}% | "
            "dense {:.1f}%",
            r.sae, r.eval_rows, r.eval_fvu, r.eval_l0, 100.0 * r.eval_dead_fraction,
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
                out << (i ? "," : "") << (it == row.end() ? "" : it->second);
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
