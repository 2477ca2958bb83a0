#include "saetrain/data_split.h"

#include <fmt/format.h>

#include <algorithm>

#include "saetrain/error.h"

namespace saetrain {

namespace {

// The rows of data.path that are trained on: all, less the held-out rows at its end when they
// come from the same data.
int64_t training_rows(const DataConfig& dc, const DatasetInfo& data, int readers) {
    if (!dc.eval_path.empty() || dc.eval_rows == 0) return data.total_rows;
    SAE_ENFORCE(dc.eval_rows + readers <= data.total_rows,
                "data.eval_rows = {} leaves too few of the {} rows of {} to train {} rank(s) "
                "on; hold out fewer rows or give data.eval_path",
                dc.eval_rows, data.total_rows, data.source, readers);
    return data.total_rows - dc.eval_rows;
}

}  // namespace

DataSplit data_split_for(const Config& cfg, const RankCoords& me, const DatasetInfo& data,
                         const DatasetInfo* eval_data) {
    const DataConfig& dc = cfg.data;
    DataSplit out;
    out.train_rows = training_rows(dc, data, me.readers());

    // The held-out rows: split among the replicas of an SAE, each loaded by its first shard.
    if (eval_data || dc.eval_rows > 0) {
        const DatasetInfo& src = eval_data ? *eval_data : data;
        if (eval_data)
            out.eval_all = {
                0, dc.eval_rows > 0 ? std::min(dc.eval_rows, src.total_rows) : src.total_rows};
        else
            out.eval_all = {src.total_rows - dc.eval_rows, src.total_rows};
        out.eval_source = eval_data ? src.source : fmt::format("the last rows of {}", src.source);
        const RowRange part = partition_rows(out.eval_all.size(), me.replica, me.replicas);
        out.eval_mine = {out.eval_all.begin + part.begin, out.eval_all.begin + part.end};
        out.loads_eval = me.latent_shard == 0;
    }

    // This rank's slice of the training rows (each replica's first latent shard reads for the
    // others).
    const int reader = me.reader(), readers = me.readers();
    if (reader < 0) return out;
    out.reads = true;
    out.seed = cfg.run.seed * 1000003u + static_cast<uint64_t>(reader);
    if (dc.max_tokens > 0) {
        // max_tokens counts one SAE's tokens: split over the ranks that feed that SAE.
        out.max_rows = me.shared_data
                           ? partition_rows(dc.max_tokens, reader, readers).size()
                           : partition_rows(dc.max_tokens, me.replica, me.replicas).size();
    }
    out.slice = partition_rows(out.train_rows, reader, readers);
    return out;
}

}  // namespace saetrain
