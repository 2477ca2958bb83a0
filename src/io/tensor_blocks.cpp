// tensor_blocks.cpp — see tensor_blocks.h.
#include "tensor_blocks.h"

#include <algorithm>

#include "saetrain/error.h"

namespace saetrain::blocks {

void ChunkHash::begin(const std::string& name, bool named, const std::vector<int64_t>& shape) {
    uint64_t count = 1;
    for (int64_t s : shape) count *= static_cast<uint64_t>(s);
    sum.begin_tensor(count, named ? name : "");
}

void ChunkHash::add(const TensorChunk& c) {
    if (c.f32)
        sum.add(c.f32, static_cast<size_t>(c.count) * sizeof(float));
    else
        sum.add(c.i64, static_cast<size_t>(c.count) * sizeof(int64_t));
}

h5::Dataset create_dataset(hid_t file, const TensorInfo& t) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Space s(
        SAE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
    return h5::Dataset(
        SAE_H5_CHECK(H5Dcreate2(file, t.name.c_str(), t.i64 ? H5T_STD_I64LE : H5T_IEEE_F32LE,
                                s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

void write_chunk(hid_t dset, const TensorInfo& t, const TensorChunk& c, const std::string& path) {
    const hsize_t cols = t.shape.size() == 2 ? static_cast<hsize_t>(t.shape[1]) : 1;
    std::vector<hsize_t> start = {static_cast<hsize_t>(c.offset) / cols},
                         count = {static_cast<hsize_t>(c.count) / cols};
    if (t.shape.size() == 2) start.push_back(0), count.push_back(cols);
    h5::Space file_space(SAE_H5_CHECK(H5Dget_space(dset)));
    SAE_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     count.data(), nullptr));
    h5::Space mem(
        SAE_H5_CHECK(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
    const herr_t rc =
        c.f32 ? H5Dwrite(dset, H5T_NATIVE_FLOAT, mem.get(), file_space.get(), H5P_DEFAULT, c.f32)
              : H5Dwrite(dset, H5T_NATIVE_INT64, mem.get(), file_space.get(), H5P_DEFAULT, c.i64);
    if (rc < 0) {
        const std::string os = h5::os_error();
        throw Error(fmt::format("file {}: writing dataset '{}' failed ({}); is the disk full?",
                                path, t.name, os.empty() ? h5::last_error() : os));
    }
}

void read_block(hid_t file, const std::string& path, const std::string& name,
                const std::vector<int64_t>& start, const std::vector<int64_t>& count, hid_t type,
                void* out) {
    h5::Dataset d = h5::open_dataset(file, name, path);
    const std::vector<hsize_t> dims = h5::dataset_dims(d.get());
    SAE_ENFORCE(dims.size() == start.size() && start.size() == count.size(),
                "file {}: dataset '{}' has {} dimensions, expected {}", path, name, dims.size(),
                start.size());
    std::vector<hsize_t> s(start.size()), c(count.size());
    for (size_t i = 0; i < dims.size(); ++i) {
        SAE_ENFORCE(
            start[i] >= 0 && count[i] >= 0 && static_cast<hsize_t>(start[i] + count[i]) <= dims[i],
            "file {}: dataset '{}' is smaller than an SAE of this shape needs", path, name);
        s[i] = static_cast<hsize_t>(start[i]), c[i] = static_cast<hsize_t>(count[i]);
        if (c[i] == 0) return;
    }
    h5::Space file_space(SAE_H5_CHECK(H5Dget_space(d.get())));
    SAE_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, s.data(), nullptr, c.data(),
                                     nullptr));
    h5::Space mem(SAE_H5_CHECK(H5Screate_simple(static_cast<int>(c.size()), c.data(), nullptr)));
    if (H5Dread(d.get(), type, mem.get(), file_space.get(), H5P_DEFAULT, out) < 0) {
        const std::string os = h5::os_error();
        throw Error(fmt::format("file {}: reading dataset '{}' failed ({}); the file is damaged",
                                path, name, os.empty() ? h5::last_error() : os));
    }
}

void hash_dataset(hid_t file, const std::string& path, const std::string& name, bool named,
                  bool i64, ChunkHash& hash) {
    std::vector<hsize_t> dims;
    {
        h5::Dataset d = h5::open_dataset(file, name, path);
        dims = h5::dataset_dims(d.get());
    }
    SAE_ENFORCE(!dims.empty() && dims.size() <= 2, "file {}: dataset '{}' has {} dimensions", path,
                name, dims.size());
    std::vector<int64_t> shape(dims.begin(), dims.end());
    hash.begin(name, named, shape);
    const int64_t cols = dims.size() == 2 ? shape[1] : 1;
    const int64_t rows =
        std::max<int64_t>(1, static_cast<int64_t>(kReadChunkElements) / std::max<int64_t>(cols, 1));
    std::vector<float> f32;
    std::vector<int64_t> i64s;
    for (int64_t r0 = 0; r0 < shape[0]; r0 += rows) {
        const int64_t rb = std::min(rows, shape[0] - r0);
        std::vector<int64_t> start = {r0}, count = {rb};
        if (dims.size() == 2) start.push_back(0), count.push_back(cols);
        TensorChunk c{0, 0, rb * cols, nullptr, nullptr};
        if (i64) {
            i64s.resize(static_cast<size_t>(c.count));
            read_block(file, path, name, start, count, H5T_NATIVE_INT64, i64s.data());
            c.i64 = i64s.data();
        } else {
            f32.resize(static_cast<size_t>(c.count));
            read_block(file, path, name, start, count, H5T_NATIVE_FLOAT, f32.data());
            c.f32 = f32.data();
        }
        hash.add(c);
    }
}

}  // namespace saetrain::blocks
