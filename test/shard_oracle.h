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
#include <string>
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

// Writes `inputs` and `targets` (one set a layer, row for row, as dataset_open found them) into
// `dir` as a multi-layer paired set: per shard of inputs[0], a file of the same name holding
// `inputs` and `targets` [rows, L, d], each element its set's stored bits (float32 or 16-bit
// words; a bfloat16 set's dtype attribute kept), and the first input's token_ids when it has
// them. `chunk_rows` > 0: chunked by that many rows (whole rows); < 0: by -chunk_rows rows of
// one layer (no chunk holds a whole row: read by H5Dread); 0: contiguous.
void write_layer_pairs(const std::string& dir, const std::vector<DatasetInfo>& inputs,
                       const std::vector<DatasetInfo>& targets, int64_t chunk_rows = 0);

}  // namespace saetrain::testing
