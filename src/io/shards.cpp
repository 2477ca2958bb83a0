// shards.cpp — listing, validating, describing and partitioning HDF5 activation shards.
#include "saetrain/shards.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "h5.h"
#include "raw_shards.h"
#include "s3_vfd.h"
#include "saetrain/error.h"

namespace fs = std::filesystem;

namespace saetrain {

// --- listing and validation ----------------------------------------------------------------

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// ground_truth.h5 sits beside synthetic shards and holds the planted features, not rows.
bool is_shard_name(const fs::path& p) {
    return p.extension() == ".h5" && p.filename() != "ground_truth.h5";
}

// The objects of an s3:// source (s3.h's listing), as shards with their size and ETag.
std::vector<ShardInfo> list_objects(const std::string& source, const S3Settings& s3) {
    std::vector<ShardInfo> out;
    for (const S3Object& o : s3_client(s3, source)->list(source)) {
        if (!is_shard_name(fs::path(o.key).filename())) continue;
        ShardInfo s;
        s.path = o.url(), s.bytes = o.size, s.etag = o.etag;
        out.push_back(std::move(s));
    }
    SAE_ENFORCE(!out.empty(),
                "dataset {}: no .h5 objects there (listed at {}); point data.path at a prefix "
                "holding .h5 shards (s3://bucket/prefix/), a glob such as "
                "'s3://bucket/prefix/shard_*.h5', or one .h5 object",
                source, s3_client(s3, source)->endpoint());
    return out;
}

std::vector<std::string> list_shards(const std::string& source) {
    std::vector<std::string> out;
    std::error_code ec;
    if (fs::is_directory(source, ec)) {
        for (const auto& e : fs::directory_iterator(source, ec)) {
            if (!is_shard_name(e.path())) continue;
            // A .h5 name that is no readable file (a dangling symlink, a FIFO, a directory) is
            // refused, not skipped: skipping it would train on fewer rows than the user has.
            require_regular_file(e.path().string(), "dataset " + source + ": shard");
            out.push_back(e.path().string());
        }
        SAE_ENFORCE(!ec, "dataset {}: cannot list directory ({})", source, ec.message());
        std::sort(out.begin(), out.end());
        SAE_ENFORCE(!out.empty(),
                    "dataset {}: no .h5 shards in this directory; point data.path at a directory "
                    "of .h5 shards, a glob such as 'dir/shard_*.h5', or one .h5 file",
                    source);
        return out;
    }
    if (has_glob_chars(source)) {
        glob_t g{};
        int rc = glob(source.c_str(), 0, nullptr, &g);  // results come sorted by name
        if (rc == 0) {
            for (size_t i = 0; i < g.gl_pathc; ++i) {
                fs::path p(g.gl_pathv[i]);
                if (!is_shard_name(p)) continue;
                if (!fs::is_regular_file(p, ec)) {
                    globfree(&g);
                    require_regular_file(p.string(), "dataset " + source + ": shard");
                }
                out.push_back(p.string());
            }
        }
        globfree(&g);
        SAE_ENFORCE(rc == 0 || rc == GLOB_NOMATCH, "dataset {}: glob failed (code {})", source, rc);
        SAE_ENFORCE(!out.empty(),
                    "dataset {}: the glob matches no .h5 files; check the pattern and quote it "
                    "so the shell does not expand it",
                    source);
        return out;
    }
    SAE_ENFORCE(fs::exists(source, ec),
                "dataset {}: no such file or directory; point data.path at a directory of .h5 "
                "shards, a glob, or one .h5 file",
                source);
    require_regular_file(source, "dataset");
    out.push_back(source);
    return out;
}

// What one shard holds, as read from its metadata.
struct ShardMeta {
    int64_t rows = 0, d_model = 0;
    int64_t layers = 0;  // a 3-D dataset's [rows, L, d]: L (d_model = L d); 0: 2-D
    DType dtype = DType::f32;
    std::string model, hook;
};

std::string attr_on(hid_t dset, hid_t file, const char* name) {
    if (auto v = h5::read_attr_string(dset, name)) return *v;
    if (auto v = h5::read_attr_string(file, name)) return *v;
    return "";
}

// Classifies a dataset's element type; throws naming the shard when it is not usable.
DType classify_type(hid_t dset, hid_t file, const std::string& path, const std::string& name) {
    h5::Type t(SAE_H5_CHECK(H5Dget_type(dset)));
    H5T_class_t cls = H5Tget_class(t.get());
    size_t size = H5Tget_size(t.get());
    if (cls == H5T_FLOAT && size == 4) return DType::f32;
    if (cls == H5T_FLOAT && size == 2) {
        // IEEE half has 5 exponent and 10 mantissa bits; a 2-byte float type with 8 and 7 is
        // bfloat16 declared as a custom HDF5 float, which we read the same way.
        size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
        SAE_H5_CHECK(H5Tget_fields(t.get(), &spos, &epos, &esize, &mpos, &msize));
        if (esize == 5 && msize == 10) return DType::f16;
        if (esize == 8 && msize == 7) return DType::bf16;
    }
    if (cls == H5T_INTEGER && size == 2 && attr_on(dset, file, "dtype") == "bfloat16")
        return DType::bf16;
    const char* what = cls == H5T_FLOAT     ? "floating point"
                       : cls == H5T_INTEGER ? "integer"
                                            : "non-numeric";
    throw Error(fmt::format(
        "shard {}: dataset '{}' has {}-byte {} elements; expected float32, float16, or 16-bit "
        "words with attribute dtype=\"bfloat16\" (convert the shard, e.g. arr.astype('float32'))",
        path, name, size, what));
}

// --- where a shard's bytes live ------------------------------------------------------------
// HDF5 answers where a dataset's elements are; these checks make sure that answer is inside the
// file we were given and covers every row, so that only the bytes the user wrote are trained.
// Each refusal is made here, at validation, before out_dir is locked or anything is written.

// a x b, or nullopt when it does not fit in int64.
std::optional<int64_t> times(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

// The filters of a chunked dataset that this HDF5 cannot decode, e.g. "32000 (lzf)".
std::string missing_filters(hid_t dcpl) {
    std::string missing;
    const int n = H5Pget_nfilters(dcpl);
    for (int i = 0; i < n; ++i) {
        unsigned flags = 0, config = 0;
        size_t nvalues = 0;
        char name[64] = {};
        const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvalues,
                                               nullptr, sizeof(name), name, &config);
        unsigned have = 0;
        if (id >= 0 && H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &have) >= 0 &&
            (have & H5Z_FILTER_CONFIG_DECODE_ENABLED) != 0)
            continue;
        missing += fmt::format("{}{}{}", missing.empty() ? "" : ", ", static_cast<int>(id),
                               name[0] ? fmt::format(" ({})", name) : "");
    }
    return missing;
}

// Throws naming the shard unless every element of dataset d ([rows, d_model] of `elem` bytes)
// is stored in the shard file itself, inside it, apart from its metadata, and readable: no
// virtual dataset, no external raw-data file, no filter this HDF5 lacks, no row never written,
// no size larger than the file.
void check_storage(hid_t f, hid_t d, const std::string& path, const std::string& name, int64_t rows,
                   int64_t d_model, int64_t elem, int64_t file_bytes) {
    h5::Plist dcpl(SAE_H5_CHECK(H5Dget_create_plist(d)));
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    SAE_ENFORCE(layout != H5D_VIRTUAL,
                "shard {}: dataset '{}' is a virtual dataset (its rows live in other files); "
                "saetrain reads only data stored in the shard: write the rows into it (h5repack "
                "-l CONTI, or copy them with h5py)",
                path, name);
    SAE_ENFORCE(H5Pget_external_count(dcpl.get()) <= 0,
                "shard {}: dataset '{}' keeps its elements in external raw-data files; saetrain "
                "reads only data stored in the shard: write the rows into it (h5repack -l CONTI)",
                path, name);
    if (layout == H5D_CHUNKED) {
        const std::string missing = missing_filters(dcpl.get());
        SAE_ENFORCE(missing.empty(),
                    "shard {}: dataset '{}' is compressed with filter {}, which this HDF5 cannot "
                    "decode; re-write it uncompressed (h5repack -f NONE) or with gzip",
                    path, name, missing);
    }
    h5::Plist fcpl(SAE_H5_CHECK(H5Fget_create_plist(f)));
    hsize_t user_block = 0;
    SAE_H5_CHECK(H5Pget_userblock(fcpl.get(), &user_block));
    const std::optional<int64_t> elems = times(rows, d_model);
    const std::optional<int64_t> bytes = elems ? times(*elems, elem) : std::nullopt;
    SAE_ENFORCE(bytes,
                "shard {}: dataset '{}' declares [{}, {}] elements, over 2^63 bytes; its header "
                "is damaged: re-write it",
                path, name, rows, d_model);
    if (layout == H5D_CONTIGUOUS) {
        const haddr_t a = H5Dget_offset(d);
        SAE_ENFORCE(a != HADDR_UNDEF,
                    "shard {}: dataset '{}' was never written (HDF5 allocated no storage for it; "
                    "reads would return fill values); re-write the shard",
                    path, name);
        const auto end = static_cast<int64_t>(user_block + a) + *bytes;
        SAE_ENFORCE(static_cast<int64_t>(user_block + a) >= 0 && end >= 0 && end <= file_bytes,
                    "shard {}: dataset '{}' says its {} bytes start at offset {}, past the end of "
                    "the file ({} bytes); the file is truncated or damaged: re-write or re-copy it",
                    path, name, *bytes, user_block + a, file_bytes);
        for (const h5::MetaExtent& m : h5::metadata_extents(f)) {
            SAE_ENFORCE(!m.overlaps(a, static_cast<hsize_t>(*bytes)),
                        "shard {}: dataset '{}' says its elements lie at offset {}, over the "
                        "file's own metadata (at {}); its header is damaged: re-write the shard",
                        path, name, user_block + a, user_block + m.addr);
        }
    } else if (layout == H5D_CHUNKED) {
        // Every dimension's chunks multiplied: a 3-D [rows, L, d] dataset's as well.
        h5::Space dspace(SAE_H5_CHECK(H5Dget_space(d)));
        const int nd = SAE_H5_CHECK(H5Sget_simple_extent_ndims(dspace.get()));
        hsize_t dims[3] = {0, 0, 0}, chunk[3] = {0, 0, 0};
        SAE_ENFORCE(nd >= 2 && nd <= 3 && H5Pget_chunk(dcpl.get(), nd, chunk) == nd,
                    "shard {}: dataset '{}' has an unreadable chunk shape; re-write the shard",
                    path, name);
        SAE_H5_CHECK(H5Sget_simple_extent_dims(dspace.get(), dims, nullptr));
        uint64_t want = 1;
        bool fits = true;
        for (int i = 0; i < nd; ++i) {
            SAE_ENFORCE(chunk[i] > 0,
                        "shard {}: dataset '{}' has an unreadable chunk shape; re-write the shard",
                        path, name);
            const uint64_t per_dim = (static_cast<uint64_t>(dims[i]) + chunk[i] - 1) / chunk[i];
            fits = fits && !__builtin_mul_overflow(want, per_dim, &want);
        }
        h5::Space space(SAE_H5_CHECK(H5Dget_space(d)));
        hsize_t have = 0;
        SAE_H5_CHECK(H5Dget_num_chunks(d, space.get(), &have));
        SAE_ENFORCE(fits && have == want,
                    "shard {}: dataset '{}' has {} of its {} chunks written; rows in the others "
                    "were never written (reads would return fill values): re-write the shard",
                    path, name, have, fits ? fmt::format("{}", want) : "2^64 or more");
    }
    const bool compressed = layout == H5D_CHUNKED && H5Pget_nfilters(dcpl.get()) > 0;
    SAE_ENFORCE(compressed || layout == H5D_COMPACT || *bytes <= file_bytes,
                "shard {}: dataset '{}' declares [{}, {}] elements ({} bytes) but the file holds "
                "{} bytes; it was never fully written or its header is damaged: re-write it",
                path, name, rows, d_model, *bytes, file_bytes);
}

// The bytes a shard holds: a file's size, an object's as listed.
int64_t shard_bytes(const ShardInfo& shard) {
    if (is_s3_url(shard.path)) return shard.bytes;
    struct stat st {};
    SAE_ENFORCE(::stat(shard.path.c_str(), &st) == 0, "shard {}: cannot stat ({})", shard.path,
                std::strerror(errno));
    return static_cast<int64_t>(st.st_size);
}

ShardMeta inspect_shard(const DatasetInfo& info, const ShardInfo& shard, const std::string& name) {
    const std::string& path = shard.path;
    h5::File f = io::open_shard(info, shard);
    if (!h5::link_exists(f.get(), name, path)) {
        std::string have;
        for (const auto& n : h5::list_root(f.get())) have += (have.empty() ? "" : ", ") + n;
        throw Error(fmt::format(
            "shard {}: no dataset '{}' (has: {}); every shard needs it, or set the dataset name",
            path, name, have.empty() ? "nothing" : have));
    }
    h5::Dataset d = h5::open_dataset(f.get(), name, path);
    std::vector<hsize_t> dims = h5::dataset_dims(d.get());
    SAE_ENFORCE(dims.size() == 2 || dims.size() == 3,
                "shard {}: dataset '{}' has {} dimensions; expected 2, [rows, d_model] (or 3, "
                "[rows, layers, d_model], for a multi-layer paired set)",
                path, name, dims.size());
    const auto shape = [&](const hsize_t* v) {
        std::string t;
        for (size_t i = 0; i < dims.size(); ++i) t += fmt::format("{}{}", i ? ", " : "", v[i]);
        return "[" + t + "]";
    };
    {
        // A shape beyond the dataset's maximum shape is a damaged header (HDF5 1.14 refuses to
        // open it; 1.10 does not, and then reads such a dataset inconsistently: found by
        // fuzzing, docs/fuzzing.md).
        h5::Space s(SAE_H5_CHECK(H5Dget_space(d.get())));
        hsize_t cur[3] = {0, 0, 0}, max[3] = {0, 0, 0};
        SAE_H5_CHECK(H5Sget_simple_extent_dims(s.get(), cur, max));
        for (size_t i = 0; i < dims.size(); ++i)
            SAE_ENFORCE(max[i] == H5S_UNLIMITED || cur[i] <= max[i],
                        "shard {}: dataset '{}' is {} but its maximum shape is {}; the file's "
                        "header is damaged, re-write or re-copy it",
                        path, name, shape(cur), shape(max));
    }
    ShardMeta m;
    m.rows = static_cast<int64_t>(dims[0]);
    m.d_model = static_cast<int64_t>(dims[1]);
    if (dims.size() == 3) {
        m.layers = static_cast<int64_t>(dims[1]);
        SAE_ENFORCE(
            m.layers > 0 && dims[2] > 0 &&
                !__builtin_mul_overflow(m.layers, static_cast<int64_t>(dims[2]), &m.d_model),
            "shard {}: dataset '{}' is {}; expected [rows, layers, d_model], none of them "
            "0",
            path, name, shape(dims.data()));
    }
    SAE_ENFORCE(m.rows > 0, "shard {}: dataset '{}' has 0 rows; remove the empty shard", path,
                name);
    SAE_ENFORCE(m.d_model > 0, "shard {}: dataset '{}' has 0 columns; expected [rows, d_model]",
                path, name);
    m.dtype = classify_type(d.get(), f.get(), path, name);
    check_storage(f.get(), d.get(), path, name, m.rows, m.d_model, dtype_size(m.dtype),
                  shard_bytes(shard));
    if (auto a = h5::read_attr_int64(d.get(), "d_model")) {
        // A 3-D dataset's d_model is one layer's width.
        const int64_t width = m.layers > 0 ? m.d_model / m.layers : m.d_model;
        SAE_ENFORCE(*a == width,
                    "shard {}: attribute d_model={} disagrees with the dataset's {} columns; fix "
                    "the attribute or re-write the shard",
                    path, *a, width);
    }
    m.model = attr_on(d.get(), f.get(), "model");
    m.hook = attr_on(d.get(), f.get(), "hook");
    return m;
}

// inspect_shard, with the failed request's own line when HDF5 failed reading an object (HDF5
// says only "read failed").
ShardMeta inspect(const DatasetInfo& info, const ShardInfo& shard, const std::string& name) {
    try {
        return inspect_shard(info, shard, name);
    } catch (const Error&) {
        io::s3_vfd_rethrow();
        throw;
    }
}

}  // namespace

DatasetInfo dataset_open(const std::string& path_or_glob, const std::string& dataset,
                         const S3Settings& s3) {
    auto guard = h5::lock();
    h5::init();
    DatasetInfo info;
    info.source = path_or_glob;
    info.dataset = dataset;
    info.s3 = s3;
    std::vector<ShardInfo> listed;
    if (is_s3_url(path_or_glob)) {
        listed = list_objects(path_or_glob, s3);
    } else {
        for (std::string& p : list_shards(path_or_glob))
            listed.push_back(ShardInfo{p, 0, 0, 0, ""});
    }
    std::vector<std::string> paths;
    for (const ShardInfo& s : listed) paths.push_back(s.path);
    size_t early = 0;  // objects whose first blocks are being fetched ahead of their opening
    for (size_t i = 0; i < paths.size(); ++i) {
        // Objects: the next 32's first blocks under way while this one is validated.
        for (; is_s3_url(path_or_glob) && early < std::min(paths.size(), i + 32); ++early)
            io::s3_vfd_prefetch(*s3_client(s3, path_or_glob), io::s3_object_of(listed[early]));
        ShardMeta m = inspect(info, listed[i], dataset);
        if (i == 0) {
            info.d_model = m.d_model;
            info.layers = m.layers;
            info.dtype = m.dtype;
            info.model = m.model;
            info.hook = m.hook;
        } else {
            SAE_ENFORCE(m.d_model == info.d_model,
                        "shard {}: d_model {} differs from {} in {}; all shards of a dataset must "
                        "come from the same hook",
                        paths[i], m.d_model, info.d_model, paths[0]);
            SAE_ENFORCE(m.layers == info.layers,
                        "shard {}: dataset '{}' holds {} layer(s) a row, but {} holds {}; all "
                        "shards of a dataset must have one shape",
                        paths[i], dataset, m.layers, paths[0], info.layers);
            SAE_ENFORCE(m.dtype == info.dtype,
                        "shard {}: dtype {} differs from {} in {}; convert the shards to one dtype",
                        paths[i], dtype_name(m.dtype), dtype_name(info.dtype), paths[0]);
        }
        info.shards.push_back(
            ShardInfo{paths[i], m.rows, info.total_rows, listed[i].bytes, listed[i].etag});
        SAE_ENFORCE(!__builtin_add_overflow(info.total_rows, m.rows, &info.total_rows),
                    "dataset {}: the shards' rows add up to more than 2^63 (at shard {}); the "
                    "shards' headers are damaged",
                    path_or_glob, paths[i]);
    }
    return info;
}

// --- paired datasets ----------------------------------------------------------------------

namespace {

// Up to `count` token ids of a shard from row `row` (int32; empty when the shard has none).
std::vector<int32_t> token_ids_at(hid_t file, const std::string& path, int64_t row, int64_t count) {
    if (!h5::link_exists(file, "token_ids")) return {};
    h5::Dataset ds = h5::open_dataset(file, "token_ids", path);
    const std::vector<hsize_t> dims = h5::dataset_dims(ds.get());
    if (dims.size() != 1 || static_cast<int64_t>(dims[0]) < row + count) return {};
    std::vector<int32_t> out(static_cast<size_t>(count));
    h5::Space file_space(SAE_H5_CHECK(H5Dget_space(ds.get())));
    const hsize_t start[1] = {static_cast<hsize_t>(row)}, n[1] = {static_cast<hsize_t>(count)};
    SAE_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, n, nullptr));
    h5::Space mem(SAE_H5_CHECK(H5Screate_simple(1, n, nullptr)));
    SAE_H5_CHECK(
        H5Dread(ds.get(), H5T_NATIVE_INT32, mem.get(), file_space.get(), H5P_DEFAULT, out.data()));
    return out;
}

}  // namespace

std::vector<int32_t> read_row_ints(const DatasetInfo& info, const std::string& name, RowRange range,
                                   std::string* why) {
    std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(range.size(), 0)));
    for (const ShardInfo& s : info.shards) {
        if (!shard_overlaps(s, range)) continue;
        if (is_s3_url(s.path)) {
            *why = fmt::format("{} is an object (s3://): its {} are not read", s.path, name);
            return {};
        }
        h5::File f = h5::open_file(s.path);
        if (!h5::link_exists(f.get(), name, s.path)) {
            *why = fmt::format("{} has no '{}' dataset", s.path, name);
            return {};
        }
        h5::Dataset ds = h5::open_dataset(f.get(), name, s.path);
        const std::vector<hsize_t> dims = h5::dataset_dims(ds.get());
        h5::Type t(SAE_H5_CHECK(H5Dget_type(ds.get())));
        if (H5Tget_class(t.get()) != H5T_INTEGER || dims.size() != 1 ||
            static_cast<int64_t>(dims[0]) != s.rows) {
            *why = fmt::format("{}: '{}' is not one integer a row ({} rows)", s.path, name, s.rows);
            return {};
        }
        const int64_t lo = std::max(range.begin, s.first_row);
        const int64_t hi = std::min(range.end, s.first_row + s.rows);
        h5::Space file_space(SAE_H5_CHECK(H5Dget_space(ds.get())));
        const hsize_t start[1] = {static_cast<hsize_t>(lo - s.first_row)};
        const hsize_t n[1] = {static_cast<hsize_t>(hi - lo)};
        SAE_H5_CHECK(
            H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, n, nullptr));
        h5::Space mem(SAE_H5_CHECK(H5Screate_simple(1, n, nullptr)));
        SAE_ENFORCE(H5Dread(ds.get(), H5T_NATIVE_INT32, mem.get(), file_space.get(), H5P_DEFAULT,
                            out.data() + (lo - range.begin)) >= 0,
                    "shard {}: reading '{}' rows [{}, {}) failed ({})", s.path, name, lo, hi,
                    h5::last_error());
    }
    return out;
}

bool dataset_check_paired(const DatasetInfo& input, const DatasetInfo& target,
                          const std::string& input_key, const std::string& target_key) {
    const std::string hint =
        "; both sets must come from one extraction (tools/extract_activations.py with both "
        "hooks, the same text and --max-tokens)";
    SAE_ENFORCE(input.total_rows == target.total_rows, "{} {} holds {} rows, but {} {} holds {}{}",
                target_key, target.source, target.total_rows, input_key, input.source,
                input.total_rows, hint);
    SAE_ENFORCE(input.shards.size() == target.shards.size(),
                "{} {} has {} shard(s), but {} {} has {}{}", target_key, target.source,
                target.shards.size(), input_key, input.source, input.shards.size(), hint);
    SAE_ENFORCE(input.d_model == target.d_model,
                "{} {} has d_model {}, but {} {} has {}: a transcoder here maps d_model values "
                "to as many (an MLP's input to its output)",
                target_key, target.source, target.d_model, input_key, input.source, input.d_model);
    SAE_ENFORCE(input.layers == target.layers,
                "{} {} holds {} layer(s) a row, but {} {} holds {}{}", target_key, target.source,
                target.layers, input_key, input.source, input.layers, hint);
    SAE_ENFORCE(input.dtype == target.dtype,
                "{} {} stores {}, but {} {} stores {}; write both sets with one --dtype",
                target_key, target.source, dtype_name(target.dtype), input_key, input.source,
                dtype_name(input.dtype));
    auto guard = h5::lock();
    h5::init();
    bool compared = false;
    for (size_t i = 0; i < input.shards.size(); ++i) {
        const ShardInfo& a = input.shards[i];
        const ShardInfo& b = target.shards[i];
        SAE_ENFORCE(a.rows == b.rows, "{} shard {} holds {} rows, but its partner {} holds {}{}",
                    target_key, b.path, b.rows, a.path, a.rows, hint);
        // The tokens behind the rows, where both shards name them: the first and the last
        // 4096 token ids (a different text, order or --max-tokens shows there), and the
        // extraction's digest of its contexts.
        h5::File fa = io::open_shard(input, a), fb = io::open_shard(target, b);
        h5::Dataset da = h5::open_dataset(fa.get(), input.dataset, a.path);
        h5::Dataset db = h5::open_dataset(fb.get(), target.dataset, b.path);
        for (const std::string name : {"contexts_sha256", "first_context"}) {
            const std::string va = attr_on(da.get(), fa.get(), name.c_str());
            const std::string vb = attr_on(db.get(), fb.get(), name.c_str());
            compared = compared || (name == "contexts_sha256" && !va.empty() && !vb.empty());
            SAE_ENFORCE(va.empty() || vb.empty() || va == vb,
                        "{} shard {}: attribute {} ({}) differs from its partner {} ({}){}",
                        target_key, b.path, name, vb, a.path, va, hint);
        }
        const int64_t n = std::min<int64_t>(4096, a.rows);
        for (int64_t row : {int64_t{0}, a.rows - n}) {
            const std::vector<int32_t> ta = token_ids_at(fa.get(), a.path, row, n);
            const std::vector<int32_t> tb = token_ids_at(fb.get(), b.path, row, n);
            if (ta.empty() || tb.empty()) break;
            compared = true;
            const auto m = std::mismatch(ta.begin(), ta.end(), tb.begin());
            SAE_ENFORCE(m.first == ta.end(),
                        "{} shard {}: row {} is token id {}, but row {} of its partner {} is "
                        "token id {}: the rows are not aligned{}",
                        target_key, b.path, row + (m.first - ta.begin()), *m.second,
                        row + (m.first - ta.begin()), a.path, *m.first, hint);
        }
    }
    return compared;
}

// --- packing ------------------------------------------------------------------------------

namespace {

class Packer {
public:
    void i64(int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
    void str(const std::string& v) {
        i64(static_cast<int64_t>(v.size()));
        out += v;
    }
    std::string out;
};

class Unpacker {
public:
    explicit Unpacker(const std::string& b) : bytes(b) {}
    int64_t i64() {
        need(sizeof(int64_t));
        int64_t v = 0;
        std::memcpy(&v, bytes.data() + pos, sizeof(v));
        pos += sizeof(v);
        return v;
    }
    std::string str() {
        const int64_t n = i64();
        SAE_ENFORCE(n >= 0, "dataset description is damaged (negative length)");
        need(static_cast<size_t>(n));
        std::string v = bytes.substr(pos, static_cast<size_t>(n));
        pos += static_cast<size_t>(n);
        return v;
    }
    bool done() const { return pos == bytes.size(); }

private:
    void need(size_t n) const {
        SAE_ENFORCE(n <= bytes.size() - pos, "dataset description is truncated");
    }
    const std::string& bytes;
    size_t pos = 0;
};

constexpr int64_t kPackMagic = 0x5341454453493033;  // "SAEDSI03"

}  // namespace

std::string dataset_info_pack(const DatasetInfo& info) {
    Packer p;
    p.i64(kPackMagic);
    p.str(info.source), p.str(info.dataset), p.str(info.model), p.str(info.hook);
    p.i64(info.d_model), p.i64(info.layers), p.i64(info.total_rows);
    p.i64(static_cast<int64_t>(info.dtype));
    p.str(info.s3.endpoint), p.str(info.s3.region), p.str(info.s3.addressing);
    p.i64(info.s3.anonymous ? 1 : 0), p.i64(info.s3.connections), p.i64(info.s3.request_bytes);
    p.i64(info.s3.retries), p.i64(static_cast<int64_t>(info.s3.timeout_s * 1000));
    p.i64(static_cast<int64_t>(info.shards.size()));
    for (const ShardInfo& s : info.shards)
        p.str(s.path), p.i64(s.rows), p.i64(s.first_row), p.i64(s.bytes), p.str(s.etag);
    return p.out;
}

DatasetInfo dataset_info_unpack(const std::string& bytes) {
    Unpacker u(bytes);
    SAE_ENFORCE(u.i64() == kPackMagic, "not a packed dataset description");
    DatasetInfo info;
    info.source = u.str(), info.dataset = u.str(), info.model = u.str(), info.hook = u.str();
    info.d_model = u.i64(), info.layers = u.i64(), info.total_rows = u.i64();
    SAE_ENFORCE(info.layers >= 0 && (info.layers == 0 || info.d_model % info.layers == 0),
                "dataset description is damaged ({} layers of d_model {})", info.layers,
                info.d_model);
    const int64_t t = u.i64();
    SAE_ENFORCE(t >= 0 && t <= static_cast<int64_t>(DType::bf16),
                "dataset description is damaged (dtype {})", t);
    info.dtype = static_cast<DType>(t);
    info.s3.endpoint = u.str(), info.s3.region = u.str(), info.s3.addressing = u.str();
    info.s3.anonymous = u.i64() != 0, info.s3.connections = u.i64();
    info.s3.request_bytes = u.i64(), info.s3.retries = u.i64();
    info.s3.timeout_s = static_cast<double>(u.i64()) / 1000;
    const int64_t n = u.i64();
    SAE_ENFORCE(n >= 0, "dataset description is damaged ({} shards)", n);
    for (int64_t i = 0; i < n; ++i) {
        ShardInfo s;
        s.path = u.str(), s.rows = u.i64(), s.first_row = u.i64(), s.bytes = u.i64();
        s.etag = u.str();
        info.shards.push_back(std::move(s));
    }
    SAE_ENFORCE(u.done(), "dataset description has trailing bytes");
    return info;
}

// --- partitioning --------------------------------------------------------------------------

RowRange partition_rows(int64_t total_rows, int rank, int world) {
    SAE_ENFORCE(world >= 1, "cannot partition rows over {} ranks; the world size must be >= 1",
                world);
    SAE_ENFORCE(rank >= 0 && rank < world, "rank {} is out of range for a world of {} ranks", rank,
                world);
    SAE_ENFORCE(total_rows >= world,
                "cannot split {} rows over {} ranks: every rank needs at least one row; use "
                "fewer ranks or more data",
                total_rows, world);
    int64_t base = total_rows / world, extra = total_rows % world;
    int64_t begin = rank * base + std::min<int64_t>(rank, extra);
    return RowRange{begin, begin + base + (rank < extra ? 1 : 0)};
}

// --- lookup ------------------------------------------------------------------------------

size_t shard_index(const DatasetInfo& info, int64_t row) {
    // Last shard whose first_row <= row.
    auto it = std::upper_bound(info.shards.begin(), info.shards.end(), row,
                               [](int64_t r, const ShardInfo& s) { return r < s.first_row; });
    return static_cast<size_t>(std::distance(info.shards.begin(), it) - 1);
}

bool shard_overlaps(const ShardInfo& s, RowRange range) {
    return s.first_row < range.end && s.first_row + s.rows > range.begin;
}

}  // namespace saetrain
