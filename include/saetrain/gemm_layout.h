// gemm_layout.h — the row-major GEMM of the Backend seam as a column-major BLAS call.
//
// Backend::gemm is row-major (C[m,n] = alpha op(A) op(B) + beta C); cuBLAS and cuBLASLt are
// column-major. A row-major matrix with leading dimension ld is, byte for byte, the
// column-major transpose with the same ld, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: swap the operands, keep each one's transpose flag, swap m and n.
// This one host function does that mapping (and checks the leading dimensions); the CUDA GEMM
// uses it and test_gemm_layout checks it against a column-major reference GEMM for every call
// the trainer makes. Pure C++: no CUDA needed to build or test it.
#pragma once

#include <cstdint>

namespace saetrain {

// A matrix as column-major storage: `rows` x `cols` stored with leading dimension `ld`.
struct ColMajorLayout {
    int64_t rows = 0, cols = 0, ld = 0;
};

// The column-major call equivalent to a row-major Backend::gemm.
struct ColMajorGemm {
    bool trans_a = false, trans_b = false;  // op flags of the column-major call
    int64_t m = 0, n = 0, k = 0;            // column-major C is m x n, op(A) m x k, op(B) k x n
    bool swap_operands = true;              // column-major A is the row-major B and vice versa
    ColMajorLayout a, b, c;                 // storage of the column-major A, B and C (C == D)
};

// Maps row-major C[m,n] = op(A)[m,k] op(B)[k,n] (leading dimensions lda, ldb, ldc as in
// Backend::gemm) to the column-major call. Throws saetrain::Error when a leading dimension is
// smaller than its row length or a size is negative.
ColMajorGemm to_col_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               int64_t lda, int64_t ldb, int64_t ldc);

}  // namespace saetrain
