#include "atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

}  // namespace saetrain
