#include "saetrain/serve/run_status.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "saetrain/error.h"
#include "saetrain/serve/launcher.h"  // defines: process_alive, wrapper_exit_code, signal_name

namespace saetrain::serve {

namespace {

constexpr size_t kMaxSmallFile = 4 << 20;  // run.json, summary.csv, config.yaml, launch.json
constexpr size_t kConsoleTail = 64 << 10;  // the end of console.log that is searched

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
    return buf;
}

std::optional<std::string> read_beneath(int dir_fd, const std::string& name) {
    if (dir_fd < 0) return std::nullopt;
    std::string why;
    Fd fd = open_beneath(dir_fd, name, false, &why);
    if (!fd.valid()) return std::nullopt;
    return read_fd(fd.get(), kMaxSmallFile, &why);
}

// The last `bytes` of dir/name (not following a symlink).
std::string read_tail(int dir_fd, const std::string& name, size_t bytes) {
    if (dir_fd < 0) return "";
    std::string why;
    Fd fd = open_beneath(dir_fd, name, false, &why);
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) return "";
    const off_t from = std::max<off_t>(0, st.st_size - static_cast<off_t>(bytes));
    std::string text(static_cast<size_t>(st.st_size - from), '\0');
    const ssize_t n = ::pread(fd.get(), text.data(), text.size(), from);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return text;
}

int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// summary.csv: comma-separated, fields with a comma or quote in double quotes ("" for a quote).
std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> row;
    std::string field;
    bool quoted = false, any = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (quoted) {
            if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
                field += '"';
                ++i;
            } else if (c == '"') {
                quoted = false;
            } else {
                field += c;
            }
            continue;
        }
        if (c == '"') {
            quoted = any = true;
        } else if (c == ',') {
            row.push_back(field);
            field.clear();
            any = true;
        } else if (c == '\n') {
            if (any || !field.empty()) {
                row.push_back(field);
                rows.push_back(row);
            }
            row.clear();
            field.clear();
            any = false;
        } else if (c != '\r') {
            field += c;
            any = true;
        }
    }
    if (any || !field.empty()) {
        row.push_back(field);
        rows.push_back(row);
    }
    return rows;
}

// A summary.csv cell as JSON: a number when it is one, null when empty, else the text.
nlohmann::ordered_json cell(const std::string& v) {
    if (v.empty()) return nullptr;
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v.c_str(), &end);
    if (end != nullptr && *end == '\0' && errno == 0 && std::isfinite(d)) return d;
    return v;
}

// run.json and metrics lines are read as they are: a key of an unexpected type (a damaged or
// hand-made file) reads as missing, never as an exception that would end a poll.
template <class J>
int64_t int_of(const J& j, const char* key, int64_t fallback) {
    if (!j.is_object()) return fallback;
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->template get<int64_t>() : fallback;
}
template <class J>
std::string str_of(const J& j, const char* key) {
    if (!j.is_object()) return "";
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->template get<std::string>() : "";
}

const char* const kGateColumns[] = {
    "gates",      "gates_on",   "gates_failed",        "rel_recon_err",
    "zeros_frac", "decorr_rms", "gates_dead_fraction", "gates_dense_fraction"};

}  // namespace

// ---- launch.json -------------------------------------------------------------------------------

std::string LaunchRecord::to_json() const {
    nlohmann::ordered_json j;
    j["launched_ns"] = launched_ns;
    j["ranks"] = ranks;
    j["command"] = command;
    j["wrapper_pid"] = wrapper_pid;
    j["wrapper_start"] = wrapper_start;
    j["stop_requested_ns"] = stop_requested_ns;
    return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::optional<LaunchRecord> LaunchRecord::from_json(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    try {
        LaunchRecord r;
        r.launched_ns = j.at("launched_ns").get<int64_t>();
        r.ranks = j.at("ranks").get<int>();
        r.command = j.at("command").get<std::vector<std::string>>();
        r.wrapper_pid = j.at("wrapper_pid").get<pid_t>();
        r.wrapper_start = j.at("wrapper_start").get<uint64_t>();
        r.stop_requested_ns = j.value("stop_requested_ns", int64_t{0});
        return r;
    } catch (const nlohmann::json::exception&) {
        return std::nullopt;
    }
}

// ---- the state ---------------------------------------------------------------------------------

RunState state_derive(const StateInputs& in) {
    auto from_exit = [&](int code) {
        RunState s;
        s.exit_code = code;
        if (code == 0) {
            s.state = "complete";
            s.exit_line = in.console_line;
        } else if (code == 75) {
            s.state = "stopped";
            s.exit_line = !in.console_line.empty()
                              ? in.console_line
                              : "stopped by a signal with a checkpoint committed (exit 75)";
        } else {
            s.state = "failed";
            s.exit_line = in.console_line;
            if (code > 128 && code < 128 + 65)
                s.exit_line +=
                    fmt::format("{}the command was ended by {}", s.exit_line.empty() ? "" : "; ",
                                signal_name(code - 128));
            else if (s.exit_line.empty())
                s.exit_line = fmt::format("the command exited with code {}", code);
        }
        return s;
    };
    auto active = [&](const char* state) {
        RunState s;
        s.state = in.stop_requested ? "stopping" : state;
        return s;
    };
    if (in.launched && in.launch_newer) {
        // Launched and not training yet (or never got to it): the wrapper says how it went.
        if (in.wrapper_alive) return active("queued");
        if (in.wrapper_exit) return from_exit(*in.wrapper_exit);
        return RunState{"failed", std::nullopt,
                        fmt::format("the run's wrapper (pid {}) is gone and wrote no exit status "
                                    "(killed?)",
                                    in.wrapper_pid)};
    }
    if (in.run_json_state) {
        const std::string& st = *in.run_json_state;
        // Whether the run's process is still there: the wrapper for a launched run (so a run is
        // stopped or complete only once every process of it is gone and out_dir's lock is free
        // for a resume), else rank 0's pid on this host; on another host, run.json's word.
        const bool up = in.launched ? in.wrapper_alive : in.run_pid_alive.value_or(st == "running");
        if (up) return active("running");
        if (st == "running") {
            if (in.launched && in.wrapper_exit) return from_exit(*in.wrapper_exit);
            return RunState{"failed", in.wrapper_exit,
                            fmt::format("killed: run.json says running, but its process {} is "
                                        "gone; resume continues from the last checkpoint",
                                        in.launched ? in.wrapper_pid : in.run_pid)};
        }
        RunState s;
        s.state = st == "complete" || st == "stopped" ? st : "failed";
        s.exit_code = in.run_json_exit;
        if (!in.console_line.empty() && in.launched)
            s.exit_line = in.console_line;
        else if (!in.run_json_message.empty())
            s.exit_line = "saetrain: error: " + in.run_json_message;
        else if (st == "stopped")
            s.exit_line = "stopped by a signal with a checkpoint committed (exit 75)";
        return s;
    }
    if (in.complete_marker) return RunState{"complete", std::nullopt, ""};
    return RunState{"unknown", std::nullopt,
                    "no run.json: a run of an older saetrain, or one that never started "
                    "training"};
}

std::string console_exit_line(const std::string& console_tail) {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; start < console_tail.size(); start = nl + 1) {
        nl = console_tail.find('\n', start);
        if (nl == std::string::npos) nl = console_tail.size();
        std::string l = console_tail.substr(start, nl - start);
        while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
        lines.push_back(l);
    }
    // This launch's lines: after the wrapper's last "starting:" line.
    size_t from = 0;
    for (size_t i = lines.size(); i-- > 0;)
        if (lines[i].rfind("sae-serve: ", 0) == 0 &&
            lines[i].find(": starting: ") != std::string::npos) {
            from = i + 1;
            break;
        }
    for (size_t i = from; i < lines.size(); ++i)
        if (lines[i].rfind("saetrain: error", 0) == 0 || lines[i].rfind("sae-serve: error", 0) == 0)
            return printable(lines[i]);
    for (size_t i = lines.size(); i-- > from;)
        if (lines[i].rfind("saetrain: stopped", 0) == 0) return printable(lines[i]);
    for (size_t i = lines.size(); i-- > from;)
        if (!lines[i].empty() && lines[i].rfind("sae-serve: ", 0) != 0) return printable(lines[i]);
    return "";
}

// ---- RunWatch ----------------------------------------------------------------------------------

RunWatch::RunWatch(const RunsRoot& root, std::string id) : root_(root), id_(std::move(id)) {
    open_dirs();
}

std::string RunWatch::state_dir_path() const { return root_.path() + "/.sae-serve/runs/" + id_; }

void RunWatch::open_dirs() {
    std::string why;
    if (!dir_.valid()) {
        dir_ = root_.open_run(id_, &why);
        if (dir_.valid()) tail_ = std::make_unique<MetricsTail>(dir_.get());
    }
    if (!sdir_.valid()) {
        Fd serve = open_beneath(root_.fd(), ".sae-serve", true, &why);
        Fd runs = serve.valid() ? open_beneath(serve.get(), "runs", true, &why) : Fd();
        if (runs.valid()) sdir_ = open_beneath(runs.get(), id_, true, &why);
    }
}

int RunWatch::state_dir_fd() {
    if (!sdir_.valid()) {
        for (const std::string& d :
             {root_.path() + "/.sae-serve", root_.path() + "/.sae-serve/runs", state_dir_path()})
            SAE_ENFORCE(::mkdir(d.c_str(), 0700) == 0 || errno == EEXIST, "cannot create {}: {}", d,
                        std::strerror(errno));
        open_dirs();
        SAE_ENFORCE(sdir_.valid(), "cannot open {} (a symlink or not a directory)",
                    state_dir_path());
    }
    return sdir_.get();
}

bool RunWatch::refresh(int dir_fd, const std::string& name, Cached& c) const {
    const std::optional<struct stat> st = dir_fd >= 0 ? stat_beneath(dir_fd, name) : std::nullopt;
    Cached now;
    if (st) {
        now.present = true;
        now.ino = static_cast<uint64_t>(st->st_ino);
        now.size = static_cast<int64_t>(st->st_size);
        now.mtime_ns = static_cast<int64_t>(st->st_mtim.tv_sec) * 1000000000 + st->st_mtim.tv_nsec;
    }
    const bool changed = now.present != c.present || now.ino != c.ino || now.size != c.size ||
                         now.mtime_ns != c.mtime_ns;
    c = now;
    return changed;
}

void RunWatch::read_run_json() {
    run_json_ = nullptr;
    if (const auto text = read_beneath(dir_.get(), "run.json")) {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(*text, nullptr, false);
        if (j.is_object()) run_json_ = std::move(j);
    }
    run_json_mtime_ns_ = run_json_c_.mtime_ns;
}

void RunWatch::read_summary() {
    summary_.clear();
    const auto text = read_beneath(dir_.get(), "summary.csv");
    if (!text) return;
    const auto rows = csv_rows(*text);
    if (rows.size() < 2) return;
    const std::vector<std::string>& head = rows[0];
    for (size_t r = 1; r < rows.size(); ++r) {
        nlohmann::ordered_json row = nlohmann::ordered_json::object();
        for (size_t c = 0; c < head.size() && c < rows[r].size(); ++c)
            row[head[c]] = c == 0 ? nlohmann::ordered_json(rows[r][c]) : cell(rows[r][c]);
        if (!rows[r].empty()) summary_.emplace_back(rows[r][0], std::move(row));
    }
}

void RunWatch::read_launch() {
    launch_.reset();
    if (const auto text = read_beneath(sdir_.get(), "launch.json"))
        launch_ = LaunchRecord::from_json(*text);
}

void RunWatch::set_launch(const LaunchRecord& rec) {
    const int fd = state_dir_fd();
    const std::string text = rec.to_json();
    const std::string tmp = state_dir_path() + "/.launch.json.tmp";
    const int out = ::openat(fd, ".launch.json.tmp",
                             O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    SAE_ENFORCE(out >= 0, "cannot write {}: {}", tmp, std::strerror(errno));
    {
        Fd owned(out);
        SAE_ENFORCE(::write(out, text.data(), text.size()) == static_cast<ssize_t>(text.size()),
                    "cannot write {}: {}", tmp, std::strerror(errno));
    }
    SAE_ENFORCE(::renameat(fd, ".launch.json.tmp", fd, "launch.json") == 0, "cannot write {}: {}",
                state_dir_path() + "/launch.json", std::strerror(errno));
    launch_ = rec;
    refresh(fd, "launch.json", launch_c_);
    // A new launch: the previous one's exit status is not this one's.
    if (rec.stop_requested_ns == 0) {
        ::unlinkat(fd, "exit", 0);
        refresh(fd, "exit", exit_c_);
        wrapper_exit_.reset();
    }
    refresh_state();
}

void RunWatch::note_stop_requested() { hand_stop_ns_ = now_ns(); }

pid_t RunWatch::local_saetrain_pid() const {
    if (!run_json_.is_object() || str_of(run_json_, "host") != host_name()) return 0;
    const auto pid = static_cast<pid_t>(int_of(run_json_, "pid", 0));
    if (!process_alive(pid, 0) || process_name(pid).rfind("saetrain", 0) != 0) return 0;
    // run.json is a file anyone who can write the run directory can forge: the pid is this run's
    // only when it holds the run's lock (a stop never goes to another saetrain).
    if (!dir_.valid() || !process_holds_flock(pid, dir_.get(), ".saetrain.lock")) return 0;
    return pid;
}

StateInputs RunWatch::state_inputs() {
    StateInputs in;
    if (launch_) {
        in.launched = true;
        in.launch_newer = !run_json_.is_object() || run_json_mtime_ns_ < launch_->launched_ns;
        in.wrapper_pid = launch_->wrapper_pid;
        // The wrapper writes the exit status as its last act: once it is there, it is done.
        in.wrapper_alive =
            !wrapper_exit_ && process_alive(launch_->wrapper_pid, launch_->wrapper_start);
        in.wrapper_exit = wrapper_exit_;
        in.stop_requested = launch_->stop_requested_ns > 0;
        in.console_line = console_line_;
    } else {
        in.stop_requested = hand_stop_ns_ > 0;
    }
    if (run_json_.is_object()) {
        if (const std::string st = str_of(run_json_, "state"); !st.empty()) in.run_json_state = st;
        if (const int64_t code = int_of(run_json_, "exit_code", -1); code >= 0 && code < 256)
            in.run_json_exit = static_cast<int>(code);
        in.run_json_message = str_of(run_json_, "message");
        in.run_pid = static_cast<pid_t>(int_of(run_json_, "pid", 0));
        if (str_of(run_json_, "host") == host_name())
            in.run_pid_alive =
                process_alive(in.run_pid, 0) && process_name(in.run_pid).rfind("saetrain", 0) == 0;
    }
    in.complete_marker = complete_c_.present;
    return in;
}

void RunWatch::refresh_state() {
    open_dirs();
    if (refresh(dir_.get(), "run.json", run_json_c_)) read_run_json();
    if (refresh(dir_.get(), "summary.csv", summary_c_)) read_summary();
    refresh(dir_.get(), "COMPLETE", complete_c_);
    if (refresh(sdir_.get(), "launch.json", launch_c_)) read_launch();
    if (refresh(sdir_.get(), "exit", exit_c_))
        wrapper_exit_ = sdir_.valid() ? wrapper_exit_code(sdir_.get()) : std::nullopt;
    if (refresh(sdir_.get(), "console.log", console_c_))
        console_line_ = console_exit_line(read_tail(sdir_.get(), "console.log", kConsoleTail));
    state_ = state_derive(state_inputs());
    // A stop request of a run started by hand lasts until the run is no longer active.
    if (!state_.active()) hand_stop_ns_ = 0;
}

RunWatch::Changes RunWatch::poll() {
    Changes ch;
    refresh_state();
    size_t saes = 0;
    if (run_json_.is_object() && run_json_.contains("saes") && run_json_["saes"].is_object())
        saes = run_json_["saes"].size();
    if (tail_) ch.metrics = tail_->poll(saes, !state_.active());
    ch.state_changed = !(state_ == reported_);
    reported_ = state_;
    return ch;
}

std::string RunWatch::config_text() const {
    if (auto text = read_beneath(dir_.get(), "config.yaml")) return *text;
    if (sdir_.valid())
        if (auto text = read_beneath(sdir_.get(), "config.yaml")) return *text;
    return "";
}

int RunWatch::ranks() const {
    if (launch_) return launch_->ranks;
    if (const int64_t r = int_of(run_json_, "ranks", 1); r >= 1 && r <= (1 << 20))
        return static_cast<int>(r);
    return 1;
}

// ---- JSON --------------------------------------------------------------------------------------

nlohmann::ordered_json RunWatch::summary() const {
    nlohmann::ordered_json j;
    j["id"] = id_;
    j["state"] = state_.state;
    j["exit_code"] = state_.exit_code ? nlohmann::ordered_json(*state_.exit_code) : nullptr;
    j["exit_line"] = state_.exit_line;
    j["launched"] = launch_.has_value();
    j["ranks"] = ranks();
    const bool rj = run_json_.is_object();
    j["started"] = rj && run_json_.contains("started") ? run_json_["started"] : nullptr;
    j["ended"] = rj && run_json_.contains("ended") ? run_json_["ended"] : nullptr;
    const int64_t total = int_of(run_json_, "total_steps", 0);
    j["total_steps"] = total > 0 ? nlohmann::ordered_json(total) : nullptr;
    std::vector<std::string> ids;
    if (rj && run_json_.contains("saes") && run_json_["saes"].is_object())
        for (const auto& [k, v] : run_json_["saes"].items()) ids.push_back(k);
    j["saes"] = ids;
    // The latest complete step: its step, tokens and the slowest SAE's rate (a sweep's SAEs
    // step together), and from them the time left.
    nlohmann::ordered_json step = nullptr, tokens = nullptr, tps = nullptr, eta = nullptr;
    if (tail_ && !tail_->steps().empty()) {
        const MetricsStep& last = tail_->steps().back();
        step = last.step;
        double slowest = 0;
        for (const std::string& line : last.lines) {
            const nlohmann::json l = nlohmann::json::parse(line, nullptr, false);
            if (l.contains("tokens") && l["tokens"].is_number()) tokens = l["tokens"];
            if (l.contains("tokens_per_s") && l["tokens_per_s"].is_number()) {
                const double r = l["tokens_per_s"].get<double>();
                slowest = slowest == 0 ? r : std::min(slowest, r);
            }
        }
        if (slowest > 0) tps = slowest;
        const int64_t per_step = int_of(run_json_, "tokens_per_step", 0);
        if (state_.state == "running" && slowest > 0 && total > last.step && per_step > 0)
            eta = static_cast<double>(total - last.step) * static_cast<double>(per_step) / slowest;
    }
    j["step"] = step;
    j["tokens"] = tokens;
    j["tokens_per_s"] = tps;
    j["eta_s"] = eta;
    j["url"] = "/api/runs/" + id_;
    return j;
}

nlohmann::ordered_json RunWatch::detail() const {
    nlohmann::ordered_json j = summary();
    j["config"] = config_text();
    j["run"] = run_json_.is_object() ? run_json_ : nlohmann::ordered_json(nullptr);
    if (launch_) {
        j["launch"] = {{"ranks", launch_->ranks},
                       {"command", launch_->command},
                       {"wrapper_pid", launch_->wrapper_pid},
                       {"launched_ns", launch_->launched_ns}};
    } else {
        j["launch"] = nullptr;
    }
    // Per SAE: the latest line, the latest line with held-out figures, and the quality gates.
    nlohmann::ordered_json per = nlohmann::ordered_json::object();
    for (const std::string& id : j["saes"].get<std::vector<std::string>>())
        per[id] = {{"latest", nullptr}, {"held_out", nullptr}, {"gates", nullptr}};
    if (tail_) {
        const auto& steps = tail_->steps();
        for (size_t s = steps.size(); s-- > 0;) {
            for (size_t i = 0; i < steps[s].lines.size(); ++i) {
                const std::string& sae = steps[s].saes[i];
                if (!per.contains(sae))
                    per[sae] = {{"latest", nullptr}, {"held_out", nullptr}, {"gates", nullptr}};
                nlohmann::ordered_json& e = per[sae];
                if (!e["latest"].is_null() && !e["held_out"].is_null()) continue;
                const nlohmann::ordered_json l =
                    nlohmann::ordered_json::parse(steps[s].lines[i], nullptr, false);
                if (e["latest"].is_null()) e["latest"] = l;
                if (e["held_out"].is_null() && int_of(l, "eval_rows", 0) > 0) e["held_out"] = l;
            }
        }
    }
    for (const auto& [sae, row] : summary_) {
        nlohmann::ordered_json g = nlohmann::ordered_json::object();
        for (const char* k : kGateColumns)
            if (row.contains(k)) g[k] = row[k];
        if (!per.contains(sae))
            per[sae] = {{"latest", nullptr}, {"held_out", nullptr}, {"gates", nullptr}};
        per[sae]["gates"] = g;
        per[sae]["summary"] = row;
    }
    j["sae"] = per;
    j["metrics"] = {{"steps", tail_ ? tail_->steps().size() : 0},
                    {"last_step", tail_ ? tail_->last_step() : -1},
                    {"skipped_lines", tail_ ? tail_->skipped_lines() : 0}};
    j["report"] = "/runs/" + id_ + "/report/";
    return j;
}

std::string RunWatch::state_message() const {
    nlohmann::ordered_json j;
    j["type"] = "state";
    j["id"] = id_;
    j["state"] = state_.state;
    j["exit_code"] = state_.exit_code ? nlohmann::ordered_json(*state_.exit_code) : nullptr;
    j["exit_line"] = state_.exit_line;
    const int64_t total = int_of(run_json_, "total_steps", 0);
    j["total_steps"] = total > 0 ? nlohmann::ordered_json(total) : nlohmann::ordered_json(nullptr);
    j["saes"] = summary()["saes"];
    // Text from files (an exit line) may hold bytes that are not UTF-8: they become U+FFFD.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace saetrain::serve
