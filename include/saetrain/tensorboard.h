// tensorboard.h — the run's scalars as TensorBoard event files (out_dir/tb/), written by hand.
//
// An event file is a sequence of TFRecords: uint64 length (little-endian), the masked CRC-32C
// of those 8 bytes, the payload, the masked CRC-32C of the payload. Each payload is a
// protobuf Event {double wall_time = 1; int64 step = 2; string file_version = 3;
// Summary summary = 5}, Summary {repeated Value value = 1}, Value {string tag = 1;
// float simple_value = 2}; the first event of a file carries file_version "brain.Event:2".
// That is all TensorBoard's loader needs for scalars, so no protobuf or TensorFlow dependency.
//
// Rank 0 writes one Event per SAE per log interval with the same numbers as the metrics.jsonl
// line (tensorboard_scalars), tags "<sae id>/<metric>", flushed after every write so a killed
// run leaves every complete record readable (the loader stops at a torn last record).
// On resume the writer rewrites the directory as one file holding the old records up to the
// resumed step (metrics.jsonl is cut there the same way), so no step is duplicated or rewound.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/metrics.h"

namespace saetrain {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so a CRC of data holding CRCs
// is not trivially related to them.
uint32_t crc32c_masked(uint32_t crc);
// One framed record: length, masked CRC of the length, payload, masked CRC of the payload.
std::string tfrecord_frame(const std::string& payload);
// The complete, checksum-valid records of an event file, in order; reading stops at the first
// torn or corrupt record (a run killed mid-write), whose byte offset is `valid_bytes`.
struct TfRecords {
    std::vector<std::string> payloads;
    int64_t valid_bytes = 0;
    bool complete = true;  // false: the file ends in a torn or corrupt record
};
TfRecords tfrecord_read(const std::string& path);

using TbScalar = std::pair<std::string, float>;  // tag, value
// Event payloads (protobuf, see above).
std::string tb_event_file_version(double wall_time);
std::string tb_event_scalars(double wall_time, int64_t step, const std::vector<TbScalar>& values);
// The fields of an Event payload this writer produces; throws Error when it is not one.
struct TbEvent {
    double wall_time = 0;
    int64_t step = 0;
    std::string file_version;  // "" unless the file's first event
    std::vector<TbScalar> scalars;
};
TbEvent tb_event_parse(const std::string& payload);

// The metrics.jsonl numbers of one row as TensorBoard tags "<sae>/<name>": the JSON keys, with
// "_fraction" shortened to "_frac" (dead_frac, wait_frac, eval_dead_frac, eval_dense_frac);
// mfu, gpu_mem_peak_GB, host_mem_peak_GB and the eval_* values only when metrics_json writes
// them.
std::vector<TbScalar> tensorboard_scalars(const MetricsRow& row);

class TensorBoardWriter {
public:
    // Opens a new event file in `dir` (created). resumed_step < 0: a fresh run, any event file
    // already there is removed. Otherwise the records of the event files there with step <=
    // resumed_step are carried into the new file (their wall times kept) and the old files
    // removed, so the directory holds exactly one file whose steps increase.
    explicit TensorBoardWriter(const std::string& dir, int64_t resumed_step = -1);
    ~TensorBoardWriter();
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
    // One Event at `step` with `values`; written and flushed before it returns. A tag's steps
    // only increase: a value at or before the tag's last written step is left out (the end of
    // a run logs its last step again with the held-out figures; those alone are new).
    void write(int64_t step, const std::vector<TbScalar>& values);
    const std::string& path() const { return path_; }

private:
    void append(const std::string& payload, bool flush);
    std::FILE* f_ = nullptr;
    std::string path_;
    std::map<std::string, int64_t> last_step_;  // by tag
};

}  // namespace saetrain
