// run.out_dir's lock and clean-up (run_dir.h).
#include "saetrain/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "saetrain/checkpointer.h"  // defines: Checkpointer::committed_steps
#include "saetrain/error.h"

namespace fs = std::filesystem;

namespace saetrain {

OutDirLock::OutDirLock(const std::string& out_dir) {
    const fs::path out = out_dir;
    std::error_code ec;
    fs::create_directories(out, ec);
    SAE_ENFORCE(!ec,
                "run.out_dir {}: cannot create it ({}); choose a directory this job can "
                "write",
                out.string(), ec.message());
    const fs::path path = out / ".saetrain.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
    auto sweep = [&](const fs::path& dir, bool checkpoints) {
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            const std::string name = e.path().filename().string();
            const size_t at = name.rfind(".tmp");
            const bool temp = at != std::string::npos && at > 0 &&
                              name.find_first_not_of("0123456789", std::min(name.size(), at + 5)) ==
                                  std::string::npos &&
                              (at + 4 == name.size() || name[at + 4] == '.');
            long long step = -1;
            char rest[16] = "";
            const bool pair = checkpoints && !temp &&
                              std::sscanf(name.c_str(), "checkpoint-%lld%15s", &step, rest) == 2 &&
                              (std::string(rest) == ".h5" || std::string(rest) == ".state.h5");
            if (temp ||
                (pair && std::find(committed.begin(), committed.end(), step) == committed.end()))
                fs::remove(e.path(), ec);
        }
    };
    sweep(out / "checkpoints", false);
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

}  // namespace saetrain
