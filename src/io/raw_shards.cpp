// raw_shards.cpp — layout probing, pread of stored rows, H5Dread fallback, and read_rows
// (shards.h) built on them.
#include "raw_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "h5.h"
#include "s3_io.h"
#include "s3_vfd.h"
#include "saetrain/error.h"

namespace saetrain::io {

h5::File open_shard(const DatasetInfo& info, const ShardInfo& shard) {
    if (!is_s3_url(shard.path)) return h5::open_file(shard.path);
    return s3_open_file(s3_client(info.s3, info.source), s3_object_of(shard));
}

S3Object s3_object_of(const ShardInfo& shard) {
    const S3Url u = s3_url_parse(shard.path);
    S3Object o;
    o.bucket = u.bucket, o.key = u.key, o.size = shard.bytes, o.etag = shard.etag;
    return o;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "raw shard reads assume a little-endian host (the stored order of every shard seen)");

// --- layout --------------------------------------------------------------------------------

namespace {

// True when the stored element type is exactly what widen_to_f32 expects for `t`, in
// little-endian order; else *why says what differs.
bool plain_type(hid_t dset, DType t, std::string* why) {
    h5::Type ft(SAE_H5_CHECK(H5Dget_type(dset)));
    if (H5Tget_order(ft.get()) != H5T_ORDER_LE) {
        *why = "elements are not little-endian";
        return false;
    }
    const H5T_class_t cls = H5Tget_class(ft.get());
    const size_t size = H5Tget_size(ft.get());
    if (t == DType::bf16 && cls == H5T_INTEGER && size == 2) return true;  // raw 16-bit words
    if (cls != H5T_FLOAT || size != static_cast<size_t>(dtype_size(t))) {
        *why = "element type is not a plain IEEE float";
        return false;
    }
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    SAE_H5_CHECK(H5Tget_fields(ft.get(), &spos, &epos, &esize, &mpos, &msize));
    const size_t want[3][5] = {{31, 23, 8, 0, 23}, {15, 10, 5, 0, 10}, {15, 7, 8, 0, 7}};
    const size_t* w = want[t == DType::f32 ? 0 : t == DType::f16 ? 1 : 2];
    if (spos != w[0] || epos != w[1] || esize != w[2] || mpos != w[3] || msize != w[4] ||
        H5Tget_offset(ft.get()) != 0 || H5Tget_precision(ft.get()) != size * 8) {
        *why = "float fields differ from IEEE";
        return false;
    }
    return true;
}

// The extents of a chunked dataset whose chunks span whole rows, merged where adjacent on disk;
// false (and out->why) when some chunk cannot be read with pread.
bool chunk_extents(hid_t f, hid_t d, hid_t dcpl, const ShardInfo& shard, const DatasetInfo& info,
                   ShardExtents* out) {
    if (H5Pget_nfilters(dcpl) > 0) {
        out->why = "chunks are filtered (compressed)";
        return false;
    }
    // A row is [d_model] of a 2-D dataset, [L, d] of a 3-D one: a chunk must hold whole ones.
    const int nd = info.layers > 0 ? 3 : 2;
    hsize_t cdims[3] = {0, 0, 0};
    const bool whole = H5Pget_chunk(dcpl, nd, cdims) == nd &&
                       (nd == 2 ? static_cast<int64_t>(cdims[1]) == info.d_model
                                : static_cast<int64_t>(cdims[1]) == info.layers &&
                                      static_cast<int64_t>(cdims[1] * cdims[2]) == info.d_model);
    if (!whole) {
        out->why = "chunks do not span whole rows";
        return false;
    }
    const int64_t row_bytes = info.d_model * dtype_size(info.dtype);
    const int64_t cr = static_cast<int64_t>(cdims[0]);
    const std::vector<h5::MetaExtent> meta = h5::metadata_extents(f);
    for (int64_t r = 0; r < shard.rows; r += cr) {
        hsize_t coord[3] = {static_cast<hsize_t>(r), 0, 0};
        unsigned mask = 0;
        haddr_t a = HADDR_UNDEF;
        hsize_t size = 0;
        // H5Dget_chunk_info_by_coord and H5Dread can disagree on a damaged chunk index (found
        // by fuzzing: a record listed by the first is not found by the lookup the second uses,
        // which then returns fill values; or a record at address 0, the superblock). So the
        // chunk must also be found, at its full size, by the lookup behind H5Dread
        // (H5Dget_chunk_storage_size); else H5Dread is used, and the raw path never delivers
        // other bytes than it would.
        hsize_t looked_up = 0;
        if (H5Dget_chunk_info_by_coord(d, coord, &mask, &a, &size) < 0 || a == HADDR_UNDEF ||
            a == 0 || H5Dget_chunk_storage_size(d, coord, &looked_up) < 0 ||
            looked_up != static_cast<hsize_t>(cr * row_bytes)) {
            out->why = "a chunk is not allocated or the chunk index is inconsistent";
            out->extents.clear();
            return false;
        }
        const int64_t n = std::min(cr, shard.rows - r);
        // HDF5 would read such a chunk too, from the file's own metadata: refused either way.
        for (const h5::MetaExtent& m : meta)
            SAE_ENFORCE(!m.overlaps(a, size),
                        "shard {}: the chunk of rows [{}, {}) of dataset '{}' lies at offset {}, "
                        "over the file's own metadata (at {}); its chunk index is damaged: "
                        "re-write the shard",
                        shard.path, r, r + n, info.dataset, a, m.addr);
        Extent e{r, n, static_cast<int64_t>(a)};
        Extent* last = out->extents.empty() ? nullptr : &out->extents.back();
        // Merge when this chunk starts where the previous full chunk's bytes end.
        if (last && last->rows % cr == 0 && last->offset + last->rows * row_bytes == e.offset)
            last->rows += n;
        else
            out->extents.push_back(e);
    }
    return true;
}

// The extents of dataset d, when its storage can be read with pread; false and out->why when
// not.
bool storage_extents(hid_t f, hid_t d, const ShardInfo& shard, const DatasetInfo& info,
                     ShardExtents* out) {
    if (!plain_type(d, info.dtype, &out->why)) return false;
    {
        // HDF5 addresses are relative to the end of a user block; only trust them without one.
        h5::Plist fcpl(SAE_H5_CHECK(H5Fget_create_plist(f)));
        hsize_t ub = 0;
        SAE_H5_CHECK(H5Pget_userblock(fcpl.get(), &ub));
        if (ub != 0) {
            out->why = "file has a user block";
            return false;
        }
    }
    h5::Plist dcpl(SAE_H5_CHECK(H5Dget_create_plist(d)));
    const H5D_layout_t lay = H5Pget_layout(dcpl.get());
    if (lay == H5D_CHUNKED) return chunk_extents(f, d, dcpl.get(), shard, info, out);
    if (lay != H5D_CONTIGUOUS) {
        out->why = "compact layout";
        return false;
    }
    const haddr_t a = H5Dget_offset(d);
    if (a == HADDR_UNDEF || a == 0) {  // address 0 is the superblock, never data
        out->why = "storage not allocated";
        return false;
    }
    out->extents.push_back(Extent{0, shard.rows, static_cast<int64_t>(a)});
    return true;
}

// Checks the extents lie inside the file and records which file they describe (an object: its
// size as listed; its ETag is checked by every read).
void stat_extents(const ShardInfo& shard, int64_t row_bytes, ShardExtents* out) {
    if (is_s3_url(shard.path)) {
        for (const Extent& e : out->extents)
            SAE_ENFORCE(e.offset + e.rows * row_bytes <= shard.bytes,
                        "shard {}: rows [{}, {}) lie beyond the end of the object ({} bytes); it "
                        "is truncated, re-upload it",
                        shard.path, e.row, e.row + e.rows, shard.bytes);
        out->size = shard.bytes;
        return;
    }
    struct stat st {};
    SAE_ENFORCE(::stat(shard.path.c_str(), &st) == 0, "shard {}: cannot stat ({})", shard.path,
                std::strerror(errno));
    for (const Extent& e : out->extents) {
        SAE_ENFORCE(e.offset + e.rows * row_bytes <= static_cast<int64_t>(st.st_size),
                    "shard {}: rows [{}, {}) lie beyond the end of the file ({} bytes); the file "
                    "is truncated, re-write or re-copy it",
                    shard.path, e.row, e.row + e.rows, st.st_size);
    }
    out->dev = static_cast<uint64_t>(st.st_dev), out->ino = static_cast<uint64_t>(st.st_ino);
    out->size = static_cast<int64_t>(st.st_size);
    out->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Throws naming the shard when dataset d is not the [rows, d_model] that dataset_open saw.
void check_shape(hid_t d, const ShardInfo& shard, const DatasetInfo& info) {
    const std::vector<hsize_t> dims = h5::dataset_dims(d);
    const bool same = info.layers > 0
                          ? dims.size() == 3 && static_cast<int64_t>(dims[1]) == info.layers &&
                                static_cast<int64_t>(dims[1] * dims[2]) == info.d_model
                          : dims.size() == 2 && static_cast<int64_t>(dims[1]) == info.d_model;
    SAE_ENFORCE(same && static_cast<int64_t>(dims[0]) == shard.rows,
                "shard {}: its shape changed since the dataset was opened; do not modify shards "
                "during a run",
                shard.path);
}

}  // namespace

ShardExtents probe_extents(const ShardInfo& shard, const DatasetInfo& info) {
    auto guard = h5::lock();
    h5::init();
    ShardExtents out;
    h5::File f = open_shard(info, shard);
    h5::Dataset d = h5::open_dataset(f.get(), info.dataset, shard.path);
    check_shape(d.get(), shard, info);
    if (!storage_extents(f.get(), d.get(), shard, info, &out)) return out;
    stat_extents(shard, info.d_model * dtype_size(info.dtype), &out);
    out.raw = true;
    return out;
}

// --- reader --------------------------------------------------------------------------------

namespace {

// Calls f(shard, shard_row, n) for the pieces of global rows [row, row + rows), shard by shard.
template <class F>
void for_each_shard_piece(const DatasetInfo& info, int64_t row, int64_t rows, F f) {
    while (rows > 0) {
        const size_t i = shard_index(info, row);
        const ShardInfo& s = info.shards[i];
        const int64_t here = std::min(rows, s.first_row + s.rows - row);
        f(i, row - s.first_row, here);
        row += here, rows -= here;
    }
}

// Calls f(r, offset, n) for the runs on disk of a raw shard's rows [r, r + n) (shard-relative):
// n rows from shard row r lie at byte `offset` of the file.
template <class F>
void for_each_extent(const ShardExtents& L, int64_t r, int64_t n, int64_t row_bytes, F f) {
    auto e = std::upper_bound(L.extents.begin(), L.extents.end(), r,
                              [](int64_t v, const Extent& x) { return v < x.row; });
    --e;  // extents start at row 0 and tile the shard
    while (n > 0) {
        const int64_t k = std::min(n, e->row + e->rows - r);
        f(r, e->offset + (r - e->row) * row_bytes, k);
        r += k, n -= k;
        ++e;
    }
}

}  // namespace

struct RawRowReader::Impl {
    DatasetInfo info;
    RowRange range;
    int64_t row_bytes = 0;
    size_t first = 0, last = 0;  // shards overlapping the range: [first, last)
    std::vector<ShardExtents> layouts;
    std::vector<int> fds;  // per shard, -1 until opened
    int open_fds = 0;
    // The shard read through HDF5 stays open between calls.
    int64_t h5_index = -1;
    h5::File file;
    h5::Dataset dset;
    h5::Space fspace;
    h5::Type mtype;
    bool zero_fill = false;  // no fill value: H5Dread leaves unstored chunks' bytes untouched
    std::unique_ptr<S3RangeReader> s3;  // objects: their range GETs (shard i is object i)

    ~Impl() {
        for (int fd : fds)
            if (fd >= 0) ::close(fd);
        auto guard = h5::lock();
        dset.reset();
        fspace.reset();
        mtype.reset();
        file.reset();
    }

    // Shard i's descriptor, opened on first use; `row` (shard-relative) is what the caller is
    // about to read, for the message. A shard that vanished since start-up, or is now another
    // file or was rewritten (inode, size or mtime differ from the probe's), is an error naming
    // it: its probed extents would point at someone else's bytes. An open descriptor keeps
    // reading the file it opened even if the name is unlinked or replaced (POSIX): those rows
    // are still the run's data.
    int fd_of(size_t i, int64_t row) {
        if (fds[i] >= 0) {
            check_unchanged(i, fds[i], row);
            return fds[i];
        }
        if (open_fds >= 256) {  // stay well below descriptor limits on huge ranges
            for (int& fd : fds)
                if (fd >= 0) ::close(fd), fd = -1;
            open_fds = 0;
        }
        const std::string& p = info.shards[i].path;
        int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
        SAE_ENFORCE(fd >= 0,
                    "shard {}: cannot open it to read row {} ({}); it was readable when the run "
                    "started: restore it and run the same command to resume from the last "
                    "checkpoint",
                    p, row, std::strerror(errno));
        try {
            check_unchanged(i, fd, row);
        } catch (...) {
            ::close(fd);
            throw;
        }
        fds[i] = fd;
        ++open_fds;
        return fd;
    }

    void check_unchanged(size_t i, int fd, int64_t row) const {
        const ShardExtents& L = layouts[i];
        struct stat st {};
        SAE_ENFORCE(::fstat(fd, &st) == 0, "shard {}: cannot stat it to read row {} ({})",
                    info.shards[i].path, row, std::strerror(errno));
        const int64_t mtime_ns =
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        const bool same_file =
            static_cast<uint64_t>(st.st_dev) == L.dev && static_cast<uint64_t>(st.st_ino) == L.ino;
        const int64_t size = static_cast<int64_t>(st.st_size);
        if (same_file && size == L.size && mtime_ns == L.mtime_ns) return;
        throw Error(fmt::format(
            "shard {}: reading row {}: the file changed since the run started ({}); do not "
            "modify shards during a run: restore it and run the same command to resume from the "
            "last checkpoint",
            info.shards[i].path, row,
            !same_file       ? "it is another file now"
            : size < L.size  ? fmt::format("truncated to {} bytes, was {}", size, L.size)
            : size != L.size ? fmt::format("{} bytes, was {}", size, L.size)
                             : "rewritten in place"));
    }

    // `bytes` at `offset` of shard i, which hold its rows from `row` (shard-relative) on.
    void pread_all(size_t i, int64_t row, int64_t offset, int64_t bytes, char* out) {
        const int fd = fd_of(i, row);
        int64_t done = 0;
        while (done < bytes) {
            const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(bytes - done),
                                      static_cast<off_t>(offset + done));
            if (r < 0 && errno == EINTR) continue;
            SAE_ENFORCE(r > 0,
                        "shard {}: reading row {} (of rows [{}, {}), {} bytes at offset {}) failed "
                        "({}); the file may have been truncated or replaced during the run, or the "
                        "storage is failing",
                        info.shards[i].path, row + done / row_bytes, row, row + bytes / row_bytes,
                        bytes - done, offset + done,
                        r == 0 ? "unexpected end of file" : std::strerror(errno));
            done += r;
        }
    }

    void h5_open(size_t i) {
        if (h5_index == static_cast<int64_t>(i)) return;
        dset.reset(), fspace.reset(), mtype.reset(), file.reset();
        h5_index = -1;
        const ShardInfo& s = info.shards[i];
        file = open_shard(info, s);
        // Chunk cache large enough for many row chunks; w0 = 1 evicts fully read chunks first.
        h5::Plist dapl(SAE_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
        SAE_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 12421, 64u << 20, 1.0));
        dset = h5::open_dataset(file.get(), info.dataset, s.path, dapl.get());
        fspace = h5::Space(SAE_H5_CHECK(H5Dget_space(dset.get())));
        {
            h5::Plist dcpl(SAE_H5_CHECK(H5Dget_create_plist(dset.get())));
            H5D_fill_value_t fill = H5D_FILL_VALUE_DEFAULT;
            SAE_H5_CHECK(H5Pfill_value_defined(dcpl.get(), &fill));
            zero_fill = fill == H5D_FILL_VALUE_UNDEFINED;
        }
        if (info.dtype == DType::f32) {
            mtype = h5::Type(SAE_H5_CHECK(H5Tcopy(H5T_IEEE_F32LE)));
        } else {
            // The stored 16-bit words without value conversion, in little-endian order.
            h5::Type ft(SAE_H5_CHECK(H5Dget_type(dset.get())));
            mtype = h5::Type(SAE_H5_CHECK(H5Tcopy(ft.get())));
            SAE_H5_CHECK(H5Tset_order(mtype.get(), H5T_ORDER_LE));
        }
        h5_index = static_cast<int64_t>(i);
    }

    void h5_read(size_t i, int64_t shard_row, int64_t rows, char* out) {
        auto guard = h5::lock();
        h5_open(i);
        // Whole rows: [rows, d_model], or [rows, L, d] of a 3-D dataset.
        const int nd = info.layers > 0 ? 3 : 2;
        hsize_t start[3] = {static_cast<hsize_t>(shard_row), 0, 0};
        hsize_t count[3] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(info.d_model), 0};
        if (nd == 3)
            count[1] = static_cast<hsize_t>(info.layers),
            count[2] = static_cast<hsize_t>(info.d_model / info.layers);
        SAE_H5_CHECK(
            H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
        h5::Space mspace(SAE_H5_CHECK(H5Screate_simple(nd, count, nullptr)));
        // The window buffers are not initialised: without a fill value, rows of unstored chunks
        // would otherwise be whatever the buffer held (found by fuzzing).
        if (zero_fill) std::memset(out, 0, static_cast<size_t>(rows * row_bytes));
        if (H5Dread(dset.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0) {
            s3_vfd_rethrow();
            std::string why = h5::last_error();
            throw Error(fmt::format(
                "shard {}: reading rows [{}, {}) failed{}; the file may be truncated or damaged",
                info.shards[i].path, shard_row, shard_row + rows,
                why.empty() ? "" : " (" + why + ")"));
        }
    }

    // Rows [r, r + n) of shard i (shard-relative) into out.
    void read_shard(size_t i, int64_t r, int64_t n, char* out) {
        const ShardExtents& L = layouts[i];
        if (!L.raw) return h5_read(i, r, n, out);
        for_each_extent(L, r, n, row_bytes, [&](int64_t at, int64_t offset, int64_t k) {
            if (s3)
                s3->read(i, offset, k * row_bytes, out);
            else
                pread_all(i, at, offset, k * row_bytes, out);
            out += k * row_bytes;
        });
    }
};

RawRowReader::RawRowReader(const DatasetInfo& info, RowRange range) : impl_(new Impl) {
    SAE_ENFORCE(range.begin >= 0 && range.begin <= range.end && range.end <= info.total_rows,
                "row range [{}, {}) is outside the dataset's {} rows", range.begin, range.end,
                info.total_rows);
    Impl& m = *impl_;
    m.info = info;
    m.range = range;
    m.row_bytes = info.d_model * dtype_size(info.dtype);
    m.layouts.resize(info.shards.size());
    m.fds.assign(info.shards.size(), -1);
    m.first = info.shards.size(), m.last = 0;
    const bool objects = !info.shards.empty() && is_s3_url(info.shards.front().path);
    size_t early = 0;  // objects: the next ones' first blocks fetched while one is probed
    for (size_t i = 0; i < info.shards.size(); ++i) {
        if (!shard_overlaps(info.shards[i], range)) continue;
        m.first = std::min(m.first, i), m.last = i + 1;
        for (early = std::max(early, i); objects && early < std::min(info.shards.size(), i + 32);
             ++early)
            if (shard_overlaps(info.shards[early], range))
                s3_vfd_prefetch(*s3_client(info.s3, info.source), s3_object_of(info.shards[early]));
        m.layouts[i] = probe_extents(info.shards[i], info);
    }
    if (objects) {
        std::vector<S3Object> all;
        for (const ShardInfo& s : info.shards) all.push_back(s3_object_of(s));
        m.s3 = std::make_unique<S3RangeReader>(s3_client(info.s3, info.source), std::move(all));
    }
}

RawRowReader::~RawRowReader() = default;

void RawRowReader::read(int64_t row, int64_t rows, void* out) {
    Impl& m = *impl_;
    SAE_ENFORCE(row >= m.range.begin && rows >= 0 && row + rows <= m.range.end,
                "RawRowReader::read: rows [{}, {}) outside the range [{}, {})", row, row + rows,
                m.range.begin, m.range.end);
    char* dst = static_cast<char*>(out);
    for_each_shard_piece(m.info, row, rows, [&](size_t i, int64_t r, int64_t n) {
        m.read_shard(i, r, n, dst);
        dst += n * m.row_bytes;
    });
}

void RawRowReader::will_need(int64_t row, int64_t rows) {
    Impl& m = *impl_;
    row = std::max(row, m.range.begin);
    rows = std::min(rows, m.range.end - row);
    for_each_shard_piece(m.info, row, rows, [&](size_t i, int64_t r, int64_t n) {
        const ShardExtents& L = m.layouts[i];
        if (!L.raw) return;
        if (m.s3) {
            for_each_extent(L, r, n, m.row_bytes, [&](int64_t, int64_t offset, int64_t k) {
                m.s3->hint(i, offset, k * m.row_bytes);
            });
            return;
        }
        const int fd = m.fd_of(i, r);
        for_each_extent(L, r, n, m.row_bytes, [&](int64_t, int64_t offset, int64_t k) {
            // Advice only: an error (say, a file system without readahead) changes nothing.
            ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(k * m.row_bytes),
                            POSIX_FADV_WILLNEED);
        });
    });
}

void RawRowReader::forget_hints() {
    if (impl_->s3) impl_->s3->forget();
}

int64_t RawRowReader::row_bytes() const { return impl_->row_bytes; }

int64_t RawRowReader::ahead_bytes() const { return impl_->s3 ? impl_->s3->ahead_bytes() : 0; }

int RawRowReader::raw_shards() const {
    int n = 0;
    for (size_t i = impl_->first; i < impl_->last; ++i) n += impl_->layouts[i].raw ? 1 : 0;
    return n;
}

int RawRowReader::hdf5_shards() const {
    return static_cast<int>(impl_->last - impl_->first) - raw_shards();
}

const ShardExtents& RawRowReader::layout(size_t shard) const { return impl_->layouts[shard]; }

}  // namespace saetrain::io

// --- whole ranges ---------------------------------------------------------------------------

namespace saetrain {

std::vector<float> read_rows(const DatasetInfo& info, RowRange range) {
    io::RawRowReader reader(info, range);
    const int64_t d = info.d_model, row_bytes = reader.row_bytes();
    std::vector<float> out(static_cast<size_t>(range.size() * d));
    // In requests of about 8 MiB of stored rows: the staging buffer stays small beside `out`.
    const int64_t step = std::min(range.size(), std::max<int64_t>(1, (8 << 20) / row_bytes));
    std::vector<char> stored(static_cast<size_t>(step * row_bytes));
    for (int64_t row = range.begin; row < range.end; row += step) {
        const int64_t n = std::min(step, range.end - row);
        reader.read(row, n, stored.data());
        widen_to_f32(info.dtype, stored.data(), out.data() + (row - range.begin) * d, n * d);
    }
    return out;
}

std::vector<float> read_rows(const std::vector<DatasetInfo>& parts, RowRange range) {
    if (parts.size() == 1) return read_rows(parts.front(), range);
    int64_t width = 0;
    for (const DatasetInfo& p : parts) width += p.d_model;
    std::vector<float> out(static_cast<size_t>(range.size() * width));
    int64_t col = 0;
    for (const DatasetInfo& p : parts) {
        const std::vector<float> part = read_rows(p, range);
        for (int64_t r = 0; r < range.size(); ++r)
            std::copy_n(part.data() + r * p.d_model, p.d_model, out.data() + r * width + col);
        col += p.d_model;
    }
    return out;
}

}  // namespace saetrain
