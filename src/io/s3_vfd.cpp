// s3_vfd.cpp — the read-only HDF5 virtual file driver over range GETs (see s3_vfd.h).
#include "s3_vfd.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "s3_io.h"
#include "saetrain/error.h"

namespace saetrain::io {

namespace {

// The exception of the last failed request of this thread's HDF5 calls (s3_vfd_rethrow).
thread_local std::exception_ptr vfd_error;

constexpr int64_t kBlock = 256 << 10;  // bytes of one cached block
constexpr size_t kBlocks = 64;         // blocks cached per open object (16 MiB)

// What H5Pset_driver copies into the file access list: the object to open.
struct Source {
    std::shared_ptr<const S3Client> client;
    S3Object obj;
};
struct DriverInfo {
    const Source* source;
};

// Blocks fetched before their object is opened (s3_vfd_prefetch), taken by the open: listing a
// dataset of thousands of objects then costs one round trip per many objects, not per object.
struct Early {
    std::unique_ptr<S3Pending> pending;
    std::shared_ptr<std::vector<char>> buf;
};
constexpr size_t kEarly = 256;  // blocks held at most (64 MiB)
std::mutex early_m;
std::map<std::string, Early>& early() {
    static std::map<std::string, Early> m;
    return m;
}
std::string early_key(const S3Object& o, int64_t b) {
    return fmt::format("{}\n{}\n{}", o.url(), o.etag, b);
}

struct OpenObject {
    std::shared_ptr<const S3Client> client;
    S3Object obj;
    std::map<int64_t, std::vector<char>> blocks;  // by block index
    std::list<int64_t> lru;                       // most recent first
    // Blocks fetched on open, not yet waited for.
    std::map<int64_t, std::unique_ptr<S3Pending>> pending;
    std::map<int64_t, std::shared_ptr<std::vector<char>>> pending_buf;

    int64_t block_bytes(int64_t b) const { return std::min(kBlock, obj.size - b * kBlock); }

    void start_block(int64_t b) {
        if (b < 0 || b * kBlock >= obj.size || blocks.count(b) || pending.count(b)) return;
        {
            std::lock_guard<std::mutex> g(early_m);
            auto it = early().find(early_key(obj, b));
            if (it != early().end()) {
                pending[b] = std::move(it->second.pending);
                pending_buf[b] = std::move(it->second.buf);
                early().erase(it);
                return;
            }
        }
        auto buf = std::make_shared<std::vector<char>>(static_cast<size_t>(block_bytes(b)));
        pending[b] = s3_fetch(*client, obj, b * kBlock, block_bytes(b), buf->data(), buf, true);
        pending_buf[b] = buf;
    }

    const std::vector<char>& block(int64_t b) {
        auto it = blocks.find(b);
        if (it != blocks.end()) {
            lru.remove(b);
            lru.push_front(b);
            return it->second;
        }
        start_block(b);
        const std::string e = pending[b]->wait_error();
        std::vector<char> data = std::move(*pending_buf[b]);
        pending.erase(b), pending_buf.erase(b);
        SAE_ENFORCE(e.empty(), "{}", e);
        if (blocks.size() >= kBlocks) {
            blocks.erase(lru.back());
            lru.pop_back();
        }
        lru.push_front(b);
        return blocks[b] = std::move(data);
    }

    // [addr, addr + size) of the object (zeros past its end) into out.
    void read(int64_t addr, int64_t size, char* out) {
        const int64_t end = std::min(addr + size, obj.size);
        if (addr >= end) {
            std::memset(out, 0, static_cast<size_t>(size));
            return;
        }
        if (end < addr + size)
            std::memset(out + (end - addr), 0, static_cast<size_t>(addr + size - end));
        if (end - addr >= kBlock) {
            client->read(obj, addr, end - addr, out);
            return;
        }
        for (int64_t at = addr; at < end;) {
            const int64_t b = at / kBlock;
            const std::vector<char>& data = block(b);
            const int64_t n = std::min(end, (b + 1) * kBlock) - at;
            std::memcpy(out + (at - addr), data.data() + (at - b * kBlock), static_cast<size_t>(n));
            at += n;
        }
    }
};

struct File {
    H5FD_t pub;  // first: HDF5 sees an H5FD_t*
    OpenObject* object;
    haddr_t eoa;
};

File* as_file(const H5FD_t* f) { return reinterpret_cast<File*>(const_cast<H5FD_t*>(f)); }

H5FD_t* vfd_open(const char*, unsigned flags, hid_t fapl, haddr_t) {
    if ((flags & (H5F_ACC_RDWR | H5F_ACC_CREAT | H5F_ACC_TRUNC)) != 0) return nullptr;
    const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
    if (info == nullptr || info->source == nullptr) return nullptr;
    auto* f = new File{};
    f->object = new OpenObject{info->source->client, info->source->obj, {}, {}, {}, {}};
    try {
        // The superblock and h5py's metadata at the start; attributes written after the data
        // at the end: both in one round trip.
        f->object->start_block(0);
        f->object->start_block((f->object->obj.size - 1) / kBlock);
    } catch (const std::exception&) {
        vfd_error = std::current_exception();
        delete f->object;
        delete f;
        return nullptr;
    }
    return &f->pub;
}

herr_t vfd_close(H5FD_t* h) {
    File* f = as_file(h);
    // Blocks still being fetched keep their buffers alive until they end.
    delete f->object;
    delete f;
    return 0;
}

herr_t vfd_query(const H5FD_t*, unsigned long* flags) {
    // Small raw-data reads (token ids, a hyperslab) through HDF5's sieve buffer; metadata
    // reads merged by its accumulator.
    if (flags) *flags = H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_ACCUMULATE_METADATA;
    return 0;
}

haddr_t vfd_get_eoa(const H5FD_t* h, H5FD_mem_t) { return as_file(h)->eoa; }

herr_t vfd_set_eoa(H5FD_t* h, H5FD_mem_t, haddr_t addr) {
    as_file(h)->eoa = addr;
    return 0;
}

haddr_t vfd_get_eof(const H5FD_t* h, H5FD_mem_t) {
    return static_cast<haddr_t>(as_file(h)->object->obj.size);
}

herr_t vfd_read(H5FD_t* h, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
    File* f = as_file(h);
    if (addr == HADDR_UNDEF || addr > static_cast<haddr_t>(INT64_MAX) - size) return -1;
    try {
        f->object->read(static_cast<int64_t>(addr), static_cast<int64_t>(size),
                        static_cast<char*>(buf));
    } catch (const std::exception&) {
        vfd_error = std::current_exception();
        return -1;
    }
    return 0;
}

herr_t vfd_write(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, size_t, const void*) {
    return -1;  // read-only
}

hid_t driver_id() {
    static const hid_t id = [] {
        static H5FD_class_t c;
        std::memset(&c, 0, sizeof(c));
#if H5_VERSION_GE(1, 14, 0)
        c.version = H5FD_CLASS_VERSION;
        c.value = 560;  // a "testing" value: 512-1023 are for user drivers
#endif
        c.name = "saetrain_s3";
        c.maxaddr = static_cast<haddr_t>(INT64_MAX);
        c.fc_degree = H5F_CLOSE_WEAK;
        c.fapl_size = sizeof(DriverInfo);
        c.open = vfd_open;
        c.close = vfd_close;
        c.query = vfd_query;
        c.get_eoa = vfd_get_eoa;
        c.set_eoa = vfd_set_eoa;
        c.get_eof = vfd_get_eof;
        c.read = vfd_read;
        c.write = vfd_write;
        for (int t = 0; t < H5FD_MEM_NTYPES; ++t) c.fl_map[t] = H5FD_MEM_DEFAULT;
        return H5FDregister(&c);
    }();
    return id;
}

}  // namespace

void s3_vfd_prefetch(const S3Client& client, const S3Object& obj) {
    std::lock_guard<std::mutex> g(early_m);
    for (const int64_t b : {int64_t{0}, (obj.size - 1) / kBlock}) {
        if (obj.size <= 0 || early().size() >= kEarly) return;
        const std::string key = early_key(obj, b);
        if (early().count(key)) continue;
        const int64_t n = std::min(kBlock, obj.size - b * kBlock);
        auto buf = std::make_shared<std::vector<char>>(static_cast<size_t>(n));
        Early e;
        e.pending = s3_fetch(client, obj, b * kBlock, n, buf->data(), buf, true);
        e.buf = std::move(buf);
        early().emplace(key, std::move(e));
    }
}

void s3_vfd_rethrow() {
    if (vfd_error) std::rethrow_exception(std::exchange(vfd_error, nullptr));
}

h5::File s3_open_file(std::shared_ptr<const S3Client> client, const S3Object& obj) {
    h5::init();
    vfd_error = nullptr;
    const Source source{std::move(client), obj};
    const DriverInfo info{&source};
    h5::Plist fapl(SAE_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    const hid_t driver = SAE_H5_CHECK(driver_id());
    SAE_H5_CHECK(H5Pset_driver(fapl.get(), driver, &info));
    const std::string url = obj.url();
    h5::File f(H5Fopen(url.c_str(), H5F_ACC_RDONLY, fapl.get()));
    if (!f) {
        s3_vfd_rethrow();
        const std::string why = h5::last_error();
        throw Error(fmt::format(
            "object {}: cannot open as HDF5{}; check that it is a complete .h5 file (re-upload it "
            "if it was cut short)",
            url, why.empty() ? "" : " (" + why + ")"));
    }
    return f;
}

}  // namespace saetrain::io
