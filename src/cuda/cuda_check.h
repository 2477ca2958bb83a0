// cuda_check.h — SAE_CUDA_CHECK / SAE_CUBLAS_CHECK / SAE_NCCL_CHECK: the error.h family for
// the CUDA libraries (internal to src/cuda). Each reports the failing statement, the library's
// error string, file:line and host (throw_check_failure).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "saetrain/error.h"

#define SAE_CUDA_CHECK(stmt)                                                                   \
    do {                                                                                       \
        cudaError_t _e = (stmt);                                                               \
        if (_e != cudaSuccess)                                                                 \
            ::saetrain::throw_check_failure(                                                   \
                "CUDA", #stmt,                                                                 \
                fmt::format("{}: {}", cudaGetErrorName(_e), cudaGetErrorString(_e)), __FILE__, \
                __LINE__);                                                                     \
    } while (0)

#define SAE_CUBLAS_CHECK(stmt)                                                              \
    do {                                                                                    \
        cublasStatus_t _s = (stmt);                                                         \
        if (_s != CUBLAS_STATUS_SUCCESS)                                                    \
            ::saetrain::throw_check_failure("cuBLASLt", #stmt,                              \
                                            fmt::format("status {}", static_cast<int>(_s)), \
                                            __FILE__, __LINE__);                            \
    } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define SAE_CUDA_LAUNCH_CHECK() SAE_CUDA_CHECK(cudaGetLastError())
