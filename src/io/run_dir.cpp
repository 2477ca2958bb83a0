// run.out_dir's lock and clean-up (run_dir.h).
#include "saetrain/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "atomic_file.h"                // defines: atomic_write_text
#include "saetrain/checkpoint_parts.h"  // defines: checkpoint_file_step
#include "saetrain/checkpointer.h"      // defines: Checkpointer::committed_steps
#include "saetrain/error.h"
#include "saetrain/schedule.h"  // defines: warmup_steps_for, restart_steps_for

namespace fs = std::filesystem;

namespace saetrain {

void check_out_dir_is_ours(const std::string& out_dir) {
    const fs::path out = out_dir;
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(fs::absolute(out, ec), ec);
    // (An unresolvable path, one too long for the system, came back empty: "the root".)
    SAE_ENFORCE(!ec && !real.empty(), "run.out_dir {} cannot be resolved ({}); choose another",
                out_dir, ec ? ec.message() : "empty");
    SAE_ENFORCE(real != real.root_path(),
                "run.out_dir {} is the root directory; give the run a directory of its own "
                "(e.g. runs/<name>)",
                out_dir);
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
        const fs::path h = fs::weakly_canonical(home, ec);
        SAE_ENFORCE(ec || real != h,
                    "run.out_dir {} is the home directory; give the run a directory of its own "
                    "(e.g. {}/runs/<name>)",
                    out_dir, h.string());
    }
    const fs::file_status st = fs::symlink_status(out, ec);
    if (ec || !fs::exists(st)) return;  // a new directory
    SAE_ENFORCE(fs::is_directory(fs::status(out, ec)),
                "run.out_dir {} exists and is not a directory; choose another run.out_dir",
                out_dir);
    if (fs::exists(out / ".saetrain.lock", ec) || fs::exists(out / "run.json", ec)) {
        // A run's directory: saetrain appends to some of its files (metrics.jsonl, tb/) and
        // replaces or removes others, so a symlink to a file planted there would be written or
        // removed through. Directories may be links (checkpoints/ on another disk).
        const auto opts = fs::directory_options::follow_directory_symlink |
                          fs::directory_options::skip_permission_denied;
        for (auto it = fs::recursive_directory_iterator(out, opts, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            if (it.depth() >= 3) it.disable_recursion_pending();
            std::error_code e2;
            if (it->is_symlink(e2) && !it->is_directory(e2))
                throw Error(fmt::format(
                    "run.out_dir {}: {} is a symlink; saetrain writes only its own files in a "
                    "run's directory and would write or remove through it: remove the link",
                    out_dir, it->path().lexically_relative(out).string()));
        }
        return;
    }
    for (const auto& e : fs::directory_iterator(out, ec))
        throw Error(fmt::format(
            "run.out_dir {} holds files that no saetrain run wrote (e.g. '{}'); a run writes and "
            "removes config.yaml, sae/, tb/, report/ and checkpoints/ there, so choose an empty "
            "or new directory (--overwrite replaces only a saetrain run's directory)",
            out_dir, e.path().filename().string()));
}

void write_run_config(const std::string& out_dir, const std::string& yaml) {
    const std::string path = (fs::path(out_dir) / "config.yaml").string();
    atomic_write_text(path, yaml);
}

OutDirLock::OutDirLock(const std::string& out_dir) {
    const fs::path out = out_dir;
    std::error_code ec;
    fs::create_directories(out, ec);
    SAE_ENFORCE(!ec,
                "run.out_dir {}: cannot create it ({}); choose a directory this job can "
                "write",
                out.string(), ec.message());
    const fs::path path = out / ".saetrain.lock";
    // Not through a symlink: a planted link would have the lock truncate a file elsewhere.
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    SAE_ENFORCE(fd_ >= 0 || errno != ELOOP,
                "run.out_dir {}: the lock file {} is a symlink; remove it (saetrain writes no "
                "file through a link)",
                out.string(), path.string());
    SAE_ENFORCE(fd_ >= 0,
                "run.out_dir {}: cannot create the lock file {} ({}); choose a directory "
                "this job can write",
                out.string(), path.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        std::string holder(256, '\0');
        const ssize_t got = ::pread(fd_, holder.data(), holder.size() - 1, 0);
        holder.resize(got > 0 ? static_cast<size_t>(got) : 0);
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0'))
            holder.pop_back();
        ::close(fd_);
        fd_ = -1;
        SAE_ENFORCE(err != EWOULDBLOCK,
                    "{} is in use by another saetrain run ({}); wait for it to end or choose "
                    "another run.out_dir",
                    out.string(), holder.empty() ? "its lock file is empty" : holder);
        throw Error(fmt::format("cannot lock {}: {}", path.string(), std::strerror(err)));
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::string me = fmt::format("pid {} on {}\n", ::getpid(), host);
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
        // The lock holds without the note; only the message of a refused run is poorer.
    }
}

OutDirLock::~OutDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void remove_stale_files(const std::string& out_dir) {
    const fs::path out = out_dir;
    std::error_code ec;
    const std::vector<int64_t> committed = Checkpointer::committed_steps(out.string());
    // `only`: in out_dir itself, just the temp files of saetrain's own files there.
    auto sweep = [&](const fs::path& dir, bool checkpoints,
                     const std::vector<std::string>& only = {}) {
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            const std::string name = e.path().filename().string();
            if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
                    return name.rfind(o + ".tmp", 0) == 0;
                }))
                continue;
            const size_t at = name.rfind(".tmp");
            const bool temp = at != std::string::npos && at > 0 &&
                              name.find_first_not_of("0123456789", std::min(name.size(), at + 5)) ==
                                  std::string::npos &&
                              (at + 4 == name.size() || name[at + 4] == '.');
            // A checkpoint's files (its pair, or its parts and manifest) of no committed step.
            const int64_t step = checkpoints && !temp ? checkpoint_file_step(name) : -1;
            if (temp || (step >= 0 &&
                         std::find(committed.begin(), committed.end(), step) == committed.end()))
                fs::remove(e.path(), ec);
        }
    };
    sweep(out / "checkpoints", false);
    sweep(out, false, {"config.yaml", "run.json", "COMPLETE", "summary.csv"});
    for (const auto& e : fs::directory_iterator(out / "sae", ec))
        if (e.is_directory(ec)) sweep(e.path(), true);
}

void drop_metrics_after(const std::string& path, int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    std::vector<std::string> keep;
    for (std::string line; std::getline(in, line);) {
        const size_t p = line.find("\"step\":");
        if (p == std::string::npos || std::stoll(line.substr(p + 7)) <= step) keep.push_back(line);
    }
    in.close();
    std::ofstream out(path, std::ios::trunc);
    for (const std::string& l : keep) out << l << "\n";
}

// ---- COMPLETE ----------------------------------------------------------------------------------

namespace {

constexpr char kCompleteFormat[] = "saetrain-complete-1";

// A regular file's text, at most max_bytes of it (not through a symlink, not a FIFO that would
// block), or nothing and why not ("is not a regular file": the file is its subject).
std::optional<std::string> read_small_file(const fs::path& path, std::uintmax_t max_bytes,
                                           std::string* why_not) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    if (ec || !fs::exists(st)) {
        *why_not = "does not exist";
        return std::nullopt;
    }
    if (!fs::is_regular_file(st)) {
        *why_not = "is not a regular file";
        return std::nullopt;
    }
    if (fs::file_size(path, ec) > max_bytes || ec) {
        *why_not = fmt::format("is larger than {} bytes", max_bytes);
        return std::nullopt;
    }
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (in.bad()) {
        *why_not = "cannot be read";
        return std::nullopt;
    }
    return text;
}

}  // namespace

void write_complete_marker(const std::string& out_dir, int64_t steps, int64_t total_steps,
                           const std::string& config_yaml) {
    nlohmann::ordered_json j;
    j["format"] = kCompleteFormat;
    j["steps"] = steps;
    j["total_steps"] = total_steps;
    j["config_digest"] = config_result_digest(config_yaml);
    const std::string path = (fs::path(out_dir) / "COMPLETE").string();
    atomic_write_text(path, j.dump() + "\n");
}

std::optional<std::string> finished_run_config(const std::string& out_dir, std::string* why_not) {
    const fs::path out = out_dir;
    std::string why;
    // A marker is under 200 bytes; config.yaml is held to config_load's limit.
    const std::optional<std::string> text = read_small_file(out / "COMPLETE", 4096, &why);
    const auto fail = [&](const std::string& reason) {
        *why_not = reason;
        return std::nullopt;
    };
    if (!text) return fail("it " + why);
    const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_number_integer())
        return fail(
            "it holds only a step count (an older saetrain's marker), which does not say "
            "which run finished");
    const auto has = [&j](const char* key, bool (nlohmann::json::*is)() const noexcept) {
        return j.contains(key) && (j[key].*is)();
    };
    const bool ours = j.is_object() && has("format", &nlohmann::json::is_string) &&
                      j["format"] == kCompleteFormat &&
                      has("steps", &nlohmann::json::is_number_integer) &&
                      has("total_steps", &nlohmann::json::is_number_integer) &&
                      has("config_digest", &nlohmann::json::is_string);
    if (!ours) return fail("it is not a marker saetrain wrote");
    const std::optional<std::string> config = read_small_file(out / "config.yaml", 4 << 20, &why);
    if (!config)
        return fail(fmt::format("{} {}, so it cannot say which run finished",
                                (out / "config.yaml").string(), why));
    const std::string digest = j["config_digest"].get<std::string>();
    if (digest != config_result_digest(*config))
        return fail(fmt::format("its config_digest {} is not that of {} (another run's marker)",
                                digest, (out / "config.yaml").string()));
    const auto steps = j["steps"].get<int64_t>();
    const std::vector<int64_t> committed = Checkpointer::committed_steps(out_dir);
    if (!committed.empty() && committed.front() != steps)
        return fail(fmt::format(
            "it says {} steps, but the newest committed checkpoint is at step {} (another run's "
            "marker)",
            steps, committed.front()));
    return config;
}

// ---- run.json ----------------------------------------------------------------------------------

namespace {

std::string utc_now() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string host_name() {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) return "localhost";
    return host;
}

}  // namespace

RunStateFile::RunStateFile(std::string out_dir, const RunRecord& r)
    : path_((fs::path(out_dir) / "run.json").string()) {
    nlohmann::ordered_json j;
    j["state"] = "running";
    j["exit_code"] = nullptr;
    j["pid"] = static_cast<int64_t>(::getpid());
    j["host"] = host_name();
    j["started"] = utc_now();
    j["ended"] = nullptr;
    j["version"] = r.version;
    j["backend"] = r.backend;
    j["ranks"] = r.ranks;
    j["hosts"] = r.hosts;
    j["total_steps"] = r.total_steps;
    j["tokens_per_step"] = r.tokens_per_step;
    j["resumed_from_step"] = r.resumed_from_step >= 0 ? nlohmann::ordered_json(r.resumed_from_step)
                                                      : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json saes = nlohmann::ordered_json::object();
    for (const auto& [id, c] : r.saes) {
        // Resolved, so that lr_at's formula alone reproduces every step's LR.
        nlohmann::ordered_json lr;
        lr["lr"] = c.lr;
        lr["warmup_steps"] = warmup_steps_for(c, r.total_steps);
        lr["lr_decay"] = c.lr_decay;
        lr["decay_start"] = c.decay_start;
        lr["lr_min_ratio"] = c.lr_min_ratio;
        lr["restart_steps"] = restart_steps_for(c, r.total_steps);
        lr["restart_mult"] = c.restart_mult;
        saes[id] = {{"arch", c.arch}, {"lr", lr}};
    }
    j["saes"] = saes;
    json_ = j.dump(1);
    write();
}

void RunStateFile::write() const { atomic_write_text(path_, json_ + "\n"); }

void RunStateFile::end(int exit_code, const std::string& message) noexcept {
    try {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(json_);
        j["state"] = exit_code == 0 ? "complete" : exit_code == 75 ? "stopped" : "failed";
        j["exit_code"] = exit_code;
        j["ended"] = utc_now();
        if (!message.empty()) j["message"] = message;
        json_ = j.dump(1);
        write();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "saetrain: warning: %s: %s\n", path_.c_str(), e.what());
    }
}

}  // namespace saetrain
