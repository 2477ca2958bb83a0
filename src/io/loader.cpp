#include "saetrain/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain {

ShardBatchSource::ShardBatchSource(const DatasetInfo& info, RowRange range,
                                   const LoaderOptions& opt)
    : reader_(info, range), d_(info.d_model), per_epoch_(range.size()), opt_(opt), rng_(opt.seed) {
    SAE_ENFORCE(per_epoch_ > 0, "dataset {}: this rank's row range is empty", info.source);
    total_ = opt.max_rows > 0 ? opt.max_rows : per_epoch_ * std::max<int64_t>(1, opt.epochs);
    read_rows_ = std::max<int64_t>(1, opt.read_bytes / (d_ * 4));
    if (opt_.shuffle_rows > 0) {
        opt_.shuffle_rows = std::min(opt_.shuffle_rows, total_);
        buf_.resize(static_cast<size_t>(opt_.shuffle_rows * d_));
    }
}

int64_t ShardBatchSource::bytes_read() const { return reader_.bytes_read(); }

int64_t ShardBatchSource::read_stream(float* out, int64_t rows) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t done = 0;
    rows = std::min(rows, total_ - streamed_);
    while (done < rows) {
        if (reader_.position() == reader_.range().end) reader_.seek(reader_.range().begin);
        const int64_t got = reader_.read(out + done * d_, rows - done);
        SAE_ENFORCE(got > 0, "shard reader made no progress at row {}", reader_.position());
        done += got;
    }
    streamed_ += done;
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return done;
}

void ShardBatchSource::refill() {
    const int64_t cap = opt_.shuffle_rows;
    while (held_ < cap && streamed_ < total_) {
        const int64_t want = std::min(cap - held_, read_rows_);
        held_ += read_stream(buf_.data() + held_ * d_, want);
    }
}

int64_t ShardBatchSource::next(float* out, int64_t rows) {
    rows = std::min(rows, total_ - delivered_);
    if (rows <= 0) return 0;
    if (opt_.shuffle_rows == 0) {
        read_stream(out, rows);
    } else {
        // Top the buffer up only when a read request's worth has drained, so reads stay large.
        if (opt_.shuffle_rows - held_ >= read_rows_ || held_ < rows) refill();
        for (int64_t i = 0; i < rows; ++i) {
            if (held_ == 0) refill();
            std::uniform_int_distribution<int64_t> pick(0, held_ - 1);
            const int64_t j = pick(rng_);
            std::memcpy(out + i * d_, buf_.data() + j * d_, static_cast<size_t>(d_) * 4);
            --held_;
            if (j != held_)
                std::memcpy(buf_.data() + j * d_, buf_.data() + held_ * d_,
                            static_cast<size_t>(d_) * 4);
        }
    }
    delivered_ += rows;
    return rows;
}

}  // namespace saetrain
