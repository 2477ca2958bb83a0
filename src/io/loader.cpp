// loader.cpp — the prefetching, shuffling reader behind ShardBatchSource (see loader.h).
//
// A source may read several datasets side by side (a transcoder's input and target): one plan,
// one permutation and one cursor for all, each part read into its own region of the window and
// a delivered row holding each part's row in turn.
//
// Three parties, two queues of buffer indices between them:
//   reader thread  : reads a window's chunks (raw stored bytes) into one of two window buffers;
//                    the only thread that touches the files (and HDF5, for fallback shards).
//   emitter thread : takes a filled window, permutes its rows into a ring of output blocks (as
//                    stored, or widened to float32 with LoaderOptions::widen), and gives the
//                    window buffer back.
//   next()         : copies rows out of ready blocks (the one copy the trainer sees); the time
//                    it blocks on an empty ring is wait_seconds().
// Memory: two windows of stored bytes, the output ring, one permutation; all allocated once
// (from LoaderOptions::allocator) and kept across restore().
#include "saetrain/loader.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "raw_shards.h"
#include "saetrain/error.h"
#include "saetrain/stage.h"

namespace saetrain {

namespace {

// A closable blocking queue of small integers (buffer indices).
class Channel {
public:
    void push(int v) {
        {
            std::lock_guard<std::mutex> g(m_);
            if (closed_) return;
            q_.push_back(v);
        }
        cv_.notify_one();
    }
    // Blocks until a value or close; after close, drains what is queued, then returns false.
    bool pop(int* v) {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return closed_ || !q_.empty(); });
        if (q_.empty()) return false;
        *v = q_.front();
        q_.pop_front();
        return true;
    }
    bool try_pop(int* v) {
        std::lock_guard<std::mutex> g(m_);
        if (q_.empty()) return false;
        *v = q_.front();
        q_.pop_front();
        return true;
    }
    void close() {
        {
            std::lock_guard<std::mutex> g(m_);
            closed_ = true;
        }
        cv_.notify_all();
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<int> q_;
    bool closed_ = false;
};

// A large buffer from the options' allocator, left uninitialised: zero-filling a window of
// hundreds of MB costs more than reading it from the page cache (a third of a warm pass,
// measured with perf).
class BigBuffer {
public:
    BigBuffer() = default;
    BigBuffer(const BigBuffer&) = delete;
    BigBuffer& operator=(const BigBuffer&) = delete;
    BigBuffer(BigBuffer&& o) noexcept { *this = std::move(o); }
    BigBuffer& operator=(BigBuffer&& o) noexcept {
        if (this != &o) {
            release();
            p_ = o.p_, bytes_ = o.bytes_, a_ = std::move(o.a_);
            o.p_ = nullptr, o.bytes_ = 0;
        }
        return *this;
    }
    ~BigBuffer() { release(); }

    // Keeps the current memory when it already has exactly `bytes` (a restore).
    void allocate(size_t bytes, const HostAllocator& a) {
        constexpr size_t page = 4096;
        bytes = (bytes + page - 1) / page * page;
        if (p_ != nullptr && bytes == bytes_) return;
        release();
        a_ = a;
        p_ = static_cast<char*>(a_.alloc(bytes));
        SAE_ENFORCE(p_ != nullptr,
                    "reader: the {} allocator cannot provide {} MB of buffers; lower "
                    "data.shuffle_buffer_rows (or data.shuffle_buffer_bytes)",
                    a_.name, bytes >> 20);
        bytes_ = bytes;
    }
    char* data() const { return p_; }
    size_t bytes() const { return bytes_; }

private:
    void release() {
        if (p_ != nullptr) a_.free(p_, bytes_);
        p_ = nullptr, bytes_ = 0;
    }
    char* p_ = nullptr;
    size_t bytes_ = 0;
    HostAllocator a_;
};

// Maps every page of [p, p + bytes) now, so that later writes (the reader's pread) take no page
// faults: on the development VM first-touch faults cost about 1 s per GB, as much as the disk
// read. MADV_POPULATE_WRITE (Linux 5.14) does it without touching the bytes; else one write per
// page (the caller owns the memory).
void populate(char* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (size_t k = 0; k < bytes; k += 4096) p[k] = 0;
}

// The same without writing, for memory another thread may be writing into; false when the
// kernel cannot (before Linux 5.14).
bool populate_without_writing(char* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    return ::madvise(p, bytes, MADV_POPULATE_WRITE) == 0;
#else
    (void)p, (void)bytes;
    return false;
#endif
}

int64_t rows_of_run(const LoaderOptions& opt, int64_t per_epoch) {
    if (opt.max_rows > 0) return opt.max_rows;
    int64_t rows = 0;
    SAE_ENFORCE(!__builtin_mul_overflow(per_epoch, std::max<int64_t>(1, opt.epochs), &rows),
                "data.epochs {} x {} rows overflows a row count; lower data.epochs", opt.epochs,
                per_epoch);
    return rows;
}

// The widest part's stored row: what one read request of read_bytes is cut by (each part's
// requests are then at most read_bytes).
int64_t widest_row_bytes(const std::vector<DatasetInfo>& parts) {
    int64_t b = 1;
    for (const DatasetInfo& p : parts) b = std::max(b, p.d_model * dtype_size(p.dtype));
    return b;
}

}  // namespace

// --- pipeline ------------------------------------------------------------------------------

struct ShardBatchSource::Impl {
    // The datasets read side by side (one for SAEs; a transcoder's input and target), each
    // with its reader and its region of a window: part k's rows lie at window byte
    // window_rows * (bytes of the parts before k), [rows, its d_model] as stored.
    std::vector<DatasetInfo> parts;
    const DatasetInfo& info;  // parts[0], named in messages
    RowRange range;
    LoaderOptions opt;
    ShufflePlan plan;
    // d: values per delivered row (the parts' widths summed); disk_row_bytes: their stored bytes.
    int64_t d = 0, per_epoch = 0, total = 0, disk_row_bytes = 0;
    std::vector<int64_t> part_bytes;  // stored bytes of a row of each part
    DType out_type = DType::f32;      // what next() delivers: the stored type, or float32 (widen)
    int64_t out_row_bytes = 0;

    // Consumer state (the caller's thread).
    int64_t delivered = 0;  // rows returned by next(), counted over the whole run
    int cur = -1;           // output block being drained, or -1
    int64_t cur_pos = 0;
    double wait_s = 0;

    // Window buffers: stored bytes of up to chunk_rows * window_chunks rows each.
    struct Window {
        BigBuffer bytes;
        int64_t epoch = 0, index = 0, rows = 0;
    };
    Window windows[2];
    bool populated = false;  // the windows' pages are mapped (emit_loop did it before a restore)
    std::atomic<int64_t> reader_at{0};  // bytes of the first window read so far
    Channel free_windows, full_windows;

    // Output ring: n_blocks blocks of block_rows rows of out_type.
    int64_t block_rows = 0;
    int n_blocks = 0;
    BigBuffer block_mem;
    char* blocks = nullptr;          // [n_blocks, block_rows, d] of out_type in block_mem
    std::vector<int64_t> block_len;  // rows in each block
    Channel free_blocks, ready_blocks;
    std::vector<uint32_t> perm;  // emitter's permutation of the current window

    std::vector<std::unique_ptr<io::RawRowReader>> readers;  // one per part
    struct Piece {
        int64_t row, rows;  // range-relative first row, rows
    };
    std::vector<Piece> pieces;       // reader thread: the current window's read requests
    std::vector<Piece> next_pieces;  // and the next window's, hinted early for objects
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> buffer_bytes{0};
    std::mutex err_m;
    std::exception_ptr err;
    std::atomic<bool> stop{false};
    std::thread read_thread, emit_thread;

    Impl(const std::vector<DatasetInfo>& in, RowRange r, const LoaderOptions& o)
        : parts(in),
          info(parts.front()),
          range(r),
          opt(o),
          plan(ShufflePlan::from_options(std::max<int64_t>(1, r.size()), widest_row_bytes(in), o)) {
        for (const DatasetInfo& p : parts) {
            d += p.d_model;
            part_bytes.push_back(p.d_model * dtype_size(p.dtype));
            disk_row_bytes += part_bytes.back();
        }
        per_epoch = range.size();
        total = rows_of_run(opt, per_epoch);
        out_type = opt.widen ? DType::f32 : info.dtype;
        out_row_bytes = d * dtype_size(out_type);
        if (!opt.allocator.alloc || !opt.allocator.free) opt.allocator = host_allocator_default();
    }

    ~Impl() { shutdown(); }

    void shutdown() {
        stop = true;
        free_windows.close(), full_windows.close(), free_blocks.close(), ready_blocks.close();
        if (read_thread.joinable()) read_thread.join();
        if (emit_thread.joinable()) emit_thread.join();
    }

    void fail(std::exception_ptr e) {
        {
            std::lock_guard<std::mutex> g(err_m);
            if (!err) err = e;
        }
        free_windows.close(), full_windows.close(), free_blocks.close(), ready_blocks.close();
    }

    void start(ReaderCursor c) {
        SAE_ENFORCE(c.epoch >= 0 && c.offset >= 0 && c.offset < per_epoch,
                    "reader cursor (epoch {}, offset {}) is invalid for a range of {} rows; the "
                    "checkpoint comes from another dataset or rank count",
                    c.epoch, c.offset, per_epoch);
        delivered = c.epoch * per_epoch + c.offset;
        SAE_ENFORCE(delivered <= total,
                    "reader cursor (epoch {}, offset {}) lies beyond the run's {} rows", c.epoch,
                    c.offset, total);
        if (readers.empty())
            for (const DatasetInfo& p : parts)
                readers.push_back(std::make_unique<io::RawRowReader>(p, range));
        const int64_t window_rows = plan.window_capacity();
        for (Window& w : windows)
            w.bytes.allocate(static_cast<size_t>(window_rows * disk_row_bytes), opt.allocator);
        // Output blocks of about read_bytes/4 bytes (>= 1 row); the ring is ring_bytes: 16-bit
        // rows delivered as stored fit twice as many rows in it as float32.
        block_rows =
            std::max<int64_t>(1, std::min<int64_t>(opt.read_bytes / 4, 4 << 20) / out_row_bytes);
        n_blocks =
            static_cast<int>(std::max<int64_t>(2, opt.ring_bytes / (block_rows * out_row_bytes)));
        block_mem.allocate(static_cast<size_t>(n_blocks * block_rows * out_row_bytes),
                           opt.allocator);
        blocks = block_mem.data();
        block_len.assign(static_cast<size_t>(n_blocks), 0);
        perm.reserve(static_cast<size_t>(window_rows));
        buffer_bytes = static_cast<int64_t>(2 * windows[0].bytes.bytes() + block_mem.bytes() +
                                            perm.capacity() * sizeof(uint32_t));
        // Window 1 is handed to the reader only after the emitter has mapped its pages, which
        // it does while the reader fills window 0 (see emit_loop).
        free_windows.push(0);
        for (int b = 0; b < n_blocks; ++b) free_blocks.push(b);
        if (delivered == total) {
            ready_blocks.close();
            return;
        }
        read_thread = std::thread([this, c] {
            lower_priority();
            try {
                read_loop(c);
            } catch (...) {
                fail(std::current_exception());
            }
        });
        emit_thread = std::thread([this, c, from = delivered] {
            lower_priority();
            try {
                emit_loop(c, from);
            } catch (...) {
                fail(std::current_exception());
            }
        });
    }

    // The reader's threads yield to the training threads when they compete for cores (a CPU
    // rank that uses every core): a preempted OpenMP worker stalls its whole parallel region,
    // while the reader has a window of slack. On an idle core the nice value changes nothing.
    // Ten nice levels below the process (capped at 19); only ever lowered. A failure (a policy
    // that forbids it) leaves the thread as it was.
    static void lower_priority() {
        const auto tid = static_cast<id_t>(syscall(SYS_gettid));
        errno = 0;
        const int now = getpriority(PRIO_PROCESS, tid);
        if (now == -1 && errno != 0) return;
        if (now < 19) setpriority(PRIO_PROCESS, tid, std::min(19, now + 10));
    }

    // Window w's requests in disk order: chunks adjacent on disk coalesced, at most 4 chunks per
    // request (keeps stop responsive and the cache friendly).
    void window_pieces(const ShufflePlan::Epoch& ep, int64_t w, std::vector<Piece>* out) const {
        const std::vector<int64_t> chunks = ep.window_chunks(w);
        out->clear();
        for (size_t k = 0; k < chunks.size();) {
            size_t j = k + 1;
            while (j < chunks.size() && chunks[j] == chunks[j - 1] + 1) ++j;
            const int64_t row0 = chunks[k] * plan.chunk_rows();
            int64_t rows = 0;
            for (size_t q = k; q < j; ++q) rows += plan.chunk_size(chunks[q]);
            for (int64_t r = 0; r < rows; r += 4 * plan.chunk_rows())
                out->push_back({row0 + r, std::min(rows - r, 4 * plan.chunk_rows())});
            k = j;
        }
    }

    // Reads windows from the one holding cursor c until the run's last row.
    void read_loop(ReaderCursor c) {
        ShufflePlan::Epoch ep = plan.epoch(c.epoch);
        int64_t w = ep.window_of(c.offset);
        for (;;) {
            const int64_t begin = ep.epoch * per_epoch + ep.window_begin[static_cast<size_t>(w)];
            if (begin >= total || stop) break;
            int idx = 0;
            if (!free_windows.pop(&idx)) return;
            Window& win = windows[idx];
            win.epoch = ep.epoch, win.index = w, win.rows = 0;
            window_pieces(ep, w, &pieces);
            // Keep about two read chunks hinted beyond the one being read: the requests jump
            // from stratum to stratum, and without the hint the disk idles at every jump while
            // the kernel restarts its readahead (+40-80% on strided 8 MiB reads here).
            // Objects in S3 want more in flight: enough to keep every connection busy, also
            // across the end of the window (the next window's first pieces are hinted while
            // this one's last are read; files keep to their window, as always).
            int64_t ahead_bytes = 2 * plan.chunk_rows() * disk_row_bytes;
            bool across = false;
            for (auto& reader : readers) {
                ahead_bytes = std::max(ahead_bytes, reader->ahead_bytes());
                across = across || reader->ahead_bytes() > 0;
            }
            next_pieces.clear();
            if (across) {
                const bool last = w + 1 == plan.n_windows();
                const ShufflePlan::Epoch next = last ? plan.epoch(ep.epoch + 1) : ep;
                const int64_t nw = last ? 0 : w + 1;
                if (next.epoch * per_epoch + next.window_begin[static_cast<size_t>(nw)] < total)
                    window_pieces(next, nw, &next_pieces);
            }
            const size_t n_hintable = pieces.size() + next_pieces.size();
            auto hintable = [&](size_t j) -> const Piece& {
                return j < pieces.size() ? pieces[j] : next_pieces[j - pieces.size()];
            };
            size_t hinted = 0;   // pieces [i + 1, hinted) are hinted
            int64_t queued = 0;  // their bytes
            for (size_t i = 0; i < pieces.size(); ++i) {
                if (hinted <= i)
                    hinted = i + 1, queued = 0;
                else
                    queued -= pieces[i].rows * disk_row_bytes;
                for (; hinted < n_hintable && queued < ahead_bytes; ++hinted) {
                    const Piece& h = hintable(hinted);
                    for (auto& reader : readers) reader->will_need(range.begin + h.row, h.rows);
                    queued += h.rows * disk_row_bytes;
                }
                const Piece& pc = pieces[i];
                // Each part's rows into its region of the window, in part order.
                int64_t region = 0;
                for (size_t k = 0; k < readers.size(); ++k) {
                    readers[k]->read(range.begin + pc.row, pc.rows,
                                     win.bytes.data() + region + win.rows * part_bytes[k]);
                    region += plan.window_capacity() * part_bytes[k];
                }
                bytes += pc.rows * disk_row_bytes;
                win.rows += pc.rows;
                reader_at.store(win.rows * disk_row_bytes, std::memory_order_relaxed);
                if (stop) return;
            }
            full_windows.push(idx);
            if (++w == plan.n_windows()) ep = plan.epoch(ep.epoch + 1), w = 0;
        }
    }

    // Emits rows from the window holding cursor c (skipping what was delivered) to the end.
    void emit_loop(ReaderCursor c, int64_t global) {
        // Off the reader's path, while window 0 is read: map window 0 from its end down to
        // where the reader has got to (the two threads share its first-touch faults), then
        // window 1, in steps, until window 0 is full (emitting it must not wait; what is left
        // is faulted by the reader's pread, as without this).
        int ready = -1;
        if (!populated) {
            const size_t step = size_t{32} << 20;
            char* p0 = windows[0].bytes.data();
            for (size_t end = windows[0].bytes.bytes(); !full_windows.try_pop(&ready);) {
                const size_t begin = end > step ? end - step : 0;
                if (static_cast<int64_t>(begin) <= reader_at.load(std::memory_order_relaxed) ||
                    !populate_without_writing(p0 + begin, end - begin))
                    break;
                end = begin;
            }
            char* p1 = windows[1].bytes.data();
            const size_t n = windows[1].bytes.bytes();
            for (size_t off = 0; off < n && ready < 0 && !full_windows.try_pop(&ready); off += step)
                populate(p1 + off, std::min(step, n - off));
            populated = true;
        }
        free_windows.push(1);
        bool first = true;
        ShufflePlan::Epoch ep = plan.epoch(c.epoch);
        for (;;) {
            int idx = ready;
            ready = -1;
            if (idx < 0 && !full_windows.pop(&idx)) return;
            Window& win = windows[idx];
            if (win.epoch != ep.epoch) ep = plan.epoch(win.epoch);
            const int64_t wbegin = ep.window_begin[static_cast<size_t>(win.index)];
            if (plan.shuffled()) plan.row_permutation(win.epoch, win.index, win.rows, &perm);
            int64_t p = first ? c.offset - wbegin : 0;
            first = false;
            while (p < win.rows && global < total) {
                int b = 0;
                if (!free_blocks.pop(&b)) return;
                const int64_t n = std::min({block_rows, win.rows - p, total - global});
                char* dst = blocks + static_cast<int64_t>(b) * block_rows * out_row_bytes;
                // Window row r into block row i: each part's row side by side, as stored or
                // widened.
                const bool widen = out_type != info.dtype;
                const int64_t cap = plan.window_capacity();
                auto emit_row = [&](int64_t r, int64_t i) {
                    const char* region = win.bytes.data();
                    char* out = dst + i * out_row_bytes;
                    for (size_t k = 0; k < parts.size(); ++k) {
                        const char* src = region + r * part_bytes[k];
                        const int64_t w = parts[k].d_model;
                        if (widen)
                            widen_to_f32(info.dtype, src, reinterpret_cast<float*>(out), w);
                        else
                            std::memcpy(out, src, static_cast<size_t>(part_bytes[k]));
                        out += w * dtype_size(out_type);
                        region += cap * part_bytes[k];
                    }
                };
                // A block's rows are gathered on convert_threads threads: one thread gathers
                // and widens ~0.5M 16-bit rows/s of d 768, less than a GPU trains.
                const int nt = n * d >= (1 << 15) ? std::max(1, opt.convert_threads) : 1;
                if (!plan.shuffled() && !widen && parts.size() == 1) {
                    // Disk order as stored: the block is one run of the window.
                    std::memcpy(dst, win.bytes.data() + p * disk_row_bytes,
                                static_cast<size_t>(n * disk_row_bytes));
                } else if (!plan.shuffled()) {
#pragma omp parallel for schedule(static) num_threads(nt)
                    for (int64_t i = 0; i < n; ++i) emit_row(p + i, i);
                } else {
                    const char* base = win.bytes.data();
#pragma omp parallel for schedule(static) num_threads(nt)
                    for (int64_t i = 0; i < n; ++i) {
                        // Rows are scattered over a window of hundreds of MB: ask for the row
                        // after next early so its first lines are in cache when converted.
                        if (p + i + 2 < win.rows) {
                            const char* region = base;
                            for (size_t k = 0; k < parts.size(); ++k) {
                                const char* ahead =
                                    region + static_cast<int64_t>(perm[p + i + 2]) * part_bytes[k];
                                for (int64_t o = 0; o < part_bytes[k]; o += 256)
                                    __builtin_prefetch(ahead + o);
                                region += cap * part_bytes[k];
                            }
                        }
                        emit_row(static_cast<int64_t>(perm[p + i]), i);
                    }
                }
                block_len[static_cast<size_t>(b)] = n;
                ready_blocks.push(b);
                p += n, global += n;
            }
            free_windows.push(idx);
            if (global >= total) break;
        }
        ready_blocks.close();  // consumers drain what is queued, then see the end
    }
};

// --- ShardBatchSource ----------------------------------------------------------------------

namespace {

std::vector<DatasetInfo> staged(const std::vector<DatasetInfo>& parts, RowRange range,
                                const LoaderOptions& opt) {
    if (opt.stage_dir.empty()) return parts;
    std::vector<DatasetInfo> out;
    for (const DatasetInfo& p : parts)
        out.push_back(stage_shards(p, range, opt.stage_dir, opt.progress));
    return out;
}

}  // namespace

ShardBatchSource::ShardBatchSource(const DatasetInfo& info, RowRange range,
                                   const LoaderOptions& opt)
    : ShardBatchSource(info, range, opt, ReaderCursor{}) {}

ShardBatchSource::ShardBatchSource(const DatasetInfo& info, RowRange range,
                                   const LoaderOptions& opt, ReaderCursor start)
    : ShardBatchSource(std::vector<DatasetInfo>{info}, range, opt, start) {}

ShardBatchSource::ShardBatchSource(const std::vector<DatasetInfo>& parts, RowRange range,
                                   const LoaderOptions& opt, ReaderCursor start) {
    SAE_ENFORCE(!parts.empty(), "loader: no dataset to read");
    for (const DatasetInfo& p : parts) {
        SAE_ENFORCE(range.begin >= 0 && range.begin < range.end && range.end <= p.total_rows,
                    "dataset {}: this rank's row range [{}, {}) is empty or outside the "
                    "dataset's {} rows",
                    p.source, range.begin, range.end, p.total_rows);
        SAE_ENFORCE(p.dtype == parts.front().dtype,
                    "dataset {} stores {}, but {} read beside it stores {}; paired datasets "
                    "must store one type",
                    p.source, dtype_name(p.dtype), parts.front().source,
                    dtype_name(parts.front().dtype));
    }
    SAE_ENFORCE(opt.max_rows >= 0 && opt.epochs >= 0 && opt.ring_bytes > 0,
                "loader: max_rows {} and epochs {} must be >= 0, ring_bytes {} > 0", opt.max_rows,
                opt.epochs, opt.ring_bytes);
    impl_ = std::make_unique<Impl>(staged(parts, range, opt), range, opt);
    impl_->start(start);
}

ShardBatchSource::~ShardBatchSource() = default;

int64_t ShardBatchSource::row_width() const { return impl_->d; }
DType ShardBatchSource::dtype() const { return impl_->out_type; }
int64_t ShardBatchSource::total_rows() const { return impl_->total; }
int64_t ShardBatchSource::bytes_read() const { return impl_->bytes.load(); }
double ShardBatchSource::wait_seconds() const { return impl_->wait_s; }
int64_t ShardBatchSource::buffer_bytes() const { return impl_->buffer_bytes.load(); }
const ShufflePlan& ShardBatchSource::plan() const { return impl_->plan; }
const DatasetInfo& ShardBatchSource::dataset() const { return impl_->info; }
const std::vector<DatasetInfo>& ShardBatchSource::datasets() const { return impl_->parts; }

ReaderCursor ShardBatchSource::cursor() const {
    const Impl& m = *impl_;
    return ReaderCursor{m.delivered / m.per_epoch, m.delivered % m.per_epoch};
}

void ShardBatchSource::restore(ReaderCursor c) {
    // A fresh pipeline over the same (already staged) dataset, in the same buffers (peak memory
    // stays buffer_bytes()); byte and wait counters carry on.
    impl_->shutdown();
    auto fresh = std::make_unique<Impl>(impl_->parts, impl_->range, impl_->opt);
    fresh->bytes = impl_->bytes.load();
    fresh->wait_s = impl_->wait_s;
    fresh->readers = std::move(impl_->readers);
    for (auto& r : fresh->readers) r->forget_hints();  // the old position's ranges ahead
    for (int k = 0; k < 2; ++k) fresh->windows[k].bytes = std::move(impl_->windows[k].bytes);
    fresh->block_mem = std::move(impl_->block_mem);
    fresh->perm = std::move(impl_->perm);
    fresh->populated = impl_->populated;
    impl_ = std::move(fresh);
    impl_->start(c);
}

int64_t ShardBatchSource::next(void* out, int64_t rows) {
    Impl& m = *impl_;
    rows = std::min(rows, m.total - m.delivered);
    // Blocks are taken from the ring and copied out in rounds of at most half the ring (the
    // reader keeps the other half to fill); a round's copies run on copy_threads threads, in
    // pieces of about 1 MB.
    struct Piece {
        const char* src;
        char* dst;
        int64_t n;  // bytes
    };
    std::vector<Piece> pieces;
    std::vector<int> held;
    const size_t max_held = static_cast<size_t>(std::max(1, m.n_blocks / 2));
    const int64_t row_bytes = m.out_row_bytes;
    const int64_t piece_bytes = std::max<int64_t>(row_bytes, (1 << 20) / row_bytes * row_bytes);
    auto flush = [&] {
        const auto np = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) num_threads(m.opt.copy_threads) if (np > 1)
        for (int64_t i = 0; i < np; ++i)
            std::memcpy(pieces[i].dst, pieces[i].src, static_cast<size_t>(pieces[i].n));
        for (int b : held) m.free_blocks.push(b);
        pieces.clear(), held.clear();
    };
    int64_t done = 0;
    while (done < rows) {
        if (m.cur < 0) {
            int b = 0;
            bool ok = m.ready_blocks.try_pop(&b);
            if (!ok) {
                const auto t0 = std::chrono::steady_clock::now();
                ok = m.ready_blocks.pop(&b);
                m.wait_s +=
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            }
            if (!ok) {
                std::lock_guard<std::mutex> g(m.err_m);
                if (m.err) std::rethrow_exception(m.err);
                throw Error(fmt::format("dataset {}: the reader ended after {} of {} rows",
                                        m.info.source, m.delivered + done, m.total));
            }
            m.cur = b, m.cur_pos = 0;
        }
        const size_t b = static_cast<size_t>(m.cur);
        const int64_t n = std::min(rows - done, m.block_len[b] - m.cur_pos);
        const char* src =
            m.blocks + (static_cast<int64_t>(b) * m.block_rows + m.cur_pos) * row_bytes;
        char* dst = static_cast<char*>(out) + done * row_bytes;
        for (int64_t f = 0; f < n * row_bytes; f += piece_bytes)
            pieces.push_back({src + f, dst + f, std::min(piece_bytes, n * row_bytes - f)});
        m.cur_pos += n, done += n;
        if (m.cur_pos == m.block_len[b]) {
            held.push_back(m.cur), m.cur = -1;
            if (held.size() >= max_held) flush();
        }
    }
    flush();
    m.delivered += rows;
    return rows;
}

}  // namespace saetrain
