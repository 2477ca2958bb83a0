// sae-iobench — the training reader's throughput beside the raw bandwidth of the same files.
//
// Reads DATA the way training does (ShardBatchSource: same reads and shuffle, rows delivered in
// the shards' element type; --widen: widened to float32 by the reader, as before 16-bit rows
// were kept) and compares it with plain sequential 1 MiB reads of the same files, with a cold
// page cache
// (each file's pages evicted with posix_fadvise DONTNEED before a pass) and warm, and with the
// naive baseline of random single-row HDF5 reads. Prints a fixed-width table (the raw figure is
// the limit beside each reader figure), the bytes per token each stage moves, and, with
// --json, one JSON object. DATA may be s3://bucket/prefix/ (s3.h): then the limit is a plain
// parallel range-GET pass over every object (no HDF5, no loader: --s3-connections requests of
// --s3-request-mib at once) against the same store, beside the reader's first and later epochs.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "app_cli.h"  // defines: cli_parse (--version, usage errors)
#include "saetrain/error.h"
#include "saetrain/loader.h"   // defines: ShardBatchSource, LoaderOptions
#include "saetrain/s3.h"       // defines: S3Settings, s3_read_all (the store's plain rate)
#include "saetrain/shards.h"   // defines: dataset_open, shard_index
#include "saetrain/shuffle.h"  // defines: ShufflePlan, shuffle_quality

namespace fs = std::filesystem;
using namespace saetrain;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Progress on stderr at most twice a second; cleared by done().
struct Progress {
    std::string what;
    double total_mb;
    Clock::time_point t0 = Clock::now(), last = Clock::now();
    void update(double mb) {
        if (since(last) < 0.5) return;
        last = Clock::now();
        std::fprintf(stderr, "\r%-22s %8.0f / %.0f MB  %7.0f MB/s   ", what.c_str(), mb, total_mb,
                     mb / since(t0));
    }
    void done() const { std::fprintf(stderr, "\r%-70s\r", ""); }
};

// Drops the files' pages from the page cache (after flushing any dirty ones).
void evict(const DatasetInfo& info) {
    for (const auto& s : info.shards) {
        int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
        SAE_ENFORCE(fd >= 0, "cannot open {}", s.path);
        ::fdatasync(fd);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
}

struct Figure {
    std::string name;
    double in_bytes = 0, out_bytes = 0, rows = 0, seconds = 0;
    double in_MBps() const { return seconds > 0 ? in_bytes / seconds / 1e6 : 0; }
    double out_MBps() const { return seconds > 0 ? out_bytes / seconds / 1e6 : 0; }
    double rows_per_s() const { return seconds > 0 ? rows / seconds : 0; }
};

// Bytes per row in the files.
double row_bytes_in(const DatasetInfo& info) {
    return static_cast<double>(info.d_model * dtype_size(info.dtype));
}

// The figure of a reader that has delivered f.rows rows of `out` since t0.
void finish_rows(Figure& f, const DatasetInfo& info, DType out, Clock::time_point t0) {
    f.seconds = since(t0);
    f.in_bytes = f.rows * row_bytes_in(info);
    f.out_bytes = f.rows * static_cast<double>(info.d_model * dtype_size(out));
}

// The element type a reader with these options delivers.
DType delivered(const DatasetInfo& info, const LoaderOptions& lo) {
    return lo.widen ? DType::f32 : info.dtype;
}

// Every byte of every file, in order, with 1 MiB requests.
Figure raw_pass(const DatasetInfo& info, const char* name, double max_s) {
    Figure f;
    f.name = name;
    std::vector<char> buf(1u << 20);
    double total = 0;
    for (const auto& s : info.shards) total += static_cast<double>(fs::file_size(s.path));
    Progress p{name, total / 1e6};
    const auto t0 = Clock::now();
    for (const auto& s : info.shards) {
        int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
        SAE_ENFORCE(fd >= 0, "cannot open {}", s.path);
        ssize_t r;
        while ((r = ::read(fd, buf.data(), buf.size())) > 0) {
            f.in_bytes += static_cast<double>(r);
            p.update(f.in_bytes / 1e6);
            if (max_s > 0 && since(t0) > max_s) break;
        }
        ::close(fd);
        if (max_s > 0 && since(t0) > max_s) break;
    }
    f.seconds = since(t0);
    f.rows = f.in_bytes / row_bytes_in(info);
    p.done();
    return f;
}

// One epoch of the training reader over the whole dataset (construction included).
Figure reader_pass(const DatasetInfo& info, const LoaderOptions& lo, int64_t batch,
                   const char* name, double max_s, int64_t* buffer_bytes) {
    Figure f;
    f.name = name;
    const double row_in = row_bytes_in(info);
    Progress p{name, static_cast<double>(info.total_rows) * row_in / 1e6};
    std::vector<float> out(static_cast<size_t>(batch * info.d_model));  // fits any type
    const auto t0 = Clock::now();
    ShardBatchSource src(info, RowRange{0, info.total_rows}, lo);
    int64_t got;
    while ((got = src.next(out.data(), batch)) > 0) {
        f.rows += static_cast<double>(got);
        p.update(f.rows * row_in / 1e6);
        if (max_s > 0 && since(t0) > max_s) break;
    }
    finish_rows(f, info, delivered(info, lo), t0);
    *buffer_bytes = src.buffer_bytes();
    p.done();
    return f;
}

// Four epochs of one reader; the figure is epochs 2-4: the steady state of a long run, with
// the buffers mapped (the first pass pays allocation, first-touch page faults and the
// unoverlapped first window). The reader starts epoch 2 up to one window ahead, a share of
// at most 1 / (3 * windows per epoch) of what is timed.
Figure reader_later_epochs(const DatasetInfo& info, LoaderOptions lo, int64_t batch,
                           const char* name) {
    Figure f;
    f.name = name;
    lo.epochs = 4;
    lo.max_rows = 0;
    const double row_in = row_bytes_in(info);
    Progress p{name, 4 * static_cast<double>(info.total_rows) * row_in / 1e6};
    std::vector<float> out(static_cast<size_t>(batch * info.d_model));
    ShardBatchSource src(info, RowRange{0, info.total_rows}, lo);
    int64_t rows = 0;
    // Epoch 1 up to its last batch boundary, so that epoch 2 starts on a fresh next() call.
    while (rows + batch <= info.total_rows) {
        rows += src.next(out.data(), batch);
        p.update(static_cast<double>(rows) * row_in / 1e6);
    }
    rows += src.next(out.data(), info.total_rows - rows);
    const auto t0 = Clock::now();
    int64_t got;
    while ((got = src.next(out.data(), batch)) > 0) {
        f.rows += static_cast<double>(got);
        p.update((static_cast<double>(rows) + f.rows) * row_in / 1e6);
    }
    finish_rows(f, info, delivered(info, lo), t0);
    p.done();
    return f;
}

// One HDF5 id, closed when it goes out of scope.
class H5Id {
public:
    H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    ~H5Id() {
        if (id_ >= 0) close_(id_);
    }
    H5Id(const H5Id&) = delete;
    H5Id& operator=(const H5Id&) = delete;
    hid_t get() const { return id_; }

private:
    hid_t id_;
    herr_t (*close_)(hid_t);
};

// The shard the naive reader has open; it opens another when a row lies there.
struct NaiveShard {
    explicit NaiveShard(const std::string& path, const std::string& dataset)
        : file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose),
          dset(H5Dopen2(file.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose),
          space(H5Dget_space(dset.get()), H5Sclose) {
        SAE_ENFORCE(space.get() >= 0, "cannot open dataset '{}' of {} with HDF5", dataset, path);
    }
    H5Id file, dset, space;
};

// Random single-row reads through HDF5 (what a map-style dataset does: one hyperslab H5Dread
// per row, HDF5 converting to float32), for max_s seconds. The naive baseline, deliberately
// plain: none of the reader's machinery. bfloat16 stored as 16-bit words comes out as integers
// converted to float, the same work (the rows are discarded).
Figure naive_pass(const DatasetInfo& info, double max_s, uint64_t seed) {
    Figure f;
    f.name = "naive random rows";
    const hsize_t count[2] = {1, static_cast<hsize_t>(info.d_model)};
    const H5Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    std::unique_ptr<NaiveShard> open;
    size_t open_index = 0;
    std::vector<float> row(static_cast<size_t>(info.d_model));
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int64_t> pick(0, info.total_rows - 1);
    const double row_in = row_bytes_in(info);
    Progress p{f.name, 0};
    const auto t0 = Clock::now();
    while (since(t0) < max_s) {
        const int64_t r = pick(g);
        const size_t i = shard_index(info, r);
        if (!open || i != open_index) {
            open.reset();
            open = std::make_unique<NaiveShard>(info.shards[i].path, info.dataset);
            open_index = i;
        }
        const hsize_t start[2] = {static_cast<hsize_t>(r - info.shards[i].first_row), 0};
        SAE_ENFORCE(H5Sselect_hyperslab(open->space.get(), H5S_SELECT_SET, start, nullptr, count,
                                        nullptr) >= 0 &&
                        H5Dread(open->dset.get(), H5T_NATIVE_FLOAT, mspace.get(), open->space.get(),
                                H5P_DEFAULT, row.data()) >= 0,
                    "shard {}: reading row {} with HDF5 failed", info.shards[i].path, start[0]);
        f.rows += 1;
        if (static_cast<int64_t>(f.rows) % 256 == 0) p.update(f.rows * row_in / 1e6);
    }
    finish_rows(f, info, DType::f32, t0);  // HDF5 converts to float32
    p.done();
    return f;
}

// The command line.
struct Args {
    std::string data;
    int64_t batch = 4096, shuffle_rows = 262144, read_mib = 8;
    double seconds = 0, naive_seconds = 5;
    int passes = 1;
    bool json = false, no_cold = false, widen = false;
    uint64_t seed = 0;
    S3Settings s3;  // s3:// DATA; endpoint, region and credentials the AWS way (s3.h)
    int64_t s3_request_mib = 8;
};

void add_options(CLI::App& app, Args& a) {
    app.add_option("DATA", a.data, "dataset: directory, glob or .h5 shard")->required();
    app.add_option("--batch", a.batch, "rows per next() call, as data.batch_size")
        ->capture_default_str();
    app.add_option("--shuffle-rows", a.shuffle_rows, "shuffle window rows (0: disk order)")
        ->capture_default_str();
    app.add_option("--read-mib", a.read_mib, "MiB per read chunk")->capture_default_str();
    app.add_option("--passes", a.passes, "passes per measurement (best is reported)")
        ->capture_default_str();
    app.add_option("--seconds", a.seconds, "cap on each pass (0: whole dataset)")
        ->capture_default_str();
    app.add_option("--naive-seconds", a.naive_seconds, "time for random single-row reads")
        ->capture_default_str();
    app.add_option("--seed", a.seed, "shuffle seed")->capture_default_str();
    app.add_flag("--no-cold", a.no_cold, "skip the cold-cache passes");
    app.add_flag("--widen", a.widen,
                 "the reader widens 16-bit rows to float32 (default: delivered as stored, as "
                 "saetrain trains on them)");
    app.add_flag("--json", a.json, "also print one JSON object");
    app.add_option("--s3-connections", a.s3.connections,
                   "s3:// DATA: concurrent range GETs (data.s3_connections)")
        ->capture_default_str();
    app.add_option("--s3-request-mib", a.s3_request_mib,
                   "s3:// DATA: MiB of one range GET (data.s3_request_bytes)")
        ->capture_default_str();
}

void print_setup(const Args& a, const DatasetInfo& info, const ShufflePlan& plan) {
    const double row_in = row_bytes_in(info);
    std::printf("dataset %s | %zu shard(s), %lld rows, d_model %lld, %s | %.1f MB\n",
                a.data.c_str(), info.shards.size(), static_cast<long long>(info.total_rows),
                static_cast<long long>(info.d_model), dtype_name(info.dtype),
                static_cast<double>(info.total_rows) * row_in / 1e6);
    std::printf(
        "reader | chunks of %lld rows (%.1f MiB), windows of %lld chunks (%lld rows)"
        ", batch %lld\n",
        static_cast<long long>(plan.chunk_rows()),
        static_cast<double>(plan.chunk_rows()) * row_in / (1 << 20),
        static_cast<long long>(plan.window_chunks()),
        static_cast<long long>(plan.chunk_rows() * plan.window_chunks()),
        static_cast<long long>(a.batch));
}

// Every measurement of one run, and the reader's buffer bytes.
struct Figures {
    Figure raw_cold, reader_cold, raw_warm, reader_warm, reader_steady, naive;
    int64_t buffer_bytes = 0;
};

// The fastest (by MB/s read) of `passes` runs of `pass`.
template <typename Pass>
Figure best_of(int passes, Pass pass) {
    Figure b = pass();
    for (int i = 1; i < passes; ++i) {
        Figure f = pass();
        if (f.in_MBps() > b.in_MBps()) b = f;
    }
    return b;
}

Figures measure(const Args& a, const DatasetInfo& info, const LoaderOptions& lo) {
    auto best = [&](auto pass) { return best_of(a.passes, pass); };
    Figures r;
    int64_t* buf = &r.buffer_bytes;
    if (!a.no_cold) {
        r.raw_cold = best([&] {
            evict(info);
            return raw_pass(info, "raw sequential cold", a.seconds);
        });
        r.reader_cold = best([&] {
            evict(info);
            return reader_pass(info, lo, a.batch, "reader cold", a.seconds, buf);
        });
    }
    raw_pass(info, "warming the cache", 0);
    r.raw_warm = best([&] { return raw_pass(info, "raw sequential warm", a.seconds); });
    r.reader_warm =
        best([&] { return reader_pass(info, lo, a.batch, "reader warm", a.seconds, buf); });
    r.reader_steady =
        best([&] { return reader_later_epochs(info, lo, a.batch, "reader warm epochs 2-4"); });
    if (a.naive_seconds > 0) {
        evict(info);
        r.naive = naive_pass(info, a.naive_seconds, a.seed);
    }
    return r;
}

// s3:// DATA: the plain parallel range-GET pass over every object (the limit), then the reader's
// first epoch and its epochs 2-4, against the same store. No page cache to be cold or warm.
Figures measure_s3(const Args& a, const DatasetInfo& info, const LoaderOptions& lo) {
    auto best = [&](auto pass) { return best_of(a.passes, pass); };
    std::vector<S3Object> objects;
    for (const ShardInfo& s : info.shards) {
        const S3Url u = s3_url_parse(s.path);
        objects.push_back(S3Object{u.bucket, u.key, s.bytes, s.etag});
    }
    const std::shared_ptr<const S3Client> client = s3_client(info.s3, info.source);
    Figures r;
    r.raw_warm = best([&] {
        Figure f;
        f.name = "range GET plain";
        const auto t0 = Clock::now();
        f.in_bytes = static_cast<double>(s3_read_all(*client, objects, a.seconds));
        f.seconds = since(t0);
        f.rows = f.in_bytes / row_bytes_in(info);
        return f;
    });
    r.reader_warm =
        best([&] { return reader_pass(info, lo, a.batch, "reader", a.seconds, &r.buffer_bytes); });
    r.reader_steady =
        best([&] { return reader_later_epochs(info, lo, a.batch, "reader epochs 2-4"); });
    return r;
}

void print_table(const Figures& r, const ShuffleQuality& q, bool no_cold, DType out) {
    // The delivered element type in the column's head ("out bf16"): 10 characters at most.
    const char* type = out == DType::f32 ? "f32" : out == DType::f16 ? "f16" : "bf16";
    char out_head[32];
    std::snprintf(out_head, sizeof out_head, "out %s", type);
    std::printf("\n%-22s %10s %9s %10s %10s %12s %10s\n", "measure", "read", "time", "in", out_head,
                "rows/s", "of limit");
    std::printf("%-22s %10s %9s %10s %10s %12s %10s\n", "", "MB", "s", "MB/s", "MB/s", "rows/s",
                "%");
    auto row = [&](const Figure& f, const Figure* limit) {
        if (f.seconds <= 0) return;
        char pct[32] = "";
        if (limit && limit->in_MBps() > 0)
            std::snprintf(pct, sizeof pct, "%.1f", 100.0 * f.in_MBps() / limit->in_MBps());
        std::printf("%-22s %10.1f %9.2f %10.1f %10.1f %12.0f %10s\n", f.name.c_str(),
                    f.in_bytes / 1e6, f.seconds, f.in_MBps(), f.out_MBps(), f.rows_per_s(), pct);
    };
    row(r.raw_cold, nullptr);
    row(r.reader_cold, &r.raw_cold);
    row(r.raw_warm, nullptr);
    row(r.reader_warm, &r.raw_warm);
    row(r.reader_steady, &r.raw_warm);
    row(r.naive, no_cold ? nullptr : &r.raw_cold);
    if (r.raw_warm.name == "range GET plain")
        std::printf(
            "\nlimits: the reader's figures are compared with the plain parallel range-GET pass "
            "over every object (same store, connections and request size, no HDF5, no loader). "
            "The reader's first pass includes its construction; 'epochs 2-4' times the later "
            "epochs of one reader (steady state)\n");
    else
        std::printf(
            "\nlimits: the reader's cold figure is compared with raw sequential cold, its "
            "warm figures with raw warm; naive with raw cold. Reader passes include its "
            "construction; 'epochs 2-4' times the later epochs of one reader (steady state)\n");
    std::printf(
        "shuffle quality: displacement %.3f (1 = uniform permutation, 0 = disk order)"
        " | batch-mean lag-1 corr %.3f (0 ideal) | batch-mean spread %.2f x ideal"
        " (groups = shards)\n",
        q.displacement, q.batch_corr, q.batch_spread);
    std::printf(
        "reader buffers: %.1f MB (two windows of stored rows, output ring, "
        "permutation)\n",
        static_cast<double>(r.buffer_bytes) / 1e6);
}

// What one token costs at each stage of the data path, in bytes (d_model values each).
struct TokenBytes {
    int64_t disk = 0, ring = 0, upload = 0, device = 0;
};
TokenBytes token_bytes(const DatasetInfo& info, DType out) {
    return {info.d_model * dtype_size(info.dtype), info.d_model * dtype_size(out),
            info.d_model * dtype_size(out), info.d_model * 4};
}

void print_token_bytes(const DatasetInfo& info, DType out) {
    const TokenBytes b = token_bytes(info, out);
    auto line = [](const char* stage, int64_t bytes, const std::string& how) {
        std::printf("  %-34s %8lld  %s\n", stage, static_cast<long long>(bytes), how.c_str());
    };
    std::printf("\nbytes per token (d_model %lld):\n", static_cast<long long>(info.d_model));
    line("disk, shuffle window", b.disk, dtype_name(info.dtype));
    line("output ring, next(), loop's batch", b.ring, dtype_name(out));
    line("shared sweep all-gather", b.ring, "x (G-1)/G per rank, G readers");
    line("latent-shard broadcast", b.ring, dtype_name(out));
    line("upload", b.upload, dtype_name(out));
    line("on the device", b.device, "float32 (widened after the upload)");
}

void print_json(const Args& a, const DatasetInfo& info, const Figures& r, const ShuffleQuality& q,
                DType out) {
    nlohmann::json j;
    j["dataset"] = a.data;
    j["dtype"] = dtype_name(info.dtype);
    j["out_dtype"] = dtype_name(out);
    const TokenBytes b = token_bytes(info, out);
    j["bytes_per_token"] = {{"disk", b.disk},
                            {"ring", b.ring},
                            {"allgather", b.ring},
                            {"upload", b.upload},
                            {"device", b.device}};
    j["rows"] = info.total_rows;
    j["d_model"] = info.d_model;
    j["batch"] = a.batch;
    j["shuffle_rows"] = a.shuffle_rows;
    j["read_mib"] = a.read_mib;
    j["raw_cold_MBps"] = r.raw_cold.in_MBps();
    j["reader_cold_MBps"] = r.reader_cold.in_MBps();
    j["reader_cold_out_MBps"] = r.reader_cold.out_MBps();
    j["raw_warm_MBps"] = r.raw_warm.in_MBps();
    j["reader_warm_MBps"] = r.reader_warm.in_MBps();
    j["reader_warm_out_MBps"] = r.reader_warm.out_MBps();
    j["reader_warm_rows_per_s"] = r.reader_warm.rows_per_s();
    j["reader_warm_epochs2to4_MBps"] = r.reader_steady.in_MBps();
    j["reader_warm_epochs2to4_out_MBps"] = r.reader_steady.out_MBps();
    j["naive_random_MBps"] = r.naive.in_MBps();
    j["naive_random_rows_per_s"] = r.naive.rows_per_s();
    j["cold_fraction_of_raw"] =
        r.raw_cold.in_MBps() > 0 ? r.reader_cold.in_MBps() / r.raw_cold.in_MBps() : 0.0;
    j["shuffle_quality"] = {{"displacement", q.displacement},
                            {"batch_corr", q.batch_corr},
                            {"batch_spread", q.batch_spread}};
    j["reader_buffer_bytes"] = r.buffer_bytes;
    if (is_s3_url(a.data)) {
        j["s3_range_get_MBps"] = r.raw_warm.in_MBps();
        j["s3_reader_MBps"] = r.reader_warm.in_MBps();
        j["s3_reader_epochs2to4_MBps"] = r.reader_steady.in_MBps();
        j["s3_reader_fraction_of_range_get"] =
            r.raw_warm.in_MBps() > 0 ? r.reader_steady.in_MBps() / r.raw_warm.in_MBps() : 0.0;
        j["s3_connections"] = a.s3.connections;
        j["s3_request_mib"] = a.s3_request_mib;
    }
    std::printf("%s\n", j.dump().c_str());
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Training reader throughput beside raw sequential reads of the same files."};
    Args a;
    add_options(app, a);
    if (const int code = cli_parse(app, "sae-iobench",
                                   "sae-iobench DATA [--batch N] [--shuffle-rows N] [--read-mib N] "
                                   "[--passes N] [--seconds S] [--no-cold] [--json] ...",
                                   argc, argv);
        code >= 0)
        return code;

    try {
        a.s3.request_bytes = a.s3_request_mib << 20;
        const bool s3 = is_s3_url(a.data);
        const DatasetInfo info = dataset_open(a.data, "activations", a.s3);
        LoaderOptions lo;
        lo.shuffle_rows = a.shuffle_rows;
        lo.read_bytes = a.read_mib << 20;
        lo.seed = a.seed;
        lo.widen = a.widen;
        const int64_t row_in = info.d_model * dtype_size(info.dtype);
        const ShufflePlan plan = ShufflePlan::from_options(info.total_rows, row_in, lo);
        print_setup(a, info, plan);
        const Figures r = s3 ? measure_s3(a, info, lo) : measure(a, info, lo);
        // Shuffle quality of the stream just measured (groups = shards, at least 2).
        const ShuffleQuality q =
            shuffle_quality(plan.epoch_order(0), a.batch,
                            std::max<int64_t>(2, static_cast<int64_t>(info.shards.size())));
        const DType out = delivered(info, lo);
        print_table(r, q, a.no_cold || s3, out);
        print_token_bytes(info, out);
        if (a.json) print_json(a, info, r, q, out);
    } catch (const Error& e) {
        std::fprintf(stderr, "sae-iobench: error: %s\n", printable(e.what()).c_str());
        return 1;
    }
    return 0;
}
