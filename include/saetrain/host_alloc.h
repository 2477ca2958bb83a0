// host_alloc.h — how the reader allocates its large host buffers (windows and output ring).
//
// The reader's buffers are hundreds of MB. On the CPU backend they come from the default
// allocator here (2 MiB-aligned, with transparent huge pages requested: first-touch page faults
// on 4 KiB pages cost ~1 s per GB on the development VM, more than reading the bytes from
// disk). With the CUDA backend they must be pinned (page-locked) host memory so that uploads
// are true DMA transfers: apps/saetrain passes cuda_pinned_allocator() (cuda_pinned.h).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace saetrain {

struct HostAllocator {
    // Returns `bytes` bytes aligned to at least 4096, or nullptr when they cannot be had.
    std::function<void*(size_t bytes)> alloc;
    // Releases what alloc returned (with the same byte count).
    std::function<void(void* p, size_t bytes)> free;
    std::string name;  // in error messages: "default", "CUDA pinned", ...
};

// Aligned heap memory with transparent huge pages requested (madvise, where supported).
HostAllocator host_allocator_default();

}  // namespace saetrain
