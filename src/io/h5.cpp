// h5.cpp — RAII helpers around the HDF5 C API (see h5.h).
#include "h5.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace saetrain::h5 {

void init() {
    static std::once_flag once;
    std::call_once(once, [] { H5open(); });
    // Errors come out as one-line saetrain::Error messages, not HDF5's stack dumps. A
    // thread-safe HDF5 keeps this setting per thread, and checkpoints are written by a thread of
    // their own: switch it off in every thread that calls in.
    thread_local bool quiet = false;
    if (!quiet) {
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
        quiet = true;
    }
}

std::unique_lock<std::recursive_mutex> lock() {
    static std::recursive_mutex m;
    return std::unique_lock<std::recursive_mutex>(m);
}

std::string last_error() {
    std::string msg;
    // Walk upward from the innermost entry: the first has the most specific description.
    H5Ewalk2(
        H5E_DEFAULT, H5E_WALK_UPWARD,
        [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
            if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
            return 0;
        },
        &msg);
    return msg;
}

std::string os_error() {
    std::string msg;
    // HDF5's POSIX driver records "..., errno = 28, error message = 'No space left on device'".
    H5Ewalk2(
        H5E_DEFAULT, H5E_WALK_DOWNWARD,
        [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
            auto* m = static_cast<std::string*>(out);
            const char* p = e->desc ? std::strstr(e->desc, "error message = '") : nullptr;
            if (!m->empty() || !p) return 0;
            p += std::strlen("error message = '");
            const char* q = std::strchr(p, '\'');
            if (q) m->assign(p, q);
            return 0;
        },
        &msg);
    return msg;
}

std::string file_name(hid_t loc) {
    const ssize_t n = H5Fget_name(loc, nullptr, 0);
    if (n <= 0) return "(unknown file)";
    std::string name(static_cast<size_t>(n) + 1, '\0');
    H5Fget_name(loc, name.data(), name.size());
    name.resize(static_cast<size_t>(n));
    return name;
}

// --- files and datasets --------------------------------------------------------------------

File open_file(const std::string& path) {
    require_regular_file(path, "file");  // HDF5 would block in open() on a FIFO
    init();
    File f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f) {
        std::string why = last_error();
        throw Error(fmt::format(
            "file {}: cannot open as HDF5{}; check that it exists and is a complete .h5 file "
            "(re-write it if it was truncated)",
            path, why.empty() ? "" : " (" + why + ")"));
    }
    return f;
}

File create_file(const std::string& path) {
    init();
    File f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!f) {
        std::string why = last_error();
        throw Error(fmt::format("file {}: cannot create{}; check the directory is writable", path,
                                why.empty() ? "" : " (" + why + ")"));
    }
    return f;
}

namespace {

// "FILE:OBJECT" of the last external link this thread refused to follow, or "".
thread_local std::string refused_external_link;

herr_t refuse_external_link(const char*, const char*, const char* file, const char* object,
                            unsigned*, hid_t, void*) {
    refused_external_link = fmt::format("{}:{}", file, object);
    return -1;  // HDF5 fails the traversal before it opens `file`
}

// Link access with external links refused: an external link would make HDF5 open another file
// (any path, a FIFO too) and read a dataset that is not stored in the file we were given.
// `base` (a link or dataset access list, or H5P_DEFAULT) is copied, not changed.
Plist no_external_links(hid_t base, hid_t cls) {
    Plist p(SAE_H5_CHECK(base == H5P_DEFAULT ? H5Pcreate(cls) : H5Pcopy(base)));
    SAE_H5_CHECK(H5Pset_elink_cb(p.get(), refuse_external_link, nullptr));
    return p;
}

// Throws naming `path` when the last failed traversal met an external link.
void throw_if_external_link(hid_t loc, const std::string& path, const std::string& name) {
    if (refused_external_link.empty()) return;
    const std::string target = std::exchange(refused_external_link, std::string());
    throw Error(fmt::format(
        "file {}: '{}' leads through an external link to {}; saetrain reads only data stored "
        "in the file itself (copy it in with h5copy, or point the config at that file)",
        path.empty() ? file_name(loc) : path, name, target));
}

}  // namespace

bool link_exists(hid_t loc, const std::string& name, const std::string& path) {
    Plist lapl = no_external_links(H5P_DEFAULT, H5P_LINK_ACCESS);
    refused_external_link.clear();
    const htri_t r = H5Lexists(loc, name.c_str(), lapl.get());
    throw_if_external_link(loc, path, name);
    return r > 0;
}

std::vector<std::string> list_root(hid_t file) {
    std::vector<std::string> names;
    hsize_t idx = 0;
    H5Literate(
        file, H5_INDEX_NAME, H5_ITER_INC, &idx,
        [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
            static_cast<std::vector<std::string>*>(out)->emplace_back(name);
            return 0;
        },
        &names);
    return names;
}

Dataset open_dataset(hid_t file, const std::string& name, const std::string& path, hid_t dapl) {
    if (!link_exists(file, name, path)) {
        std::string have;
        for (const auto& n : list_root(file)) have += (have.empty() ? "" : ", ") + n;
        throw Error(
            fmt::format("file {}: no dataset '{}' (has: {}); write it under that name or "
                        "choose the dataset name",
                        path, name, have.empty() ? "nothing" : have));
    }
    Plist access = no_external_links(dapl, H5P_DATASET_ACCESS);
    Dataset d(H5Dopen2(file, name.c_str(), access.get()));
    throw_if_external_link(file, path, name);
    SAE_ENFORCE(d.valid(), "file {}: '{}' is not a readable dataset ({})", path, name,
                last_error());
    return d;
}

namespace {
#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info1_t;  // the 1.10 record (address, header size) under its 1.12 name
#else
using ObjectInfo = H5O_info_t;
#endif
}  // namespace

std::vector<MetaExtent> metadata_extents(hid_t file) {
    std::vector<MetaExtent> out;
    H5F_info2_t fi{};
    SAE_H5_CHECK(H5Fget_info2(file, &fi));
    out.push_back({0, std::max<hsize_t>(fi.super.super_size, 1)});
    SAE_H5_CHECK(H5Ovisit2(
        file, H5_INDEX_NAME, H5_ITER_NATIVE,
        [](hid_t, const char*, const ObjectInfo* info, void* data) -> herr_t {
            static_cast<std::vector<MetaExtent>*>(data)->push_back(
                {info->addr, info->hdr.nchunks == 1 ? info->hdr.space.total : 1});
            return 0;
        },
        &out, H5O_INFO_BASIC | H5O_INFO_HDR));
    return out;
}

std::vector<hsize_t> dataset_dims(hid_t dset) {
    Space s(SAE_H5_CHECK(H5Dget_space(dset)));
    int nd = SAE_H5_CHECK(H5Sget_simple_extent_ndims(s.get()));
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    SAE_H5_CHECK(H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr));
    return dims;
}

void write_f32(hid_t loc, const std::string& name, const float* data,
               const std::vector<hsize_t>& dims) {
    Space s(SAE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
    Dataset d(SAE_H5_CHECK(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, s.get(), H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT)));
    if (H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        const std::string os = os_error();
        throw Error(fmt::format("file {}: writing dataset '{}' failed ({}); is the disk full?",
                                file_name(loc), name, os.empty() ? last_error() : os));
    }
}

std::vector<float> read_f32(hid_t loc, const std::string& name, const std::string& path,
                            std::vector<hsize_t>* dims) {
    Dataset d = open_dataset(loc, name, path);
    Type t(SAE_H5_CHECK(H5Dget_type(d.get())));
    SAE_ENFORCE(H5Tget_class(t.get()) == H5T_FLOAT,
                "file {}: dataset '{}' is not floating point; expected float32", path, name);
    *dims = dataset_dims(d.get());
    // The element count comes from the file's header: before allocating for it, check that the
    // file actually stores that much data, so a damaged or hostile header (a [2^20, 2^20]
    // dataset with no chunks written) is an error, not a terabyte allocation. Unfiltered
    // storage holds every element; deflate, the strongest common filter, compresses at most
    // ~1032:1, so filtered storage may hold 1032x fewer bytes than the elements.
    hsize_t n = 1;
    bool overflow = false;
    for (hsize_t x : *dims) overflow = overflow || __builtin_mul_overflow(n, x, &n);
    const hsize_t elem = H5Tget_size(t.get());  // 0 when the stored type is unreadable
    SAE_ENFORCE(elem > 0,
                "file {}: dataset '{}' has an unreadable element type; the file is damaged", path,
                name);
    hsize_t want = 0;
    overflow = overflow || __builtin_mul_overflow(n, elem, &want);
    Plist dcpl(SAE_H5_CHECK(H5Dget_create_plist(d.get())));
    const hsize_t ratio = H5Pget_nfilters(dcpl.get()) > 0 ? 1032 : 1;
    // The storage size comes from the header too (a contiguous layout's size field): the bytes
    // can be no more than the file holds.
    hsize_t file_bytes = 0;
    {
        File fh(SAE_H5_CHECK(H5Iget_file_id(loc)));
        SAE_H5_CHECK(H5Fget_filesize(fh.get(), &file_bytes));
    }
    const hsize_t stored = std::min<hsize_t>(H5Dget_storage_size(d.get()), file_bytes);
    SAE_ENFORCE(!overflow && want / ratio <= stored,
                "file {}: dataset '{}' declares {} elements but stores only {} bytes; the file "
                "is truncated, damaged or was not completely written",
                path, name, overflow ? std::string("too many") : std::to_string(n), stored);
    std::vector<float> out(n);
    if (n > 0) {
        herr_t r = H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
        SAE_ENFORCE(r >= 0, "file {}: reading dataset '{}' failed ({}); the file may be damaged",
                    path, name, last_error());
    }
    return out;
}

// --- attributes ----------------------------------------------------------------------------

bool attr_exists(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
    if (attr_exists(obj, name)) SAE_H5_CHECK(H5Adelete(obj, name.c_str()));
    // Variable-length UTF-8, as h5py writes `attrs["x"] = "..."`, so Python reads back a str.
    Type t(SAE_H5_CHECK(H5Tcopy(H5T_C_S1)));
    SAE_H5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE));
    SAE_H5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8));
    Space s(SAE_H5_CHECK(H5Screate(H5S_SCALAR)));
    Attr a(SAE_H5_CHECK(H5Acreate2(obj, name.c_str(), t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT)));
    const char* p = value.c_str();
    SAE_H5_CHECK(H5Awrite(a.get(), t.get(), &p));
}

void write_attr_int64(hid_t obj, const std::string& name, int64_t value) {
    if (attr_exists(obj, name)) SAE_H5_CHECK(H5Adelete(obj, name.c_str()));
    Space s(SAE_H5_CHECK(H5Screate(H5S_SCALAR)));
    Attr a(SAE_H5_CHECK(
        H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, s.get(), H5P_DEFAULT, H5P_DEFAULT)));
    SAE_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &value));
}

std::optional<std::string> read_attr_string(hid_t obj, const std::string& name) {
    if (!attr_exists(obj, name)) return std::nullopt;
    Attr a(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
    if (!a) return std::nullopt;
    Type ft(H5Aget_type(a.get()));
    if (!ft || H5Tget_class(ft.get()) != H5T_STRING) return std::nullopt;
    Space s(SAE_H5_CHECK(H5Aget_space(a.get())));
    hssize_t npts = H5Sget_simple_extent_npoints(s.get());
    if (npts < 1) return std::nullopt;
    Type mt(SAE_H5_CHECK(H5Tcopy(H5T_C_S1)));
    SAE_H5_CHECK(H5Tset_cset(mt.get(), H5Tget_cset(ft.get())));
    if (H5Tis_variable_str(ft.get()) > 0) {
        SAE_H5_CHECK(H5Tset_size(mt.get(), H5T_VARIABLE));
        std::vector<char*> ptrs(static_cast<size_t>(npts), nullptr);
        if (H5Aread(a.get(), mt.get(), ptrs.data()) < 0) return std::nullopt;
        std::string out = ptrs[0] ? ptrs[0] : "";
        H5Dvlen_reclaim(mt.get(), s.get(), H5P_DEFAULT, ptrs.data());
        return out;
    }
    size_t size = H5Tget_size(ft.get());
    SAE_H5_CHECK(H5Tset_size(mt.get(), size));
    SAE_H5_CHECK(H5Tset_strpad(mt.get(), H5T_STR_NULLPAD));
    std::vector<char> buf(size * static_cast<size_t>(npts) + 1, '\0');
    if (H5Aread(a.get(), mt.get(), buf.data()) < 0) return std::nullopt;
    std::string out(buf.data(), size);
    out.resize(out.find('\0') == std::string::npos ? out.size() : out.find('\0'));
    return out;
}

std::optional<int64_t> read_attr_int64(hid_t obj, const std::string& name) {
    if (!attr_exists(obj, name)) return std::nullopt;
    Attr a(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
    if (!a) return std::nullopt;
    Type ft(H5Aget_type(a.get()));
    if (!ft || H5Tget_class(ft.get()) != H5T_INTEGER) return std::nullopt;
    Space s(SAE_H5_CHECK(H5Aget_space(a.get())));
    hssize_t npts = H5Sget_simple_extent_npoints(s.get());
    if (npts < 1) return std::nullopt;
    std::vector<int64_t> v(static_cast<size_t>(npts));
    if (H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0) return std::nullopt;
    return v[0];
}

}  // namespace saetrain::h5
