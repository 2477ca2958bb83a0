#include "saetrain/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "atomic_file.h"
#include "saetrain/error.h"

namespace saetrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors is little-endian; a big-endian host would need byte swaps");

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

constexpr uint64_t kMaxElements = uint64_t{1} << 40;

// Elements of a shape, or -1 when a dimension is negative or the product exceeds kMaxElements
// (checked before each multiplication, so it cannot wrap). A zero dimension makes 0.
int64_t elements(const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t s : shape)
        if (s < 0) return -1;
    for (int64_t s : shape) {
        if (s == 0) return 0;
        if (n > kMaxElements / static_cast<uint64_t>(s)) return -1;
        n *= static_cast<uint64_t>(s);
    }
    return static_cast<int64_t>(n);
}

}  // namespace

void safetensors_write(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::vector<const TensorView*> order;
    for (const TensorView& t : tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (size_t i = 0; i < order.size(); ++i) {
        const TensorView& t = *order[i];
        SAE_ENFORCE(!t.name.empty() && t.name != "__metadata__", "{}: invalid tensor name '{}'",
                    path, t.name);
        SAE_ENFORCE(i == 0 || order[i - 1]->name != t.name, "{}: tensor '{}' given twice", path,
                    t.name);
        SAE_ENFORCE(elements(t.shape) >= 0, "{}: tensor '{}' has a negative or too large shape",
                    path, t.name);
        const uint64_t bytes = static_cast<uint64_t>(elements(t.shape)) * sizeof(float);
        header[t.name] = {
            {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    atomic_write(path, [&](const std::string& tmp) {
        std::ofstream out(tmp, std::ios::binary);
        const uint64_t n = text.size();
        out.write(reinterpret_cast<const char*>(&n), sizeof(n));
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        for (const TensorView* t : order)
            if (elements(t->shape) > 0)
                out.write(reinterpret_cast<const char*>(t->data),
                          static_cast<std::streamsize>(elements(t->shape)) *
                              static_cast<std::streamsize>(sizeof(float)));
        out.flush();
        SAE_ENFORCE(out.good(), "cannot write {}", tmp);
    });
}

std::map<std::string, Tensor> safetensors_read(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
    std::ifstream in(path, std::ios::binary);
    SAE_ENFORCE(in.good(), "cannot open {}", path);
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    SAE_ENFORCE(!ec && size >= 8,
                "{}: not a safetensors file (shorter than its 8-byte header size)", path);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof(n));
    SAE_ENFORCE(n >= 2 && n <= kMaxHeader && n <= size - 8,
                "{}: header size {} is impossible for a {}-byte file (limit {} bytes)", path, n,
                size, kMaxHeader);
    std::string text(n, '\0');
    in.read(text.data(), static_cast<std::streamsize>(n));
    SAE_ENFORCE(in.good() && text[0] == '{', "{}: the header is not a JSON object", path);
    const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    SAE_ENFORCE(header.is_object(), "{}: the header is not valid JSON", path);
    const uint64_t buffer = size - 8 - n;

    std::map<std::string, Tensor> out;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            SAE_ENFORCE(entry.is_object(), "{}: __metadata__ is not an object", path);
            for (const auto& [k, v] : entry.items()) {
                SAE_ENFORCE(v.is_string(), "{}: __metadata__ value '{}' is not a string", path, k);
                if (metadata) (*metadata)[k] = v.get<std::string>();
            }
            continue;
        }
        SAE_ENFORCE(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                        entry.contains("data_offsets"),
                    "{}: tensor '{}' lacks dtype, shape or data_offsets", path, name);
        SAE_ENFORCE(entry["dtype"] == "F32", "{}: tensor '{}' has dtype {}; only F32 is read", path,
                    name, entry["dtype"].dump());
        const auto& shape = entry["shape"];
        const auto& offs = entry["data_offsets"];
        SAE_ENFORCE(shape.is_array() && offs.is_array() && offs.size() == 2 &&
                        offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
                    "{}: tensor '{}' has a malformed shape or data_offsets", path, name);
        Tensor t;
        for (const auto& s : shape) {
            SAE_ENFORCE(s.is_number_unsigned() && s.get<uint64_t>() < kMaxElements,
                        "{}: tensor '{}' has a bad dimension {}", path, name, s.dump());
            t.shape.push_back(s.get<int64_t>());
        }
        const int64_t elems = elements(t.shape);
        SAE_ENFORCE(elems >= 0, "{}: tensor '{}' is too large (over 2^40 elements)", path, name);
        const auto count = static_cast<uint64_t>(elems);
        const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
        SAE_ENFORCE(begin <= end && end <= buffer && end - begin == count * sizeof(float),
                    "{}: tensor '{}' has data_offsets [{}, {}] that do not hold its {} floats in "
                    "the {}-byte buffer",
                    path, name, begin, end, count, buffer);
        spans.emplace_back(begin, end);
        t.data.resize(count);
        if (count > 0) {
            in.seekg(static_cast<std::streamoff>(8 + n + begin));
            in.read(reinterpret_cast<char*>(t.data.data()),
                    static_cast<std::streamsize>(end - begin));
            SAE_ENFORCE(in.good(), "{}: cannot read tensor '{}'", path, name);
        }
        out.emplace(name, std::move(t));
    }
    // The tensors must tile the buffer exactly: no overlap, no hole, nothing after the last.
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (const auto& [b, e] : spans) {
        SAE_ENFORCE(b == at, "{}: tensor data overlaps or leaves a hole at byte {}", path, at);
        at = e;
    }
    SAE_ENFORCE(at == buffer, "{}: {} bytes after the last tensor", path, buffer - at);
    return out;
}

}  // namespace saetrain
