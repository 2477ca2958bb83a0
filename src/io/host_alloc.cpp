// host_alloc.cpp — the default allocator for the reader's large buffers (see host_alloc.h).
#include "saetrain/host_alloc.h"

#include <sys/mman.h>

#include <cstdlib>

namespace saetrain {

namespace {

constexpr size_t huge_page = size_t{2} << 20;

void* huge_aligned_alloc(size_t bytes) {
    // A multiple of the huge page size (aligned_alloc requires a multiple of the alignment);
    // the advice is best effort: without THP support the memory is ordinary pages.
    const size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
    void* p = std::aligned_alloc(huge_page, rounded);
#ifdef MADV_HUGEPAGE
    if (p != nullptr) ::madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

}  // namespace

HostAllocator host_allocator_default() {
    HostAllocator a;
    a.alloc = huge_aligned_alloc;
    a.free = [](void* p, size_t) { std::free(p); };
    a.name = "default";
    return a;
}

}  // namespace saetrain
