#include "saetrain/serve/runs_root.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain::serve {

namespace {

constexpr size_t kMaxIdBytes = 128;

bool plain_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

// The reason a plain name (run id, report file) is refused, "" when it is fine.
std::string plain_name_problem(const std::string& name) {
    if (name.empty()) return "is empty";
    if (name.size() > kMaxIdBytes) return fmt::format("is longer than {} bytes", kMaxIdBytes);
    if (name[0] == '.') return "starts with '.' (hidden names and '..' are not runs)";
    for (char c : name)
        if (!plain_name_char(c))
            return "holds a character other than letters, digits, '.', '_' and '-'";
    return "";
}

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

std::string run_id_check(const std::string& id) {
    const std::string p = plain_name_problem(id);
    return p.empty() ? "" : fmt::format("run id '{}' {}", printable(id), p);
}

std::string file_name_check(const std::string& name) {
    const std::string p = plain_name_problem(name);
    return p.empty() ? "" : fmt::format("file name '{}' {}", printable(name), p);
}

std::optional<std::string> percent_decode(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out += text[i];
            continue;
        }
        if (i + 2 >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[i + 1])) ||
            !std::isxdigit(static_cast<unsigned char>(text[i + 2])))
            return std::nullopt;
        const char hex[3] = {text[i + 1], text[i + 2], 0};
        const char c = static_cast<char>(std::strtol(hex, nullptr, 16));
        if (c == '\0') return std::nullopt;
        out += c;
        i += 2;
    }
    return out;
}

// ---- Fd ----------------------------------------------------------------------------------------

Fd::~Fd() {
    if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}

Fd open_beneath(int dir_fd, const std::string& name, bool directory, std::string* why) {
    const int flags =
        O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (directory ? O_DIRECTORY : 0);
    const int fd = ::openat(dir_fd, name.c_str(), flags);
    if (fd < 0) {
        const int e = errno;
        // O_NOFOLLOW on a symlink: ELOOP; O_DIRECTORY on a symlink may give ENOTDIR.
        struct stat st {};
        if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            *why = fmt::format("{} is a symlink (not followed)", printable(name));
        else if (e == ENOENT)
            *why = fmt::format("{} does not exist", printable(name));
        else if (e == ENOTDIR)
            *why = fmt::format("{} is not a directory", printable(name));
        else
            *why = fmt::format("{} cannot be opened: {}", printable(name), errno_text(e));
        return Fd();
    }
    Fd out(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        *why = fmt::format("{} cannot be read: {}", printable(name), errno_text(errno));
        return Fd();
    }
    if (!directory && !S_ISREG(st.st_mode)) {
        *why = fmt::format("{} is not a regular file", printable(name));
        return Fd();
    }
    // The descriptor was opened non-blocking only so that a FIFO could not hang the open.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return out;
}

std::optional<std::string> read_fd(int fd, size_t max_bytes, std::string* why) {
    std::string text;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR) continue;
            *why = fmt::format("cannot be read: {}", errno_text(errno));
            return std::nullopt;
        }
        if (n == 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > max_bytes) {
            *why = fmt::format("is larger than {} bytes", max_bytes);
            return std::nullopt;
        }
    }
    return text;
}

std::optional<struct stat> stat_beneath(int dir_fd, const std::string& name) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
    return st;
}

namespace {

// Every name in `dir_fd` (hidden ones included), sorted.
std::vector<std::string> list_names(int dir_fd) {
    std::vector<std::string> names;
    // A second descriptor: readdir moves its offset, and dir_fd is shared with every openat.
    const int dup = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup < 0) return names;
    DIR* d = ::fdopendir(dup);
    if (d == nullptr) {
        ::close(dup);
        return names;
    }
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

// ---- RunsRoot ----------------------------------------------------------------------------------

RunsRoot::RunsRoot(const std::string& path) {
    SAE_ENFORCE(!path.empty(), "--root is empty: name the directory of the runs");
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
        SAE_ENFORCE(false, "--root {}: cannot be created: {}", printable(path), errno_text(errno));
    char real[PATH_MAX];
    SAE_ENFORCE(::realpath(path.c_str(), real) != nullptr, "--root {}: {}", printable(path),
                errno_text(errno));
    path_ = real;
    const int fd = ::open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    SAE_ENFORCE(fd >= 0, "--root {}: {}", printable(path), errno_text(errno));
    fd_ = Fd(fd);
}

Fd RunsRoot::open_run(const std::string& id, std::string* why) const {
    if (std::string bad = run_id_check(id); !bad.empty()) {
        *why = bad;
        return Fd();
    }
    std::string inner;
    Fd fd = open_beneath(fd_.get(), id, /*directory=*/true, &inner);
    if (!fd.valid())
        *why = fmt::format("run '{}': {} in the runs root {}", id,
                           inner.substr(inner.find(' ') + 1), path_);
    return fd;
}

bool RunsRoot::exists(const std::string& id) const {
    return stat_beneath(fd_.get(), id).has_value();
}

std::vector<std::string> RunsRoot::list_runs() const { return list_plain_dirs(fd_.get()); }

std::vector<std::string> list_plain_dirs(int dir_fd) {
    std::vector<std::string> ids;
    for (const std::string& name : list_names(dir_fd)) {
        if (!run_id_check(name).empty()) continue;
        const auto st = stat_beneath(dir_fd, name);
        if (st && S_ISDIR(st->st_mode)) ids.push_back(name);
    }
    return ids;  // sorted, as list_names is
}

std::optional<std::string> RunsRoot::run_id_of_out_dir(const std::string& out_dir,
                                                       const std::string& cwd,
                                                       std::string* why) const {
    const std::string hint = fmt::format(
        "a run launched by sae-serve writes into a directory directly in the runs root {}: set "
        "run.out_dir to its name (the run id) or to {}/NAME, or pass ?id=NAME",
        path_, path_);
    std::string dir = out_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (dir.find('/') == std::string::npos) {
        if (std::string bad = run_id_check(dir); !bad.empty()) {
            *why = fmt::format("run.out_dir '{}': {}; {}", printable(out_dir), bad, hint);
            return std::nullopt;
        }
        return dir;
    }
    if (dir[0] != '/') dir = cwd + "/" + dir;
    const size_t slash = dir.rfind('/');
    const std::string parent = slash == 0 ? "/" : dir.substr(0, slash);
    const std::string name = dir.substr(slash + 1);
    char real[PATH_MAX];
    if (::realpath(parent.c_str(), real) == nullptr || path_ != real) {
        *why =
            fmt::format("run.out_dir '{}' is outside the runs root; {}", printable(out_dir), hint);
        return std::nullopt;
    }
    if (std::string bad = run_id_check(name); !bad.empty()) {
        *why = fmt::format("run.out_dir '{}': {}; {}", printable(out_dir), bad, hint);
        return std::nullopt;
    }
    return name;
}

namespace {

bool is_link(int dir_fd, const std::string& name) {
    const auto st = stat_beneath(dir_fd, name);
    return st && S_ISLNK(st->st_mode);
}

}  // namespace

std::string planted_link(int run_fd) {
    for (const char* name : {"config.yaml", "run.json", "metrics.jsonl", "summary.csv", "COMPLETE",
                             ".saetrain.lock", "checkpoints", "sae", "report"})
        if (is_link(run_fd, name)) return fmt::format("{} is a symlink", name);
    std::string why;
    if (Fd sae = open_beneath(run_fd, "sae", true, &why); sae.valid())
        for (const std::string& id : list_names(sae.get())) {
            if (is_link(sae.get(), id)) return fmt::format("sae/{} is a symlink", printable(id));
            if (Fd dir = open_beneath(sae.get(), id, true, &why);
                dir.valid() && is_link(dir.get(), "feature_density.csv"))
                return fmt::format("sae/{}/feature_density.csv is a symlink", printable(id));
        }
    if (Fd report = open_beneath(run_fd, "report", true, &why); report.valid())
        for (const std::string& name : list_names(report.get()))
            if (is_link(report.get(), name))
                return fmt::format("report/{} is a symlink", printable(name));
    return "";
}

namespace {

std::vector<std::string> path_parts(const std::string& path) {
    std::vector<std::string> parts;
    size_t a = 0;
    while (a <= path.size()) {
        size_t b = path.find('/', a);
        if (b == std::string::npos) b = path.size();
        const std::string part = path.substr(a, b - a);
        if (!part.empty() && part != ".") parts.push_back(part);
        a = b + 1;
    }
    return parts;
}

}  // namespace

std::optional<std::string> RunsRoot::stage_dir_for_launch(const std::string& stage_dir,
                                                          const std::string& cwd,
                                                          const std::string& tmpdir,
                                                          std::string* why) const {
    const std::string tmp = tmpdir.empty() ? "/tmp" : tmpdir;
    const auto refuse = [&](const std::string& what) {
        *why = fmt::format(
            "data.stage_dir '{}' {}; a run launched by sae-serve writes only in the runs root {} "
            "and the node's temporary directory {} ($TMPDIR): leave it empty or write "
            "$TMPDIR/NAME",
            printable(stage_dir), what, path_, printable(tmp));
        return std::nullopt;
    };
    std::string path = stage_dir;
    if (path.rfind("$TMPDIR", 0) == 0) path = tmp + path.substr(7);
    if (path.empty() || path[0] != '/') path = cwd + "/" + path;
    const std::vector<std::string> parts = path_parts(path);
    for (const std::string& p : parts)
        if (p == "..") return refuse("holds '..'");
    // The bases a launched run may write below: the temporary directory as named and as its
    // real path, and the root.
    std::vector<std::string> bases = {tmp};
    char real[PATH_MAX];
    if (::realpath(tmp.c_str(), real) != nullptr) bases.emplace_back(real);
    bases.push_back(path_);
    for (const std::string& base : bases) {
        const std::vector<std::string> bp = path_parts(base);
        if (bp.size() > parts.size() || !std::equal(bp.begin(), bp.end(), parts.begin())) continue;
        if (::realpath(base.c_str(), real) == nullptr)
            return refuse(fmt::format("is in {}, which cannot be resolved: {}", printable(base),
                                      errno_text(errno)));
        std::string out = real;
        Fd dir(::open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!dir.valid())
            return refuse(fmt::format("is in {}, which cannot be opened: {}", printable(base),
                                      errno_text(errno)));
        for (size_t i = bp.size(); i < parts.size(); ++i) {
            const std::string& name = parts[i];
            if (::mkdirat(dir.get(), name.c_str(), 0700) != 0 && errno != EEXIST)
                return refuse(fmt::format("cannot be created at {}/{}: {}", printable(out),
                                          printable(name), errno_text(errno)));
            std::string inner;
            Fd next = open_beneath(dir.get(), name, true, &inner);
            if (!next.valid())
                return refuse(fmt::format("leads through {}/{}", printable(out), inner));
            struct stat st {};
            if (::fstat(next.get(), &st) != 0) return refuse(errno_text(errno));
            if ((st.st_uid != ::geteuid() && st.st_uid != 0) || (st.st_mode & 022) != 0)
                return refuse(fmt::format(
                    "leads through {}/{}, a directory {}; another user could plant a link in it",
                    printable(out), printable(name),
                    st.st_uid != ::geteuid() && st.st_uid != 0 ? "of another user"
                                                               : "others may write"));
            out += "/" + name;
            dir = std::move(next);
        }
        return out;
    }
    return refuse(fmt::format("is {}, outside both", printable(path)));
}

}  // namespace saetrain::serve
