// shard_oracle.h — the tests' oracle: a deliberately simple, independent read of shard rows.
//
// The training path (raw_shards: pread at the offsets HDF5 reports or H5Dread, the F16C /
// sae_math conversion, the loader's windows) is checked against this. It shares no reading code
// with src/io, only the DatasetInfo that dataset_open produced: per request it opens the shard
// with the HDF5 C API, reads the rows' hyperslab with one H5Dread and widens 16-bit words with
// its own conversion, written from the formats' definitions. Nothing stays open between calls;
// it is slow, and obvious. It does not take the io layer's HDF5 lock: call it while no other
// thread of the test uses HDF5.
#pragma once

#include <cstdint>
#include <vector>

#include "saetrain/shards.h"

namespace saetrain::testing {

// Sequential reader over a global row range, crossing shard boundaries, converting to float32.
class ShardOracle {
public:
    // Throws Error when `range` is not inside the dataset.
    ShardOracle(const DatasetInfo& info, RowRange range);

    // Reads up to max_rows rows at the cursor into out [rows, d_model]; returns rows read
    // (0 at the end of the range) and advances the cursor. Throws Error on a failed read.
    int64_t read(float* out, int64_t max_rows);
    // Moves the cursor to global row `row` (within the range, its end included).
    void seek(int64_t row);
    int64_t position() const { return cursor_; }   // global row of the cursor
    int64_t bytes_read() const { return bytes_; }  // stored bytes read so far
    const RowRange& range() const { return range_; }

private:
    DatasetInfo info_;
    RowRange range_;
    int64_t cursor_ = 0, bytes_ = 0;
};

// Every row of `range`: [range.size(), d_model].
std::vector<float> oracle_rows(const DatasetInfo& info, RowRange range);

}  // namespace saetrain::testing
