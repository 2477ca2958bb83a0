// cuda_pinned.h — pinned (page-locked) host memory for the reader's buffers and the training
// loop's batch (CUDA builds only).
//
// With the CUDA backend the reader's window buffers and output ring, and the batch the trainer
// uploads, are allocated with cudaHostAlloc, so the upload is a DMA instead of being staged
// through a driver bounce buffer. apps/saetrain passes this allocator in LoaderOptions and
// LoopOptions::batch_allocator when a rank's backend is CUDA.
#pragma once

#include "saetrain/host_alloc.h"

namespace saetrain {

// cudaHostAlloc (portable: usable from every device context) / cudaFreeHost. alloc throws a
// saetrain::Error naming the CUDA error and the size when the memory cannot be pinned.
HostAllocator cuda_pinned_allocator();

}  // namespace saetrain
