// data_split.h — which rows a rank reads and which it holds out, from its place in the rank
// grid (rank_grid.h) and the datasets' row counts: decided here once for every parallel mode.
//
//   training rows  data.path's rows, less its last data.eval_rows when those are held out
//   slice          reader i of the grid's readers (RankCoords::reader, each replica's first
//                  latent shard) reads the i-th contiguous part of the training rows
//                  (partition_rows); the other shards read nothing
//   seed           run.seed * 1000003 + reader: each slice its own shuffle
//   max_rows       data.max_tokens counts one SAE's tokens, so it is split over the readers that
//                  feed that SAE: every reader with shared data, else the SAE's replicas
//   held-out       data.eval_path's first data.eval_rows rows (0: all), or data.path's last
//                  data.eval_rows; replica q of R holds the q-th contiguous part, on its first
//                  latent shard (SaeTrainer::evaluate broadcasts each batch to the others)
//
// Pure arithmetic (no file is read): test_data_split checks it against the loader's contract.
#pragma once

#include <cstdint>
#include <string>

#include "saetrain/config.h"     // defines: Config
#include "saetrain/rank_grid.h"  // defines: RankCoords
#include "saetrain/shards.h"     // defines: DatasetInfo, RowRange, partition_rows

namespace saetrain {

struct DataSplit {
    int64_t train_rows = 0;  // the rows of data.path trained on: [0, train_rows)
    bool reads = false;      // this rank reads a slice (reader() >= 0)
    RowRange slice;          // its rows (when it reads)
    uint64_t seed = 0;       // its shuffle seed (when it reads)
    int64_t max_rows = 0;    // its share of data.max_tokens (0: no limit; when it reads)
    // The held-out rows in their dataset's row space (empty: no evaluation), this replica's
    // part of them, whether this rank loads that part, and where they come from (for messages).
    RowRange eval_all, eval_mine;
    bool loads_eval = false;
    std::string eval_source;
};

// `eval_data`: the held-out dataset when data.eval_path is set, else null. Throws Error when
// data.eval_rows leaves fewer training rows than readers, or a part would be empty.
DataSplit data_split_for(const Config& cfg, const RankCoords& me, const DatasetInfo& data,
                         const DatasetInfo* eval_data);

}  // namespace saetrain
