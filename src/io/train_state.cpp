#include "saetrain/train_state.h"

#include <fcntl.h>
#include <unistd.h>

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

template <typename T>
void mix(const std::vector<T>& v, Checksum& sum, const std::string& name = "") {
    sum.begin_tensor(v.size(), name);
    sum.add(v.data(), v.size() * sizeof(T));
}

void write_i64(hid_t loc, const std::string& name, const std::vector<int64_t>& v) {
    const hsize_t n = v.size();
    h5::Space s(SAE_H5_CHECK(H5Screate_simple(1, &n, nullptr)));
    h5::Dataset d(SAE_H5_CHECK(H5Dcreate2(loc, name.c_str(), H5T_STD_I64LE, s.get(), H5P_DEFAULT,
                                          H5P_DEFAULT, H5P_DEFAULT)));
    if (n > 0)
        SAE_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
}

std::vector<int64_t> read_i64(hid_t loc, const std::string& name, const std::string& path,
                              size_t max_elements) {
    h5::Dataset d = h5::open_dataset(loc, name, path);
    const std::vector<hsize_t> dims = h5::dataset_dims(d.get());
    SAE_ENFORCE(dims.size() == 1 && dims[0] <= max_elements,
                "checkpoint state {}: dataset '{}' has an unexpected shape", path, name);
    std::vector<int64_t> v(dims[0]);
    if (!v.empty())
        SAE_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
    return v;
}

int64_t attr_or_throw(hid_t f, const std::string& name, const std::string& path) {
    const auto v = h5::read_attr_int64(f, name);
    SAE_ENFORCE(v.has_value(), "checkpoint state {}: attribute '{}' is missing", path, name);
    return *v;
}

}  // namespace

namespace {

// The checksum up to the reader cursors: the weights, the moments, the counters.
void checksum_before_cursors(const SaeWeights& w, const TrainState& s, Checksum& sum) {
    // The four base tensors first, unnamed, then the others with their names (sae_file.h).
    for (const char* name : {"W_enc", "W_dec", "b_enc", "b_dec"})
        if (const WeightTensor* t = w.find(name)) mix(t->data, sum);
    for (const WeightTensor& t : w.tensors)
        if (!sae_file_base_tensor(t.name)) mix(t.data, sum, t.name);
    for (const auto* v : {&s.opt_m, &s.opt_v}) mix(*v, sum);
    mix(s.since_fired, sum);
}

std::string checksum_of(const SaeWeights& w, const TrainState& s, Checksum::Kind kind) {
    Checksum sum(kind);
    checksum_before_cursors(w, s, sum);
    sum.add_header(s);
    return sum.text();
}

}  // namespace

void read_train_state_header(hid_t f, const std::string& path, TrainState& s) {
    s.cursors = read_i64(f, "data_cursors", path, 2 << 20);
    s.step = attr_or_throw(f, "step", path);
    s.tokens = attr_or_throw(f, "tokens", path);
    s.iteration = attr_or_throw(f, "iteration", path);
}

std::string stored_checksum(hid_t f, const std::string& path) {
    const auto sum = h5::read_attr_string(f, "checksum");
    SAE_ENFORCE(sum.has_value(), "checkpoint state {}: attribute 'checksum' is missing", path);
    return *sum;
}

std::string train_state_checksum(const SaeWeights& w, const TrainState& s) {
    return checksum_of(w, s, Checksum::Kind::xxh3);
}

void write_train_state_attributes(hid_t f, const TrainState& s, Checksum& sum) {
    write_i64(f, "data_cursors", s.cursors);
    h5::write_attr_int64(f, "step", s.step);
    h5::write_attr_int64(f, "tokens", s.tokens);
    h5::write_attr_int64(f, "iteration", s.iteration);
    sum.add_header(s);
    h5::write_attr_string(f, "checksum", sum.text());
}

std::string checkpoint_weights_path(const std::string& sae_dir, int64_t step) {
    return (fs::path(sae_dir) / fmt::format("checkpoint-{}.h5", step)).string();
}

std::string checkpoint_state_path(const std::string& sae_dir, int64_t step) {
    return (fs::path(sae_dir) / fmt::format("checkpoint-{}.state.h5", step)).string();
}

void train_state_write(const std::string& path, const SaeWeights& w, const TrainState& s) {
    auto guard = h5::lock();
    h5::init();
    atomic_write(path, [&](const std::string& tmp) {
        h5::File f = h5::create_file(tmp);
        h5::write_f32(f.get(), "adam_m", s.opt_m.data(), {s.opt_m.size()});
        h5::write_f32(f.get(), "adam_v", s.opt_v.data(), {s.opt_v.size()});
        write_i64(f.get(), "since_fired", s.since_fired);
        Checksum sum;
        checksum_before_cursors(w, s, sum);
        write_train_state_attributes(f.get(), s, sum);
        SAE_ENFORCE(f.close() >= 0, "file {}: closing failed ({}); is the disk full?", tmp,
                    h5::os_error().empty() ? h5::last_error() : h5::os_error());
    });
}

TrainState train_state_read(const std::string& path, const SaeWeights& w) {
    auto guard = h5::lock();
    h5::File f = h5::open_file(path);
    TrainState s;
    size_t params = 0;  // the four base tensors' values
    for (const WeightTensor& t : w.tensors)
        if (sae_file_base_tensor(t.name)) params += t.data.size();
    std::vector<hsize_t> dims;
    s.opt_m = h5::read_f32(f.get(), "adam_m", path, &dims);
    s.opt_v = h5::read_f32(f.get(), "adam_v", path, &dims);
    // The moments also cover the architecture's parameters among the extra tensors (the trainer
    // checks the exact count); they are never fewer than the four tensors every SAE has.
    SAE_ENFORCE(s.opt_m.size() == s.opt_v.size() && s.opt_m.size() >= params,
                "checkpoint state {}: Adam moments hold {} and {} values, the weights at least {}",
                path, s.opt_m.size(), s.opt_v.size(), params);
    s.since_fired = read_i64(f.get(), "since_fired", path, static_cast<size_t>(w.n_latents));
    read_train_state_header(f.get(), path, s);
    const std::string stored = stored_checksum(f.get(), path);
    SAE_ENFORCE(stored == checksum_of(w, s, Checksum::kind_of(stored)),
                "checkpoint {}: checksum mismatch: the checkpoint is damaged or its weights "
                "file does not belong to it",
                path);
    return s;
}

}  // namespace saetrain
