// trainer_io.cpp — a trainer's SAE as its checkpoint files' tensors, and back (see trainer_io.h).
#include "saetrain/trainer_io.h"

#include <algorithm>
#include <type_traits>

#include "saetrain/error.h"

namespace saetrain {

namespace {

constexpr int64_t kChunkElements = int64_t{1} << 24;  // 64 MiB of floats

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string out;
    for (int64_t x : shape) out += (out.empty() ? "" : ", ") + std::to_string(x);
    return out;
}

// SaeWeights of a whole flat parameter buffer (the whole layout): each declared tensor in its
// file shape (W_enc transposed to [d, n]).
SaeWeights weights_of(const SaeTrainer& t, const std::vector<float>& p) {
    SaeWeights w;
    w.d_model = t.d_model(), w.n_latents = t.n_latents();
    for (const ParamSegment& s : t.store().whole_layout().segments()) {
        const float* v = p.data() + s.offset;
        w.set(s.name, s.file_shape(),
              s.transposed ? transposed(v, s.rows, s.cols) : std::vector<float>(v, v + s.size()));
    }
    return w;
}

// This latent shard's rows [n_local x cols] of a per-latent tensor (host), gathered latent shard by
// latent shard in chunks to the first latent shard's sink for tensor `t` from element `base`, each
// value folded by c as `fold` says (sae_tensors.h).
template <class T>
void gather_latent_rows(const SaeTrainer& tr, const T* mine, int64_t cols, int t, int64_t base,
                        ScaleFold fold, float c, const ChunkSink& sink) {
    tr.store().gather_latents(mine, cols, [&](int64_t at, int64_t count, T* values) {
        TensorChunk chunk{t, base + at, count, nullptr, nullptr};
        if constexpr (std::is_same_v<T, int64_t>) {
            chunk.i64 = values;
        } else {
            fold_values(fold, c, values, count);
            chunk.f32 = values;
        }
        sink(chunk);
    });
}

// Latent sharding: trainer_weights collected from the gather on the first latent shard (empty
// weights on the others).
SaeWeights streamed_weights(const SaeTrainer& t) {
    const std::vector<TensorInfo> tensors = trainer_weight_tensors(t, false);
    SaeWeights w;
    if (t.store().latent_shard().group->rank() == 0) {
        w.d_model = t.d_model(), w.n_latents = t.n_latents();
        for (const TensorInfo& info : tensors) {
            int64_t size = 1;
            for (int64_t s : info.shape) size *= s;
            w.set(info.name, info.shape, std::vector<float>(static_cast<size_t>(size)));
        }
    }
    trainer_gather_weights(t, false, [&](const TensorChunk& c) {
        std::copy_n(c.f32, c.count,
                    w.tensors[static_cast<size_t>(c.tensor)].data.begin() + c.offset);
    });
    return w;
}

}  // namespace

// --- the whole SAE in memory -------------------------------------------------------------------

SaeWeights trainer_weights(const SaeTrainer& t) {
    if (t.latent_sharded()) return streamed_weights(t);
    SaeWeights w = weights_of(t, t.params_host());
    for (auto& [name, v] : t.arch_buffers()) {  // BatchTopK's threshold
        const auto size = static_cast<int64_t>(v.size());
        w.set(name, {size}, std::move(v));
    }
    if (t.config().normalize != "none") w.set("activation_scale", {1}, {t.input_scale()});
    return w;
}

TrainState trainer_state(const SaeTrainer& t) {
    TrainState s;
    s.step = t.step_count();
    s.tokens = t.tokens();
    if (!t.latent_sharded()) {
        s.opt_m = t.store().host(ParamStore::Buffer::opt_m);
        s.opt_v = t.store().host(ParamStore::Buffer::opt_v);
        s.since_fired = t.since_fired();
        return s;
    }
    if (t.store().latent_shard().group->rank() ==
        0) {  // the first latent shard collects the gather
        s.opt_m.resize(static_cast<size_t>(t.store().whole_layout().total()));
        s.opt_v.resize(s.opt_m.size());
        s.since_fired.resize(static_cast<size_t>(t.n_latents()));
    }
    trainer_gather_state(t, [&](const TensorChunk& c) {
        if (c.i64)
            std::copy_n(c.i64, c.count, s.since_fired.begin() + c.offset);
        else
            std::copy_n(c.f32, c.count, (c.tensor == 0 ? s.opt_m : s.opt_v).begin() + c.offset);
    });
    return s;
}

// --- the whole SAE gathered to the first latent shard (latent sharding)
// --------------------------------

std::vector<TensorInfo> trainer_weight_tensors(const SaeTrainer& t, bool folded) {
    std::vector<TensorInfo> out;
    for (const ParamSegment& s : t.store().whole_layout().segments())
        out.push_back({s.name, s.file_shape(), false});
    for (const auto& [name, v] : t.arch_buffers())
        out.push_back({name, {static_cast<int64_t>(v.size())}, false});
    if (!folded && t.config().normalize != "none") out.push_back({"activation_scale", {1}, false});
    return out;
}

std::vector<TensorInfo> trainer_state_tensors(const SaeTrainer& t) {
    const int64_t total = t.store().whole_layout().total();
    return {{"adam_m", {total}, false},
            {"adam_v", {total}, false},
            {"since_fired", {t.n_latents()}, true}};
}

void trainer_gather_weights(const SaeTrainer& tr, bool folded, const ChunkSink& sink) {
    SAE_ENFORCE(tr.latent_sharded(), "trainer_gather_weights is for latent-sharded SAEs");
    const int64_t n_local = tr.local_latents(), n = tr.n_latents();
    std::vector<float> p = tr.store().host(ParamStore::Buffer::params);
    // final.h5 takes raw activations: data.normalize's scale folded in (sae_tensors.h).
    const bool fold = folded && tr.config().normalize != "none";
    const float c = fold ? tr.input_scale() : 1.0f;
    const bool root = tr.store().latent_shard().group->rank() == 0;
    int t = 0;
    std::vector<float> rows_out;
    for (const ParamSegment& s : tr.store().layout().segments()) {
        const ScaleFold rule = fold ? s.fold : ScaleFold::keep;
        float* seg = p.data() + s.offset;
        if (s.transposed) {
            // [cols, n] in files (W_enc [d, n]): blocks of file rows, each latent shard's columns
            // transposed from its latent rows.
            const int64_t cols = s.cols, block = std::max<int64_t>(1, kChunkElements / n);
            for (int64_t c0 = 0; c0 < cols; c0 += block) {
                const int64_t cb = std::min(block, cols - c0);
                rows_out.resize(root ? static_cast<size_t>(cb * n) : 0);
                tr.store().gather_parts(
                    cb * n_local,
                    [&](float* part) {
                        for (int64_t r = 0; r < cb; ++r)
                            for (int64_t l = 0; l < n_local; ++l)
                                part[r * n_local + l] = seg[l * cols + c0 + r];
                        fold_values(rule, c, part, cb * n_local);
                    },
                    [&](int64_t q, const float* part) {
                        for (int64_t r = 0; r < cb; ++r)
                            std::copy_n(part + r * n_local, n_local,
                                        rows_out.begin() + r * n + q * n_local);
                    });
                if (root) sink({t, c0 * n, cb * n, rows_out.data(), nullptr});
            }
        } else if (s.per_latent) {
            gather_latent_rows(tr, seg, s.cols, t, 0, rule, c, sink);
        } else {
            fold_values(rule, c, seg, s.size());
            if (root) sink({t, 0, s.size(), seg, nullptr});
        }
        ++t;
    }
    for (auto& [name, v] : tr.arch_buffers()) {  // a pass's state: no fold
        if (root) sink({t, 0, static_cast<int64_t>(v.size()), v.data(), nullptr});
        ++t;
    }
    const float scale = tr.input_scale();
    if (!fold && tr.config().normalize != "none" && root) sink({t, 0, 1, &scale, nullptr});
}

void trainer_gather_state(const SaeTrainer& tr, const ChunkSink& sink) {
    SAE_ENFORCE(tr.latent_sharded(), "trainer_gather_state is for latent-sharded SAEs");
    const bool root = tr.store().latent_shard().group->rank() == 0;
    const auto& segs = tr.store().layout().segments();
    const auto& wsegs = tr.store().whole_layout().segments();
    for (int which = 0; which < 2; ++which) {
        const std::vector<float> a =
            tr.store().host(which == 0 ? ParamStore::Buffer::opt_m : ParamStore::Buffer::opt_v);
        for (size_t i = 0; i < segs.size(); ++i) {
            if (segs[i].per_latent)
                gather_latent_rows(tr, a.data() + segs[i].offset, segs[i].cols, which,
                                   wsegs[i].offset, ScaleFold::keep, 1.0f, sink);
            else if (root)
                sink({which, wsegs[i].offset, segs[i].size(), a.data() + segs[i].offset, nullptr});
        }
    }
    gather_latent_rows(tr, tr.since_fired().data(), 1, 2, 0, ScaleFold::keep, 1.0f, sink);
}

// --- read back: this trainer's part of a checkpoint
// ------------------------------------------------

CheckpointPart trainer_read_part(const SaeTrainer& t, const TensorSource& src) {
    const int64_t n = t.n_latents(), first = t.store().latent_shard().first();
    const int64_t d = t.d_model(), n_local = t.local_latents();
    if (const auto w_dec = src.shape("W_dec"); w_dec && t.store().layout().has("W_dec"))
        SAE_ENFORCE(*w_dec == (std::vector<int64_t>{n, d}),
                    "checkpoint holds an SAE of d_model {} x {} latents, the config {} x {}",
                    w_dec->size() == 2 ? (*w_dec)[1] : 0, w_dec->empty() ? 0 : (*w_dec)[0], d, n);
    auto size_of = [&](const std::string& name) -> int64_t {
        const auto shape = src.shape(name);
        if (!shape) return -1;
        int64_t size = 1;
        for (int64_t x : *shape) size *= x;
        return size;
    };
    const ParamLayout& layout = t.store().layout();
    const ParamLayout& whole_layout = t.store().whole_layout();
    SAE_ENFORCE(size_of("adam_m") == whole_layout.total() &&
                    size_of("adam_v") == whole_layout.total() && size_of("since_fired") == n,
                "checkpoint state does not match an SAE of {} latents", n);
    const auto& segs = layout.segments();
    const auto& wsegs = whole_layout.segments();
    CheckpointPart part;
    part.params.resize(static_cast<size_t>(t.store().size()));
    part.opt_m.resize(part.params.size());
    part.opt_v.resize(part.params.size());
    // Each declared tensor, and its moments: this latent shard's rows of a per-latent tensor,
    // the others whole.
    for (size_t i = 0; i < segs.size(); ++i) {
        const ParamSegment& s = segs[i];
        const std::vector<int64_t> shape = wsegs[i].file_shape();
        const auto file = src.shape(s.name);
        SAE_ENFORCE(
            !(s.name == "W_enc" && s.cols != d && file && *file == std::vector<int64_t>{d, n}),
            "checkpoint of a {} SAE holds the dense encoder W_enc [{}, {}] of an earlier "
            "saetrain; this one holds it compact, [{}], and cannot resume it: start the "
            "run again (--overwrite)",
            t.config().arch, d, n, shape_text(shape));
        SAE_ENFORCE(file && (*file == shape || (shape.size() == 1 && size_of(s.name) == shape[0])),
                    "checkpoint of a {} SAE has no '{}' tensor of shape [{}]", t.config().arch,
                    s.name, shape_text(shape));
        const int64_t from = s.per_latent ? first * s.cols : 0, count = s.size();
        float* p = part.params.data() + s.offset;
        if (s.transposed) {
            // [cols, n] in files (W_enc [d, n]): this latent shard's columns, in blocks of file
            // rows, transposed to latent rows.
            const int64_t block = std::max<int64_t>(1, kChunkElements / n_local);
            std::vector<float> rows;
            for (int64_t c0 = 0; c0 < s.cols; c0 += block) {
                const int64_t cb = std::min(block, s.cols - c0);
                rows.resize(static_cast<size_t>(cb * n_local));
                src.read(s.name, {c0, first}, {cb, n_local}, rows.data());
                for (int64_t r = 0; r < cb; ++r)
                    for (int64_t l = 0; l < n_local; ++l)
                        p[l * s.cols + c0 + r] = rows[r * n_local + l];
            }
        } else if (shape.size() > 1) {
            // Latents (or the rows of a tensor of none) first: [rows, ...] from row `first`.
            std::vector<int64_t> at(shape.size(), 0), len = shape;
            if (s.per_latent) at[0] = first, len[0] = s.rows;
            src.read(s.name, at, len, p);
        } else {
            src.read(s.name, {from}, {count}, p);
        }
        src.read("adam_m", {wsegs[i].offset + from}, {count}, part.opt_m.data() + s.offset);
        src.read("adam_v", {wsegs[i].offset + from}, {count}, part.opt_v.data() + s.offset);
    }
    part.since_fired.resize(static_cast<size_t>(n_local));
    src.read("since_fired", first, n_local, part.since_fired.data());
    auto whole = [&](const std::string& name) {
        std::vector<float> v(static_cast<size_t>(std::max<int64_t>(size_of(name), 0)));
        if (!v.empty()) src.read(name, {0}, {static_cast<int64_t>(v.size())}, v.data());
        return v;
    };
    if (t.config().normalize != "none") {
        const std::vector<float> c = whole("activation_scale");
        SAE_ENFORCE(c.size() == 1,
                    "checkpoint has no 'activation_scale' tensor, but data.normalize is {}; it "
                    "was written without normalization",
                    t.config().normalize);
        part.input_scale = c[0];
    }
    for (const auto& [name, value] : t.arch_buffers()) {
        if (size_of(name) < 0 && t.arch_buffer_optional(name)) continue;
        SAE_ENFORCE(size_of(name) >= 0, "checkpoint of a {} SAE has no '{}' tensor",
                    t.config().arch, name);
        part.buffers.emplace_back(name, whole(name));
    }
    return part;
}

void trainer_restore(SaeTrainer& t, const SaeWeights& w, const TrainState& s) {
    t.restore(trainer_read_part(t, TensorsInMemory(w, s)), s.step, s.tokens);
}

}  // namespace saetrain
