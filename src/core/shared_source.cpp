#include "saetrain/shared_source.h"

#include <chrono>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain {

SharedBatchSource::SharedBatchSource(BatchSource& local, Communicator& group, int64_t batch_rows)
    : local_(local), group_(group), batch_rows_(batch_rows) {
    const int64_t g = group.size(), r = group.rank();
    SAE_ENFORCE(batch_rows >= g,
                "data.batch_size = {} is smaller than the {} ranks that share each batch; use at "
                "least {}",
                batch_rows, g, g);
    share_ = batch_rows / g + (r < batch_rows % g ? 1 : 0);
    max_share_ = (batch_rows + g - 1) / g;
    double rows = static_cast<double>(local.total_rows());
    group.allreduce_sum(&rows, 1);
    total_ = static_cast<int64_t>(rows);
    // The blocks are copied as bytes: every rank must hold the same element type (they read
    // one dataset, so only a bug can make them differ).
    int64_t type[2] = {static_cast<int64_t>(local.dtype()), -static_cast<int64_t>(local.dtype())};
    group.allreduce_max(type, 2);
    SAE_ENFORCE(type[0] == -type[1],
                "shared batch source: rank {} of the stream delivers {} rows, another rank "
                "another type",
                r, dtype_name(local.dtype()));
    row_bytes_ = local.row_width() * dtype_size(local.dtype());
    const int64_t words = 1 + (max_share_ * row_bytes_ + 7) / 8;
    block_bytes_ = words * 8;
    send_.resize(static_cast<size_t>(words));
    recv_.resize(static_cast<size_t>(words * g));
}

int64_t SharedBatchSource::next(void* out, int64_t rows) {
    SAE_ENFORCE(rows == batch_rows_, "shared batch source built for {} rows, asked for {}",
                batch_rows_, rows);
    send_[0] = local_.next(send_.data() + 1, share_);
    const auto t0 = std::chrono::steady_clock::now();
    group_.allgather(send_.data(), recv_.data(), block_bytes_);
    exchange_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    exchanged_ += block_bytes_ * (group_.size() - 1);
    auto* dst = static_cast<char*>(out);
    int64_t done = 0;
    for (int p = 0; p < group_.size(); ++p) {
        const int64_t* block = recv_.data() + static_cast<size_t>(p) * send_.size();
        const int64_t n = block[0];
        std::memcpy(dst + done * row_bytes_, block + 1, static_cast<size_t>(n * row_bytes_));
        done += n;
    }
    return done;
}

BroadcastBatchSource::BroadcastBatchSource(BatchSource* reader, Communicator& group,
                                           int64_t d_model)
    : reader_(group.rank() == 0 ? reader : nullptr), group_(group), d_(d_model) {
    SAE_ENFORCE(group.rank() != 0 || reader != nullptr,
                "BroadcastBatchSource: the group's first rank needs a reader");
    int64_t head[2] = {reader_ ? reader_->total_rows() : 0,
                       static_cast<int64_t>(reader_ ? reader_->dtype() : DType::f32)};
    group.bcast(head, sizeof(head), 0);
    total_ = head[0];
    dtype_ = static_cast<DType>(head[1]);
}

int64_t BroadcastBatchSource::next(void* out, int64_t rows) {
    int64_t got = reader_ ? reader_->next(out, rows) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    group_.bcast(&got, sizeof(got), 0);
    if (got > 0) group_.bcast(out, got * d_ * dtype_size(dtype_), 0);
    exchange_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return got;
}

}  // namespace saetrain
