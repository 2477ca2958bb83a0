// batch_source.h — where the trainer's rows come from.
//
// The trainer pulls batches [rows, row_width] from a BatchSource and does not care whether they
// come from HDF5 shards, a peer rank or memory. A row is one token's activations: d_model values,
// or for paired data (a transcoder's input and target, data.target_path) the input's d_model
// values followed by the target's, read row for row from both datasets. A source delivers its rows
// in one element type, dtype(): float32, or the shards' float16/bfloat16 kept as stored (dtype.h:
// 16-bit rows move at 2 bytes a value and are widened once, on upload). The shard-backed source
// lives in the io layer (loader.h); tests and benchmarks use MemoryBatchSource.
#pragma once

#include <cstdint>
#include <vector>

#include "saetrain/dtype.h"  // defines: DType, BatchView

namespace saetrain {

class BatchSource {
public:
    virtual ~BatchSource() = default;
    // Values per row: d_model, or the sum of the widths of paired datasets.
    virtual int64_t row_width() const = 0;
    // The element type of the rows next() writes (dtype_size(dtype()) bytes each).
    virtual DType dtype() const { return DType::f32; }
    // Rows this source will deliver in all (over every epoch).
    virtual int64_t total_rows() const = 0;
    // Fills out [rows, row_width] of dtype(); returns the rows written: fewer than asked only at
    // the end of the data, 0 once everything has been delivered.
    virtual int64_t next(void* out, int64_t rows) = 0;
    virtual int64_t bytes_read() const { return 0; }
    // Seconds the caller spent blocked inside next() waiting for data.
    virtual double wait_seconds() const { return 0.0; }
};

// Rows held in memory, delivered in order, `epochs` times.
class MemoryBatchSource final : public BatchSource {
public:
    MemoryBatchSource(std::vector<float> rows, int64_t d_model, int64_t epochs = 1);
    // 16-bit rows (float16 or bfloat16 bits), delivered as they are: dtype() is `t`.
    MemoryBatchSource(std::vector<uint16_t> rows, DType t, int64_t d_model, int64_t epochs = 1);
    int64_t row_width() const override { return d_; }
    DType dtype() const override { return dtype_; }
    int64_t total_rows() const override { return n_rows_ * epochs_; }
    int64_t next(void* out, int64_t rows) override;

private:
    void check_rows(size_t values);
    std::vector<float> f32_;
    std::vector<uint16_t> b16_;
    DType dtype_ = DType::f32;
    int64_t d_, n_rows_ = 0, epochs_, pos_ = 0;
};

}  // namespace saetrain
