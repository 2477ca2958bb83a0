#include "saetrain/batch_source.h"

#include <algorithm>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain {

MemoryBatchSource::MemoryBatchSource(std::vector<float> rows, int64_t d_model, int64_t epochs)
    : f32_(std::move(rows)), d_(d_model), epochs_(epochs) {
    check_rows(f32_.size());
}

MemoryBatchSource::MemoryBatchSource(std::vector<uint16_t> rows, DType t, int64_t d_model,
                                     int64_t epochs)
    : b16_(std::move(rows)), dtype_(t), d_(d_model), epochs_(epochs) {
    SAE_ENFORCE(t != DType::f32, "memory batch source: 16-bit rows cannot be {}", dtype_name(t));
    check_rows(b16_.size());
}

void MemoryBatchSource::check_rows(size_t values) {
    SAE_ENFORCE(d_ > 0 && values % static_cast<size_t>(d_) == 0,
                "memory batch source: {} values do not form rows of {}", values, d_);
    n_rows_ = static_cast<int64_t>(values) / d_;
}

int64_t MemoryBatchSource::next(void* out, int64_t rows) {
    const int64_t row_bytes = d_ * dtype_size(dtype_);
    const char* data = dtype_ == DType::f32 ? reinterpret_cast<const char*>(f32_.data())
                                            : reinterpret_cast<const char*>(b16_.data());
    auto* dst = static_cast<char*>(out);
    int64_t done = 0;
    while (done < rows && pos_ < total_rows()) {
        const int64_t r = pos_ % n_rows_;
        const int64_t take = std::min({rows - done, n_rows_ - r, total_rows() - pos_});
        std::memcpy(dst + done * row_bytes, data + r * row_bytes,
                    static_cast<size_t>(take * row_bytes));
        done += take;
        pos_ += take;
    }
    return done;
}

}  // namespace saetrain
