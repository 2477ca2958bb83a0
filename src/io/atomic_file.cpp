#include "atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "saetrain/error.h"

namespace fs = std::filesystem;

namespace saetrain {
namespace {

// Flushes a file or directory to stable storage; rename is only durable once both are.
void fsync_path(const std::string& path, bool directory) {
    const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    SAE_ENFORCE(fd >= 0, "file {}: cannot open for fsync ({})", path, std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    SAE_ENFORCE(rc == 0, "file {}: fsync failed ({}); is the disk full?", path, std::strerror(err));
}

// Test hook: SAETRAIN_FAULT_DISK_FULL="<text>:<n>" makes the n-th and later atomic writes of a
// path containing <text> (0-based, counted per process) fail as a full disk does: part of the
// temp file written, then ENOSPC. Unset in normal runs.
void injected_disk_full(const std::string& path, const std::string& tmp) {
    static const char* spec = std::getenv("SAETRAIN_FAULT_DISK_FULL");
    if (!spec) return;
    const std::string s(spec);
    const size_t colon = s.rfind(':');
    const std::string text = s.substr(0, colon);
    const long from =
        colon == std::string::npos ? 0 : std::strtol(s.c_str() + colon + 1, nullptr, 10);
    static long seen = 0;
    if (path.find(text) == std::string::npos || seen++ < from) return;
    std::error_code ec;
    fs::resize_file(tmp, fs::file_size(tmp, ec) / 2, ec);
    throw Error(
        fmt::format("file {}: write failed ({}; injected by SAETRAIN_FAULT_DISK_FULL); is "
                    "the disk full?",
                    tmp, std::strerror(ENOSPC)));
}

// Test hook: SAETRAIN_FAULT_KILL_IN_WRITE="<path>" makes the atomic write of exactly that path
// die by SIGKILL halfway through its temp file, as a rank killed in the middle of a checkpoint
// does (saetrain sets it for SAETRAIN_FAULT=rank:iteration:KILL:checkpoint). Unset normally.
void injected_kill(const std::string& path, const std::string& tmp) {
    const char* target = std::getenv("SAETRAIN_FAULT_KILL_IN_WRITE");
    if (!target || path != target) return;
    std::error_code ec;
    fs::resize_file(tmp, fs::file_size(tmp, ec) / 2, ec);
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    std::fprintf(
        stderr, "saetrain: SAETRAIN_FAULT_KILL_IN_WRITE: SIGKILL halfway through %s at %.3f\n",
        tmp.c_str(), static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec));
    std::fflush(stderr);
    std::raise(SIGKILL);
}

}  // namespace

void atomic_write(const std::string& path, const std::function<void(const std::string&)>& write) {
    const fs::path target(path);
    const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    std::error_code ec;
    fs::create_directories(dir, ec);
    SAE_ENFORCE(!ec, "file {}: cannot create directory {} ({})", path, dir.string(), ec.message());
    // Temp file in the same directory, so the rename is atomic (same file system).
    const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
    try {
        write(tmp);
        injected_disk_full(path, tmp);
        injected_kill(path, tmp);
        fsync_path(tmp, false);
        fs::rename(tmp, target, ec);
        SAE_ENFORCE(!ec, "file {}: cannot rename {} into place ({})", path, tmp, ec.message());
        fsync_path(dir.string(), true);
    } catch (...) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        throw;
    }
}

void atomic_write_text(const std::string& path, const std::string& text) {
    atomic_write(path, [&](const std::string& tmp) {
        errno = 0;
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        SAE_ENFORCE(out.good(), "cannot write {}: {}", path,
                    errno ? std::strerror(errno) : "write failed");
    });
}

}  // namespace saetrain
