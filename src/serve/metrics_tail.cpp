#include "saetrain/serve/metrics_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "saetrain/serve/runs_root.h"  // defines: Fd

namespace saetrain::serve {

namespace {
// At most this much is read in one poll, so that a huge backlog (a long run's file read at the
// server's start) is taken in pieces between the other runs' polls and the clients' requests.
constexpr int64_t kMaxReadPerPoll = 16 << 20;
constexpr size_t kTailCheckBytes = 256;
}  // namespace

bool MetricsTail::tail_unchanged(int fd) const {
    if (consumed_tail_.empty()) return true;
    std::string now(consumed_tail_.size(), '\0');
    const off_t at = static_cast<off_t>(offset_) - static_cast<off_t>(now.size());
    const ssize_t r = ::pread(fd, now.data(), now.size(), at);
    return r == static_cast<ssize_t>(now.size()) && now == consumed_tail_;
}

size_t MetricsTail::first_after(int64_t since) const {
    const auto it = std::upper_bound(steps_.begin(), steps_.end(), since,
                                     [](int64_t s, const MetricsStep& m) { return s < m.step; });
    return static_cast<size_t>(it - steps_.begin());
}

void MetricsTail::complete_pending() {
    if (pending_.lines.empty()) return;
    steps_.push_back(std::move(pending_));
    pending_ = MetricsStep{};
}

// lines_[0, verify_) are the file's first lines; the rest are gone from it. Complete steps made
// only of kept lines stay; the kept lines after them become the pending step; if a complete
// step lost a line, the clients are told to drop everything after the last step kept.
void MetricsTail::drop_unmatched(Update& up) {
    size_t n = 0, k = 0;
    while (k < steps_.size() && n + steps_[k].lines.size() <= verify_)
        n += steps_[k++].lines.size();
    const bool dropped_complete = k < steps_.size();
    steps_.resize(k);
    lines_.resize(verify_);
    pending_ = MetricsStep{};
    for (size_t i = n; i < lines_.size(); ++i) {
        pending_.step = lines_[i].step;
        pending_.lines.push_back(lines_[i].text);
        pending_.saes.push_back(lines_[i].sae);
    }
    if (dropped_complete) {
        up.rewound = steps_.empty() ? int64_t{-1} : steps_.back().step;
        up.first_new = std::min(up.first_new, k);
    }
    verify_ = SIZE_MAX;
}

MetricsTail::Update MetricsTail::poll(size_t saes, bool ended) {
    Update up;
    up.first_new = steps_.size();

    const int fd =
        ::openat(dir_fd_, "metrics.jsonl", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    Fd owned(fd);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        if (static_cast<uint64_t>(st.st_ino) != inode_ || st.st_size < offset_ ||
            !tail_unchanged(fd)) {
            // Replaced or rewritten: read it again from the start, matching what was taken.
            inode_ = static_cast<uint64_t>(st.st_ino);
            offset_ = 0;
            partial_.clear();
            consumed_tail_.clear();
            verify_ = lines_.empty() ? SIZE_MAX : 0;
        }
        const int64_t want = std::min<int64_t>(st.st_size - offset_, kMaxReadPerPoll);
        if (want > 0) {
            std::string buf(static_cast<size_t>(want), '\0');
            int64_t got = 0;
            while (got < want) {
                const ssize_t r =
                    ::pread(fd, buf.data() + got, static_cast<size_t>(want - got), offset_ + got);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;
                got += r;
            }
            buf.resize(static_cast<size_t>(got));
            offset_ += got;
            consumed_tail_ += buf;
            if (consumed_tail_.size() > kTailCheckBytes)
                consumed_tail_.erase(0, consumed_tail_.size() - kTailCheckBytes);
            partial_ += buf;
            size_t start = 0;
            for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos;
                 start = nl + 1) {
                std::string text = partial_.substr(start, nl - start);
                const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
                if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
                    !j.contains("sae") || !j["sae"].is_string()) {
                    ++skipped_;
                    continue;
                }
                take(Line{std::move(text), j["sae"].get<std::string>(), j["step"].get<int64_t>()},
                     saes, up);
            }
            partial_.erase(0, start);
        }
    }
    if (ended) {
        // The file will not grow again: lines not found in it are gone, a step in part is whole.
        if (verify_ != SIZE_MAX) drop_unmatched(up);
        complete_pending();
    }
    return up;
}

void MetricsTail::take(Line line, size_t saes, Update& up) {
    if (verify_ != SIZE_MAX) {
        if (verify_ < lines_.size() && lines_[verify_].text == line.text) {
            if (++verify_ == lines_.size()) verify_ = SIZE_MAX;
            return;
        }
        drop_unmatched(up);  // the file differs from here on
    }
    if (!pending_.lines.empty() && line.step != pending_.step) complete_pending();
    pending_.step = line.step;
    pending_.lines.push_back(line.text);
    pending_.saes.push_back(line.sae);
    lines_.push_back(std::move(line));
    if (saes > 0 && pending_.lines.size() >= saes) complete_pending();
}

}  // namespace saetrain::serve
