// forwarding_backend.h — a Backend that passes every call to another backend, through one hook.
//
// The one list of the Backend's ops for wrappers: bench_step's per-op timing (TimedBackend) and
// tests that record what the trainer asks of a backend (test_gemm_layout) derive from it and
// override around() or a single op, instead of each forwarding all of them again. A new
// Backend virtual is added here too: a pure one fails to compile until it is; one with a default
// would silently run the default under a wrapper, so every virtual is forwarded, defaults too.
// An architecture's own ops (arch_ops.h) are not listed here: arch_ops() wraps the inner
// backend's implementation of a set in the set's own forwarding wrapper, which passes each of
// its ops through around() by name, so a wrapper times and records them like the Backend's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/comm.h"  // defines: Communicator (gradient_comm passes one on)

namespace saetrain {

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(Backend& inner) : be_(inner) {}
    Backend& inner() const { return be_; }

    // Runs one forwarded op (`op`: its name; GEMMs "gemm MxNxK"): f() here; override to time,
    // count or record. Queries (name, placement, reports) and allocation bypass it.
    virtual void around(const std::string& /*op*/, const std::function<void()>& f) { f(); }

    std::string name() const override { return be_.name(); }
    void* alloc_bytes(int64_t bytes) override { return be_.alloc_bytes(bytes); }
    void free_bytes(void* p) override { be_.free_bytes(p); }
    void upload(void* dst, const void* src, int64_t bytes) override;
    void download(void* dst, const void* src, int64_t bytes) override;
    void upload_rows(float* dst, const void* src, DType t, int64_t n) override;
    void upload_columns(float* dst, const void* src, DType t, int64_t rows, int64_t cols,
                        int64_t stride) override;
    void fill(float* x, int64_t n, float value) override;
    void zero_block(float* x, int64_t rows, int64_t cols, int64_t ld) override;
    void copy_block(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                    int64_t row_bytes, int64_t rows) override;
    void synchronize() override { be_.synchronize(); }
    void set_host_threads(int threads) override { be_.set_host_threads(threads); }
    bool host_memory() const override { return be_.host_memory(); }
    bool supports(BackendOp op, const OpShape& shape, std::string* why) const override {
        return be_.supports(op, shape, why);
    }
    HostAllocator host_allocator() const override { return be_.host_allocator(); }
    void* native_stream() const override { return be_.native_stream(); }
    CommFacts comm_facts() const override { return be_.comm_facts(); }
    std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> group, int world_rank,
                                                const std::string& host, double timeout_s,
                                                CommChoice* choice) override {
        return be_.gradient_comm(std::move(group), world_rank, host, timeout_s, choice);
    }

    void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override;
    double sum_squares(const float* x, int64_t n) override;
    void sub_rows(float* out, const float* x, const float* bias, int64_t rows,
                  int64_t cols) override;
    void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) override;
    void residual(float* xh, const float* x, int64_t rows, int64_t d, float grad_scale,
                  float* x_col_sum, float* db_dec, float* stats) override;
    void topk_forward(const float* pre, const float* b_enc, int64_t rows, int64_t n, int64_t k,
                      int32_t* idx, float* val, bool relu) override;
    void topk_forward_columns(const float* pre, const float* bias, int64_t rows, int64_t n,
                              const int32_t* cols, int64_t count, int64_t k, int32_t* idx,
                              float* val, bool relu, float* scratch) override;
    void sparse_decode(const int32_t* idx, const float* val, const float* w_dec, int64_t rows,
                       int64_t k, int64_t d, float* x_hat) override;
    void sparse_decode_layered(const int32_t* idx, const float* val, const float* w_dec,
                               int64_t rows, int64_t k, int64_t d, int64_t n, int64_t layers,
                               float* x_hat) override;
    void topk_backward(const SparseBackward& a) override;
    void decorr_grad(const float* z, const int32_t* idx, int64_t width, int64_t rows, int64_t n,
                     float scale, float* dz, float* stats) override;
    void offset_indices(int32_t* idx, int64_t count, int32_t offset) override;
    void axpby(float* y, const float* x, float a, float b, int64_t n) override;
    void swap(float* a, float* b, int64_t n) override;
    void row_norms(const float* w, int64_t rows, int64_t cols, float* norms) override;
    void project_out_parallel(const float* w, float* g, int64_t rows, int64_t cols) override;
    void normalize_rows(float* w, int64_t rows, int64_t cols) override;
    void add_norm_grad(const float* w, const float* coeff, float scale, float* g, int64_t rows,
                       int64_t cols) override;

    std::string device_name() const override { return be_.device_name(); }
    std::string gemm_precision() const override { return be_.gemm_precision(); }
    int64_t device_memory_peak_bytes() const override { return be_.device_memory_peak_bytes(); }

    ArchOps* arch_ops(const ArchOpSet& set) override;

private:
    Backend& be_;
};

}  // namespace saetrain
