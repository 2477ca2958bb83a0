// shards.h — HDF5 activation shards as one global row space.
//
// A dataset is a directory (or glob) of .h5 shards ordered by name, or the same of objects in
// S3-compatible storage (s3://bucket/prefix/, s3.h), ordered by key; each holds a 2-D dataset
// `activations` [rows, d_model] of float32 or float16 (bfloat16: 16-bit words with attribute
// dtype="bfloat16"), contiguous or chunked, or a 3-D one [rows, L, d] read as [rows, L d] (a
// multi-layer paired set's `inputs` and `targets`, DatasetInfo::layers). The rows of all shards, in
// name order, form one global row space; each rank owns one contiguous range of it (ranges may
// cross shards). Everything is validated on open, and a bad shard is named in the error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "saetrain/dtype.h"  // defines: DType, dtype_name, dtype_size, dtype_parse
#include "saetrain/s3.h"     // defines: S3Settings, is_s3_url

namespace saetrain {

struct ShardInfo {
    std::string path;  // a file, or s3://bucket/key
    int64_t rows = 0;
    int64_t first_row = 0;  // global index of this shard's row 0
    // Objects: size and ETag as listed when the dataset was opened (every read asks for this
    // ETag); 0 and "" for files.
    int64_t bytes = 0;
    std::string etag;
};

struct DatasetInfo {
    std::string source;   // the path or glob given
    std::string dataset;  // dataset name inside each shard
    std::vector<ShardInfo> shards;
    int64_t d_model = 0;
    // 0: every shard's dataset is [rows, d_model]. L > 0: it is [rows, L, d] (a multi-layer
    // paired set's `inputs` or `targets`: L layers' values of one token), read as rows of
    // d_model = L d values, the layers in turn.
    int64_t layers = 0;
    int64_t total_rows = 0;
    DType dtype = DType::f32;
    std::string model, hook;  // from attributes when present (first shard), else empty
    S3Settings s3;            // how objects are read (s3:// sources)
};

// Lists and validates the shards (same shape and dtype, 2-D or 3-D, readable, non-empty). Throws
// Error naming the offending shard or the path when nothing matches. `s3`: how s3:// paths are
// read (the data.s3_* keys; unused for files).
DatasetInfo dataset_open(const std::string& path_or_glob,
                         const std::string& dataset = "activations", const S3Settings& s3 = {});

// Throws Error naming the shard unless `target` is aligned with `input` row for row (a
// transcoder's MLP input and output): the same rows per shard, d_model and type, and, where the
// shards carry them, the same token ids (the first and last 4096 of each shard) and extraction
// digest (contexts_sha256). The keys name the config's settings in messages (data.path,
// data.target_path). Returns whether the tokens behind the rows were compared: false when no
// shard pair carries token ids or the extraction's digest on both sides (only the counts, the
// width and the type agree; the caller says so).
bool dataset_check_paired(const DatasetInfo& input, const DatasetInfo& target,
                          const std::string& input_key, const std::string& target_key);

// DatasetInfo as bytes and back: one rank validates a dataset and broadcasts the result, so a
// job of R ranks opens every shard's metadata once instead of R times. unpack throws Error on
// bytes that pack did not produce.
std::string dataset_info_pack(const DatasetInfo& info);
DatasetInfo dataset_info_unpack(const std::string& bytes);

// Half-open range [begin, end) of global rows.
struct RowRange {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
};

// Rank `rank` of `world`'s contiguous share: the first (total % world) ranks get one extra row,
// ranges are disjoint, ordered by rank and cover [0, total). Throws Error when total < world.
RowRange partition_rows(int64_t total_rows, int rank, int world);

// Index into info.shards of the shard holding global row `row` (0 <= row < total_rows).
size_t shard_index(const DatasetInfo& info, int64_t row);
// True when shard s holds some rows of `range`.
bool shard_overlaps(const ShardInfo& s, RowRange range);

// Global rows `range` as float32 [range.size(), d_model], through the training reader's path
// (raw stored bytes by pread or H5Dread, then the same conversion): the held-out rows. Throws
// Error naming the shard when a read fails.
std::vector<float> read_rows(const DatasetInfo& info, RowRange range);
// The same of several datasets read side by side: [range.size(), sum of their d_model], each
// row the parts' rows in turn (a transcoder's held-out input and target).
std::vector<float> read_rows(const std::vector<DatasetInfo>& parts, RowRange range);

// The per-row integers `name` (a 1-D integer dataset beside the activations in every shard:
// token_ids, positions) of global rows `range`, as int32. Empty, with the reason in *why, when
// a shard of the range lacks it or holds it in another shape, or the shards are objects
// (s3://); throws Error naming the shard when a read fails.
std::vector<int32_t> read_row_ints(const DatasetInfo& info, const std::string& name, RowRange range,
                                   std::string* why);

}  // namespace saetrain
