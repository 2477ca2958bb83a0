#include "saetrain/error.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace saetrain {

[[noreturn]] void throw_check_failure(const char* lib, const char* stmt, const std::string& detail,
                                      const char* file, int line) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::string msg = fmt::format("{} call failed: {}", lib, stmt);
    if (!detail.empty()) msg += fmt::format(" ({})", detail);
    msg += fmt::format(" at {}:{} on {}", file, line, host);
    throw Error(msg);
}

void require_regular_file(const std::string& path, const std::string& what) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        if (S_ISREG(st.st_mode)) return;
        const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                           : S_ISDIR(st.st_mode)  ? "a directory"
                           : S_ISCHR(st.st_mode)  ? "a character device"
                           : S_ISBLK(st.st_mode)  ? "a block device"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                                                  : "not a file";
        throw Error(
            fmt::format("{} {} is {}, not a regular file; saetrain reads only regular files", what,
                        path, kind));
    }
    const int err = errno;
    struct stat lst {};
    if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
        throw Error(
            fmt::format("{} {} is a dangling symlink (its target does not exist); fix or "
                        "remove the link",
                        what, path));
    throw Error(
        fmt::format("{} {}: {}", what, path, err == ENOENT ? "no such file" : std::strerror(err)));
}

std::string printable(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f)
            out += fmt::format("\\x{:02x}", u);
        else
            out += c;
    }
    return out;
}

}  // namespace saetrain
