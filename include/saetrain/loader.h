// loader.h — the shard-backed BatchSource: a prefetching, shuffling, resumable reader.
//
// Randomness never comes from random small reads. A rank's row range is cut into read chunks of
// `read_bytes` (MiB-sized, sequential on disk, crossing shard boundaries). Every epoch the chunk
// order is permuted from (seed, epoch) into windows of about `shuffle_rows` rows (each window
// takes one chunk from every stratum of the range, so it samples all of it), read in disk order by
// a background thread (raw pread at the offset HDF5 reports, or H5Dread when the layout is not
// plain); a second thread emits each window's rows in a random permutation from (seed, epoch,
// window) into a ring of output blocks, while the next window is read. next() only copies.
// Rows come out as stored (dtype(): float16/bfloat16 stay 16-bit through the windows, the ring
// and next(), half the bytes of float32; the consumer widens them once, Backend::upload_rows),
// or, with LoaderOptions::widen, widened to float32 by the emitter.
//
// Every row of the range is delivered exactly once per epoch, and the position is just
// {epoch, rows delivered in the epoch} (ReaderCursor): the permutations are regenerated from
// the seed on restore, so a cursor restores the exact remaining stream for a given seed and
// rank count. shuffle_rows = 0 delivers disk order. See docs/reader.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "saetrain/batch_source.h"
#include "saetrain/host_alloc.h"
#include "saetrain/shards.h"
#include "saetrain/shuffle.h"  // defines: ShufflePlan (the delivery order)

namespace saetrain {

struct LoaderOptions {
    int64_t epochs = 1;
    int64_t max_rows = 0;          // > 0: stop after this many rows instead of after epochs
    int64_t shuffle_rows = 0;      // rows per shuffle window; 0: no shuffling (disk order)
    int64_t read_bytes = 8 << 20;  // bytes of one read chunk (one sequential request)
    uint64_t seed = 0;
    int64_t ring_bytes = 32 << 20;  // bytes of the output ring between the reader and next()
    // true: next() delivers float32 (the emitter widens 16-bit rows: twice the bytes through
    // the ring and every copy after it); false: the shards' own type (dtype()), which the
    // trainer widens on upload. saetrain and the benchmarks that train pass false; true keeps
    // callers that read float32 rows from any dataset (tests, sae-iobench --widen) simple.
    bool widen = true;
    // Non-empty: copy the rank's shards into this directory first (node-local disk) and read
    // them there; "$TMPDIR" means the environment's TMPDIR (else /tmp). Skipped per shard when
    // a file of the same size is already there.
    std::string stage_dir;
    bool progress = false;  // staging progress on stderr
    // Threads that copy a batch out of the ring in next() (OpenMP, on the caller's side): one
    // core copies ~5-10 GB/s, so a 12.6 MB float32 batch takes milliseconds on one thread,
    // longer than a GPU step. saetrain passes its CPU threads per rank.
    int copy_threads = 1;
    // Threads that gather (and with `widen`, convert) a block of rows on the reader's side (at
    // the reader's lowered priority): one core widens ~0.5M shuffled 16-bit rows of d 768 a
    // second, less than a GPU trains. saetrain uses its CPU threads on a GPU rank and 1 on a
    // CPU rank, whose cores the trainer keeps busy.
    int convert_threads = 1;
    // Where the window buffers and the output ring come from; empty: host_allocator_default().
    // The CUDA backend passes pinned memory (cuda_pinned.h). Called on the constructing thread
    // only; buffers are kept across restore() and freed by the destructor.
    HostAllocator allocator;
};

// Position in the stream: `offset` rows of epoch `epoch` have been delivered. With
// max_rows > 0 epochs still count whole passes over the range.
struct ReaderCursor {
    int64_t epoch = 0;
    int64_t offset = 0;
};

// --- reader ----------------------------------------------------------------------------------

class ShardBatchSource final : public BatchSource {
public:
    ShardBatchSource(const DatasetInfo& info, RowRange range, const LoaderOptions& opt);
    // Starts at `start` (a cursor() saved earlier with the same dataset, range and options).
    ShardBatchSource(const DatasetInfo& info, RowRange range, const LoaderOptions& opt,
                     ReaderCursor start);
    // Several datasets read row for row (a transcoder's input and target): every part's rows
    // of `range`, in one shuffle, each delivered row the parts' rows side by side
    // ([rows, sum of their d_model]). The parts must store one type and hold the range;
    // dataset_check_paired (shards.h) checks that they are aligned.
    ShardBatchSource(const std::vector<DatasetInfo>& parts, RowRange range,
                     const LoaderOptions& opt, ReaderCursor start = {});
    ~ShardBatchSource() override;
    ShardBatchSource(const ShardBatchSource&) = delete;
    ShardBatchSource& operator=(const ShardBatchSource&) = delete;

    int64_t row_width() const override;
    // The shards' type, or float32 with LoaderOptions::widen.
    DType dtype() const override;
    // Rows of the whole run (all epochs, or max_rows), including any delivered before a restore.
    int64_t total_rows() const override;
    int64_t next(void* out, int64_t rows) override;
    int64_t bytes_read() const override;  // bytes read from disk
    // Seconds next() blocked waiting for the background reader.
    double wait_seconds() const override;

    // Position after the rows next() has returned so far.
    ReaderCursor cursor() const;
    // Restarts the stream at `c` (drops what was prefetched).
    void restore(ReaderCursor c);
    // Bytes of buffers the reader holds (windows, output ring, permutations); constant once the
    // first window is planned.
    int64_t buffer_bytes() const;
    const ShufflePlan& plan() const;
    // The dataset actually read: after staging, its shard paths point at the staged copies.
    // With several parts, the first; datasets() lists them all.
    const DatasetInfo& dataset() const;
    const std::vector<DatasetInfo>& datasets() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace saetrain
