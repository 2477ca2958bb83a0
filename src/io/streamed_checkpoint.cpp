// streamed_checkpoint.cpp — a latent-sharded SAE's files without a whole copy in memory
// (train_state.h, write_streamed): the trainer streams the whole SAE's tensors to its first
// shard chunk by chunk, which writes each chunk into its place and hashes it in file order, so
// the files and their checksum are those sae_write_h5 and train_state_write would write.
#include <exception>

#include "atomic_file.h"
#include "h5.h"
#include "sae_file.h"
#include "saetrain/error.h"
#include "saetrain/train_state.h"
#include "saetrain/trainer.h"

namespace saetrain {
namespace {

// The checksum (train_state_checksum) built up chunk by chunk: before a tensor's first chunk,
// its name (the weights' extra tensors) and its element count, as mix() hashes them.
struct StreamHash {
    uint64_t h = kFnvBasis;
    void begin(const TensorInfo& t, bool named) {
        if (named) h = fnv1a(t.name.data(), t.name.size(), h);
        uint64_t count = 1;
        for (int64_t s : t.shape) count *= static_cast<uint64_t>(s);
        h = fnv1a(&count, sizeof(count), h);
    }
    void add(const TensorChunk& c) {
        h = c.f32 ? fnv1a(c.f32, static_cast<size_t>(c.count) * sizeof(float), h)
                  : fnv1a(c.i64, static_cast<size_t>(c.count) * sizeof(int64_t), h);
    }
};

h5::Dataset create_dataset(hid_t file, const TensorInfo& t) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Space s(
        SAE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
    return h5::Dataset(
        SAE_H5_CHECK(H5Dcreate2(file, t.name.c_str(), t.i64 ? H5T_STD_I64LE : H5T_IEEE_F32LE,
                                s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

// Elements [offset, offset + count) of the tensor, whole rows of a 2-D one.
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

// One file of `tensors`, filled by `stream` (collective: the other shards call it too), then
// `finish` (attributes). On a failure the stream still runs to its end on this rank, so no
// shard is left waiting; the error is thrown after it.
void write_one(const std::string& path, const std::vector<TensorInfo>& tensors, bool named,
               StreamHash& hash, const std::function<void(const SaeTrainer::ChunkSink&)>& stream,
               const std::function<void(hid_t)>& finish) {
    bool streamed = false;
    std::exception_ptr failed;
    try {
        auto guard = h5::lock();
        h5::init();
        atomic_write(path, [&](const std::string& tmp) {
            h5::File f = h5::create_file(tmp);
            std::vector<h5::Dataset> sets;
            for (const TensorInfo& t : tensors) sets.push_back(create_dataset(f.get(), t));
            std::exception_ptr chunk_failed;
            streamed = true;
            stream([&](const TensorChunk& c) {
                const TensorInfo& t = tensors[static_cast<size_t>(c.tensor)];
                if (c.offset == 0) hash.begin(t, named && c.tensor >= 4);
                hash.add(c);
                if (chunk_failed) return;
                try {
                    write_chunk(sets[static_cast<size_t>(c.tensor)].get(), t, c, tmp);
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
    if (!streamed) stream([](const TensorChunk&) {});
    if (failed) std::rethrow_exception(failed);
}

}  // namespace

void write_streamed(const SaeTrainer& t, bool writes, const std::string& weights_path,
                    const std::string& state_path, const SaeMeta& meta, const TrainState& header,
                    bool folded) {
    if (!writes) {  // send this shard's part; the first shard writes
        t.stream_weights(folded, [](const TensorChunk&) {});
        if (!state_path.empty()) t.stream_state([](const TensorChunk&) {});
        return;
    }
    const std::vector<TensorInfo> weights = t.weight_tensors(folded);
    std::string names;
    for (size_t i = 4; i < weights.size(); ++i)
        names += (names.empty() ? "" : ",") + weights[i].name;
    StreamHash hash;
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
        [&](const SaeTrainer::ChunkSink& s) { t.stream_weights(folded, s); },
        [&](hid_t f) { write_sae_attributes(f, meta, t.d_model(), t.n_latents(), names); });
    if (!state_path.empty())
        run(
            state_path, t.state_tensors(), false, hash,
            [&](const SaeTrainer::ChunkSink& s) { t.stream_state(s); },
            [&](hid_t f) { write_train_state_attributes(f, header, hash.h); });
    if (failed) std::rethrow_exception(failed);
}

}  // namespace saetrain
