// host_alloc.h — where large host buffers come from: the reader's windows and output ring (io)
// and the training loop's batch (core).
//
// The buffers are hundreds of MB, allocated once. A Backend says which allocator it prefers
// (Backend::host_allocator, backend.h): on the CPU backend the default here (page-aligned heap
// memory); with the CUDA backend pinned (page-locked) host memory, which batches can be uploaded
// from by DMA (cuda_pinned_allocator(), cuda_pinned.h). Tests pass counting allocators. A core
// header: the compute seam names it, and the reader takes one.
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

// This machine's physical memory in bytes (0 when the system does not say): what a buffer sized
// by the config or the data is checked against before it is allocated, so that one too large
// is named with its key instead of ending in std::bad_alloc or the OOM killer.
double machine_memory_bytes();

}  // namespace saetrain
