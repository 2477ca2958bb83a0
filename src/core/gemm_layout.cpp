#include "saetrain/gemm_layout.h"

#include "saetrain/error.h"

namespace saetrain {

ColMajorGemm to_col_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               int64_t lda, int64_t ldb, int64_t ldc) {
    SAE_ENFORCE(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m={} n={} k={}", m, n, k);
    // Row-major storage of A is [m,k] (or [k,m] when transposed); its rows have lda >= cols.
    const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    SAE_ENFORCE(lda >= a_cols && lda >= 1, "gemm: lda {} < row length {} of A", lda, a_cols);
    SAE_ENFORCE(ldb >= b_cols && ldb >= 1, "gemm: ldb {} < row length {} of B", ldb, b_cols);
    SAE_ENFORCE(ldc >= n && ldc >= 1, "gemm: ldc {} < row length {} of C", ldc, n);

    ColMajorGemm g;
    g.swap_operands = true;
    g.trans_a = trans_b;  // column-major A := row-major B, read as B^T; op keeps its flag
    g.trans_b = trans_a;
    g.m = n;
    g.n = m;
    g.k = k;
    // Column-major storage of an operand: rows x cols = op-free shape, i.e. (M x K) when not
    // transposed and (K x M) when transposed.
    g.a = {g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, ldb};
    g.b = {g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, lda};
    g.c = {g.m, g.n, ldc};
    return g;
}

}  // namespace saetrain
