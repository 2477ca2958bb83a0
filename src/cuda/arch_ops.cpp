// The CUDA implementations of the architectures' own ops and the optimizer's (arch_ops.h): thin
// classes over the launchers in kernels.h (kernels.cu, topk_select.cu, topk.cu, switch.cu,
// matryoshka.cu) and optimizer.h (optimizer.cu), each registered by one line below.
#include "arch_ops.h"

#include "optimizer.h"  // defines: optimizer_grad_sum_squares, optimizer_apply (optimizer.cu)
#include "saetrain/arch/batchtopk.h"
#include "saetrain/arch/gated.h"
#include "saetrain/arch/jumprelu.h"
#include "saetrain/arch/matryoshka.h"
#include "saetrain/arch/relu.h"
#include "saetrain/arch/switch.h"
#include "saetrain/optimizer.h"  // defines: OptimizerOps

namespace saetrain::cuda {
namespace {

class CudaReluOps final : public ReluOps {
public:
    explicit CudaReluOps(const OpContext& c) : c_(c) {}
    void relu_forward(float* pre, const float* b_enc, int64_t rows, int64_t n) override {
        cuda::relu_forward(c_.stream, pre, b_enc, rows, n);
    }
    void relu_backward(const float* z, float* dz, const float* norms, float l1, int64_t rows,
                       int64_t n, float* db_enc, float* z_col_sum, int32_t* fires,
                       float* stats) override {
        cuda::relu_backward(c_.stream, *c_.ws, z, dz, norms, l1, rows, n, db_enc, z_col_sum, fires,
                            stats);
    }

private:
    OpContext c_;
};

class CudaBatchTopkOps final : public BatchTopkOps {
public:
    explicit CudaBatchTopkOps(const OpContext& c) : c_(c) {}
    float batch_threshold(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                          int64_t count) override {
        return cuda::batch_threshold(c_.stream, *c_.ws, pre, b_enc, rows, n, count);
    }
    int64_t select_above(const float* pre, const float* b_enc, float threshold, int64_t rows,
                         int64_t n, int64_t width, int32_t* idx, float* val) override {
        return cuda::select_above(c_.stream, *c_.ws, pre, b_enc, threshold, rows, n, width, idx,
                                  val);
    }

private:
    OpContext c_;
};

class CudaJumpReluOps final : public JumpReluOps {
public:
    explicit CudaJumpReluOps(const OpContext& c) : c_(c) {}
    void jumprelu_forward(float* pre, const float* b_enc, const float* log_threshold, int64_t rows,
                          int64_t n, float* z) override {
        cuda::jumprelu_forward(c_.stream, pre, b_enc, log_threshold, rows, n, z);
    }
    void jumprelu_backward(const JumpReluBackward& a) override {
        cuda::jumprelu_backward(c_.stream, *c_.ws, a);
    }

private:
    OpContext c_;
};

class CudaGatedOps final : public GatedOps {
public:
    explicit CudaGatedOps(const OpContext& c) : c_(c) {}
    void gated_forward(const float* pre, const float* b_gate, const float* r_mag,
                       const float* b_mag, int64_t rows, int64_t n, float* z,
                       float* gate) override {
        cuda::gated_forward(c_.stream, pre, b_gate, r_mag, b_mag, rows, n, z, gate);
    }
    void gated_backward(const GatedBackward& a) override {
        cuda::gated_backward(c_.stream, *c_.ws, a);
    }

private:
    OpContext c_;
};

class CudaSwitchOps final : public SwitchOps {
public:
    explicit CudaSwitchOps(const OpContext& c) : c_(c) {}
    void gather_rows(float* dst, const float* src, const int32_t* rows_of, const float* scale,
                     float beta, int64_t rows, int64_t cols) override {
        cuda::gather_rows(c_.stream, dst, src, rows_of, scale, beta, rows, cols);
    }
    void gather_index_rows(int32_t* dst, const int32_t* src, const int32_t* rows_of, int64_t rows,
                           int64_t width) override {
        cuda::gather_index_rows(c_.stream, dst, src, rows_of, rows, width);
    }
    void row_dots(const float* a, const float* b, int64_t rows, int64_t cols, float* out) override {
        cuda::row_dots(c_.stream, a, b, rows, cols, out);
    }

private:
    OpContext c_;
};

class CudaMatryoshkaOps final : public MatryoshkaOps {
public:
    explicit CudaMatryoshkaOps(const OpContext& c) : c_(c) {}
    void prefix_mask(const int32_t* idx, const float* val, int64_t count, int64_t prefix,
                     float* out) override {
        cuda::prefix_mask(c_.stream, idx, val, count, prefix, out);
    }

private:
    OpContext c_;
};

// The fused optimizer (optimizer.cu): two passes over the parameters instead of five.
class CudaOptimizerOps final : public OptimizerOps {
public:
    explicit CudaOptimizerOps(const OpContext& c) : c_(c) {}
    double grad_sum_squares(const float* params, float* grads, int64_t count,
                            const UnitRows& unit) override {
        return cuda::optimizer_grad_sum_squares(c_.stream, *c_.ws, params, grads, count, unit);
    }
    void apply(float* params, float* grads, float* m, float* v,
               const std::vector<AdamRange>& ranges, const UnitRows& unit, math::AdamScalars s,
               float weight_decay) override {
        cuda::optimizer_apply(c_.stream, params, grads, m, v, ranges, unit, s, weight_decay);
    }
    void update(float* p, const float* g, float* m, float* v, int64_t n,
                const math::AdamScalars& s) override {
        cuda::adam(c_.stream, p, g, m, v, n, s);
    }

private:
    OpContext c_;
};

template <class Ops>
std::unique_ptr<ArchOps> make(const OpContext& c) {
    return std::make_unique<Ops>(c);
}

}  // namespace

const std::vector<ArchOpsImpl>& arch_ops_impls() {
    static const std::vector<ArchOpsImpl> impls = {
        {&relu_op_set(), make<CudaReluOps>},
        {&batchtopk_op_set(), make<CudaBatchTopkOps>},
        {&jumprelu_op_set(), make<CudaJumpReluOps>},
        {&gated_op_set(), make<CudaGatedOps>},
        {&switch_op_set(), make<CudaSwitchOps>},
        {&matryoshka_op_set(), make<CudaMatryoshkaOps>},
        {&optimizer_op_set(), make<CudaOptimizerOps>},
    };
    return impls;
}

}  // namespace saetrain::cuda
