// raw_shards.h — reading shard rows as raw stored bytes, mostly without HDF5 (internal).
//
// A contiguous dataset of little-endian IEEE elements is one run of bytes at the offset HDF5
// reports (H5Dget_offset); an unfiltered chunked dataset whose chunks span whole rows is a list
// of such runs (H5Dget_chunk_info_by_coord), usually back to back. For those, rows are read
// with pread: no HDF5 call, no library lock and no per-call overhead on the hot path. Anything
// else (filters, big-endian, user blocks, unallocated storage, partial-width chunks) falls back
// to H5Dread of the stored type, under the io layer's HDF5 lock. Shards in S3 (s3_io.h) are
// read the same way with range GETs in place of pread, fetched ahead on will_need, and HDF5
// reading them through the object driver (s3_vfd.h).
// Internal to saetrain_io.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "h5.h"
#include "saetrain/shards.h"

namespace saetrain::io {

// A shard of `info` opened with HDF5, read-only: a file, or an object (s3_vfd.h). Throws naming
// it.
h5::File open_shard(const DatasetInfo& info, const ShardInfo& shard);
// The object behind an s3:// shard, with the size and ETag it was listed with.
S3Object s3_object_of(const ShardInfo& shard);

// Rows [row, row + rows) of a shard stored at byte `offset` of its file.
struct Extent {
    int64_t row = 0, rows = 0, offset = 0;
};

struct ShardExtents {
    bool raw = false;             // extents are valid: pread works
    std::string why;              // when !raw: why HDF5 reads are used
    std::vector<Extent> extents;  // sorted by row, merged when adjacent on disk
    // The file the extents describe (stat at probe time): a shard replaced or rewritten during
    // the run (another inode, size or mtime) is refused when read, not read at stale offsets.
    uint64_t dev = 0, ino = 0;
    int64_t size = 0, mtime_ns = 0;
};

// Inspects one shard's storage (opens it with HDF5 under the lock). Throws naming the file.
ShardExtents probe_extents(const ShardInfo& shard, const DatasetInfo& info);

// Reads raw stored rows of a global row range into a byte buffer ([rows, d_model] elements of
// dtype_size bytes, little-endian). One thread at a time.
class RawRowReader {
public:
    RawRowReader(const DatasetInfo& info, RowRange range);
    ~RawRowReader();
    RawRowReader(const RawRowReader&) = delete;
    RawRowReader& operator=(const RawRowReader&) = delete;

    // Reads global rows [row, row + rows) (inside the range) into out.
    void read(int64_t row, int64_t rows, void* out);
    // Asks the kernel to start reading global rows [row, row + rows) into the page cache now
    // (posix_fadvise WILLNEED; no-op for shards read with H5Dread). The loader hints the next
    // requests of a window before it reads the current one: its requests are sequential but
    // strided (one chunk per stratum), and each jump otherwise restarts the kernel's readahead
    // with the disk idle.
    void will_need(int64_t row, int64_t rows);
    // Forgets what will_need asked for that was not read (objects: their buffers ahead); the
    // caller restarts elsewhere.
    void forget_hints();
    int64_t row_bytes() const;
    // Bytes the caller should hint (will_need) ahead of its reads: 0 for files (the kernel's
    // readahead does the rest); for objects, enough to keep every connection busy.
    int64_t ahead_bytes() const;
    // Shards of the range that are read with pread / with H5Dread.
    int raw_shards() const;
    int hdf5_shards() const;
    const ShardExtents& layout(size_t shard) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace saetrain::io
