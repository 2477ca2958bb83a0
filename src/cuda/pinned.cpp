// pinned.cpp — cudaHostAlloc-backed HostAllocator for the reader (see cuda_pinned.h).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "saetrain/cuda_pinned.h"
#include "saetrain/error.h"

namespace saetrain {

namespace {

void* pinned_alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky, but leave no error behind for the next call
        throw Error(
            fmt::format("reader: cudaHostAlloc of {} MB of pinned buffers failed ({}: {}); lower "
                        "data.shuffle_buffer_rows or data.prefetch_bytes",
                        bytes >> 20, cudaGetErrorName(e), cudaGetErrorString(e)));
    }
    return p;
}

void pinned_free(void* p, size_t) {
    // Called from destructors: an error here (a dead context at exit) cannot be reported.
    if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

}  // namespace

HostAllocator cuda_pinned_allocator() {
    HostAllocator a;
    a.alloc = pinned_alloc;
    a.free = pinned_free;
    a.name = "CUDA pinned";
    return a;
}

}  // namespace saetrain
