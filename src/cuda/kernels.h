// kernels.h — launchers for the CUDA backend's kernels (internal to src/cuda).
//
// Each launcher queues its kernels on `stream` and returns; sizes are the Backend's (rows B,
// d = d_model, n = n_latents). Reductions split the work the same way on every call (fixed
// grid for a given shape, partials summed in a fixed order), so results are reproducible.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "saetrain/arch/gated.h"     // defines: GatedBackward
#include "saetrain/arch/jumprelu.h"  // defines: JumpReluBackward
#include "saetrain/backend.h"        // defines: SparseBackward
#include "saetrain/sae_math.h"

namespace saetrain::cuda {

// Growable device scratch, stream-ordered: slot i keeps its buffer across calls and is
// reallocated (cudaFreeAsync + cudaMallocAsync on the stream) only when a call needs more.
// Distinct slots may be used at once; one op must not ask for the same slot twice.
class Workspace {
public:
    static constexpr int kSlots = 8;
    explicit Workspace(cudaStream_t stream) : stream_(stream) {}
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* get(int slot, size_t bytes);
    template <typename T>
    T* get(int slot, int64_t count) {
        return static_cast<T*>(get(slot, static_cast<size_t>(count) * sizeof(T)));
    }

private:
    cudaStream_t stream_;
    void* p_[kSlots] = {};
    size_t cap_[kSlots] = {};
};

void fill(cudaStream_t s, float* x, int64_t n, float value);
void scale(cudaStream_t s, float* x, int64_t rows, int64_t cols, int64_t ld, float beta);
// Blocks until the sum is on the host.
double sum_squares(cudaStream_t s, Workspace& ws, const float* x, int64_t n);

void sub_rows(cudaStream_t s, float* out, const float* x, const float* bias, int64_t rows,
              int64_t cols);
void broadcast_rows(cudaStream_t s, float* out, const float* bias, int64_t rows, int64_t cols);
void residual(cudaStream_t s, Workspace& ws, float* xh, const float* x, int64_t rows, int64_t d,
              float grad_scale, float* x_col_sum, float* db_dec, float* stats);
void relu_forward(cudaStream_t s, float* pre, const float* b_enc, int64_t rows, int64_t n);
void relu_backward(cudaStream_t s, Workspace& ws, const float* z, float* dz, const float* norms,
                   float l1, int64_t rows, int64_t n, float* db_enc, float* z_col_sum,
                   int32_t* fires, float* stats);

// Largest supported k: the selection is sorted in shared memory by one block.
constexpr int64_t kMaxTopk = 512;
void topk_forward(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc, int64_t rows,
                  int64_t n, int64_t k, int32_t* idx, float* val, bool relu);
// Backend::topk_forward_columns (workspace slots 0-2).
void topk_forward_columns(cudaStream_t s, Workspace& ws, const float* pre, const float* bias,
                          int64_t rows, int64_t n, const int32_t* cols, int64_t count, int64_t k,
                          int32_t* idx, float* val, bool relu);
void sparse_decode(cudaStream_t s, const int32_t* idx, const float* val, const float* w_dec,
                   int64_t rows, int64_t k, int64_t d, float* x_hat);
void topk_backward(cudaStream_t s, Workspace& ws, bool deterministic, const SparseBackward& a);

// BatchTopK. Both block until their result is on the host.
float batch_threshold(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc,
                      int64_t rows, int64_t n, int64_t count);
int64_t select_above(cudaStream_t s, Workspace& ws, const float* pre, const float* b_enc,
                     float threshold, int64_t rows, int64_t n, int64_t width, int32_t* idx,
                     float* val);

// JumpReLU and Gated activations (JumpReluOps' and GatedOps' comments give the semantics).
void jumprelu_forward(cudaStream_t s, float* pre_to_v, const float* b_enc,
                      const float* log_threshold, int64_t rows, int64_t n, float* z);
void jumprelu_backward(cudaStream_t s, Workspace& ws, const JumpReluBackward& a);
void gated_forward(cudaStream_t s, const float* pre, const float* b_gate, const float* r_mag,
                   const float* b_mag, int64_t rows, int64_t n, float* z, float* gate);
void gated_backward(cudaStream_t s, Workspace& ws, const GatedBackward& a);
void axpby(cudaStream_t s, float* y, const float* x, float a, float b, int64_t n);
// Exchanges a[0, n) and b[0, n).
void swap(cudaStream_t s, float* a, float* b, int64_t n);

// The Switch SAE's row permutations (switch.cu); see SwitchOps (arch/switch.h).
void gather_rows(cudaStream_t s, float* dst, const float* src, const int32_t* rows_of,
                 const float* scale, float beta, int64_t rows, int64_t cols);
void gather_index_rows(cudaStream_t s, int32_t* dst, const int32_t* src, const int32_t* rows_of,
                       int64_t rows, int64_t width);
void row_dots(cudaStream_t s, const float* a, const float* b, int64_t rows, int64_t cols,
              float* out);
void offset_indices(cudaStream_t s, int32_t* idx, int64_t count, int32_t offset);

// The Matryoshka BatchTopK SAE's prefix mask (matryoshka.cu); see MatryoshkaOps
// (arch/matryoshka.h).
void prefix_mask(cudaStream_t s, const int32_t* idx, const float* val, int64_t count,
                 int64_t prefix, float* out);

// Backend::decorr_grad, in three steps around the backend's two GEMMs (C = U^T U, then
// dU = U G; the caller owns u, c, du, inv_norm and factor). z is dense [rows, n] (idx null) or
// `width` (idx, val) pairs per row (val 0: unused); rows >= 2, n >= 2.
// u [rows, n] = the activations (the pairs scattered, a row's later pair winning a repeated
// latent), each column centred on its mean over the rows and divided by its norm after that;
// inv_norm[c] = 1 / that norm, 0 for a constant column (which becomes 0). Double sums.
void decorr_standardize(cudaStream_t s, Workspace& ws, const float* z, const int32_t* idx,
                        int64_t width, int64_t rows, int64_t n, float* u, float* inv_norm);
// With c = U^T U [n, n]: adds R = sqrt(sum_{i != j} c_ij^2 / (n (n - 1))) to *stat and sets
// *factor = 2 / (n (n - 1) R), or 0 when R is not positive. With `grad`, c's diagonal becomes
// 0: c is then G / factor (decorr_apply applies the factor). Everything stays on the device
// (no host synchronization).
void decorr_gram(cudaStream_t s, Workspace& ws, float* c, int64_t n, bool grad, float* stat,
                 float* factor);
// With du = U (G / factor), unless *factor is 0: dz += scale * factor * inv_norm[c] * (du -
// mean_r du - u * sum_r u du) at every element (idx null, dz [rows, n]) or at each pair with
// val != 0 (dz [rows, width]).
void decorr_apply(cudaStream_t s, Workspace& ws, const float* z, const int32_t* idx, int64_t width,
                  int64_t rows, int64_t n, const float* u, const float* du, const float* inv_norm,
                  const float* factor, float scale, float* dz);

void row_norms(cudaStream_t s, const float* w, int64_t rows, int64_t cols, float* norms);
void project_out_parallel(cudaStream_t s, const float* w, float* g, int64_t rows, int64_t cols);
void normalize_rows(cudaStream_t s, float* w, int64_t rows, int64_t cols);
void add_norm_grad(cudaStream_t s, const float* w, const float* coeff, float scale, float* g,
                   int64_t rows, int64_t cols);
void adam(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n,
          const math::AdamScalars& a);
void widen_16bit(cudaStream_t s, const uint16_t* src, float* dst, int64_t n, bool bf16);
// dst [rows, cols] packed = bf16(x [rows, cols] with leading dimension ld), rounded to nearest.
void round_to_bf16(cudaStream_t s, const float* x, int64_t rows, int64_t cols, int64_t ld,
                   uint16_t* dst);

// Adds a sum of doubles (fixed-order tree) to stats[slot] as float: the Backend's stats are
// float sums, the partials double so the order of the final few additions does not matter.
void add_sum_to_stat(cudaStream_t s, const double* v, int64_t len, float* stat);

}  // namespace saetrain::cuda
