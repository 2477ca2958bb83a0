// stage.h — copying a rank's shards to node-local storage before training.
//
// Parallel file systems serve large sequential reads well but share their bandwidth among all
// jobs; a node-local SSD (or $TMPDIR) does not. stage_shards copies the shards that a rank's
// row range touches into a local directory, with progress, and skips a shard already there
// with the same size (so a restarted job does not copy again). Copies are written under a
// temporary name and renamed, so a crash never leaves a short file that looks complete.
#pragma once

#include <cstdint>
#include <string>

#include "saetrain/shards.h"

namespace saetrain {

struct StageStats {
    int copied = 0, skipped = 0;
    int64_t bytes_copied = 0;
    double seconds = 0;
    std::string dir;  // the directory the shards were staged into
};

// "$TMPDIR" (or "$TMPDIR/sub...") expands to the environment's TMPDIR, else /tmp.
std::string stage_dir_resolve(const std::string& dir);

// Copies the shards overlapping `range` into dir/<parent directory name>/<file name> and
// returns `info` with those shards' paths pointing at the copies (row counts unchanged).
// progress: a line per shard and a running MB/s on stderr. Throws Error naming the file on
// failure (e.g. the local disk is full).
DatasetInfo stage_shards(const DatasetInfo& info, RowRange range, const std::string& dir,
                         bool progress, StageStats* stats = nullptr);

}  // namespace saetrain
