// gathered_checkpoint.cpp — a latent-sharded SAE's files without a whole copy in memory
// (train_state.h, write_gathered): the trainer gathers the whole SAE's tensors to its first
// latent shard chunk by chunk, which writes each chunk into its place and hashes it in file order,
// so the files and their checksum are those sae_write_h5 and train_state_write would write. And the
// way back (CheckpointFiles): a latent shard reads only its blocks of those files, and one pass
// over them, chunk by chunk, checks the checksum. TensorsInMemory, the other TensorSource, is the
// same tensors from memory.
#include <algorithm>
#include <exception>
#include <initializer_list>

#include "atomic_file.h"
#include "h5.h"
#include "sae_file.h"
#include "saetrain/error.h"
#include "saetrain/train_state.h"
#include "saetrain/trainer_io.h"
#include "tensor_blocks.h"

namespace saetrain {
namespace {

using blocks::ChunkHash;

// One file of `tensors`, filled by `gather` (collective: the other latent shards call it too), then
// `finish` (attributes). On a failure the gather still runs to its end on this rank, so no
// latent shard is left waiting; the error is thrown after it.
void write_one(const std::string& path, const std::vector<TensorInfo>& tensors, bool named,
               ChunkHash& hash, const std::function<void(const ChunkSink&)>& gather,
               const std::function<void(hid_t)>& finish) {
    bool gathered = false;
    std::exception_ptr failed;
    try {
        auto guard = h5::lock();
        h5::init();
        atomic_write(path, [&](const std::string& tmp) {
            h5::File f = h5::create_file(tmp);
            std::vector<h5::Dataset> sets;
            for (const TensorInfo& t : tensors) sets.push_back(blocks::create_dataset(f.get(), t));
            std::exception_ptr chunk_failed;
            gathered = true;
            gather([&](const TensorChunk& c) {
                const TensorInfo& t = tensors[static_cast<size_t>(c.tensor)];
                if (c.offset == 0) hash.begin(t.name, named && c.tensor >= 4, t.shape);
                hash.add(c);
                if (chunk_failed) return;
                try {
                    blocks::write_chunk(sets[static_cast<size_t>(c.tensor)].get(), t, c, tmp);
                } catch (...) {
                    chunk_failed = std::current_exception();
                }
            });
            if (chunk_failed) std::rethrow_exception(chunk_failed);
            sets.clear();
            finish(f.get());
            SAE_ENFORCE(f.close() >= 0, "file {}: closing failed ({}); is the disk full?", tmp,
                        h5::os_error().empty() ? h5::last_error() : h5::os_error());
        });
    } catch (...) {
        failed = std::current_exception();
    }
    if (!gathered) gather([](const TensorChunk&) {});
    if (failed) std::rethrow_exception(failed);
}

}  // namespace

void write_gathered(const SaeTrainer& t, bool writes, const std::string& weights_path,
                    const std::string& state_path, const SaeMeta& meta, const TrainState& header,
                    bool folded) {
    if (!writes) {  // send this latent shard's part; the first latent shard writes
        trainer_gather_weights(t, folded, [](const TensorChunk&) {});
        if (!state_path.empty()) trainer_gather_state(t, [](const TensorChunk&) {});
        return;
    }
    const std::vector<TensorInfo> weights = trainer_weight_tensors(t, folded);
    std::string names;
    for (size_t i = 4; i < weights.size(); ++i)
        names += (names.empty() ? "" : ",") + weights[i].name;
    ChunkHash hash;
    std::exception_ptr failed;
    auto run = [&](auto&&... args) {
        try {
            write_one(args...);
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
    };
    run(
        weights_path, weights, true, hash,
        [&](const ChunkSink& s) { trainer_gather_weights(t, folded, s); },
        [&](hid_t f) { write_sae_attributes(f, meta, t.d_model(), t.n_latents(), names); });
    if (!state_path.empty())
        run(
            state_path, trainer_state_tensors(t), false, hash,
            [&](const ChunkSink& s) { trainer_gather_state(t, s); },
            [&](hid_t f) { write_train_state_attributes(f, header, hash.sum); });
    if (failed) std::rethrow_exception(failed);
}

// --- CheckpointFiles ---------------------------------------------------------------------------

namespace {

bool in_state_file(const std::string& name) {
    return name == "adam_m" || name == "adam_v" || name == "since_fired";
}

}  // namespace

struct CheckpointFiles::Files {
    h5::File weights, state;
};

CheckpointFiles::CheckpointFiles(std::string weights_path, std::string state_path)
    : weights_path_(std::move(weights_path)), state_path_(std::move(state_path)) {
    auto guard = h5::lock();
    h5::init();
    files_ = std::make_unique<Files>();
    files_->weights = h5::open_file(weights_path_);
    files_->state = h5::open_file(state_path_);
}

CheckpointFiles::~CheckpointFiles() {
    auto guard = h5::lock();
    files_.reset();
}

SaeMeta CheckpointFiles::meta() const {
    auto guard = h5::lock();
    return read_sae_meta(files_->weights.get());
}

TrainState CheckpointFiles::header() const {
    auto guard = h5::lock();
    TrainState s;
    read_train_state_header(files_->state.get(), state_path_, s);
    return s;
}

void CheckpointFiles::verify() const {
    auto guard = h5::lock();
    const hid_t w = files_->weights.get(), st = files_->state.get();
    const std::string stored = stored_checksum(st, state_path_);
    ChunkHash hash(Checksum::kind_of(stored));
    for (const char* name : {"W_enc", "W_dec", "b_enc", "b_dec"})
        blocks::hash_dataset(w, weights_path_, name, false, false, hash);
    for (const std::string& name : read_extra_names(w, weights_path_))
        blocks::hash_dataset(w, weights_path_, name, true, false, hash);
    for (const char* name : {"adam_m", "adam_v"})
        blocks::hash_dataset(st, state_path_, name, false, false, hash);
    blocks::hash_dataset(st, state_path_, "since_fired", false, true, hash);
    hash.sum.add_header(header());
    SAE_ENFORCE(stored == hash.sum.text(),
                "checkpoint {}: checksum mismatch: the checkpoint is damaged or its weights "
                "file does not belong to it",
                state_path_);
}

std::optional<std::vector<int64_t>> CheckpointFiles::shape(const std::string& name) const {
    auto guard = h5::lock();
    const bool state = in_state_file(name);
    const hid_t f = state ? files_->state.get() : files_->weights.get();
    if (!h5::link_exists(f, name)) return std::nullopt;
    h5::Dataset d = h5::open_dataset(f, name, state ? state_path_ : weights_path_);
    const std::vector<hsize_t> dims = h5::dataset_dims(d.get());
    return std::vector<int64_t>(dims.begin(), dims.end());
}

void CheckpointFiles::read(const std::string& name, const std::vector<int64_t>& start,
                           const std::vector<int64_t>& count, float* out) const {
    auto guard = h5::lock();
    const bool state = in_state_file(name);
    blocks::read_block(state ? files_->state.get() : files_->weights.get(),
                       state ? state_path_ : weights_path_, name, start, count, H5T_NATIVE_FLOAT,
                       out);
}

void CheckpointFiles::read(const std::string& name, int64_t start, int64_t count,
                           int64_t* out) const {
    auto guard = h5::lock();
    blocks::read_block(files_->state.get(), state_path_, name, {start}, {count}, H5T_NATIVE_INT64,
                       out);
}

// --- TensorsInMemory ---------------------------------------------------------------------------

const std::vector<float>* TensorsInMemory::find(const std::string& name) const {
    if (name == "adam_m") return &s_.opt_m;
    if (name == "adam_v") return &s_.opt_v;
    const WeightTensor* t = w_.find(name);
    return t ? &t->data : nullptr;
}

std::optional<std::vector<int64_t>> TensorsInMemory::shape(const std::string& name) const {
    if (const WeightTensor* t = w_.find(name)) return t->shape;
    if (name == "since_fired")
        return std::vector<int64_t>{static_cast<int64_t>(s_.since_fired.size())};
    const std::vector<float>* t = find(name);
    if (!t) return std::nullopt;
    return std::vector<int64_t>{static_cast<int64_t>(t->size())};
}

void TensorsInMemory::read(const std::string& name, const std::vector<int64_t>& start,
                           const std::vector<int64_t>& count, float* out) const {
    const std::vector<float>* t = find(name);
    SAE_ENFORCE(t && start.size() == count.size(), "no tensor '{}' in the checkpoint", name);
    const std::vector<int64_t> dims = *shape(name);
    SAE_ENFORCE(dims.size() == start.size(), "tensor '{}' has {} dimensions", name, dims.size());
    for (size_t i = 0; i < start.size(); ++i)
        SAE_ENFORCE(start[i] >= 0 && count[i] >= 0 && start[i] + count[i] <= dims[i],
                    "tensor '{}': block out of its bounds", name);
    if (dims.size() == 1) return (void)std::copy_n(t->begin() + start[0], count[0], out);
    if (dims.size() > 2) {  // whole rows: [rows, ...] from row start[0]
        int64_t row = 1;
        for (size_t i = 1; i < dims.size(); ++i) {
            SAE_ENFORCE(start[i] == 0 && count[i] == dims[i],
                        "tensor '{}': only whole rows of it can be read", name);
            row *= dims[i];
        }
        return (void)std::copy_n(t->begin() + start[0] * row, count[0] * row, out);
    }
    const int64_t cols = dims[1], width = count[1];
    for (int64_t r = 0; r < count[0]; ++r)
        std::copy_n(t->begin() + (start[0] + r) * cols + start[1], width, out + r * width);
}

void TensorsInMemory::read(const std::string& name, int64_t start, int64_t count,
                           int64_t* out) const {
    SAE_ENFORCE(name == "since_fired", "no integer tensor '{}' in the checkpoint", name);
    std::copy_n(s_.since_fired.begin() + start, count, out);
}

}  // namespace saetrain
