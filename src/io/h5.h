// h5.h — internal RAII wrappers for HDF5 ids and a few dataset/attribute helpers.
//
// Every hid_t lives in a Handle that closes it in its destructor, so an exception thrown
// half-way through reading a shard leaks nothing. HDF5's automatic error-stack printing is
// switched off (h5::init): failures surface once, as our one-line saetrain::Error messages,
// optionally carrying HDF5's innermost description (h5::last_error).
// Internal to saetrain_io: not installed, not included by public headers.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/error.h"

namespace saetrain::h5 {

// Turns off HDF5's automatic error printing; idempotent, cheap after the first call.
void init();

// Serializes this library's HDF5 use across threads (a background reader beside a checkpoint
// writer): thread-safe HDF5 builds lock internally, but the serial builds on many clusters do
// not. Held for a whole public operation (opening, one read, one write); the cost is nothing
// beside megabyte reads. Recursive, so entry points may call each other.
std::unique_lock<std::recursive_mutex> lock();

// Innermost message of HDF5's current error stack, e.g. "truncated file: eof = ...", or "".
std::string last_error();
// The operating system's reason for the HDF5 error on this thread's stack (strerror text, from
// the POSIX driver's record), or "" when the error did not come from a system call.
std::string os_error();
// Name of the file that `loc` (a file, group or dataset id) belongs to.
std::string file_name(hid_t loc);

// --- handles ------------------------------------------------------------------------------

using CloseFn = herr_t (*)(hid_t);

template <CloseFn Close>
class Handle {
public:
    Handle() = default;
    explicit Handle(hid_t id) : id_(id) {}
    ~Handle() { reset(); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
    Handle& operator=(Handle&& o) noexcept {
        if (this != &o) {
            reset();
            id_ = std::exchange(o.id_, H5I_INVALID_HID);
        }
        return *this;
    }

    hid_t get() const { return id_; }
    bool valid() const { return id_ >= 0; }
    explicit operator bool() const { return valid(); }
    // Closes now and reports failure (a file's close flushes, so its result matters).
    herr_t close() {
        herr_t r = 0;
        if (valid()) r = Close(id_);
        id_ = H5I_INVALID_HID;
        return r;
    }
    void reset() {
        if (valid()) Close(id_);  // errors on close in a destructor can only be ignored
        id_ = H5I_INVALID_HID;
    }

private:
    hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Dataset = Handle<H5Dclose>;
using Space = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;
using Plist = Handle<H5Pclose>;
using Attr = Handle<H5Aclose>;

// --- files and datasets --------------------------------------------------------------------

// Opens read-only; throws Error naming `path` (and HDF5's reason) when it is not readable HDF5.
File open_file(const std::string& path);
// Creates or truncates `path` for writing.
File create_file(const std::string& path);

// Whether `name` (a path under loc) exists. External links are never followed, here or by
// open_dataset: one met on the way throws Error naming the file (`path`, or loc's file's name
// when empty) and the link's target.
bool link_exists(hid_t loc, const std::string& name, const std::string& path = "");
// Names of the objects directly under the root group, for "has: ..." hints in errors.
std::vector<std::string> list_root(hid_t file);

// Opens a dataset; `dapl` may be H5P_DEFAULT. Throws naming `path` when absent.
Dataset open_dataset(hid_t file, const std::string& name, const std::string& path,
                     hid_t dapl = H5P_DEFAULT);
// Dimensions of a dataset's dataspace.
std::vector<hsize_t> dataset_dims(hid_t dset);

// An extent of a file's metadata: [addr, addr + size), addresses relative to the base address
// (after any user block), as HDF5 gives them (H5Dget_offset, chunk addresses).
struct MetaExtent {
    haddr_t addr = 0;
    hsize_t size = 0;
    bool overlaps(haddr_t a, hsize_t n) const { return a < addr + size && addr < a + n; }
};
// The superblock and every object header reachable by hard links: where a dataset's elements
// must never be. A header split into several chunks is only known by its first byte (its other
// chunks lie elsewhere).
std::vector<MetaExtent> metadata_extents(hid_t file);

// Writes a contiguous float32 dataset of shape `dims` from `data` (row-major).
void write_f32(hid_t loc, const std::string& name, const float* data,
               const std::vector<hsize_t>& dims);
// Reads a whole dataset as float32 (HDF5 converts from any float type); sets dims.
std::vector<float> read_f32(hid_t loc, const std::string& name, const std::string& path,
                            std::vector<hsize_t>* dims);

// --- attributes ----------------------------------------------------------------------------

bool attr_exists(hid_t obj, const std::string& name);
// Writes a scalar fixed-length string attribute (replacing an existing one).
void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_int64(hid_t obj, const std::string& name, int64_t value);
// Reads a string attribute, fixed-length or variable-length (h5py's default), scalar or the
// first element of a 1-D array; nullopt when absent or not a string.
std::optional<std::string> read_attr_string(hid_t obj, const std::string& name);
// Reads an integer attribute (any integer type, converted); nullopt when absent or not integer.
std::optional<int64_t> read_attr_int64(hid_t obj, const std::string& name);

}  // namespace saetrain::h5
