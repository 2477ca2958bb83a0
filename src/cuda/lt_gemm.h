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
#include "kernels.h"             // Workspace
#include "saetrain/perfmodel.h"  // MathMode

namespace saetrain::cuda {

class LtGemm {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;  // Hopper wants 32 MiB, others 4
    LtGemm(cudaStream_t stream, MathMode math);
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
    // (trans_a, trans_b, m, n, k, lda, ldb, ldc, alignments of a, b, c, bf16 operands)
    using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           unsigned, unsigned, unsigned, bool>;
    Plan& plan_for(const Key& key);
    // A stored row-major [rows, cols] (leading dimension ld) as packed bf16 in scratch slot.
    const void* to_bf16(int slot, const float* x, int64_t rows, int64_t cols, int64_t ld);

    cudaStream_t stream_;
    MathMode math_;
    Workspace bf16_;  // slots 0 and 1: the operands' bf16 copies
    LtHandle handle_;
    DeviceBuffer workspace_;
    std::map<Key, Plan> plans_;
};

}  // namespace saetrain::cuda
