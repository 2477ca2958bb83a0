// batch_source.h — where the trainer's rows come from.
//
// The trainer pulls float32 batches [rows, d_model] from a BatchSource and does not care
// whether they come from HDF5 shards, a peer rank or memory. The shard-backed source lives in
// the io layer (loader.h); tests and benchmarks use MemoryBatchSource.
#pragma once

#include <cstdint>
#include <vector>

namespace saetrain {

class BatchSource {
public:
    virtual ~BatchSource() = default;
    virtual int64_t d_model() const = 0;
    // Rows this source will deliver in all (over every epoch).
    virtual int64_t total_rows() const = 0;
    // Fills out [rows, d_model]; returns the rows written: fewer than asked only at the end of
    // the data, 0 once everything has been delivered.
    virtual int64_t next(float* out, int64_t rows) = 0;
    virtual int64_t bytes_read() const { return 0; }
    // Seconds the caller spent blocked inside next() waiting for data.
    virtual double wait_seconds() const { return 0.0; }
};

// Rows held in memory, delivered in order, `epochs` times.
class MemoryBatchSource final : public BatchSource {
public:
    MemoryBatchSource(std::vector<float> rows, int64_t d_model, int64_t epochs = 1);
    int64_t d_model() const override { return d_; }
    int64_t total_rows() const override { return n_rows_ * epochs_; }
    int64_t next(float* out, int64_t rows) override;

private:
    std::vector<float> data_;
    int64_t d_, n_rows_, epochs_, pos_ = 0;
};

}  // namespace saetrain
