// tensorboard.h — the run's scalars and config as TensorBoard event files, written by hand.
//
// An event file is a sequence of TFRecords: uint64 length (little-endian), the masked CRC-32C
// of those 8 bytes, the payload, the masked CRC-32C of the payload. Each payload is a
// protobuf Event {double wall_time = 1; int64 step = 2; string file_version = 3;
// Summary summary = 5}, Summary {repeated Value value = 1}, Value {string tag = 1;
// float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9}; the first event
// of a file carries file_version "brain.Event:2". A text summary is a Value whose metadata names
// the "text" plugin and whose tensor is one DT_STRING (TensorProto {dtype = 1; tensor_shape = 2;
// string_val = 8}). That is all TensorBoard's loader needs, so no protobuf or TensorFlow
// dependency.
//
// Layout: one TensorBoard run per SAE, out_dir/tb/<sae id>/, so a sweep's SAEs overlay on one
// chart per tag. The tags are the same in every run (tensorboard_tag): "train/<key>" (loss,
// fvu, l0, dead_frac, lr, ...), "perf/<key>" (tokens_per_s, tflops, memory, ...) and
// "held_out/<key>" (the eval_* figures: fvu, l0, dead_frac, dense_frac, rows); each run also
// has a text summary "config" (the SAE's settings and the resolved config.yaml).
//
// Rank 0 writes one Event per SAE per log interval with the same numbers as the metrics.jsonl
// line (tensorboard_scalars), flushed after every write so a killed run leaves every complete
// record readable (the loader stops at a torn last record). On resume each SAE's writer
// rewrites its directory as one file holding the old records up to the resumed step
// (metrics.jsonl is cut there the same way), so no step is duplicated or rewound; a run that an
// earlier version wrote as one tb/ directory with "<sae id>/<key>" tags is split into this
// layout first (tensorboard_split_legacy).
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
// A text summary (TensorBoard's Text tab renders `markdown`) under `tag`.
std::string tb_event_text(double wall_time, int64_t step, const std::string& tag,
                          const std::string& markdown);
// The fields of an Event payload this writer produces; throws Error when it is not one.
struct TbEvent {
    double wall_time = 0;
    int64_t step = 0;
    std::string file_version;  // "" unless the file's first event
    std::vector<TbScalar> scalars;
    std::vector<std::pair<std::string, std::string>> texts;  // tag, text (text summaries)
};
TbEvent tb_event_parse(const std::string& payload);

// The tag of a metrics.jsonl key, the same in every SAE's run: "_fraction" shortened to
// "_frac", then "held_out/<rest>" for eval_<rest>, "perf/<key>" for the throughput and memory
// figures (tokens_per_s, read_MBps, wait_frac, elapsed_s, tflops, mfu, *_mem_peak_GB), else
// "train/<key>". Examples: fvu -> train/fvu, eval_dead_fraction -> held_out/dead_frac.
std::string tensorboard_tag(const std::string& key);
// The metrics.jsonl numbers of one row as (tensorboard_tag, value): mfu, gpu_mem_peak_GB,
// host_mem_peak_GB and the held-out values only when metrics_json writes them. The SAE is the
// run (its directory), not part of the tag.
std::vector<TbScalar> tensorboard_scalars(const MetricsRow& row);
// An earlier version's layout, event files directly in `tb_dir` with tags "<sae id>/<key>":
// each SAE's events move to tb_dir/<id>/ with tensorboard_tag's names (their steps and wall
// times kept), then the old files are removed. Nothing to do (false) when tb_dir has no event
// file of its own. For resuming such a run.
bool tensorboard_split_legacy(const std::string& tb_dir, const std::vector<std::string>& ids);

class TensorBoardWriter {
public:
    // Opens a new event file in `dir` (created). resumed_step < 0: a fresh run, any event file
    // already there is removed. Otherwise the records of the event files there with step <=
    // resumed_step (texts: < resumed_step, as the resuming run writes its own at that step)
    // are carried into the new file (their wall times kept) and the old files removed, so the
    // directory holds exactly one file whose steps increase.
    explicit TensorBoardWriter(const std::string& dir, int64_t resumed_step = -1);
    ~TensorBoardWriter();
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
    // One Event at `step` with `values`; written and flushed before it returns. A tag's steps
    // only increase: a value at or before the tag's last written step is left out (the end of
    // a run logs its last step again with the held-out figures; those alone are new).
    void write(int64_t step, const std::vector<TbScalar>& values);
    // A text summary at `step`, written and flushed before it returns.
    void write_text(int64_t step, const std::string& tag, const std::string& markdown);
    const std::string& path() const { return path_; }

private:
    void append(const std::string& payload, bool flush);
    std::FILE* f_ = nullptr;
    std::string path_;
    std::map<std::string, int64_t> last_step_;  // by tag
};

}  // namespace saetrain
