// shard_oracle.cpp — the tests' independent read of shard rows (see shard_oracle.h).
#include "shard_oracle.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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
    // [rows, d_model], or [rows, L, d] for a 3-D dataset (DatasetInfo::layers).
    const int nd = info.layers > 0 ? 3 : 2;
    const hsize_t start[3] = {static_cast<hsize_t>(row), 0, 0};
    const hsize_t count[3] = {static_cast<hsize_t>(n),
                              static_cast<hsize_t>(nd == 3 ? info.layers : info.d_model),
                              static_cast<hsize_t>(nd == 3 ? info.d_model / info.layers : 0)};
    SAE_ENFORCE(fspace.id >= 0 && H5Sselect_hyperslab(fspace.id, H5S_SELECT_SET, start, nullptr,
                                                      count, nullptr) >= 0,
                "oracle: shard {}: cannot select rows [{}, {})", s.path, row, row + n);
    const Id mspace(H5Screate_simple(nd, count, nullptr), H5Sclose);
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

namespace {

// Shard s of `info`'s dataset as stored: its element type (copied) and its bytes, [rows, d].
std::vector<char> stored_bytes(const DatasetInfo& info, const ShardInfo& s, hid_t* type_out) {
    const Id file(H5Fopen(s.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    SAE_ENFORCE(file.id >= 0, "write_layer_pairs: cannot open shard {}", s.path);
    const Id dset(H5Dopen2(file.id, info.dataset.c_str(), H5P_DEFAULT), H5Dclose);
    SAE_ENFORCE(dset.id >= 0, "write_layer_pairs: shard {} has no dataset '{}'", s.path,
                info.dataset);
    const Id ftype(H5Dget_type(dset.id), H5Tclose);
    *type_out = H5Tcopy(ftype.id);
    std::vector<char> bytes(static_cast<size_t>(s.rows * info.d_model * dtype_size(info.dtype)));
    SAE_ENFORCE(H5Dread(dset.id, *type_out, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0,
                "write_layer_pairs: reading shard {} failed", s.path);
    return bytes;
}

// Shard i of every set of `sets`, interleaved into [rows, L, d] as `name` in `out`.
void write_side(hid_t out, const char* name, const std::vector<DatasetInfo>& sets, size_t i,
                int64_t chunk_rows) {
    const auto L = static_cast<int64_t>(sets.size());
    const int64_t rows = sets[0].shards[i].rows, d = sets[0].d_model;
    const int64_t elem = dtype_size(sets[0].dtype);
    std::vector<char> all(static_cast<size_t>(rows * L * d * elem));
    hid_t type = -1;
    for (int64_t l = 0; l < L; ++l) {
        const DatasetInfo& set = sets[static_cast<size_t>(l)];
        SAE_ENFORCE(set.d_model == d && set.dtype == sets[0].dtype &&
                        set.shards.size() == sets[0].shards.size() && set.shards[i].rows == rows,
                    "write_layer_pairs: {} does not match {} shard for shard", set.source,
                    sets[0].source);
        if (type >= 0) H5Tclose(type);
        const std::vector<char> b = stored_bytes(set, set.shards[i], &type);
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(all.data() + (r * L + l) * d * elem, b.data() + r * d * elem,
                        static_cast<size_t>(d * elem));
    }
    const Id ftype(type, H5Tclose);
    const hsize_t dims[3] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(L),
                             static_cast<hsize_t>(d)};
    const Id space(H5Screate_simple(3, dims, nullptr), H5Sclose);
    const Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (chunk_rows != 0) {  // < 0: chunks of one layer's values, which span no whole row
        const hsize_t chunk[3] = {static_cast<hsize_t>(std::min(std::abs(chunk_rows), rows)),
                                  chunk_rows > 0 ? dims[1] : 1, dims[2]};
        SAE_ENFORCE(H5Pset_chunk(dcpl.id, 3, chunk) >= 0, "write_layer_pairs: bad chunk shape");
    }
    const Id ds(H5Dcreate2(out, name, ftype.id, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT),
                H5Dclose);
    SAE_ENFORCE(
        ds.id >= 0 && H5Dwrite(ds.id, ftype.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) >= 0,
        "write_layer_pairs: cannot write '{}'", name);
    if (sets[0].dtype == DType::bf16) {
        const Id st(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(st.id, 8);
        const Id sp(H5Screate(H5S_SCALAR), H5Sclose);
        const Id a(H5Acreate2(ds.id, "dtype", st.id, sp.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        SAE_ENFORCE(a.id >= 0 && H5Awrite(a.id, st.id, "bfloat16") >= 0,
                    "write_layer_pairs: cannot write the dtype attribute");
    }
}

}  // namespace

void write_layer_pairs(const std::string& dir, const std::vector<DatasetInfo>& inputs,
                       const std::vector<DatasetInfo>& targets, int64_t chunk_rows) {
    SAE_ENFORCE(!inputs.empty() && inputs.size() == targets.size(),
                "write_layer_pairs: {} input and {} target sets", inputs.size(), targets.size());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    for (size_t i = 0; i < inputs[0].shards.size(); ++i) {
        const ShardInfo& first = inputs[0].shards[i];
        const std::string name = first.path.substr(first.path.find_last_of('/') + 1);
        const std::string path = dir + "/" + name;
        const Id out(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
        SAE_ENFORCE(out.id >= 0, "write_layer_pairs: cannot create {}", path);
        write_side(out.id, "inputs", inputs, i, chunk_rows);
        write_side(out.id, "targets", targets, i, chunk_rows);
        const Id in(H5Fopen(first.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
        if (in.id >= 0 && H5Lexists(in.id, "token_ids", H5P_DEFAULT) > 0)
            SAE_ENFORCE(
                H5Ocopy(in.id, "token_ids", out.id, "token_ids", H5P_DEFAULT, H5P_DEFAULT) >= 0,
                "write_layer_pairs: cannot copy token_ids from {}", first.path);
    }
}

}  // namespace saetrain::testing
