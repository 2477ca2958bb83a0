// cuda_pinned.h — pinned (page-locked) host memory for the reader's buffers (CUDA builds only).
//
// With the CUDA backend the reader's window buffers and output ring are allocated with
// cudaHostAlloc, so that batches can be uploaded from them by DMA instead of being staged
// through a driver bounce buffer (the training loop does not do that yet: it copies rows into a
// pageable batch first; see docs/reader.md). apps/saetrain passes this allocator in
// LoaderOptions when a rank's backend is CUDA.
#pragma once

#include "saetrain/host_alloc.h"

namespace saetrain {

// cudaHostAlloc (portable: usable from every device context) / cudaFreeHost. alloc throws a
// saetrain::Error naming the CUDA error and the size when the memory cannot be pinned.
HostAllocator cuda_pinned_allocator();

}  // namespace saetrain
