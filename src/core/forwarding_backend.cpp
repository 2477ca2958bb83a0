// ForwardingBackend: every op to the inner backend through around() (forwarding_backend.h).
#include "saetrain/forwarding_backend.h"

#include <fmt/format.h>

namespace saetrain {

void ForwardingBackend::upload(void* dst, const void* src, int64_t bytes) {
    around("upload", [&] { be_.upload(dst, src, bytes); });
}
void ForwardingBackend::download(void* dst, const void* src, int64_t bytes) {
    around("download", [&] { be_.download(dst, src, bytes); });
}
void ForwardingBackend::upload_rows(float* dst, const void* src, DType t, int64_t n) {
    around("upload_rows", [&] { be_.upload_rows(dst, src, t, n); });
}

void ForwardingBackend::upload_columns(float* dst, const void* src, DType t, int64_t rows,
                                       int64_t cols, int64_t stride) {
    around("upload_columns", [&] { be_.upload_columns(dst, src, t, rows, cols, stride); });
}
void ForwardingBackend::fill(float* x, int64_t n, float value) {
    around("fill", [&] { be_.fill(x, n, value); });
}

void ForwardingBackend::zero_block(float* x, int64_t rows, int64_t cols, int64_t ld) {
    around("zero_block", [&] { be_.zero_block(x, rows, cols, ld); });
}
void ForwardingBackend::copy_block(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                                   int64_t row_bytes, int64_t rows) {
    around("copy_block", [&] { be_.copy_block(dst, dst_pitch, src, src_pitch, row_bytes, rows); });
}
void ForwardingBackend::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                             float* c, int64_t ldc) {
    around(fmt::format("gemm {}x{}x{}", m, n, k),
           [&] { be_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}
double ForwardingBackend::sum_squares(const float* x, int64_t n) {
    double r = 0;
    around("sum_squares", [&] { r = be_.sum_squares(x, n); });
    return r;
}
void ForwardingBackend::sub_rows(float* out, const float* x, const float* bias, int64_t rows,
                                 int64_t cols) {
    around("sub_rows", [&] { be_.sub_rows(out, x, bias, rows, cols); });
}
void ForwardingBackend::broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) {
    around("broadcast_rows", [&] { be_.broadcast_rows(out, bias, rows, cols); });
}
void ForwardingBackend::residual(float* xh, const float* x, int64_t rows, int64_t d,
                                 float grad_scale, float* x_col_sum, float* db_dec, float* stats) {
    around("residual", [&] { be_.residual(xh, x, rows, d, grad_scale, x_col_sum, db_dec, stats); });
}
void ForwardingBackend::topk_forward(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                                     int64_t k, int32_t* idx, float* val, bool relu) {
    around("topk_forward", [&] { be_.topk_forward(pre, b_enc, rows, n, k, idx, val, relu); });
}
void ForwardingBackend::topk_forward_columns(const float* pre, const float* bias, int64_t rows,
                                             int64_t n, const int32_t* cols, int64_t count,
                                             int64_t k, int32_t* idx, float* val, bool relu,
                                             float* scratch) {
    around("topk_forward_columns", [&] {
        be_.topk_forward_columns(pre, bias, rows, n, cols, count, k, idx, val, relu, scratch);
    });
}
void ForwardingBackend::sparse_decode(const int32_t* idx, const float* val, const float* w_dec,
                                      int64_t rows, int64_t k, int64_t d, float* x_hat) {
    around("sparse_decode", [&] { be_.sparse_decode(idx, val, w_dec, rows, k, d, x_hat); });
}
void ForwardingBackend::sparse_decode_layered(const int32_t* idx, const float* val,
                                              const float* w_dec, int64_t rows, int64_t k,
                                              int64_t d, int64_t n, int64_t layers, float* x_hat) {
    around("sparse_decode",
           [&] { be_.sparse_decode_layered(idx, val, w_dec, rows, k, d, n, layers, x_hat); });
}
void ForwardingBackend::topk_backward(const SparseBackward& a) {
    around("topk_backward", [&] { be_.topk_backward(a); });
}
void ForwardingBackend::decorr_grad(const float* z, const int32_t* idx, int64_t width, int64_t rows,
                                    int64_t n, float scale, float* dz, float* stats) {
    around("decorr_grad", [&] { be_.decorr_grad(z, idx, width, rows, n, scale, dz, stats); });
}
void ForwardingBackend::offset_indices(int32_t* idx, int64_t count, int32_t offset) {
    around("offset_indices", [&] { be_.offset_indices(idx, count, offset); });
}
void ForwardingBackend::axpby(float* y, const float* x, float a, float b, int64_t n) {
    around("axpby", [&] { be_.axpby(y, x, a, b, n); });
}

void ForwardingBackend::swap(float* a, float* b, int64_t n) {
    around("swap", [&] { be_.swap(a, b, n); });
}
void ForwardingBackend::row_norms(const float* w, int64_t rows, int64_t cols, float* norms) {
    around("row_norms", [&] { be_.row_norms(w, rows, cols, norms); });
}
void ForwardingBackend::project_out_parallel(const float* w, float* g, int64_t rows, int64_t cols) {
    around("project_out_parallel", [&] { be_.project_out_parallel(w, g, rows, cols); });
}
void ForwardingBackend::normalize_rows(float* w, int64_t rows, int64_t cols) {
    around("normalize_rows", [&] { be_.normalize_rows(w, rows, cols); });
}
void ForwardingBackend::add_norm_grad(const float* w, const float* coeff, float scale, float* g,
                                      int64_t rows, int64_t cols) {
    around("add_norm_grad", [&] { be_.add_norm_grad(w, coeff, scale, g, rows, cols); });
}

ArchOps* ForwardingBackend::arch_ops(const ArchOpSet& set) {
    ArchOps* inner = be_.arch_ops(set);
    if (!inner) return nullptr;
    return keep_arch_ops(set, [&] {
        return set.forward(*inner, [this](const std::string& op, const std::function<void()>& f) {
            around(op, f);
        });
    });
}

}  // namespace saetrain
