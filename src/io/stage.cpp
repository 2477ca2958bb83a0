// stage.cpp — copying shards to node-local storage (see stage.h).
#include "saetrain/stage.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/s3.h"

namespace fs = std::filesystem;

namespace saetrain {

std::string stage_dir_resolve(const std::string& dir) {
    const std::string key = "$TMPDIR";
    if (dir.compare(0, key.size(), key) != 0) return dir;
    const char* t = std::getenv("TMPDIR");
    return std::string(t && *t ? t : "/tmp") + dir.substr(key.size());
}

namespace {

// RAII file descriptor.
struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
};

// Writes n bytes of buf to the staged copy's temp file tmp (for dst); on a failed write the temp
// file is removed and the error names dst and the likely cause.
void write_all(int fd, const char* buf, int64_t n, const std::string& tmp, const std::string& dst) {
    for (int64_t w = 0; w < n;) {
        const ssize_t k = ::write(fd, buf + w, static_cast<size_t>(n - w));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            const int err = errno;
            ::unlink(tmp.c_str());
            throw Error(fmt::format("staging: writing {} failed ({}); is the local disk full?", dst,
                                    std::strerror(err)));
        }
        w += k;
    }
}

// Copies src to dst (through dst.tmp-<pid>, then rename) in 8 MiB requests.
void copy_file(const std::string& src, const std::string& dst, int64_t size, int64_t* done_total,
               int64_t grand_total, bool progress, std::chrono::steady_clock::time_point t0) {
    const std::string tmp = dst + ".tmp-" + std::to_string(::getpid());
    Fd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
    SAE_ENFORCE(in.fd >= 0, "staging: cannot open shard {} ({})", src, std::strerror(errno));
    Fd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    SAE_ENFORCE(out.fd >= 0, "staging: cannot create {} ({}); check the stage directory", tmp,
                std::strerror(errno));
    ::posix_fadvise(in.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<char> buf(8u << 20);
    int64_t done = 0;
    auto last = std::chrono::steady_clock::now();
    while (done < size) {
        ssize_t r = ::read(in.fd, buf.data(), buf.size());
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ::unlink(tmp.c_str());
            throw Error(fmt::format("staging: reading shard {} failed at byte {} ({})", src, done,
                                    r == 0 ? "file shrank while copying" : std::strerror(errno)));
        }
        write_all(out.fd, buf.data(), r, tmp, dst);
        done += r;
        *done_total += r;
        const auto now = std::chrono::steady_clock::now();
        if (progress && now - last > std::chrono::seconds(1)) {
            const double s = std::chrono::duration<double>(now - t0).count();
            std::fprintf(stderr, "\rstaging: %.0f / %.0f MB (%.0f MB/s)   ",
                         static_cast<double>(*done_total) / 1e6,
                         static_cast<double>(grand_total) / 1e6,
                         static_cast<double>(*done_total) / 1e6 / s);
            last = now;
        }
    }
    if (::fsync(out.fd) != 0 || std::rename(tmp.c_str(), dst.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw Error(fmt::format("staging: cannot finish {} ({})", dst, std::strerror(err)));
    }
}

// Copies object `src` (a shard of `info`, `size` bytes) to dst through dst.tmp-<pid>, in pieces
// of 64 MiB, each fetched by concurrent range GETs.
void copy_object(const DatasetInfo& info, const ShardInfo& src, const std::string& dst,
                 int64_t* done_total, int64_t grand_total, bool progress,
                 std::chrono::steady_clock::time_point t0) {
    const S3Url u = s3_url_parse(src.path);
    const S3Object obj{u.bucket, u.key, src.bytes, src.etag};
    const std::shared_ptr<const S3Client> client = s3_client(info.s3, info.source);
    const std::string tmp = dst + ".tmp-" + std::to_string(::getpid());
    Fd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    SAE_ENFORCE(out.fd >= 0, "staging: cannot create {} ({}); check the stage directory", tmp,
                std::strerror(errno));
    std::vector<char> buf(64u << 20);
    for (int64_t done = 0; done < src.bytes;) {
        const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), src.bytes - done);
        try {
            client->read(obj, done, n, buf.data());
        } catch (...) {
            ::unlink(tmp.c_str());
            throw;
        }
        write_all(out.fd, buf.data(), n, tmp, dst);
        done += n;
        *done_total += n;
        if (progress) {
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::fprintf(stderr, "\rstaging: %.0f / %.0f MB (%.0f MB/s)   ",
                         static_cast<double>(*done_total) / 1e6,
                         static_cast<double>(grand_total) / 1e6,
                         static_cast<double>(*done_total) / 1e6 / std::max(s, 1e-9));
        }
    }
    if (::fsync(out.fd) != 0 || std::rename(tmp.c_str(), dst.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw Error(fmt::format("staging: cannot finish {} ({})", dst, std::strerror(err)));
    }
}

}  // namespace

DatasetInfo stage_shards(const DatasetInfo& info, RowRange range, const std::string& dir_in,
                         bool progress, StageStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    StageStats st;
    DatasetInfo out = info;
    std::vector<size_t> todo;
    int64_t grand_total = 0;
    std::error_code ec;
    for (size_t i = 0; i < info.shards.size(); ++i) {
        if (!shard_overlaps(info.shards[i], range)) continue;
        todo.push_back(i);
        grand_total += is_s3_url(info.shards[i].path)
                           ? info.shards[i].bytes
                           : static_cast<int64_t>(fs::file_size(info.shards[i].path, ec));
    }
    const std::string root = stage_dir_resolve(dir_in);
    int64_t done_total = 0;
    for (size_t i : todo) {
        if (is_s3_url(info.shards[i].path)) {
            // An object: into dir/<the prefix's last part>/<its name>, like a file's parent.
            const fs::path key = s3_url_parse(info.shards[i].path).key;
            const fs::path dir =
                fs::path(root) / (key.has_parent_path()
                                      ? key.parent_path().filename()
                                      : fs::path(s3_url_parse(info.source).bucket));
            fs::create_directories(dir, ec);
            SAE_ENFORCE(!ec, "staging: cannot create directory {} ({})", dir.string(),
                        ec.message());
            const fs::path dst = dir / key.filename();
            std::error_code ec2;
            const auto have = fs::file_size(dst, ec2);
            if (!ec2 && static_cast<int64_t>(have) == info.shards[i].bytes) {
                ++st.skipped;
                done_total += info.shards[i].bytes;
            } else {
                copy_object(info, info.shards[i], dst.string(), &done_total, grand_total, progress,
                            t0);
                ++st.copied;
                st.bytes_copied += info.shards[i].bytes;
            }
            out.shards[i].path = dst.string();
            out.shards[i].bytes = 0, out.shards[i].etag.clear();
            continue;
        }
        const fs::path src = fs::absolute(info.shards[i].path, ec);
        // The parent directory's name keeps shards of different datasets apart.
        const fs::path dir = fs::path(root) / src.parent_path().filename();
        fs::create_directories(dir, ec);
        SAE_ENFORCE(!ec, "staging: cannot create directory {} ({})", dir.string(), ec.message());
        const fs::path dst = dir / src.filename();
        SAE_ENFORCE(fs::absolute(dst, ec) != src,
                    "staging: {} is the shard itself; point the stage directory elsewhere",
                    dst.string());
        const auto size = fs::file_size(src, ec);
        SAE_ENFORCE(!ec, "staging: cannot stat shard {} ({})", src.string(), ec.message());
        std::error_code ec2;
        const auto have = fs::file_size(dst, ec2);
        if (!ec2 && have == size) {
            ++st.skipped;
            done_total += static_cast<int64_t>(size);
        } else {
            copy_file(src.string(), dst.string(), static_cast<int64_t>(size), &done_total,
                      grand_total, progress, t0);
            ++st.copied;
            st.bytes_copied += static_cast<int64_t>(size);
        }
        out.shards[i].path = dst.string();
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.dir = root;
    if (progress) {
        std::fprintf(stderr,
                     "\rstaging: %d shard(s) copied (%.0f MB, %.1f s), %d already there, in %s\n",
                     st.copied, static_cast<double>(st.bytes_copied) / 1e6, st.seconds, st.skipped,
                     root.c_str());
    }
    if (stats) *stats = st;
    return out;
}

}  // namespace saetrain
