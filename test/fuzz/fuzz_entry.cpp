// fuzz_entry.cpp — the per-target "one input" functions (see fuzz_entry.h).
#include "fuzz_entry.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "saetrain/checkpoint.h"   // defines: sae_read_h5, sae_is_checkpoint
#include "saetrain/config.h"       // defines: config_parse, config_to_yaml
#include "saetrain/error.h"        // defines: Error (the one correct way to reject input)
#include "saetrain/loader.h"       // defines: ShardBatchSource, LoaderOptions
#include "saetrain/safetensors.h"  // defines: safetensors_read, safetensors_write
#include "saetrain/shards.h"       // defines: dataset_open
#include "shard_oracle.h"          // defines: ShardOracle (the independent read)

namespace fs = std::filesystem;

// LeakSanitizer: Debian's HDF5 1.10.8 leaks internal structures on some error paths when a
// malformed file fails to open (e.g. H5D__layout_oh_read after a bad layout message); that is
// upstream, with nothing of ours to free. Our own HDF5 ids are checked per input instead
// (check_no_open_ids). Used by the sanitizer runtime when present; inert otherwise.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5_serial.so\n"; }
// AddressSanitizer: a failed allocation returns null as malloc does in production, instead of
// aborting. HDF5 sizes some buffers from the file (an object header claiming 2^58 bytes) and
// reports a clean error when malloc fails; our own code gets std::bad_alloc, which the harness
// still reports as a bug (it is not a saetrain::Error). Run with -malloc_limit_mb=1048576 so
// libFuzzer leaves the decision to ASan; -rss_limit_mb still catches memory actually used.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace saetrain::fuzz {

namespace {

// The input written to a fresh file, removed on scope exit. A new name per input: HDF5 shares
// an already-open file by inode, and a unique name keeps one input from seeing another's.
class TempFile {
public:
    TempFile(const uint8_t* data, size_t size) {
        static std::atomic<uint64_t> counter{0};
        const char* dir = std::getenv("TMPDIR");
        path_ =
            (fs::path(dir && *dir ? dir : "/tmp") / ("saetrain_fuzz_" + std::to_string(::getpid()) +
                                                     "_" + std::to_string(counter++) + ".h5"))
                .string();
        std::ofstream out(path_, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
        out.close();
        if (!out) throw std::runtime_error("fuzz harness: cannot write temp file " + path_);
    }
    ~TempFile() {
        std::error_code ec;
        fs::remove(path_, ec);
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// Every HDF5 id the readers open lives in an RAII handle: after an input, accepted or rejected,
// none may still be open (a leaked file id also keeps the file's descriptor and lock).
void check_no_open_ids(const char* what) {
    const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open > 0)
        throw HarnessBug(std::string(what) + " left " + std::to_string(open) +
                         " HDF5 object(s) open");
}

bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
}

}  // namespace

// --- config ----------------------------------------------------------------------------------

Outcome config_one(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<std::string> overrides;
    const std::string marker = "#--set\n";
    const size_t at = text.find(marker);
    if (at != std::string::npos) {
        std::string rest = text.substr(at + marker.size());
        text.resize(at);
        size_t b = 0;
        while (b <= rest.size()) {
            size_t e = rest.find('\n', b);
            if (e == std::string::npos) e = rest.size();
            if (e > b) overrides.push_back(rest.substr(b, e - b));
            b = e + 1;
        }
    }
    Config cfg;
    try {
        cfg = config_parse(text, overrides, "<fuzz>");
    } catch (const Error&) {
        return Outcome::rejected;
    }
    // The resolved config is what out_dir/config.yaml holds and what a resume reads back: it
    // must load again and resolve to itself.
    const std::string resolved = config_to_yaml(cfg);
    std::string again;
    try {
        again = config_to_yaml(config_parse(resolved, {}, "<resolved>"));
    } catch (const Error& e) {
        throw HarnessBug(std::string("the resolved config does not load again: ") + e.what() +
                         "\n--- resolved ---\n" + resolved);
    }
    if (again != resolved)
        throw HarnessBug("the resolved config changes when loaded again:\n--- first ---\n" +
                         resolved + "\n--- second ---\n" + again);
    return Outcome::accepted;
}

// --- shard -----------------------------------------------------------------------------------

namespace {

Outcome shard_read(const std::string& path) {
    DatasetInfo info;
    try {
        info = dataset_open(path);
    } catch (const Error&) {
        return Outcome::rejected;
    }
    if (info.shards.size() != 1 || info.d_model <= 0 || info.total_rows <= 0)
        throw HarnessBug("dataset_open accepted a shard with no rows or columns");
    // Read at most kMaxShardElems elements: the first rows that fit (none when one row is
    // already too wide). The reader's own allocations follow what it is asked to read.
    const int64_t rows = std::min(info.total_rows, kMaxShardElems / info.d_model);
    if (rows == 0) return Outcome::accepted;
    const int64_t d = info.d_model;
    // Not zeros: a reader that leaves part of its output unwritten must not look right.
    constexpr float kUnwritten = -1234.5f;
    std::vector<float> direct(static_cast<size_t>(rows * d), kUnwritten);
    try {
        testing::ShardOracle reader(info, RowRange{0, rows});
        int64_t done = 0;
        while (done < rows) {
            const int64_t n =
                reader.read(direct.data() + done * d, std::min<int64_t>(64, rows - done));
            if (n <= 0) throw HarnessBug("ShardOracle::read stopped before the end of its range");
            done += n;
        }
        if (reader.read(direct.data(), 1) != 0)
            throw HarnessBug("ShardOracle::read returned rows past the end of its range");
    } catch (const Error&) {
        return Outcome::rejected;
    }
    // The prefetching reader (pread at HDF5's offsets, or H5Dread) in disk order must deliver
    // the same values; then shuffled, it must deliver every row once.
    LoaderOptions opt;
    opt.read_bytes = 4096;
    opt.ring_bytes = 64 << 10;
    std::vector<float> loaded(static_cast<size_t>(rows * d), kUnwritten);
    try {
        ShardBatchSource src(info, RowRange{0, rows}, opt);
        if (src.total_rows() != rows) throw HarnessBug("ShardBatchSource: wrong total_rows");
        int64_t done = 0;
        while (done < rows) {
            const int64_t n = src.next(loaded.data() + done * d, std::min<int64_t>(7, rows - done));
            if (n <= 0) throw HarnessBug("ShardBatchSource::next stopped early");
            done += n;
        }
        for (size_t i = 0; i < loaded.size(); ++i) {
            if (!same_float(loaded[i], direct[i]))
                throw HarnessBug("ShardBatchSource and ShardOracle disagree at element " +
                                 std::to_string(i));
        }
        opt.shuffle_rows = 5;
        opt.seed = 1;
        ShardBatchSource shuffled(info, RowRange{0, rows}, opt);
        done = 0;
        while (done < rows) {
            const int64_t n = shuffled.next(loaded.data() + done * d, rows - done);
            if (n <= 0) throw HarnessBug("shuffled ShardBatchSource::next stopped early");
            done += n;
        }
    } catch (const Error&) {
        return Outcome::rejected;
    }
    return Outcome::accepted;
}

// --- checkpoint ------------------------------------------------------------------------------

Outcome checkpoint_read(const std::string& path) {
    try {
        (void)sae_is_checkpoint(path);
        SaeMeta meta;
        SaeWeights w = sae_read_h5(path, &meta);
        const size_t dm = static_cast<size_t>(w.d_model), n = static_cast<size_t>(w.n_latents);
        if (w.d_model < 0 || w.n_latents < 0 || w.at("W_enc").size() != dm * n ||
            w.at("W_dec").size() != n * dm || w.at("b_enc").size() != n ||
            w.at("b_dec").size() != dm)
            throw HarnessBug("sae_read_h5 accepted weights whose sizes disagree with their shape");
    } catch (const Error&) {
        return Outcome::rejected;
    }
    return Outcome::accepted;
}

}  // namespace

// --- entry points: the file, then the check that nothing was left open ---------------------

Outcome shard_one(const uint8_t* data, size_t size) {
    Outcome o;
    {
        TempFile file(data, size);
        o = shard_read(file.path());
    }
    check_no_open_ids("the shard readers");
    return o;
}

Outcome checkpoint_one(const uint8_t* data, size_t size) {
    Outcome o;
    {
        TempFile file(data, size);
        o = checkpoint_read(file.path());
    }
    check_no_open_ids("sae_read_h5");
    return o;
}

Outcome safetensors_one(const uint8_t* data, size_t size) {
    TempFile file(data, size);
    std::map<std::string, std::string> meta;
    std::map<std::string, Tensor> t;
    try {
        t = safetensors_read(file.path(), &meta);
    } catch (const Error&) {
        return Outcome::rejected;
    }
    std::vector<TensorView> views;
    for (const auto& [name, tensor] : t) {
        // An accepted shape whose element count wraps is a bug too.
        uint64_t n = 1;
        bool wrapped = false;
        for (int64_t s : tensor.shape)
            wrapped |= __builtin_mul_overflow(n, static_cast<uint64_t>(s), &n);
        if (wrapped || n != tensor.data.size())
            throw HarnessBug("tensor '" + name + "' holds " + std::to_string(tensor.data.size()) +
                             " values for its shape");
        views.push_back({name, tensor.shape, tensor.data.data()});
    }
    const std::string again = file.path() + ".again";
    try {
        safetensors_write(again, views, meta);
    } catch (const Error& e) {  // names the writer refuses (e.g. empty) are not in its output
        std::error_code ec;
        fs::remove(again, ec);
        return Outcome::accepted;
    }
    std::map<std::string, std::string> meta2;
    const auto t2 = safetensors_read(again, &meta2);
    std::error_code ec;
    fs::remove(again, ec);
    if (meta2 != meta || t2.size() != t.size())
        throw HarnessBug("write -> read changed the metadata or the tensor count");
    for (const auto& [name, tensor] : t) {
        const Tensor& u = t2.at(name);
        if (u.shape != tensor.shape || u.data.size() != tensor.data.size() ||
            (!tensor.data.empty() && std::memcmp(u.data.data(), tensor.data.data(),
                                                 tensor.data.size() * sizeof(float)) != 0))
            throw HarnessBug("write -> read changed tensor '" + name + "'");
    }
    return Outcome::accepted;
}

}  // namespace saetrain::fuzz
