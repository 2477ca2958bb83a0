// host_alloc.h — how the reader allocates its large host buffers (windows and output ring).
//
// The reader's buffers are hundreds of MB, allocated once per reader. On the CPU backend they
// come from the default allocator here (page-aligned heap memory). With the CUDA backend they
// are pinned (page-locked) host memory, which batches can be uploaded from by DMA:
// apps/saetrain passes cuda_pinned_allocator() (cuda_pinned.h). Tests pass counting allocators.
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

// std::aligned_alloc(4096, ...) / std::free.
HostAllocator host_allocator_default();

}  // namespace saetrain
