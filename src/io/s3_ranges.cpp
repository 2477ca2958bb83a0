// s3_ranges.cpp — the ranges a reader fetches ahead of its reads (S3RangeReader, s3_io.h).
#include <algorithm>
#include <cstring>

#include "s3_io.h"
#include "saetrain/error.h"

// --- ranges fetched ahead --------------------------------------------------------------------

namespace saetrain::io {

struct S3RangeReader::Ahead {
    size_t object = 0;
    int64_t offset = 0, bytes = 0;
    std::shared_ptr<std::vector<char>> buf;
    std::unique_ptr<S3Pending> pending;
    bool waited = false;
    std::string error;
};

S3RangeReader::S3RangeReader(std::shared_ptr<const S3Client> client, std::vector<S3Object> objects)
    : client_(std::move(client)), objects_(std::move(objects)) {}

S3RangeReader::~S3RangeReader() {
    // Transfers still running keep their buffers alive (S3Transfer::keep); nothing to wait for.
}

int64_t S3RangeReader::ahead_bytes() const {
    const S3Settings& s = client_->settings();
    return s.connections * s.request_bytes;
}

void S3RangeReader::drop_front() {
    ahead_held_ -= ahead_.front()->bytes;
    if (ahead_.front()->waited && ahead_.front()->buf.use_count() == 1)
        spare_.push_back(std::move(ahead_.front()->buf));
    ahead_.pop_front();
}

void S3RangeReader::forget() {
    while (!ahead_.empty()) drop_front();
}

void S3RangeReader::hint(size_t i, int64_t offset, int64_t bytes) {
    const int64_t rb = client_->settings().request_bytes;
    s3_for_each_request(rb, offset, bytes, [&](int64_t off, int64_t n) {
        // The loader hints ahead_bytes() beyond the piece it reads, which is held too.
        if (ahead_held_ + n > 2 * ahead_bytes()) return;
        for (const auto& a : ahead_)  // already hinted
            if (a->object == i && a->offset == off && a->bytes == n) return;
        auto a = std::make_unique<Ahead>();
        a->object = i, a->offset = off, a->bytes = n;
        if (!spare_.empty()) {
            a->buf = std::move(spare_.back());
            spare_.pop_back();
        } else {
            a->buf = std::make_shared<std::vector<char>>();
        }
        if (static_cast<int64_t>(a->buf->size()) < n) a->buf->resize(static_cast<size_t>(rb));
        a->pending = s3_fetch(*client_, objects_[i], off, n, a->buf->data(), a->buf, false);
        ahead_held_ += n;
        ahead_.push_back(std::move(a));
    });
}

void S3RangeReader::read(size_t i, int64_t offset, int64_t bytes, char* out) {
    const int64_t end = offset + bytes;
    auto overlaps = [&](const Ahead& a) {
        return a.object == i && a.offset < end && offset < a.offset + a.bytes;
    };
    // Hints passed over (before the first one this read uses) will not be read: dropped.
    auto first = std::find_if(ahead_.begin(), ahead_.end(),
                              [&](const std::unique_ptr<Ahead>& a) { return overlaps(*a); });
    if (first != ahead_.end())
        while (ahead_.front().get() != first->get()) drop_front();
    // The gaps between what was hinted are fetched straight into `out`, urgently, first; then
    // what was fetched ahead is copied out as it arrives.
    std::vector<Ahead*> used;
    for (const auto& a : ahead_)
        if (overlaps(*a)) used.push_back(a.get());
    std::sort(used.begin(), used.end(),
              [](const Ahead* x, const Ahead* y) { return x->offset < y->offset; });
    std::vector<std::unique_ptr<S3Pending>> direct;
    auto fetch = [&](int64_t from, int64_t to) {
        if (to > from)
            s3_for_each_request(client_->settings().request_bytes, from, to - from,
                                [&](int64_t off, int64_t n) {
                                    direct.push_back(s3_fetch(*client_, objects_[i], off, n,
                                                              out + (off - offset), nullptr, true));
                                });
    };
    int64_t at = offset;
    for (const Ahead* a : used) {
        fetch(at, std::max(at, a->offset));
        at = std::max(at, a->offset + a->bytes);
    }
    fetch(at, end);
    std::string error;
    for (Ahead* a : used) {
        if (!a->waited) a->error = a->pending->wait_error(), a->waited = true;
        if (error.empty()) error = a->error;
        const int64_t from = std::max(offset, a->offset);
        const int64_t to = std::min(end, a->offset + a->bytes);
        if (a->error.empty() && to > from)
            std::memcpy(out + (from - offset), a->buf->data() + (from - a->offset),
                        static_cast<size_t>(to - from));
    }
    // Every transfer into `out` has ended before an error is thrown.
    for (auto& p : direct) {
        const std::string e = p->wait_error();
        if (error.empty()) error = e;
    }
    // Ranges read to their end are done with.
    while (!ahead_.empty() && ahead_.front()->waited && ahead_.front()->object == i &&
           ahead_.front()->offset >= offset &&
           ahead_.front()->offset + ahead_.front()->bytes <= end)
        drop_front();
    SAE_ENFORCE(error.empty(), "{}", error);
}

}  // namespace saetrain::io
