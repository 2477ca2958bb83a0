// sae-iobench — the training reader's throughput beside the raw bandwidth of the same files.
//
// Reads DATA the way training does (ShardBatchSource: same reads, conversion and shuffle) and
// compares it with plain sequential 1 MiB reads of the same files, with a cold page cache
// (each file's pages evicted with posix_fadvise DONTNEED before a pass) and warm, and with the
// naive baseline of random single-row HDF5 reads. Prints a fixed-width table (the raw figure is
// the limit beside each reader figure) and, with --json, one JSON object.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/loader.h"  // defines: ShardBatchSource, ShufflePlan, shuffle_quality
#include "saetrain/shards.h"  // defines: dataset_open, ShardReader (the naive baseline)

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
    f.rows = f.in_bytes / static_cast<double>(info.d_model * dtype_size(info.dtype));
    p.done();
    return f;
}

// One epoch of the training reader over the whole dataset (construction included).
Figure reader_pass(const DatasetInfo& info, const LoaderOptions& lo, int64_t batch,
                   const char* name, double max_s, int64_t* buffer_bytes) {
    Figure f;
    f.name = name;
    const double row_in = static_cast<double>(info.d_model * dtype_size(info.dtype));
    Progress p{name, static_cast<double>(info.total_rows) * row_in / 1e6};
    std::vector<float> out(static_cast<size_t>(batch * info.d_model));
    const auto t0 = Clock::now();
    ShardBatchSource src(info, RowRange{0, info.total_rows}, lo);
    int64_t got;
    while ((got = src.next(out.data(), batch)) > 0) {
        f.rows += static_cast<double>(got);
        p.update(f.rows * row_in / 1e6);
        if (max_s > 0 && since(t0) > max_s) break;
    }
    f.seconds = since(t0);
    f.in_bytes = f.rows * row_in;
    f.out_bytes = f.rows * static_cast<double>(info.d_model * 4);
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
    const double row_in = static_cast<double>(info.d_model * dtype_size(info.dtype));
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
    f.seconds = since(t0);
    f.in_bytes = f.rows * row_in;
    f.out_bytes = f.rows * static_cast<double>(info.d_model * 4);
    p.done();
    return f;
}

// Random single-row reads through HDF5 (what a map-style dataset does), for max_s seconds.
Figure naive_pass(const DatasetInfo& info, double max_s, uint64_t seed) {
    Figure f;
    f.name = "naive random rows";
    ShardReader r(info, RowRange{0, info.total_rows});
    std::vector<float> row(static_cast<size_t>(info.d_model));
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int64_t> pick(0, info.total_rows - 1);
    Progress p{f.name, 0};
    const auto t0 = Clock::now();
    while (since(t0) < max_s) {
        r.seek(pick(g));
        r.read(row.data(), 1);
        f.rows += 1;
        if (static_cast<int64_t>(f.rows) % 256 == 0)
            p.update(f.rows * static_cast<double>(info.d_model * dtype_size(info.dtype)) / 1e6);
    }
    f.seconds = since(t0);
    f.in_bytes = f.rows * static_cast<double>(info.d_model * dtype_size(info.dtype));
    f.out_bytes = f.rows * static_cast<double>(info.d_model * 4);
    p.done();
    return f;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Training reader throughput beside raw sequential reads of the same files."};
    std::string data;
    int64_t batch = 4096, shuffle_rows = 262144, read_mib = 8;
    double seconds = 0, naive_seconds = 5;
    int passes = 1;
    bool json = false, no_cold = false;
    uint64_t seed = 0;
    app.add_option("DATA", data, "dataset: directory, glob or .h5 shard")->required();
    app.add_option("--batch", batch, "rows per next() call, as data.batch_size")
        ->capture_default_str();
    app.add_option("--shuffle-rows", shuffle_rows, "shuffle window rows (0: disk order)")
        ->capture_default_str();
    app.add_option("--read-mib", read_mib, "MiB per read chunk")->capture_default_str();
    app.add_option("--passes", passes, "passes per measurement (best is reported)")
        ->capture_default_str();
    app.add_option("--seconds", seconds, "cap on each pass (0: whole dataset)")
        ->capture_default_str();
    app.add_option("--naive-seconds", naive_seconds, "time for random single-row reads")
        ->capture_default_str();
    app.add_option("--seed", seed, "shuffle seed")->capture_default_str();
    app.add_flag("--no-cold", no_cold, "skip the cold-cache passes");
    app.add_flag("--json", json, "also print one JSON object");
    CLI11_PARSE(app, argc, argv);

    try {
        const DatasetInfo info = dataset_open(data);
        LoaderOptions lo;
        lo.shuffle_rows = shuffle_rows;
        lo.read_bytes = read_mib << 20;
        lo.seed = seed;
        const double row_in = static_cast<double>(info.d_model * dtype_size(info.dtype));
        std::printf("dataset %s | %zu shard(s), %lld rows, d_model %lld, %s | %.1f MB\n",
                    data.c_str(), info.shards.size(), static_cast<long long>(info.total_rows),
                    static_cast<long long>(info.d_model), dtype_name(info.dtype),
                    static_cast<double>(info.total_rows) * row_in / 1e6);
        const ShufflePlan plan =
            ShufflePlan::from_options(info.total_rows, static_cast<int64_t>(row_in), lo);
        std::printf(
            "reader | chunks of %lld rows (%.1f MiB), windows of %lld chunks (%lld rows)"
            ", batch %lld\n",
            static_cast<long long>(plan.chunk_rows()),
            static_cast<double>(plan.chunk_rows()) * row_in / (1 << 20),
            static_cast<long long>(plan.window_chunks()),
            static_cast<long long>(plan.chunk_rows() * plan.window_chunks()),
            static_cast<long long>(batch));

        auto best = [&](auto pass) {
            Figure b = pass();
            for (int i = 1; i < passes; ++i) {
                Figure f = pass();
                if (f.in_MBps() > b.in_MBps()) b = f;
            }
            return b;
        };
        int64_t buf_bytes = 0;
        std::vector<Figure> figs;
        Figure raw_cold, reader_cold, naive;
        if (!no_cold) {
            raw_cold = best([&] {
                evict(info);
                return raw_pass(info, "raw sequential cold", seconds);
            });
            reader_cold = best([&] {
                evict(info);
                return reader_pass(info, lo, batch, "reader cold", seconds, &buf_bytes);
            });
        }
        raw_pass(info, "warming the cache", 0);
        const Figure raw_warm =
            best([&] { return raw_pass(info, "raw sequential warm", seconds); });
        const Figure reader_warm =
            best([&] { return reader_pass(info, lo, batch, "reader warm", seconds, &buf_bytes); });
        const Figure reader_steady =
            best([&] { return reader_later_epochs(info, lo, batch, "reader warm epochs 2-4"); });
        if (naive_seconds > 0) {
            evict(info);
            naive = naive_pass(info, naive_seconds, seed);
        }

        // Shuffle quality of the stream just measured (groups = shards, at least 2).
        const ShuffleQuality q =
            shuffle_quality(plan.epoch_order(0), batch,
                            std::max<int64_t>(2, static_cast<int64_t>(info.shards.size())));

        std::printf("\n%-22s %10s %9s %10s %10s %12s %10s\n", "measure", "read", "time", "in",
                    "out f32", "rows/s", "of limit");
        std::printf("%-22s %10s %9s %10s %10s %12s %10s\n", "", "MB", "s", "MB/s", "MB/s", "rows/s",
                    "%");
        auto row = [&](const Figure& f, const Figure* limit) {
            if (f.seconds <= 0) return;
            char pct[32] = "";
            if (limit && limit->in_MBps() > 0)
                std::snprintf(pct, sizeof pct, "%.1f", 100.0 * f.in_MBps() / limit->in_MBps());
            std::printf("%-22s %10.1f %9.2f %10.1f %10.1f %12.0f %10s\n", f.name.c_str(),
                        f.in_bytes / 1e6, f.seconds, f.in_MBps(), f.out_MBps(), f.rows_per_s(),
                        pct);
        };
        row(raw_cold, nullptr);
        row(reader_cold, &raw_cold);
        row(raw_warm, nullptr);
        row(reader_warm, &raw_warm);
        row(reader_steady, &raw_warm);
        row(naive, no_cold ? nullptr : &raw_cold);
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
            static_cast<double>(buf_bytes) / 1e6);
        if (json) {
            nlohmann::json j;
            j["dataset"] = data;
            j["dtype"] = dtype_name(info.dtype);
            j["rows"] = info.total_rows;
            j["d_model"] = info.d_model;
            j["batch"] = batch;
            j["shuffle_rows"] = shuffle_rows;
            j["read_mib"] = read_mib;
            j["raw_cold_MBps"] = raw_cold.in_MBps();
            j["reader_cold_MBps"] = reader_cold.in_MBps();
            j["reader_cold_out_MBps"] = reader_cold.out_MBps();
            j["raw_warm_MBps"] = raw_warm.in_MBps();
            j["reader_warm_MBps"] = reader_warm.in_MBps();
            j["reader_warm_out_MBps"] = reader_warm.out_MBps();
            j["reader_warm_rows_per_s"] = reader_warm.rows_per_s();
            j["reader_warm_epochs2to4_MBps"] = reader_steady.in_MBps();
            j["reader_warm_epochs2to4_out_MBps"] = reader_steady.out_MBps();
            j["naive_random_MBps"] = naive.in_MBps();
            j["naive_random_rows_per_s"] = naive.rows_per_s();
            j["cold_fraction_of_raw"] =
                raw_cold.in_MBps() > 0 ? reader_cold.in_MBps() / raw_cold.in_MBps() : 0.0;
            j["shuffle_quality"] = {{"displacement", q.displacement},
                                    {"batch_corr", q.batch_corr},
                                    {"batch_spread", q.batch_spread}};
            j["reader_buffer_bytes"] = buf_bytes;
            std::printf("%s\n", j.dump().c_str());
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "sae-iobench: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
