// shard_oracle.cpp — the tests' independent read of shard rows (see shard_oracle.h).
#include "shard_oracle.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "saetrain/error.h"

namespace saetrain::testing {

namespace {

// One HDF5 id, closed when it goes out of scope.
struct Id {
    hid_t id;
    herr_t (*close)(hid_t);
    Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
    ~Id() {
        if (id >= 0) close(id);
    }
    Id(const Id&) = delete;
    Id& operator=(const Id&) = delete;
};

// IEEE 754 binary16 by its definition: (-1)^s * 2^(e - 15) * 1.m, subnormals
// (-1)^s * 2^-14 * 0.m, e = 31 infinities and NaNs (the payload kept, as the pipeline does).
float half_value(uint16_t h) {
    const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
    if (e < 31) return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
    if (m == 0) return sign * INFINITY;
    const uint32_t bits =
        (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | (static_cast<uint32_t>(m) << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// bfloat16 is the high half of a float32.
float bf16_value(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Rows [row, row + n) of shard s (shard-relative) into out.
void read_piece(const DatasetInfo& info, const ShardInfo& s, int64_t row, int64_t n, float* out) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // failures come out as one Error, not stacks
    const Id file(H5Fopen(s.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    SAE_ENFORCE(file.id >= 0, "oracle: cannot open shard {}", s.path);
    const Id dset(H5Dopen2(file.id, info.dataset.c_str(), H5P_DEFAULT), H5Dclose);
    SAE_ENFORCE(dset.id >= 0, "oracle: shard {} has no dataset '{}'", s.path, info.dataset);
    const Id fspace(H5Dget_space(dset.id), H5Sclose);
    const hsize_t start[2] = {static_cast<hsize_t>(row), 0};
    const hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(info.d_model)};
    SAE_ENFORCE(fspace.id >= 0 && H5Sselect_hyperslab(fspace.id, H5S_SELECT_SET, start, nullptr,
                                                      count, nullptr) >= 0,
                "oracle: shard {}: cannot select rows [{}, {})", s.path, row, row + n);
    const Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    const size_t elems = static_cast<size_t>(n * info.d_model);
    // Zeros first: H5Dread leaves the rows of unstored chunks untouched when the dataset has no
    // fill value, and the pipeline delivers zeros for them.
    herr_t r = -1;
    if (info.dtype == DType::f32) {
        std::fill(out, out + elems, 0.0f);
        r = H5Dread(dset.id, H5T_NATIVE_FLOAT, mspace.id, fspace.id, H5P_DEFAULT, out);
    } else {
        // The stored 16-bit words, only put into the host's byte order.
        const Id ftype(H5Dget_type(dset.id), H5Tclose);
        const Id mtype(H5Tcopy(ftype.id), H5Tclose);
        SAE_ENFORCE(mtype.id >= 0 && H5Tset_order(mtype.id, H5Tget_order(H5T_NATIVE_UINT16)) >= 0,
                    "oracle: shard {}: unusable element type", s.path);
        std::vector<uint16_t> words(elems, 0);
        r = H5Dread(dset.id, mtype.id, mspace.id, fspace.id, H5P_DEFAULT, words.data());
        for (size_t k = 0; k < elems; ++k)
            out[k] = info.dtype == DType::f16 ? half_value(words[k]) : bf16_value(words[k]);
    }
    SAE_ENFORCE(r >= 0, "oracle: shard {}: reading rows [{}, {}) failed", s.path, row, row + n);
}

}  // namespace

ShardOracle::ShardOracle(const DatasetInfo& info, RowRange range)
    : info_(info), range_(range), cursor_(range.begin) {
    SAE_ENFORCE(range.begin >= 0 && range.begin <= range.end && range.end <= info.total_rows,
                "oracle: row range [{}, {}) is outside the dataset's {} rows", range.begin,
                range.end, info.total_rows);
}

int64_t ShardOracle::read(float* out, int64_t max_rows) {
    SAE_ENFORCE(max_rows >= 0, "oracle: max_rows is {}, must be >= 0", max_rows);
    const int64_t n = std::min(max_rows, range_.end - cursor_);
    int64_t done = 0;
    // Shard by shard, each found by a scan from the first.
    for (const ShardInfo& s : info_.shards) {
        if (done == n) break;
        if (cursor_ >= s.first_row + s.rows) continue;
        const int64_t here = std::min(n - done, s.first_row + s.rows - cursor_);
        read_piece(info_, s, cursor_ - s.first_row, here, out + done * info_.d_model);
        cursor_ += here, done += here;
    }
    SAE_ENFORCE(done == n, "oracle: the shards of {} end before row {}", info_.source, cursor_);
    bytes_ += n * info_.d_model * dtype_size(info_.dtype);
    return n;
}

void ShardOracle::seek(int64_t row) {
    SAE_ENFORCE(row >= range_.begin && row <= range_.end,
                "oracle: row {} is outside the range [{}, {})", row, range_.begin, range_.end);
    cursor_ = row;
}

std::vector<float> oracle_rows(const DatasetInfo& info, RowRange range) {
    ShardOracle r(info, range);
    std::vector<float> out(static_cast<size_t>(range.size() * info.d_model));
    SAE_ENFORCE(r.read(out.data(), range.size()) == range.size(), "oracle: short read");
    return out;
}

}  // namespace saetrain::testing
