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
    const size_t block = static_cast<size_t>(1 + max_share_ * local.d_model());
    send_.resize(block);
    recv_.resize(block * static_cast<size_t>(g));
}

int64_t SharedBatchSource::next(float* out, int64_t rows) {
    SAE_ENFORCE(rows == batch_rows_, "shared batch source built for {} rows, asked for {}",
                batch_rows_, rows);
    const int64_t d = local_.d_model();
    const int64_t got = local_.next(send_.data() + 1, share_);
    send_[0] = static_cast<float>(got);  // exact: shares are far below 2^24 rows
    const auto t0 = std::chrono::steady_clock::now();
    group_.allgather(send_.data(), recv_.data(),
                     static_cast<int64_t>(send_.size() * sizeof(float)));
    exchange_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t done = 0;
    for (int p = 0; p < group_.size(); ++p) {
        const float* block = recv_.data() + static_cast<size_t>(p) * send_.size();
        const auto n = static_cast<int64_t>(block[0]);
        std::memcpy(out + done * d, block + 1, static_cast<size_t>(n * d) * sizeof(float));
        done += n;
    }
    return done;
}

BroadcastBatchSource::BroadcastBatchSource(BatchSource* reader, Communicator& group,
                                           int64_t d_model)
    : reader_(group.rank() == 0 ? reader : nullptr), group_(group), d_(d_model) {
    SAE_ENFORCE(group.rank() != 0 || reader != nullptr,
                "BroadcastBatchSource: the group's first rank needs a reader");
    total_ = reader_ ? reader_->total_rows() : 0;
    group.bcast(&total_, sizeof(total_), 0);
}

int64_t BroadcastBatchSource::next(float* out, int64_t rows) {
    int64_t got = reader_ ? reader_->next(out, rows) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    group_.bcast(&got, sizeof(got), 0);
    if (got > 0) group_.bcast(out, got * d_ * static_cast<int64_t>(sizeof(float)), 0);
    exchange_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return got;
}

}  // namespace saetrain
