// lt_gemm.h — Backend::gemm through cuBLASLt, with one cached plan per shape (internal).
//
// A plan (operation descriptor, three layouts, the algorithm the heuristic chose) is built the
// first time a shape is seen and reused afterwards: the heuristic query costs tens of
// microseconds of host time, more than a small GEMM. The shape key includes the operands'
// pointer alignment, because the chosen kernel may assume it.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "handles.h"

namespace saetrain::cuda {

class LtGemm {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;  // Hopper wants 32 MiB, others 4
    LtGemm(cudaStream_t stream, bool tf32);
    // Row-major, as Backend::gemm.
    void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc);
    size_t cached_plans() const { return plans_.size(); }

private:
    struct Plan {
        LtMatmulDesc op;
        LtLayout a, b, c;
        cublasLtMatmulAlgo_t algo;
    };
    using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           unsigned, unsigned, unsigned>;
    Plan& plan_for(const Key& key);

    cudaStream_t stream_;
    bool tf32_;
    LtHandle handle_;
    DeviceBuffer workspace_;
    std::map<Key, Plan> plans_;
};

}  // namespace saetrain::cuda
