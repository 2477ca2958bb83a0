// test_hostile_shards — shards made to mislead the reader (issue 35): data that is not stored in
// the shard (external links, virtual datasets, external raw files), rows never written, data
// addresses over the file's metadata or past its end, filters this HDF5 cannot decode, and row
// counts that overflow. Each must be refused by dataset_open, naming the shard, before anything
// would read a byte of it; and a plain gzip shard must still open.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/shards.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;
using saetrain::testing::error_of;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_test_hostile_shards") {}
};

constexpr hsize_t kRows = 256, kCols = 16;

std::vector<float> values() {
    std::vector<float> v(kRows * kCols);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) - 48.0f;
    return v;
}

// A file with one float32 dataset `name` [rows, kCols] made with `dcpl` (H5P_DEFAULT:
// contiguous): `write` false leaves it unwritten; `rows_written` < rows (chunked only) writes
// that many rows and then extends the dataset to `rows`, as a writer killed mid-file would leave
// it. Returns the dataset's contiguous offset (HADDR_UNDEF when chunked or unwritten).
haddr_t write_file(const fs::path& path, hsize_t rows, hid_t dcpl = H5P_DEFAULT, bool write = true,
                   hsize_t rows_written = kRows, hsize_t max_rows = 0,
                   const char* name = "activations") {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(f, 0) << path;
    const hsize_t first = write ? std::min(rows, rows_written) : rows;
    hsize_t dims[2] = {first, kCols}, max[2] = {max_rows ? max_rows : rows, kCols};
    hid_t space = H5Screate_simple(2, dims, max);
    hid_t d = H5Dcreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    EXPECT_GE(d, 0) << path;
    if (write) {
        const std::vector<float> v = values();
        EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    }
    hsize_t all[2] = {rows, kCols};
    if (first < rows) {
        EXPECT_GE(H5Dset_extent(d, all), 0);
    }
    const haddr_t at = H5Dget_offset(d);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(f);
    return at;
}

hid_t chunked(hsize_t chunk_rows) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {chunk_rows, kCols};
    H5Pset_chunk(dcpl, 2, chunk);
    return dcpl;
}

#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info1_t;
#else
using ObjectInfo = H5O_info_t;
#endif

// Replaces `from`, an 8-byte little-endian address in the object header of the file's
// `activations` (its layout message), by `to`.
void patch_address(const fs::path& path, uint64_t from, uint64_t to) {
    ObjectInfo info{};
    {
        hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        ASSERT_GE(H5Oget_info_by_name2(f, "activations", &info, H5O_INFO_BASIC | H5O_INFO_HDR,
                                       H5P_DEFAULT),
                  0);
        H5Fclose(f);
    }
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> head(info.hdr.space.total);
    io.seekg(static_cast<std::streamoff>(info.addr));
    io.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::vector<size_t> at;
    for (size_t i = 0; i + 8 <= head.size(); ++i)
        if (std::memcmp(head.data() + i, &from, 8) == 0) at.push_back(i);
    ASSERT_EQ(at.size(), 1u) << "the data address should appear once in the dataset's header";
    io.clear();
    io.seekp(static_cast<std::streamoff>(info.addr + at[0]));
    io.write(reinterpret_cast<const char*>(&to), 8);
}

// Runs dataset_open and returns its message, which must name `shard` and say `what`.
void expect_refused(const fs::path& source, const fs::path& shard, const std::string& what) {
    const std::string msg = error_of([&] { dataset_open(source.string()); });
    EXPECT_NE(msg.find(shard.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

}  // namespace

TEST(HostileShards, PlainContiguousChunkedAndGzipShardsOpen) {
    TempDir tmp;
    write_file(tmp / "a.h5", kRows);
    hid_t c = chunked(64);
    write_file(tmp / "b.h5", kRows, c);
    H5Pset_deflate(c, 4);
    write_file(tmp / "c.h5", kRows, c);
    H5Pclose(c);
    const DatasetInfo info = dataset_open(tmp / "*.h5");
    EXPECT_EQ(info.total_rows, 3 * static_cast<int64_t>(kRows));
    const std::vector<float> got = read_rows(info, {2 * kRows, 3 * kRows});  // the gzip shard
    EXPECT_EQ(got, values());
}

TEST(HostileShards, ExternalLinksAreNotFollowed) {
    TempDir tmp;
    write_file(tmp / "target.h5", kRows, H5P_DEFAULT, true, kRows, 0, "data");
    fs::create_directories(tmp / "d");
    hid_t f = H5Fcreate((tmp / "d/link.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    // The dataset itself, and a group on the way to one, as external links; and one to a FIFO,
    // which HDF5 would block on if it opened it.
    H5Lcreate_external((tmp / "target.h5").c_str(), "/data", f, "activations", H5P_DEFAULT,
                       H5P_DEFAULT);
    H5Lcreate_external((tmp / "target.h5").c_str(), "/", f, "g", H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_EQ(mkfifo((tmp / "fifo.h5").c_str(), 0600), 0);
    H5Lcreate_external((tmp / "fifo.h5").c_str(), "/data", f, "to_fifo", H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    const fs::path shard = tmp / "d/link.h5";
    expect_refused(shard, shard, "external link to " + (tmp / "target.h5") + ":/data");
    std::string msg = error_of([&] { dataset_open(shard.string(), "g/data"); });
    EXPECT_NE(msg.find("external link to " + (tmp / "target.h5")), std::string::npos) << msg;
    const auto t0 = std::chrono::steady_clock::now();
    msg = error_of([&] { dataset_open(shard.string(), "to_fifo"); });
    EXPECT_NE(msg.find("fifo.h5"), std::string::npos) << msg;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "blocked";
}

TEST(HostileShards, VirtualDatasetsAndExternalRawFilesAreRefused) {
    TempDir tmp;
    hsize_t dims[2] = {kRows, kCols};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    {
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ASSERT_GE(H5Pset_virtual(dcpl, space, (tmp / "missing.h5").c_str(), "/data", space), 0);
        hid_t f = H5Fcreate((tmp / "vds.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        hid_t d =
            H5Dcreate2(f, "activations", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        ASSERT_GE(d, 0);
        H5Dclose(d);
        H5Fclose(f);
        H5Pclose(dcpl);
    }
    expect_refused(tmp / "vds.h5", tmp / "vds.h5", "virtual dataset");
    {
        std::ofstream(tmp / "raw.bin", std::ios::binary)
            .write(std::string(kRows * kCols * 4, '\0').data(), kRows * kCols * 4);
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ASSERT_GE(H5Pset_external(dcpl, (tmp / "raw.bin").c_str(), 0, kRows * kCols * 4), 0);
        write_file(tmp / "ext.h5", kRows, dcpl, false);
        H5Pclose(dcpl);
    }
    expect_refused(tmp / "ext.h5", tmp / "ext.h5", "external raw-data files");
    H5Sclose(space);
}

TEST(HostileShards, RowsNeverWrittenAreRefused) {
    TempDir tmp;
    // Contiguous, never written: no storage at all.
    write_file(tmp / "a.h5", kRows, H5P_DEFAULT, false);
    expect_refused(tmp / "a.h5", tmp / "a.h5", "was never written");
    // Chunked, one chunk of four written.
    hid_t c = chunked(64);
    write_file(tmp / "b.h5", kRows, c, true, 64);
    expect_refused(tmp / "b.h5", tmp / "b.h5", "has 1 of its 4 chunks written");
    // Chunked, declaring 2^40 rows (2^34 chunks of 64 rows), one chunk written.
    write_file(tmp / "c.h5", hsize_t{1} << 40, c, true, 64, H5S_UNLIMITED);
    expect_refused(tmp / "c.h5", tmp / "c.h5", "has 1 of its 17179869184 chunks written");
    // 2^62 rows: the byte count itself overflows.
    write_file(tmp / "d.h5", hsize_t{1} << 62, c, true, 64, H5S_UNLIMITED);
    expect_refused(tmp / "d.h5", tmp / "d.h5", "elements, over 2^63 bytes");
    H5Pclose(c);
}

TEST(HostileShards, DataAddressesOverMetadataOrPastTheEndAreRefused) {
    TempDir tmp;
    const haddr_t at = write_file(tmp / "a.h5", kRows);
    ASSERT_NE(at, HADDR_UNDEF);
    fs::copy_file(tmp / "a.h5", tmp / "b.h5");
    // Point the data at the superblock (address 0 is refused as unallocated by HDF5 itself; 8
    // is inside the superblock) and past the file's end.
    patch_address(tmp / "a.h5", at, 8);
    expect_refused(tmp / "a.h5", tmp / "a.h5", "over the file's own metadata");
    patch_address(tmp / "b.h5", at, fs::file_size(tmp / "b.h5") - 64);
    expect_refused(tmp / "b.h5", tmp / "b.h5", "past the end of the file");
}

// A chunk whose index entry points into the file's metadata is refused when the shard's storage
// is probed (before any row is read), not read from the header.
TEST(HostileShards, ChunkAddressesOverMetadataAreRefused) {
    TempDir tmp;
    const fs::path path = tmp / "a.h5";
    hid_t c = chunked(kRows);
    write_file(path, kRows, c);
    H5Pclose(c);
    haddr_t at = HADDR_UNDEF;
    {
        hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, "activations", H5P_DEFAULT);
        hsize_t coord[2] = {0, 0}, size = 0;
        unsigned mask = 0;
        ASSERT_GE(H5Dget_chunk_info_by_coord(d, coord, &mask, &at, &size), 0);
        H5Dclose(d);
        H5Fclose(f);
    }
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> bytes(at);
    io.read(bytes.data(), static_cast<std::streamsize>(at));
    std::vector<size_t> hits;
    for (size_t i = 0; i + 8 <= bytes.size(); ++i)
        if (std::memcmp(bytes.data() + i, &at, 8) == 0) hits.push_back(i);
    ASSERT_EQ(hits.size(), 1u) << "the chunk's address should appear once, in the chunk index";
    const uint64_t into_superblock = 8;
    io.clear();
    io.seekp(static_cast<std::streamoff>(hits[0]));
    io.write(reinterpret_cast<const char*>(&into_superblock), 8);
    io.close();
    const DatasetInfo info = dataset_open(path);
    const std::string msg = error_of([&] { read_rows(info, {0, 4}); });
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("the chunk of rows [0, 256) of dataset 'activations' lies at offset 8, over "
                       "the file's own metadata"),
              std::string::npos)
        << msg;
}

namespace {
// A filter this process can encode with but not decode (as an HDF5 without lzf's plugin is to
// an lzf shard written elsewhere).
size_t encode_only(unsigned, size_t, const unsigned[], size_t nbytes, size_t*, void**) {
    return nbytes;
}
}  // namespace

TEST(HostileShards, FiltersThisHdf5CannotDecodeAreRefusedAtValidation) {
    TempDir tmp;
    H5Z_class2_t cls{};
    cls.version = H5Z_CLASS_T_VERS;
    cls.id = 32000;
    cls.encoder_present = 1;
    cls.decoder_present = 0;
    cls.name = "lzf";
    cls.filter = encode_only;
    ASSERT_GE(H5Zregister(&cls), 0);
    hid_t c = chunked(64);
    ASSERT_GE(H5Pset_filter(c, 32000, H5Z_FLAG_MANDATORY, 0, nullptr), 0);
    write_file(tmp / "a.h5", kRows, c);
    H5Pclose(c);
    expect_refused(tmp / "a.h5", tmp / "a.h5", "compressed with filter 32000 (lzf)");
    H5Zunregister(32000);
}
