#include "saetrain/batch_source.h"

#include <algorithm>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain {

MemoryBatchSource::MemoryBatchSource(std::vector<float> rows, int64_t d_model, int64_t epochs)
    : data_(std::move(rows)), d_(d_model), n_rows_(0), epochs_(epochs) {
    SAE_ENFORCE(d_ > 0 && data_.size() % static_cast<size_t>(d_) == 0,
                "memory batch source: {} values do not form rows of {}", data_.size(), d_);
    n_rows_ = static_cast<int64_t>(data_.size()) / d_;
}

int64_t MemoryBatchSource::next(float* out, int64_t rows) {
    int64_t done = 0;
    while (done < rows && pos_ < total_rows()) {
        const int64_t r = pos_ % n_rows_;
        const int64_t take = std::min({rows - done, n_rows_ - r, total_rows() - pos_});
        std::memcpy(out + done * d_, data_.data() + r * d_, static_cast<size_t>(take * d_) * 4);
        done += take;
        pos_ += take;
    }
    return done;
}

}  // namespace saetrain
