// loader.h — the shard-backed BatchSource: sequential reads, a shuffle buffer, epochs.
//
// Randomness never comes from random small reads: rows are read sequentially in large
// requests into a shuffle buffer of `shuffle_rows` rows, and each output row is drawn uniformly
// from the buffer (then replaced by the next row read). Every row of the range is delivered
// exactly once per epoch. shuffle_rows = 0 delivers rows in disk order.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "saetrain/batch_source.h"
#include "saetrain/shards.h"

namespace saetrain {

struct LoaderOptions {
    int64_t epochs = 1;
    int64_t max_rows = 0;          // > 0: stop after this many rows instead of after epochs
    int64_t shuffle_rows = 0;      // 0: no shuffling
    int64_t read_bytes = 8 << 20;  // size of one sequential read request
    uint64_t seed = 0;
};

class ShardBatchSource final : public BatchSource {
public:
    ShardBatchSource(const DatasetInfo& info, RowRange range, const LoaderOptions& opt);
    int64_t d_model() const override { return d_; }
    int64_t total_rows() const override { return total_; }
    int64_t next(float* out, int64_t rows) override;
    int64_t bytes_read() const override;
    double wait_seconds() const override { return wait_s_; }

private:
    int64_t read_stream(float* out, int64_t rows);  // sequential rows, wrapping epochs
    void refill();

    ShardReader reader_;
    int64_t d_, total_, delivered_ = 0, streamed_ = 0, per_epoch_;
    LoaderOptions opt_;
    std::vector<float> buf_;  // [shuffle_rows, d]
    int64_t held_ = 0;        // rows currently in buf_
    int64_t read_rows_;       // rows per read request
    std::mt19937_64 rng_;
    double wait_s_ = 0;
};

}  // namespace saetrain
