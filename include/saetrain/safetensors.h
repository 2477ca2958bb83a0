// safetensors.h — the safetensors tensor file format (Hugging Face), float32 only.
//
// Layout: an 8-byte little-endian header size N, N bytes of JSON (an object: tensor name ->
// {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" map of
// strings), padded with spaces to a multiple of 8, then the tensors' bytes, C order, little
// endian, with no holes. This is what SAELens and sparsify load. Hand-written (no C++ library
// in Debian); the reader checks everything a damaged or hostile file could get wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace saetrain {

struct TensorView {  // a float32 tensor to write; `data` holds product(shape) values
    std::string name;
    std::vector<int64_t> shape;
    const float* data = nullptr;
};

struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// Writes atomically (temp file, fsync, rename). Tensors are stored in name order.
void safetensors_write(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads every tensor; throws Error naming the file on anything malformed (header size or
// JSON, a dtype other than F32, offsets that overlap, leave holes or do not match the shape).
std::map<std::string, Tensor> safetensors_read(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace saetrain
