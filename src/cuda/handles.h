// handles.h — RAII owners for CUDA, cuBLASLt and event handles (internal to src/cuda).
// Each is a unique_ptr over the library's opaque pointer with the library's destroy call, so
// no error path can leak a handle. Destroy errors are ignored: destructors must not throw.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <type_traits>

#include "cuda_check.h"

namespace saetrain::cuda {

template <typename T, auto Destroy>
struct HandleDeleter {
    void operator()(T h) const {
        if (h) Destroy(h);
    }
};
template <typename T, auto Destroy>
using Handle = std::unique_ptr<std::remove_pointer_t<T>, HandleDeleter<T, Destroy>>;

using Stream = Handle<cudaStream_t, cudaStreamDestroy>;
using Event = Handle<cudaEvent_t, cudaEventDestroy>;
using LtHandle = Handle<cublasLtHandle_t, cublasLtDestroy>;
using LtMatmulDesc = Handle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = Handle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = Handle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// A non-blocking stream (no implicit ordering with the legacy default stream).
inline Stream make_stream() {
    cudaStream_t s = nullptr;
    SAE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Stream(s);
}
// An event for ordering only (no timing: cheaper to record and wait on).
inline Event make_event() {
    cudaEvent_t e = nullptr;
    SAE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return Event(e);
}

// Device memory from cudaMalloc, freed on scope exit.
struct DeviceFree {
    void operator()(void* p) const {
        if (p) cudaFree(p);
    }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;
inline DeviceBuffer make_device_buffer(size_t bytes) {
    void* p = nullptr;
    SAE_CUDA_CHECK(cudaMalloc(&p, bytes));
    return DeviceBuffer(p);
}

}  // namespace saetrain::cuda
