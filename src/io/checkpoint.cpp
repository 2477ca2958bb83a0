// checkpoint.cpp — SAE weights as HDF5, written atomically (see checkpoint.h).
#include "saetrain/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "atomic_file.h"
#include "h5.h"
#include "sae_file.h"
#include "saetrain/error.h"

namespace fs = std::filesystem;

namespace saetrain {

namespace {

void write_file(const std::string& path, const SaeWeights& w, const SaeMeta& meta) {
    h5::File f = h5::create_file(path);
    std::string names;
    for (const WeightTensor& t : w.tensors) {
        h5::write_f32(f.get(), t.name, t.data.data(),
                      std::vector<hsize_t>(t.shape.begin(), t.shape.end()));
        if (!sae_file_base_tensor(t.name)) names += (names.empty() ? "" : ",") + t.name;
    }
    write_sae_attributes(f.get(), meta, w.d_model, w.n_latents, names);
    SAE_ENFORCE(f.close() >= 0, "file {}: closing failed ({}); is the disk full?", path,
                h5::os_error().empty() ? h5::last_error() : h5::os_error());
}

}  // namespace

bool sae_encoder_shape(const std::string& arch, const std::vector<int64_t>& shape, int64_t d,
                       int64_t n) {
    if (arch != "clt") return shape == std::vector<int64_t>{d, n};
    // [n, d_l]: L layers of d_l values (d = L d_l) and n / L latents each.
    return shape.size() == 2 && shape[0] == n && shape[1] > 0 && d % shape[1] == 0 &&
           n % (d / shape[1]) == 0;
}

bool sae_file_base_tensor(const std::string& name) {
    return name == "W_enc" || name == "W_dec" || name == "b_enc" || name == "b_dec";
}

void write_sae_attributes(hid_t file, const SaeMeta& meta, int64_t d, int64_t n,
                          const std::string& extra_names) {
    if (!extra_names.empty()) h5::write_attr_string(file, "extra", extra_names);
    h5::write_attr_string(file, "arch", meta.arch);
    h5::write_attr_string(file, "id", meta.id);
    h5::write_attr_string(file, "config", meta.config_yaml);
    h5::write_attr_int64(file, "k", meta.k);
    h5::write_attr_int64(file, "d_model", d);
    h5::write_attr_int64(file, "n_latents", n);
    h5::write_attr_int64(file, "step", meta.step);
    h5::write_attr_int64(file, "tokens", meta.tokens);
}

void sae_write_h5(const std::string& path, const SaeWeights& w, const SaeMeta& meta) {
    SAE_ENFORCE(w.d_model > 0 && w.n_latents > 0,
                "checkpoint {}: d_model={} and n_latents={} must be > 0", path, w.d_model,
                w.n_latents);
    const int64_t d = w.d_model, n = w.n_latents;
    const WeightTensor* enc = w.find("W_enc");
    SAE_ENFORCE(enc && sae_encoder_shape(meta.arch, enc->shape, d, n),
                "checkpoint {}: W_enc is {} of a {} SAE of d_model={} n_latents={}", path,
                enc ? "not the shape" : "missing", meta.arch, d, n);
    const std::pair<const char*, std::vector<int64_t>> base[] = {
        {"W_dec", {n, d}}, {"b_enc", {n}}, {"b_dec", {d}}};
    for (const auto& [name, shape] : base) {
        const WeightTensor* t = w.find(name);
        SAE_ENFORCE(t && t->shape == shape, "checkpoint {}: {} is {} of d_model={} n_latents={}",
                    path, name, t ? "not the shape" : "missing", d, n);
    }
    for (const WeightTensor& t : w.tensors) {
        int64_t size = 1;
        for (int64_t x : t.shape) size *= x;
        SAE_ENFORCE(size == static_cast<int64_t>(t.data.size()),
                    "checkpoint {}: tensor '{}' holds {} values for its shape's {}", path, t.name,
                    t.data.size(), size);
    }
    auto guard = h5::lock();
    h5::init();
    atomic_write(path, [&](const std::string& tmp) { write_file(tmp, w, meta); });
}

bool sae_is_checkpoint(const std::string& path) {
    auto guard = h5::lock();
    h5::init();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec) || H5Fis_hdf5(path.c_str()) <= 0) return false;
    h5::File f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    return f.valid() && h5::link_exists(f.get(), "W_dec");
}

SaeWeights sae_read_h5(const std::string& path, SaeMeta* meta) {
    auto guard = h5::lock();
    h5::File f = h5::open_file(path);
    for (const char* name : {"W_enc", "W_dec", "b_enc", "b_dec"}) {
        SAE_ENFORCE(h5::link_exists(f.get(), name),
                    "file {}: not an SAE checkpoint (no dataset '{}'); expected W_enc, W_dec, "
                    "b_enc and b_dec as written by saetrain",
                    path, name);
    }
    SaeWeights w;
    std::vector<hsize_t> de, dd, dbe, dbd;
    auto read = [&](const std::string& name, std::vector<hsize_t>& dims) {
        std::vector<float> v = h5::read_f32(f.get(), name, path, &dims);
        w.set(name, std::vector<int64_t>(dims.begin(), dims.end()), std::move(v));
    };
    read("W_enc", de);
    read("W_dec", dd);
    SAE_ENFORCE(dd.size() == 2, "file {}: W_dec has {} dimensions; expected [n_latents, d_model]",
                path, dd.size());
    w.n_latents = static_cast<int64_t>(dd[0]);
    w.d_model = static_cast<int64_t>(dd[1]);
    SAE_ENFORCE(w.d_model > 0 && w.n_latents > 0,
                "file {}: W_dec is [{}, {}]; an SAE needs n_latents > 0 and d_model > 0", path,
                w.n_latents, w.d_model);
    read("b_enc", dbe);
    read("b_dec", dbd);
    const hsize_t d = dd[1], n = dd[0];
    const std::string arch = h5::read_attr_string(f.get(), "arch").value_or("");
    SAE_ENFORCE(arch != "clt" || de != std::vector<hsize_t>({d, n}) || d == n,
                "file {}: a CLT with the dense encoder W_enc [{}, {}] of an earlier saetrain; this "
                "one holds a CLT's encoder compact, [{}, d_model / layers], and cannot read it: "
                "train it again",
                path, d, n, n);
    SAE_ENFORCE(
        sae_encoder_shape(arch, std::vector<int64_t>(de.begin(), de.end()), w.d_model, w.n_latents),
        "file {}: W_enc [{}] does not match W_dec [{}, {}]; expected [{}]", path,
        fmt::join(de, ", "), n, d,
        arch == "clt" ? fmt::format("{}, d_model / layers", n) : fmt::format("{}, {}", d, n));
    SAE_ENFORCE(dbe == std::vector<hsize_t>({n}), "file {}: b_enc shape is not [n_latents={}]",
                path, n);
    SAE_ENFORCE(dbd == std::vector<hsize_t>({d}), "file {}: b_dec shape is not [d_model={}]", path,
                d);
    for (const std::string& name : read_extra_names(f.get(), path)) {
        std::vector<hsize_t> dims;
        SAE_ENFORCE(!w.has(name), "file {}: attribute extra names '{}' twice", path, name);
        read(name, dims);
        SAE_ENFORCE(!dims.empty(), "file {}: dataset '{}' is a scalar; expected an array", path,
                    name);
    }
    if (auto a = h5::read_attr_int64(f.get(), "d_model"))
        SAE_ENFORCE(*a == w.d_model, "file {}: attribute d_model={} disagrees with W_dec's {}",
                    path, *a, w.d_model);
    if (auto a = h5::read_attr_int64(f.get(), "n_latents"))
        SAE_ENFORCE(*a == w.n_latents, "file {}: attribute n_latents={} disagrees with W_dec's {}",
                    path, *a, w.n_latents);
    if (meta) *meta = read_sae_meta(f.get());
    return w;
}

SaeMeta read_sae_meta(hid_t f) {
    SaeMeta meta;
    meta.arch = h5::read_attr_string(f, "arch").value_or("");
    meta.id = h5::read_attr_string(f, "id").value_or("");
    meta.config_yaml = h5::read_attr_string(f, "config").value_or("");
    meta.k = h5::read_attr_int64(f, "k").value_or(0);
    meta.step = h5::read_attr_int64(f, "step").value_or(0);
    meta.tokens = h5::read_attr_int64(f, "tokens").value_or(0);
    return meta;
}

std::vector<std::string> read_extra_names(hid_t f, const std::string& path) {
    std::vector<std::string> out;
    const auto names = h5::read_attr_string(f, "extra");
    for (size_t start = 0; names && start <= names->size();) {
        const size_t comma = std::min(names->find(',', start), names->size());
        out.push_back(names->substr(start, comma - start));
        SAE_ENFORCE(!out.back().empty() && h5::link_exists(f, out.back()),
                    "file {}: attribute extra names '{}', which is not a dataset there", path,
                    out.back());
        start = comma + 1;
    }
    return out;
}

std::vector<int64_t> checkpoint_steps(const std::string& dir) {
    std::vector<int64_t> steps;
    if (!fs::is_directory(dir)) return steps;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        const std::string pre = "checkpoint-", suf = ".h5";
        if (name.size() <= pre.size() + suf.size() || name.rfind(pre, 0) != 0 ||
            name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
            continue;
        const std::string num = name.substr(pre.size(), name.size() - pre.size() - suf.size());
        if (num.find_first_not_of("0123456789") != std::string::npos) continue;
        steps.push_back(std::stoll(num));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

}  // namespace saetrain
