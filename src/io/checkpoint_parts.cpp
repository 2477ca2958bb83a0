// checkpoint_parts.cpp — a latent-sharded SAE's checkpoint as one part per latent shard and a
// manifest (checkpoint_parts.h): the names, the writer (each latent shard its own part, from its
// own host copies, one buffer at a time), and the way back (CheckpointParts: the whole SAE's
// tensors as a TensorSource over the parts).
#include "saetrain/checkpoint_parts.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <type_traits>

#include "atomic_file.h"
#include "h5.h"
#include "sae_file.h"
#include "saetrain/error.h"
#include "saetrain/trainer.h"
#include "saetrain/trainer_io.h"
#include "tensor_blocks.h"

namespace fs = std::filesystem;

namespace saetrain {

// --- names --------------------------------------------------------------------------------------

std::string checkpoint_part_path(const std::string& sae_dir, int64_t step, int64_t part,
                                 int64_t parts) {
    return (fs::path(sae_dir) / fmt::format("checkpoint-{}.part-{}-of-{}.h5", step, part, parts))
        .string();
}

std::string checkpoint_part_state_path(const std::string& sae_dir, int64_t step, int64_t part,
                                       int64_t parts) {
    return (fs::path(sae_dir) /
            fmt::format("checkpoint-{}.part-{}-of-{}.state.h5", step, part, parts))
        .string();
}

std::string checkpoint_manifest_path(const std::string& sae_dir, int64_t step) {
    return (fs::path(sae_dir) / fmt::format("checkpoint-{}.manifest.json", step)).string();
}

int64_t checkpoint_file_step(const std::string& file_name) {
    static const std::regex name(
        R"(checkpoint-(\d{1,18})(\.part-\d{1,9}-of-\d{1,9})?(\.state)?\.h5|checkpoint-(\d{1,18})\.manifest\.json)");
    std::smatch m;
    if (!std::regex_match(file_name, m, name)) return -1;
    return std::stoll(m[1].matched ? m[1].str() : m[4].str());
}

namespace {

constexpr const char* kFormat = "saetrain checkpoint parts";
constexpr int64_t kVersion = 1;
constexpr int64_t kChunkElements = int64_t{1} << 24;  // 64 MiB of floats

// One of the whole SAE's weight tensors as the parts split it.
struct SplitTensor {
    std::string name;
    std::vector<int64_t> shape;  // the whole SAE's
    int axis = -1;               // the latent axis; -1: not split, part 0 holds it whole
    int64_t per_latent = 0;      // elements per latent along `axis`
    int64_t cols = 0;            // a transposed tensor's (W_enc [d, n]): its buffer rows' width
};

// A segment of the flat Adam moments: the whole parameter layout's, in order.
struct MomentSegment {
    std::string name;
    int64_t size = 0;
    int64_t per_latent = 0;  // elements per latent (a per-latent segment's row); 0: not split
};

// The extra tensors are hashed with their names, as in the pair (train_state.h, sae_file.h).
bool named(const std::string& name) { return !sae_file_base_tensor(name); }
bool in_part(const SplitTensor& t, int64_t part) { return t.axis >= 0 || part == 0; }

int64_t elements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

std::vector<int64_t> part_shape(const SplitTensor& t, int64_t latents) {
    std::vector<int64_t> shape = t.shape;
    if (t.axis >= 0) shape[static_cast<size_t>(t.axis)] = latents * t.per_latent;
    return shape;
}

// A part's elements of segment `seg` start here in its flat moments.
int64_t moments_offset(const std::vector<MomentSegment>& m, size_t seg, int64_t part,
                       int64_t latents) {
    int64_t at = 0;
    for (size_t i = 0; i < seg; ++i)
        at += m[i].per_latent > 0 ? latents * m[i].per_latent : (part == 0 ? m[i].size : 0);
    return at;
}

// The weight tensors in file order (trainer_weight_tensors'), with their latent axes.
std::vector<SplitTensor> split_weights(const SaeTrainer& t) {
    const std::vector<TensorInfo> infos = trainer_weight_tensors(t, false);
    const auto& segs = t.store().whole_layout().segments();
    std::vector<SplitTensor> out;
    for (size_t i = 0; i < infos.size(); ++i) {
        SplitTensor s{infos[i].name, infos[i].shape, -1, 0, 0};
        if (i >= segs.size() || !segs[i].per_latent) {  // whole, in part 0
        } else if (segs[i].transposed) {
            s.axis = 1, s.per_latent = 1, s.cols = segs[i].cols;  // [d, n]: a latent is a column
        } else if (s.shape.size() == 1) {
            s.axis = 0, s.per_latent = segs[i].cols;  // [n * cols], a latent's row at a time
        } else {
            s.axis = 0, s.per_latent = 1;  // [n, ...]: a latent is a row
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::vector<MomentSegment> moment_segments(const SaeTrainer& t) {
    std::vector<MomentSegment> out;
    for (const ParamSegment& s : t.store().whole_layout().segments())
        out.push_back({s.name, s.size(), s.per_latent ? s.cols : 0});
    return out;
}

// --- writing ------------------------------------------------------------------------------------

// What a latent shard wrote, as the manifest records it.
struct WrittenPart {
    std::string weights_sum, state_sum;
    int64_t weights_bytes = 0, state_bytes = 0;
};

// Elements [offset, offset + count) of `info` from `data`, hashed and written in chunks of whole
// rows.
template <class T>
void put(hid_t ds, const TensorInfo& info, const T* data, int64_t offset, int64_t count,
         blocks::ChunkHash& hash, const std::string& path) {
    const int64_t cols = info.shape.size() == 2 ? info.shape[1] : 1;
    const int64_t step = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(cols, 1)) * cols;
    for (int64_t at = 0; at < count; at += step) {
        TensorChunk c{0, offset + at, std::min(step, count - at), nullptr, nullptr};
        if constexpr (std::is_same_v<T, int64_t>)
            c.i64 = data + at;
        else
            c.f32 = data + at;
        hash.add(c);
        blocks::write_chunk(ds, info, c, path);
    }
}

void write_part_attributes(hid_t f, const LatentShard& ls) {
    h5::write_attr_int64(f, "part", ls.index);
    h5::write_attr_int64(f, "parts", ls.count);
    h5::write_attr_int64(f, "first_latent", ls.first());
    h5::write_attr_int64(f, "latents", ls.n_local());
}

void close_or_throw(h5::File& f, const std::string& tmp) {
    SAE_ENFORCE(f.close() >= 0, "file {}: closing failed ({}); is the disk full?", tmp,
                h5::os_error().empty() ? h5::last_error() : h5::os_error());
}

// The weights file of this latent shard's part, from a host copy of its parameters.
void write_part_weights(const SaeTrainer& t, const std::vector<SplitTensor>& tensors,
                        const std::string& path, const SaeMeta& meta, WrittenPart& out) {
    const LatentShard& ls = t.store().latent_shard();
    const int64_t part = ls.index, nk = ls.n_local(), d = t.d_model();
    const std::vector<float> p = t.store().host(ParamStore::Buffer::params);
    const auto& segs = t.store().layout().segments();
    const std::vector<NamedTensor> buffers = t.arch_buffers();
    const float scale = t.input_scale();
    // Tensor i's values here, contiguous: a segment of the buffer (this latent shard's rows of a
    // per-latent one), an architecture's buffer, then activation_scale.
    auto values = [&](size_t i) -> const float* {
        if (i < segs.size()) return p.data() + segs[i].offset;
        if (i < segs.size() + buffers.size()) return buffers[i - segs.size()].second.data();
        return &scale;
    };
    std::string extra;
    for (size_t i = 0; i < tensors.size(); ++i)
        if (named(tensors[i].name) && in_part(tensors[i], part))
            extra += (extra.empty() ? "" : ",") + tensors[i].name;
    blocks::ChunkHash hash;
    auto guard = h5::lock();
    h5::init();
    atomic_write(path, [&](const std::string& tmp) {
        h5::File f = h5::create_file(tmp);
        for (size_t i = 0; i < tensors.size(); ++i) {
            if (!in_part(tensors[i], part)) continue;
            const TensorInfo info{tensors[i].name, part_shape(tensors[i], nk), false};
            h5::Dataset ds = blocks::create_dataset(f.get(), info);
            hash.begin(info.name, named(info.name), info.shape);
            if (tensors[i].cols == 0) {
                put(ds.get(), info, values(i), 0, elements(info.shape), hash, tmp);
                continue;
            }
            // [cols, nk] (W_enc [d, nk]): blocks of file rows, transposed from the latent-major
            // buffer.
            const float* w = values(i);
            const int64_t cols = tensors[i].cols, block = std::max<int64_t>(1, kChunkElements / nk);
            std::vector<float> rows;
            for (int64_t c0 = 0; c0 < cols; c0 += block) {
                const int64_t cb = std::min(block, cols - c0);
                rows.resize(static_cast<size_t>(cb * nk));
                for (int64_t r = 0; r < cb; ++r)
                    for (int64_t l = 0; l < nk; ++l) rows[r * nk + l] = w[l * cols + c0 + r];
                put(ds.get(), info, rows.data(), c0 * nk, cb * nk, hash, tmp);
            }
        }
        write_sae_attributes(f.get(), meta, d, t.n_latents(), extra);
        write_part_attributes(f.get(), ls);
        out.weights_sum = hash.sum.text();
        h5::write_attr_string(f.get(), "checksum", out.weights_sum);
        close_or_throw(f, tmp);
    });
}

// The state file of this latent shard's part: its rows of each moment (one host copy at a
// time), since_fired, the header.
void write_part_state(const SaeTrainer& t, const std::vector<MomentSegment>& moments,
                      const std::string& path, const TrainState& header, WrittenPart& out) {
    const LatentShard& ls = t.store().latent_shard();
    const int64_t part = ls.index, nk = ls.n_local();
    const auto& segs = t.store().layout().segments();
    const int64_t total = moments_offset(moments, moments.size(), part, nk);
    blocks::ChunkHash hash;
    auto guard = h5::lock();
    h5::init();
    atomic_write(path, [&](const std::string& tmp) {
        h5::File f = h5::create_file(tmp);
        for (const auto which : {ParamStore::Buffer::opt_m, ParamStore::Buffer::opt_v}) {
            const std::vector<float> a = t.store().host(which);
            const TensorInfo info{
                which == ParamStore::Buffer::opt_m ? "adam_m" : "adam_v", {total}, false};
            h5::Dataset ds = blocks::create_dataset(f.get(), info);
            hash.begin(info.name, false, info.shape);
            int64_t at = 0;
            for (const ParamSegment& s : segs) {
                if (!s.per_latent && part != 0) continue;
                put(ds.get(), info, a.data() + s.offset, at, s.size(), hash, tmp);
                at += s.size();
            }
            SAE_ENFORCE(at == total, "checkpoint part {}: {} moments where {} were expected", path,
                        at, total);
        }
        const TensorInfo fired{"since_fired", {nk}, true};
        h5::Dataset ds = blocks::create_dataset(f.get(), fired);
        hash.begin(fired.name, false, fired.shape);
        put(ds.get(), fired, t.since_fired().data(), 0, nk, hash, tmp);
        ds.reset();
        write_part_attributes(f.get(), ls);
        write_train_state_attributes(f.get(), header, hash.sum);  // finishes the checksum
        out.state_sum = hash.sum.text();
        close_or_throw(f, tmp);
    });
}

// What each latent shard tells the first about its part: a few bytes, never tensors.
struct PartRecord {
    int64_t ok = 0, weights_bytes = 0, state_bytes = 0;
    char weights_sum[32] = {}, state_sum[32] = {};
};

std::string manifest_text(const SaeTrainer& t, const std::string& sae_dir, const TrainState& header,
                          const std::vector<PartRecord>& records) {
    const LatentShard& ls = t.store().latent_shard();
    nlohmann::ordered_json j;
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["step"] = header.step;
    j["tokens"] = header.tokens;
    j["iteration"] = header.iteration;
    j["d_model"] = t.d_model();
    j["n_latents"] = t.n_latents();
    j["parts"] = ls.count;
    j["weights"] = nlohmann::ordered_json::array();
    for (const SplitTensor& s : split_weights(t))
        j["weights"].push_back({{"name", s.name},
                                {"shape", s.shape},
                                {"latent_axis", s.axis},
                                {"per_latent", s.per_latent}});
    j["moments"] = nlohmann::ordered_json::array();
    for (const MomentSegment& m : moment_segments(t))
        j["moments"].push_back({{"name", m.name}, {"size", m.size}, {"per_latent", m.per_latent}});
    j["files"] = nlohmann::ordered_json::array();
    for (int64_t k = 0; k < ls.count; ++k) {
        const PartRecord& r = records[static_cast<size_t>(k)];
        auto name = [](const std::string& path) { return fs::path(path).filename().string(); };
        j["files"].push_back(
            {{"part", k},
             {"first_latent", k * ls.n_local()},
             {"latents", ls.n_local()},
             {"weights",
              {{"file", name(checkpoint_part_path(sae_dir, header.step, k, ls.count))},
               {"bytes", r.weights_bytes},
               {"checksum", std::string(r.weights_sum)}}},
             {"state",
              {{"file", name(checkpoint_part_state_path(sae_dir, header.step, k, ls.count))},
               {"bytes", r.state_bytes},
               {"checksum", std::string(r.state_sum)}}}});
    }
    // One line per key, and per element of an array: short, and readable with less(1).
    std::string text = "{";
    for (auto it = j.begin(); it != j.end(); ++it) {
        text += fmt::format("{}\n \"{}\": ", it == j.begin() ? "" : ",", it.key());
        if (!it.value().is_array()) {
            text += it.value().dump();
            continue;
        }
        text += "[";
        for (size_t i = 0; i < it.value().size(); ++i)
            text += fmt::format("{}\n  {}", i ? "," : "", it.value()[i].dump());
        text += "\n ]";
    }
    return text + "\n}\n";
}

}  // namespace

void write_checkpoint_parts(const SaeTrainer& t, const std::string& sae_dir, const SaeMeta& meta,
                            const TrainState& header) {
    SAE_ENFORCE(t.latent_sharded(), "write_checkpoint_parts is for latent-sharded SAEs");
    const LatentShard& ls = t.store().latent_shard();
    const std::string wpath = checkpoint_part_path(sae_dir, header.step, ls.index, ls.count);
    const std::string spath = checkpoint_part_state_path(sae_dir, header.step, ls.index, ls.count);
    PartRecord mine;
    std::exception_ptr failed;
    try {
        WrittenPart w;
        write_part_weights(t, split_weights(t), wpath, meta, w);
        write_part_state(t, moment_segments(t), spath, header, w);
        mine.ok = 1;
        mine.weights_bytes = static_cast<int64_t>(fs::file_size(wpath));
        mine.state_bytes = static_cast<int64_t>(fs::file_size(spath));
        std::snprintf(mine.weights_sum, sizeof(mine.weights_sum), "%s", w.weights_sum.c_str());
        std::snprintf(mine.state_sum, sizeof(mine.state_sum), "%s", w.state_sum.c_str());
    } catch (...) {
        failed = std::current_exception();
    }
    // Every latent shard takes part whatever happened, so none is left waiting.
    std::vector<PartRecord> all(static_cast<size_t>(ls.count));
    ls.group->allgather(&mine, all.data(), sizeof(PartRecord));
    if (failed) std::rethrow_exception(failed);
    if (ls.index != 0) return;
    for (int64_t k = 0; k < ls.count; ++k)
        SAE_ENFORCE(all[static_cast<size_t>(k)].ok,
                    "checkpoint at step {}: part {} of {} ({}) was not written (its latent "
                    "shard says why); no manifest",
                    header.step, k, ls.count,
                    checkpoint_part_path(sae_dir, header.step, k, ls.count));
    atomic_write_text(checkpoint_manifest_path(sae_dir, header.step),
                      manifest_text(t, sae_dir, header, all));
}

// --- CheckpointParts ----------------------------------------------------------------------------

namespace {

struct PartEntry {
    int64_t first = 0, latents = 0;
    std::string weights, state;  // paths
    std::string weights_sum, state_sum;
    int64_t weights_bytes = 0, state_bytes = 0;
};

}  // namespace

struct CheckpointParts::Impl {
    std::string manifest;
    int64_t step = 0, tokens = 0, d = 0, n = 0;
    std::vector<SplitTensor> weights;
    std::vector<MomentSegment> moments;
    std::vector<PartEntry> parts;
    mutable std::vector<h5::File> wfiles, sfiles;  // opened when first read

    hid_t weights_file(size_t k) const {
        if (!wfiles[k].valid()) wfiles[k] = h5::open_file(parts[k].weights);
        return wfiles[k].get();
    }
    hid_t state_file(size_t k) const {
        if (!sfiles[k].valid()) sfiles[k] = h5::open_file(parts[k].state);
        return sfiles[k].get();
    }
    const SplitTensor* find(const std::string& name) const {
        for (const SplitTensor& t : weights)
            if (t.name == name) return &t;
        return nullptr;
    }
    int64_t moments_total() const { return moments_offset(moments, moments.size(), 0, n); }

    // The block [start, start + count) of a split tensor, from the parts holding its latents.
    void read_split(const SplitTensor& t, bool state, const std::vector<int64_t>& start,
                    const std::vector<int64_t>& count, hid_t type, size_t elem, void* out) const;
    void read_moments(const std::string& name, int64_t start, int64_t count, float* out) const;
};

void CheckpointParts::Impl::read_split(const SplitTensor& t, bool state,
                                       const std::vector<int64_t>& start,
                                       const std::vector<int64_t>& count, hid_t type, size_t elem,
                                       void* out) const {
    const size_t a = static_cast<size_t>(t.axis);
    const int64_t lo = start[a], hi = start[a] + count[a];
    auto* o = static_cast<char*>(out);
    std::vector<char> tmp;
    for (size_t k = 0; k < parts.size(); ++k) {
        const int64_t p0 = parts[k].first * t.per_latent, p1 = p0 + parts[k].latents * t.per_latent;
        const int64_t x = std::max(lo, p0), y = std::min(hi, p1);
        if (x >= y) continue;
        std::vector<int64_t> s = start, c = count;
        s[a] = x - p0, c[a] = y - x;
        const hid_t f = state ? state_file(k) : weights_file(k);
        const std::string& path = state ? parts[k].state : parts[k].weights;
        if (a == 0) {  // whole rows of the block: in place
            int64_t inner = 1;
            for (size_t i = 1; i < count.size(); ++i) inner *= count[i];
            blocks::read_block(f, path, t.name, s, c, type,
                               o + static_cast<size_t>((x - lo) * inner) * elem);
            continue;
        }
        // Columns [x, y) of every row of the block (W_enc's latents).
        const size_t width = static_cast<size_t>(y - x) * elem;
        tmp.resize(static_cast<size_t>(count[0]) * width);
        blocks::read_block(f, path, t.name, s, c, type, tmp.data());
        for (int64_t r = 0; r < count[0]; ++r)
            std::memcpy(o + static_cast<size_t>(r * count[1] + (x - lo)) * elem,
                        tmp.data() + static_cast<size_t>(r) * width, width);
    }
}

void CheckpointParts::Impl::read_moments(const std::string& name, int64_t start, int64_t count,
                                         float* out) const {
    int64_t seg0 = 0;  // the segment's first element in the whole SAE's moments
    for (size_t i = 0; i < moments.size(); seg0 += moments[i].size, ++i) {
        const MomentSegment& m = moments[i];
        const int64_t lo = std::max(start, seg0), hi = std::min(start + count, seg0 + m.size);
        if (lo >= hi) continue;
        for (size_t k = 0; k < parts.size(); ++k) {
            // This part's elements of the segment: its latents' rows, or (part 0) all of them.
            int64_t p0 = seg0, p1 = seg0 + m.size;
            if (m.per_latent > 0) {
                p0 = seg0 + parts[k].first * m.per_latent;
                p1 = p0 + parts[k].latents * m.per_latent;
            } else if (k != 0) {
                continue;
            }
            const int64_t x = std::max(lo, p0), y = std::min(hi, p1);
            if (x >= y) continue;
            const int64_t at =
                moments_offset(moments, i, static_cast<int64_t>(k), parts[k].latents);
            blocks::read_block(state_file(k), parts[k].state, name, {at + x - p0}, {y - x},
                               H5T_NATIVE_FLOAT, out + (x - start));
        }
    }
}

CheckpointParts::CheckpointParts(const std::string& manifest_path)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.manifest = manifest_path;
    std::ifstream in(manifest_path, std::ios::binary);
    SAE_ENFORCE(in.good(), "checkpoint manifest {}: cannot open it ({})", manifest_path,
                std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    const fs::path dir = fs::path(manifest_path).parent_path();
    // A file the manifest names: a plain name in its own directory.
    auto file = [&](const std::string& name) {
        SAE_ENFORCE(
            !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
            "checkpoint manifest {}: '{}' is not a file name in its directory", manifest_path,
            name);
        return (dir / name).string();
    };
    try {
        const nlohmann::json j = nlohmann::json::parse(text.str());
        SAE_ENFORCE(j.at("format").get<std::string>() == kFormat &&
                        j.at("version").get<int64_t>() == kVersion,
                    "checkpoint manifest {}: not a saetrain checkpoint manifest of version {}",
                    manifest_path, kVersion);
        m.step = j.at("step").get<int64_t>();
        m.tokens = j.at("tokens").get<int64_t>();
        m.d = j.at("d_model").get<int64_t>();
        m.n = j.at("n_latents").get<int64_t>();
        for (const auto& w : j.at("weights"))
            m.weights.push_back(
                {w.at("name").get<std::string>(), w.at("shape").get<std::vector<int64_t>>(),
                 w.at("latent_axis").get<int>(), w.at("per_latent").get<int64_t>()});
        for (const auto& s : j.at("moments"))
            m.moments.push_back({s.at("name").get<std::string>(), s.at("size").get<int64_t>(),
                                 s.at("per_latent").get<int64_t>()});
        int64_t next = 0;
        for (const auto& f : j.at("files")) {
            PartEntry p;
            p.first = f.at("first_latent").get<int64_t>();
            p.latents = f.at("latents").get<int64_t>();
            SAE_ENFORCE(f.at("part").get<int64_t>() == static_cast<int64_t>(m.parts.size()) &&
                            p.first == next && p.latents > 0,
                        "checkpoint manifest {}: part {} does not follow the one before it",
                        manifest_path, m.parts.size());
            next = p.first + p.latents;
            const auto& w = f.at("weights");
            const auto& s = f.at("state");
            p.weights = file(w.at("file").get<std::string>());
            p.weights_bytes = w.at("bytes").get<int64_t>();
            p.weights_sum = w.at("checksum").get<std::string>();
            p.state = file(s.at("file").get<std::string>());
            p.state_bytes = s.at("bytes").get<int64_t>();
            p.state_sum = s.at("checksum").get<std::string>();
            m.parts.push_back(std::move(p));
        }
        SAE_ENFORCE(!m.parts.empty() && next == m.n &&
                        j.at("parts").get<int64_t>() == static_cast<int64_t>(m.parts.size()),
                    "checkpoint manifest {}: its parts do not cover the {} latents once",
                    manifest_path, m.n);
    } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("checkpoint manifest {}: {}; the file is damaged", manifest_path,
                                e.what()));
    }
    for (const SplitTensor& t : m.weights) {
        SAE_ENFORCE(!t.name.empty() && !t.shape.empty() && t.shape.size() <= 2 &&
                        t.axis < static_cast<int>(t.shape.size()) &&
                        (t.axis < 0 || (t.per_latent > 0 && t.shape[static_cast<size_t>(t.axis)] ==
                                                                m.n * t.per_latent)),
                    "checkpoint manifest {}: tensor '{}' has a shape its parts cannot hold",
                    manifest_path, t.name);
    }
    for (const MomentSegment& s : m.moments)
        SAE_ENFORCE(
            s.size >= 0 && s.per_latent >= 0 && (s.per_latent == 0 || s.size == m.n * s.per_latent),
            "checkpoint manifest {}: moments segment '{}' has a size its parts cannot hold",
            manifest_path, s.name);
    m.wfiles.resize(m.parts.size());
    m.sfiles.resize(m.parts.size());
}

CheckpointParts::~CheckpointParts() {
    auto guard = h5::lock();
    impl_.reset();
}

int64_t CheckpointParts::parts() const { return static_cast<int64_t>(impl_->parts.size()); }
int64_t CheckpointParts::first_latent(int64_t part) const {
    return impl_->parts.at(static_cast<size_t>(part)).first;
}
int64_t CheckpointParts::latents(int64_t part) const {
    return impl_->parts.at(static_cast<size_t>(part)).latents;
}

SaeMeta CheckpointParts::meta() const {
    auto guard = h5::lock();
    h5::init();
    return read_sae_meta(impl_->weights_file(0));
}

TrainState CheckpointParts::header() const {
    auto guard = h5::lock();
    h5::init();
    TrainState s;
    read_train_state_header(impl_->state_file(0), impl_->parts[0].state, s);
    SAE_ENFORCE(s.step == impl_->step,
                "checkpoint part {}: step {}, but its manifest {} says step {}",
                impl_->parts[0].state, s.step, impl_->manifest, impl_->step);
    return s;
}

void CheckpointParts::verify(int64_t part) const {
    auto guard = h5::lock();
    h5::init();
    const Impl& m = *impl_;
    const auto k = static_cast<size_t>(part);
    const PartEntry& p = m.parts.at(k);
    for (const auto& [path, bytes] :
         {std::pair{p.weights, p.weights_bytes}, {p.state, p.state_bytes}}) {
        std::error_code ec;
        const auto size = fs::file_size(path, ec);
        SAE_ENFORCE(!ec, "checkpoint part {}: cannot read it ({})", path, ec.message());
        SAE_ENFORCE(static_cast<int64_t>(size) == bytes,
                    "checkpoint part {}: {} bytes, but its manifest {} says {}: the part is torn "
                    "or is not this checkpoint's",
                    path, size, m.manifest, bytes);
    }
    auto check = [&](const std::string& path, hid_t f, const std::string& want,
                     const Checksum& got) {
        const std::string stored = h5::read_attr_string(f, "checksum").value_or("");
        SAE_ENFORCE(got.text() == want && stored == want,
                    "checkpoint part {}: checksum mismatch: the file is damaged or does not "
                    "belong to {}",
                    path, m.manifest);
    };
    {
        blocks::ChunkHash hash(Checksum::kind_of(p.weights_sum));
        const hid_t f = m.weights_file(k);
        for (size_t i = 0; i < m.weights.size(); ++i)
            if (in_part(m.weights[i], part))
                blocks::hash_dataset(f, p.weights, m.weights[i].name, named(m.weights[i].name),
                                     false, hash);
        check(p.weights, f, p.weights_sum, hash.sum);
    }
    blocks::ChunkHash hash(Checksum::kind_of(p.state_sum));
    const hid_t f = m.state_file(k);
    blocks::hash_dataset(f, p.state, "adam_m", false, false, hash);
    blocks::hash_dataset(f, p.state, "adam_v", false, false, hash);
    blocks::hash_dataset(f, p.state, "since_fired", false, true, hash);
    TrainState header;
    read_train_state_header(f, p.state, header);
    hash.sum.add_header(header);
    check(p.state, f, p.state_sum, hash.sum);
    SAE_ENFORCE(header.step == m.step,
                "checkpoint part {}: step {}, but its manifest {} says step {}", p.state,
                header.step, m.manifest, m.step);
}

std::optional<std::vector<int64_t>> CheckpointParts::shape(const std::string& name) const {
    if (name == "adam_m" || name == "adam_v") return std::vector<int64_t>{impl_->moments_total()};
    if (name == "since_fired") return std::vector<int64_t>{impl_->n};
    const SplitTensor* t = impl_->find(name);
    if (!t) return std::nullopt;
    return t->shape;
}

void CheckpointParts::read(const std::string& name, const std::vector<int64_t>& start,
                           const std::vector<int64_t>& count, float* out) const {
    auto guard = h5::lock();
    h5::init();
    const Impl& m = *impl_;
    const auto dims = shape(name);
    SAE_ENFORCE(dims && name != "since_fired", "checkpoint {}: no tensor '{}'", m.manifest, name);
    SAE_ENFORCE(start.size() == dims->size() && count.size() == dims->size(),
                "checkpoint {}: tensor '{}' has {} dimensions", m.manifest, name, dims->size());
    for (size_t i = 0; i < dims->size(); ++i)
        SAE_ENFORCE(start[i] >= 0 && count[i] >= 0 && start[i] + count[i] <= (*dims)[i],
                    "checkpoint {}: a block outside tensor '{}'", m.manifest, name);
    if (elements(count) == 0) return;
    if (name == "adam_m" || name == "adam_v") return m.read_moments(name, start[0], count[0], out);
    const SplitTensor& t = *m.find(name);
    if (t.axis < 0)
        return blocks::read_block(m.weights_file(0), m.parts[0].weights, name, start, count,
                                  H5T_NATIVE_FLOAT, out);
    m.read_split(t, false, start, count, H5T_NATIVE_FLOAT, sizeof(float), out);
}

void CheckpointParts::read(const std::string& name, int64_t start, int64_t count,
                           int64_t* out) const {
    auto guard = h5::lock();
    h5::init();
    const Impl& m = *impl_;
    SAE_ENFORCE(name == "since_fired", "checkpoint {}: no integer tensor '{}'", m.manifest, name);
    SAE_ENFORCE(start >= 0 && count >= 0 && start + count <= m.n,
                "checkpoint {}: a block outside tensor '{}'", m.manifest, name);
    if (count == 0) return;
    const SplitTensor fired{name, {m.n}, 0, 1};
    m.read_split(fired, true, {start}, {count}, H5T_NATIVE_INT64, sizeof(int64_t), out);
}

}  // namespace saetrain
