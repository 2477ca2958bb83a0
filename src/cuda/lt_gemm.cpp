#include "lt_gemm.h"

#include <algorithm>

#include "kernels.h"
#include "saetrain/gemm_layout.h"

namespace saetrain::cuda {
namespace {

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume of a pointer.
unsigned alignment_of(const void* p) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    unsigned a = 256;
    while (a > 4 && (u % a) != 0) a >>= 1;
    return a;
}

LtLayout make_layout(const ColMajorLayout& l, cudaDataType_t type) {
    cublasLtMatrixLayout_t h = nullptr;
    SAE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, type, static_cast<uint64_t>(l.rows),
                                                static_cast<uint64_t>(l.cols), l.ld));
    return LtLayout(h);
}

// Below this size in any dimension a GEMM is memory-bound: rounding its operands to bf16
// would add passes over them and save nothing.
constexpr int64_t kBf16MinDim = 64;

}  // namespace

LtGemm::LtGemm(cudaStream_t stream, MathMode math)
    : stream_(stream), math_(math), bf16_(stream), workspace_(make_device_buffer(kWorkspaceBytes)) {
    cublasLtHandle_t h = nullptr;
    SAE_CUBLAS_CHECK(cublasLtCreate(&h));
    handle_.reset(h);
}

const void* LtGemm::to_bf16(int slot, const float* x, int64_t rows, int64_t cols, int64_t ld) {
    auto* dst = bf16_.get<uint16_t>(slot, rows * cols);
    round_to_bf16(stream_, x, rows, cols, ld, dst);
    return dst;
}

LtGemm::Plan& LtGemm::plan_for(const Key& key) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    const auto [ta, tb, m, n, k, lda, ldb, ldc, al_a, al_b, al_c, bf16] = key;
    const ColMajorGemm g = to_col_major_gemm(ta, tb, m, n, k, lda, ldb, ldc);

    Plan p{};
    cublasLtMatmulDesc_t op = nullptr;
    const bool tf32 = math_ == MathMode::tf32 && !bf16;
    SAE_CUBLAS_CHECK(cublasLtMatmulDescCreate(
        &op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    p.op.reset(op);
    const cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    SAE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    SAE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    const cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    p.a = make_layout(g.a, ab);
    p.b = make_layout(g.b, ab);
    p.c = make_layout(g.c, CUDA_R_32F);

    cublasLtMatmulPreference_t pref_h = nullptr;
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_h));
    LtPreference pref(pref_h);
    const uint64_t ws = kWorkspaceBytes;
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // The column-major A is the row-major B (gemm_layout.h), so the alignments swap too.
    const uint32_t a_bytes = al_b, b_bytes = al_a, c_bytes = al_c;
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_bytes, sizeof(a_bytes)));
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b_bytes, sizeof(b_bytes)));
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_bytes, sizeof(c_bytes)));
    SAE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c_bytes, sizeof(c_bytes)));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    SAE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        handle_.get(), op, p.a.get(), p.b.get(), p.c.get(), p.c.get(), pref_h, 1, &result, &found));
    SAE_ENFORCE(found > 0,
                "cuBLASLt has no algorithm for gemm(trans_a={}, trans_b={}, m={}, n={}, k={}, "
                "lda={}, ldb={}, ldc={})",
                ta, tb, m, n, k, lda, ldb, ldc);
    p.algo = result.algo;
    return plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C; cuBLASLt rejects an empty inner dimension
        scale(stream_, c, m, n, ldc, beta);
        return;
    }
    const void* a_op = a;
    const void* b_op = b;
    const bool bf16 = math_ == MathMode::bf16 && std::min({m, n, k}) >= kBf16MinDim;
    if (bf16) {  // packed bf16 copies of the operands as stored (op applied by cuBLASLt)
        const int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
        a_op = to_bf16(0, a, ta ? k : m, a_cols, lda);
        b_op = to_bf16(1, b, tb ? n : k, b_cols, ldb);
        lda = a_cols, ldb = b_cols;
    }
    const Key key{
        ta,  tb, m, n, k, lda, ldb, ldc, alignment_of(a_op), alignment_of(b_op), alignment_of(c),
        bf16};
    Plan& p = plan_for(key);
    // Column-major call: C^T = op(B)^T op(A)^T, so the first operand is the row-major b.
    SAE_CUBLAS_CHECK(cublasLtMatmul(handle_.get(), p.op.get(), &alpha, b_op, p.a.get(), a_op,
                                    p.b.get(), &beta, c, p.c.get(), c, p.c.get(), &p.algo,
                                    workspace_.get(), kWorkspaceBytes, stream_));
}

}  // namespace saetrain::cuda
