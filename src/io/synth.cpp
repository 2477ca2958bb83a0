// synth.cpp — synthetic shards with planted features (see synth.h).
//
// All random draws come from one std::mt19937_64 stream in a fixed order (features, mean,
// then rows in global order), and rows are generated in float32 before any conversion, so the
// same seed gives the same float data whatever the dtype, chunking or shard count.
#include "saetrain/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>

#include "h5.h"
#include "saetrain/error.h"
#include "saetrain/sae_math.h"  // defines: float_to_fp16_bits, float_to_bf16_bits

namespace fs = std::filesystem;

namespace saetrain {

namespace {

void check_options(const SynthOptions& o) {
    SAE_ENFORCE(!o.out_dir.empty(), "synth: the output directory is empty; pass --out DIR");
    SAE_ENFORCE(o.d_model > 0, "synth: d_model is {}; it must be > 0", o.d_model);
    SAE_ENFORCE(o.n_features > 0, "synth: features is {}; it must be > 0", o.n_features);
    SAE_ENFORCE(o.active_per_row >= 0 && o.active_per_row <= static_cast<double>(o.n_features),
                "synth: active per row is {}; it must be in [0, features={}]", o.active_per_row,
                o.n_features);
    SAE_ENFORCE(o.min_scale > 0 && o.min_scale <= o.max_scale,
                "synth: scales [{}, {}] must satisfy 0 < min_scale <= max_scale", o.min_scale,
                o.max_scale);
    SAE_ENFORCE(o.noise_std >= 0, "synth: noise is {}; it must be >= 0", o.noise_std);
    SAE_ENFORCE(o.mean_norm >= 0, "synth: mean norm is {}; it must be >= 0", o.mean_norm);
    SAE_ENFORCE(o.shards >= 1, "synth: shards is {}; it must be >= 1", o.shards);
    SAE_ENFORCE(o.rows >= o.shards,
                "synth: {} rows cannot fill {} shards; every shard needs at least one row", o.rows,
                o.shards);
    SAE_ENFORCE(!o.chunked || o.chunk_rows > 0, "synth: chunk rows is {}; it must be > 0",
                o.chunk_rows);
}

// IEEE half as an HDF5 type, built the way h5py builds it so numpy reads it as float16.
h5::Type make_f16_type() {
    h5::Type t(SAE_H5_CHECK(H5Tcopy(H5T_IEEE_F32LE)));
    SAE_H5_CHECK(H5Tset_fields(t.get(), 15, 10, 5, 0, 10));
    SAE_H5_CHECK(H5Tset_size(t.get(), 2));
    SAE_H5_CHECK(H5Tset_ebias(t.get(), 15));
    return t;
}

// Generates rows in global order from the shared RNG stream.
class RowGen {
public:
    RowGen(const SynthOptions& o, std::mt19937_64& rng, const std::vector<float>& features,
           const std::vector<float>& mean, const std::vector<float>* out_features = nullptr,
           const std::vector<float>* out_mean = nullptr)
        : o_(o),
          rng_(rng),
          features_(features),
          mean_(mean),
          out_features_(out_features),
          out_mean_(out_mean),
          count_(o.n_features, std::min(1.0, o.active_per_row / static_cast<double>(o.n_features))),
          logscale_(std::log(o.min_scale), std::log(o.max_scale)),
          pick_(static_cast<size_t>(o.n_features), 0) {}

    // Fills out [n, d] with the next n rows; with target features, target [n, d] with the same
    // codes through them (its own mean and noise).
    void next(float* out, int64_t n, float* target = nullptr) {
        const int64_t d = o_.d_model, m = o_.n_features;
        std::normal_distribution<double> noise(0.0, 1.0);
        std::vector<double> x(static_cast<size_t>(d)), y(static_cast<size_t>(d));
        std::vector<int64_t> active;
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t j = 0; j < d; ++j) x[j] = mean_[j];
            if (target)
                for (int64_t j = 0; j < d; ++j) y[j] = (*out_mean_)[static_cast<size_t>(j)];
            // Bernoulli(p) per feature is Binomial(m, p) active features, chosen uniformly
            // without replacement: O(k) per row instead of O(m).
            int64_t k = count_(rng_);
            active.clear();
            // Floyd's algorithm: k distinct indices from [0, m).
            for (int64_t j = m - k; j < m; ++j) {
                int64_t t = std::uniform_int_distribution<int64_t>(0, j)(rng_);
                int64_t pick = pick_[t] ? j : t;
                pick_[pick] = 1;
                active.push_back(pick);
            }
            for (int64_t f : active) {
                pick_[f] = 0;
                double a = std::exp(logscale_(rng_));
                const float* fv = &features_[static_cast<size_t>(f * d)];
                for (int64_t j = 0; j < d; ++j) x[j] += a * fv[j];
                if (target) {
                    const float* gv = &(*out_features_)[static_cast<size_t>(f * d)];
                    for (int64_t j = 0; j < d; ++j) y[j] += a * gv[j];
                }
            }
            for (int64_t j = 0; j < d; ++j) x[j] += o_.noise_std * noise(rng_);
            for (int64_t j = 0; j < d; ++j) out[r * d + j] = static_cast<float>(x[j]);
            if (target) {
                for (int64_t j = 0; j < d; ++j) y[j] += o_.noise_std * noise(rng_);
                for (int64_t j = 0; j < d; ++j) target[r * d + j] = static_cast<float>(y[j]);
            }
        }
    }

private:
    const SynthOptions& o_;
    std::mt19937_64& rng_;
    const std::vector<float>& features_;
    const std::vector<float>& mean_;
    const std::vector<float>* out_features_;  // paired: the target's features and mean
    const std::vector<float>* out_mean_;
    std::binomial_distribution<int64_t> count_;
    std::uniform_real_distribution<double> logscale_;
    std::vector<char> pick_;  // [m] scratch marks for Floyd's sampling, all zero between rows
};

// Random Gaussian direction of norm `norm`, drawn in double then stored as float.
void random_direction(std::mt19937_64& rng, float* out, int64_t d, double norm) {
    std::normal_distribution<double> g(0.0, 1.0);
    std::vector<double> v(static_cast<size_t>(d));
    double ss = 0;
    for (auto& x : v) {
        x = g(rng);
        ss += x * x;
    }
    double s = ss > 0 ? norm / std::sqrt(ss) : 0.0;
    for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(v[j] * s);
}

// One shard's file: its `activations` dataset, written block by block, and with `first_row` >= 0
// its token_ids (the global row index: paired sets must agree on them).
class ShardFile {
public:
    ShardFile(const std::string& path, const SynthOptions& o, int64_t rows, int64_t first_row);
    void write(const float* rows, int64_t r0, int64_t n);
    void close();

private:
    std::string path_;
    const SynthOptions& o_;
    h5::File f_;
    h5::Space fspace_;
    h5::Type f16_;
    h5::Dataset ds_;
    std::vector<uint16_t> buf16_;
};

ShardFile::ShardFile(const std::string& path, const SynthOptions& o, int64_t rows,
                     int64_t first_row)
    : path_(path), o_(o) {
    const int64_t d = o.d_model;
    h5::File& f = f_;
    f = h5::create_file(path);
    hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(d)};
    fspace_ = h5::Space(SAE_H5_CHECK(H5Screate_simple(2, dims, nullptr)));
    h5::Space& fspace = fspace_;
    h5::Plist dcpl(SAE_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    if (o.chunked) {
        hsize_t chunk[2] = {static_cast<hsize_t>(std::min(o.chunk_rows, rows)),
                            static_cast<hsize_t>(d)};
        SAE_H5_CHECK(H5Pset_chunk(dcpl.get(), 2, chunk));
    }
    f16_ = make_f16_type();
    hid_t ftype = o.dtype == DType::f32   ? H5T_IEEE_F32LE
                  : o.dtype == DType::f16 ? f16_.get()
                                          : H5T_STD_U16LE;
    ds_ = h5::Dataset(SAE_H5_CHECK(H5Dcreate2(f.get(), "activations", ftype, fspace.get(),
                                              H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
    h5::write_attr_string(ds_.get(), "model", "synthetic");
    h5::write_attr_string(ds_.get(), "hook", "synthetic");
    h5::write_attr_int64(ds_.get(), "d_model", d);
    h5::write_attr_string(ds_.get(), "dtype", dtype_name(o.dtype));
    if (first_row >= 0) {
        std::vector<int32_t> ids(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<int32_t>((first_row + r) % 30522);
        const hsize_t n[1] = {static_cast<hsize_t>(rows)};
        h5::Space s(SAE_H5_CHECK(H5Screate_simple(1, n, nullptr)));
        h5::Dataset t(SAE_H5_CHECK(H5Dcreate2(f.get(), "token_ids", H5T_STD_I32LE, s.get(),
                                              H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
        SAE_H5_CHECK(
            H5Dwrite(t.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids.data()));
    }
}

void ShardFile::write(const float* rows, int64_t r0, int64_t n) {
    const int64_t d = o_.d_model;
    const size_t elems = static_cast<size_t>(n * d);
    hsize_t start[2] = {static_cast<hsize_t>(r0), 0};
    hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(d)};
    SAE_H5_CHECK(
        H5Sselect_hyperslab(fspace_.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
    h5::Space mspace(SAE_H5_CHECK(H5Screate_simple(2, count, nullptr)));
    hid_t mtype = o_.dtype == DType::f32   ? H5T_NATIVE_FLOAT
                  : o_.dtype == DType::f16 ? f16_.get()
                                           : H5T_NATIVE_UINT16;
    const void* src = rows;
    if (o_.dtype != DType::f32) {
        buf16_.resize(elems);
        for (size_t i = 0; i < elems; ++i)
            buf16_[i] = o_.dtype == DType::f16 ? math::float_to_fp16_bits(rows[i])
                                               : math::float_to_bf16_bits(rows[i]);
        src = buf16_.data();
    }
    SAE_H5_CHECK(H5Dwrite(ds_.get(), mtype, mspace.get(), fspace_.get(), H5P_DEFAULT, src));
}

void ShardFile::close() {
    ds_.reset();
    SAE_ENFORCE(f_.close() >= 0, "file {}: closing failed ({}); is the disk full?", path_,
                h5::last_error());
}

// The shard's rows from the generator, in blocks of ~4M elements (memory stays flat whatever
// the shard size); with `target_path`, the paired target shard beside it.
void write_shard(const std::string& path, const std::string& target_path, const SynthOptions& o,
                 RowRange r, RowGen& gen) {
    const int64_t d = o.d_model, rows = r.size();
    const bool paired = !target_path.empty();
    ShardFile in(path, o, rows, paired ? r.begin : -1);
    std::optional<ShardFile> out;
    if (paired) out.emplace(target_path, o, rows, r.begin);
    const int64_t block = std::max<int64_t>(1, (int64_t{1} << 22) / d);
    std::vector<float> buf, ybuf;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        const int64_t n = std::min(block, rows - r0);
        buf.resize(static_cast<size_t>(n * d));
        if (paired) ybuf.resize(buf.size());
        gen.next(buf.data(), n, paired ? ybuf.data() : nullptr);
        in.write(buf.data(), r0, n);
        if (paired) out->write(ybuf.data(), r0, n);
    }
    in.close();
    if (paired) out->close();
}

}  // namespace

void synth_write(const SynthOptions& opt) {
    check_options(opt);
    auto guard = h5::lock();
    h5::init();
    std::error_code ec;
    fs::create_directories(opt.out_dir, ec);
    SAE_ENFORCE(!ec, "synth: cannot create directory {} ({})", opt.out_dir, ec.message());

    const int64_t m = opt.n_features, d = opt.d_model;
    std::mt19937_64 rng(opt.seed);
    std::vector<float> features(static_cast<size_t>(m * d));  // [m, d], unit rows
    for (int64_t i = 0; i < m; ++i) random_direction(rng, &features[i * d], d, 1.0);
    std::vector<float> mean(static_cast<size_t>(d));  // [d], norm mean_norm
    random_direction(rng, mean.data(), d, opt.mean_norm);
    // Paired: the target's own planted features and mean, drawn after the input's.
    const bool paired = !opt.target_dir.empty();
    std::vector<float> out_features, out_mean;
    if (paired) {
        fs::create_directories(opt.target_dir, ec);
        SAE_ENFORCE(!ec, "synth: cannot create directory {} ({})", opt.target_dir, ec.message());
        out_features.resize(features.size()), out_mean.resize(mean.size());
        for (int64_t i = 0; i < m; ++i) random_direction(rng, &out_features[i * d], d, 1.0);
        random_direction(rng, out_mean.data(), d, opt.mean_norm);
    }

    auto ground_truth = [&](const std::string& dir, const std::vector<float>& f_rows,
                            const std::vector<float>& mu) {
        std::string gt = (fs::path(dir) / "ground_truth.h5").string();
        h5::File f = h5::create_file(gt);
        h5::write_f32(f.get(), "features", f_rows.data(),
                      {static_cast<hsize_t>(m), static_cast<hsize_t>(d)});
        h5::write_f32(f.get(), "mean", mu.data(), {static_cast<hsize_t>(d)});
        h5::write_attr_int64(f.get(), "seed", static_cast<int64_t>(opt.seed));
        h5::write_attr_string(f.get(), "active_per_row", fmt::format("{}", opt.active_per_row));
        SAE_ENFORCE(f.close() >= 0, "file {}: closing failed ({})", gt, h5::last_error());
    };
    ground_truth(opt.out_dir, features, mean);
    if (paired) ground_truth(opt.target_dir, out_features, out_mean);

    RowGen gen(opt, rng, features, mean, paired ? &out_features : nullptr,
               paired ? &out_mean : nullptr);
    for (int64_t s = 0; s < opt.shards; ++s) {
        // Same split as the ranks' partition: the first rows % shards shards get one more.
        RowRange r = partition_rows(opt.rows, static_cast<int>(s), static_cast<int>(opt.shards));
        const std::string name = fmt::format("shard_{:05d}.h5", s);
        write_shard((fs::path(opt.out_dir) / name).string(),
                    paired ? (fs::path(opt.target_dir) / name).string() : std::string(), opt, r,
                    gen);
    }
}

std::vector<float> synth_read_features(const std::string& path, int64_t* m, int64_t* d) {
    auto guard = h5::lock();
    h5::File f = h5::open_file(path);
    std::vector<hsize_t> dims;
    std::vector<float> v = h5::read_f32(f.get(), "features", path, &dims);
    SAE_ENFORCE(dims.size() == 2, "file {}: 'features' has {} dimensions; expected [m, d_model]",
                path, dims.size());
    *m = static_cast<int64_t>(dims[0]);
    *d = static_cast<int64_t>(dims[1]);
    return v;
}

double feature_recovery(const float* truth, int64_t m, const float* dec, int64_t n, int64_t d) {
    SAE_ENFORCE(m > 0 && n > 0 && d > 0, "feature_recovery: empty input (m={}, n={}, d={})", m, n,
                d);
    std::vector<double> dec_norm(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t k = 0; k < d; ++k) s += double(dec[j * d + k]) * dec[j * d + k];
        dec_norm[j] = std::sqrt(s);
    }
    double total = 0;
    for (int64_t i = 0; i < m; ++i) {
        const float* t = truth + i * d;
        double tn = 0;
        for (int64_t k = 0; k < d; ++k) tn += double(t[k]) * t[k];
        tn = std::sqrt(tn);
        double best = -1.0;
        for (int64_t j = 0; j < n; ++j) {
            double dot = 0;
            for (int64_t k = 0; k < d; ++k) dot += double(t[k]) * dec[j * d + k];
            double denom = tn * dec_norm[j];
            best = std::max(best, denom > 0 ? dot / denom : 0.0);
        }
        total += best;
    }
    return total / static_cast<double>(m);
}

}  // namespace saetrain
