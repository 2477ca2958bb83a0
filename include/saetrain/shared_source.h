// shared_source.h — one pass of disk I/O feeding a whole sweep.
//
// In a shared sweep every SAE must train on the same stream in the same order, yet each rank
// may read only its own disjoint slice. SharedBatchSource forms that stream: for every step of
// `batch_rows` rows, rank r of the group reads its share (batch_rows / G rows, the first
// batch_rows % G ranks one more) from its own slice, and the shares are all-gathered in rank
// order. The step's batch is therefore [rank 0's share | rank 1's share | ...], identical on
// every rank of the group; over an epoch each row of each slice appears exactly once. When a
// slice runs out its share is simply empty, so the last batches may be smaller.
//
// Both sources here pass rows in the local source's element type (dtype()): a 16-bit stream is
// all-gathered and broadcast at 2 bytes a value and widened only on upload.
#pragma once

#include <vector>

#include "saetrain/batch_source.h"
#include "saetrain/comm.h"

namespace saetrain {

class SharedBatchSource final : public BatchSource {
public:
    // Collective: every rank of `group` constructs it together.
    SharedBatchSource(BatchSource& local, Communicator& group, int64_t batch_rows);
    int64_t row_width() const override { return local_.row_width(); }
    DType dtype() const override { return local_.dtype(); }
    int64_t total_rows() const override { return total_; }
    // Collective. `rows` must be the batch_rows given at construction.
    int64_t next(void* out, int64_t rows) override;
    int64_t bytes_read() const override { return local_.bytes_read(); }
    double wait_seconds() const override { return local_.wait_seconds() + exchange_s_; }
    // Bytes this rank has received from the others through the all-gather (their blocks:
    // a row count and max_share rows of dtype() each, per step).
    int64_t bytes_exchanged() const { return exchanged_; }

private:
    BatchSource& local_;
    Communicator& group_;
    int64_t batch_rows_, share_, max_share_, row_bytes_, total_ = 0, exchanged_ = 0;
    // Per rank a block of block_bytes_: the row count (int64), then up to max_share rows.
    int64_t block_bytes_ = 0;
    std::vector<int64_t> send_, recv_;  // int64 words: the blocks stay 8-byte aligned
    double exchange_s_ = 0;
};

// One reader's batches, passed to every rank of `group` (the latent shards of one replica,
// which train on the same rows): group rank 0 reads from `reader`, and broadcasts each batch,
// so disk traffic does not grow with the number of shards.
class BroadcastBatchSource final : public BatchSource {
public:
    // Collective: every rank of `group` constructs it together; `reader` is used on rank 0
    // only (the others may pass null and learn its dtype() from rank 0).
    BroadcastBatchSource(BatchSource* reader, Communicator& group, int64_t d_model);
    int64_t row_width() const override { return d_; }
    DType dtype() const override { return dtype_; }
    int64_t total_rows() const override { return total_; }
    int64_t next(void* out, int64_t rows) override;  // collective
    int64_t bytes_read() const override { return reader_ ? reader_->bytes_read() : 0; }
    double wait_seconds() const override {
        return (reader_ ? reader_->wait_seconds() : 0.0) + exchange_s_;
    }

private:
    BatchSource* reader_;  // null except on group rank 0
    Communicator& group_;
    int64_t d_, total_ = 0;
    DType dtype_ = DType::f32;
    double exchange_s_ = 0;
};

}  // namespace saetrain
