// backend.h — the compute seam: memory, GEMM and the SAE ops, on a CPU or a GPU.
//
// The trainer is written once against this interface. Pointers returned by alloc live in the
// backend's memory space (host for CPU, device for CUDA); upload/download cross it. Matrices
// are row-major. Ops are coarse (one per pass over a batch) because each pass over
// [batch, n_latents] costs memory bandwidth; fusing is the backend's job.
//
// The ops here are the ones the trainer and several architectures share. An op that only one
// architecture runs is that architecture's (arch_ops.h): it registers the op's interface and
// CPU reference itself, and a backend hands out its implementation through arch_ops().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "saetrain/arch_ops.h"     // defines: ArchOps, ArchOpSet
#include "saetrain/comm_choice.h"  // defines: CommFacts, CommChoice
#include "saetrain/dtype.h"        // defines: DType
#include "saetrain/host_alloc.h"   // defines: HostAllocator
#include "saetrain/sae_math.h"     // defines: math::AdamScalars

namespace saetrain {

class Communicator;

// The arguments of the backward ops that take many (one struct, written once; B rows, d =
// d_model, n = n_latents). Inputs first, then outputs.

// topk_backward: the sparse backward of a selection of k (idx, val) pairs per row.
struct SparseBackward {
    const float* x = nullptr;      // [rows, d] the rows the encoder saw (x - b_dec)
    const float* derr = nullptr;   // [rows, d] dL/dx_hat
    const int32_t* idx = nullptr;  // [rows, k] latent ids
    const float* val = nullptr;    // [rows, k] activations (0: absent)
    const float* w_dec = nullptr;  // [n, d]
    int64_t rows = 0, n = 0, k = 0, d = 0;
    float* dw_enc = nullptr;   // [n, d] latent-major ([n, d / enc_layers]: see enc_layers)
    float* dw_dec = nullptr;   // [n, d]
    float* db_enc = nullptr;   // [n]
    int32_t* fires = nullptr;  // [n] non-zero activations per latent
    float* stats = nullptr;    // [kStatCount]: adds L0
    // Add to dw_enc, dw_dec and db_enc instead of overwriting them (AuxK's second selection
    // adds its gradient to the main one's).
    bool accumulate = false;
    // [rows, k] or null: added to dval of the entries with val != 0 (a penalty's gradient).
    const float* dval_extra = nullptr;
    // A layered model (a cross-layer transcoder): latent i, of layer l = i / (n / enc_layers),
    // reads only x's block l of d_l = d / enc_layers values (W_enc and dw_enc are [n, d_l]), and
    // its decoder row holds zeros in columns [0, l d_l) (sparse_decode_layered): a backend may
    // skip them, and dw_dec's values there are then unspecified (the caller zeroes them).
    // 1: every latent reads and writes all d.
    int64_t enc_layers = 1;
};

// The optimizer's view of the flat parameter buffer (OptimizerOps::apply, optimizer.h).
struct AdamRange {
    int64_t offset = 0, count = 0;
    bool decay = false;     // AdamW's weight decay applies (weights yes, biases and thresholds no)
    float lr_scale = 1.0f;  // the step's learning rate times this (ParamSegment::lr_scale)
};
// Decoder rows kept at unit norm (sae.normalize_decoder): their gradient loses its radial part
// (project_out_parallel) before it is measured and applied, and the rows are renormalized after
// the update. offset < 0: none.
struct UnitRows {
    int64_t offset = -1, rows = 0, cols = 0;
    bool any() const { return offset >= 0 && rows > 0 && cols > 0; }
};

// The ops whose shapes a backend may limit, for supports(): a run asks before it trains.
enum class BackendOp {
    topk_forward,  // OpShape::k: latents kept per row
};
struct OpShape {
    int64_t rows = 0, n = 0, k = 0, d = 0;
};

// Per-step sums an op writes into a small device array, read back by the trainer.
enum StatSlot : int {
    kStatSse = 0,  // sum over the batch of ||x_hat - x||^2
    kStatSumSqX,   // sum of ||x||^2 (with kStatSse and the batch mean, gives fvu)
    kStatL1,       // sum over tokens of sum_i z_i * ||W_dec_i||
    kStatL0,       // number of non-zero latent activations
    kStatAux,      // an architecture's auxiliary squared error (Gated's gate path, Switch's AuxK)
    kStatDecorr,   // RMS of the correlations between distinct latents (decorr_grad)
    kStatAuxK,     // AuxK's squared error (arch/common.h), beside an architecture's own
    kStatCount
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;

    // --- memory ------------------------------------------------------------------------
    virtual void* alloc_bytes(int64_t bytes) = 0;
    virtual void free_bytes(void* p) = 0;
    virtual void upload(void* dst, const void* src, int64_t bytes) = 0;
    virtual void download(void* dst, const void* src, int64_t bytes) = 0;
    // n values of type t from host memory into the float32 array dst (backend memory), widened
    // exactly (dtype.h): the trainer's batch upload, so 16-bit rows cross to the device at 2
    // bytes a value. Like upload(), src may be reused once it returns. The default widens on
    // the host (widen_to_f32) and uploads the floats; the CPU backend widens straight into dst,
    // the CUDA backend uploads the 16-bit words and widens them on its stream.
    virtual void upload_rows(float* dst, const void* src, DType t, int64_t n);
    // The same for a block of columns: dst [rows, cols] from host rows of `stride` values of
    // type t, src pointing at the block's first value (paired rows: a transcoder's input or
    // target half). The default gathers the block on the host and calls upload_rows; the CPU
    // backend widens straight into dst, the CUDA backend copies it with one strided memcpy.
    virtual void upload_columns(float* dst, const void* src, DType t, int64_t rows, int64_t cols,
                                int64_t stride);
    virtual void fill(float* x, int64_t n, float value) = 0;
    // Zeroes a block of `rows` rows of `cols` values, `ld` values apart (a CLT's weight blocks
    // that must stay zero). The default fills row by row; the CPU and CUDA backends do it in one.
    virtual void zero_block(float* x, int64_t rows, int64_t cols, int64_t ld);
    // Copies `rows` rows of `row_bytes` bytes within backend memory, from rows `src_pitch`
    // bytes apart to rows `dst_pitch` bytes apart (one layer's block of a CLT's [rows, L F]
    // pre-activations out, its selection back in). The regions must not overlap.
    virtual void copy_block(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                            int64_t row_bytes, int64_t rows) = 0;
    virtual void synchronize() = 0;
    // The CPU threads the backend's host-side passes use from the next call on (1 to the count
    // it was made with): the cores other processes leave this rank (cores.h, CoreShare). No
    // result depends on it. The default has no host-side passes to size.
    virtual void set_host_threads(int /*threads*/) {}
    // True when alloc_bytes returns ordinary host memory (the CPU backend): then the trainer
    // may place parameters in node memory that the other ranks of the node map too.
    virtual bool host_memory() const { return false; }
    // Whether `op` runs at `shape` (the CUDA top-k sorts a row's selection in shared memory,
    // so k has a limit); when not, `why` says what the limit is. Asked where a run is
    // configured (arch_check_backend), not hours into it.
    virtual bool supports(BackendOp /*op*/, const OpShape& /*shape*/,
                          std::string* /*why*/ = nullptr) const {
        return true;
    }
    // Where the reader's buffers and the training batch should live on the host so that
    // upload() is fastest (CUDA: pinned memory, a DMA); empty: the default allocator.
    virtual HostAllocator host_allocator() const { return {}; }
    // The stream (cudaStream_t as void*) every op is queued on; null for the CPU.
    virtual void* native_stream() const { return nullptr; }
    // What this rank brings to a group's communicator decision (comm_choice.h): its GPU's UUID
    // and ordinal, whether the build has NCCL and the MPI library reads device memory. The CPU:
    // no GPU (an empty UUID).
    virtual CommFacts comm_facts() const { return {}; }
    // The communicator a group of ranks exchanges this backend's buffers through (the replicas
    // of one SAE their gradients, the latent shards of one replica their partial
    // reconstructions), made from `group` (MPI on host memory). Collective over `group`: every
    // rank's comm_facts (with `world_rank` and `host`, this rank's MPI_COMM_WORLD rank and
    // processor name) are gathered and every rank checks that all decided the same kind
    // (comm_agree) before any communicator is made. The CPU returns `group` as it is (kind
    // host); the CUDA backend makes NCCL when every rank has NCCL and a GPU no other rank of the
    // group has (same device UUID), else CUDA-aware MPI when every rank's MPI is, each
    // collective after the backend's stream, else MPI staged through host copies on that stream
    // (src/cuda/gradient_comm.cpp). NCCL waits are bounded by `timeout_s`, MPI's by the
    // watchdog. A group of one is returned as it is. `choice` (may be null) receives the kind
    // and the notes worth a warning. Throws saetrain::Error, the same line on every rank of the
    // group, when it mixes CPU and GPU ranks or its ranks decided differently.
    virtual std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> group,
                                                        int world_rank, const std::string& host,
                                                        double timeout_s, CommChoice* choice);

    // --- dense algebra -----------------------------------------------------------------
    // C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, op(A) is [m,k], op(B) is [k,n].
    virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) = 0;
    virtual double sum_squares(const float* x, int64_t n) = 0;

    // --- SAE ops (B rows, d = d_model, n = n_latents) ----------------------------------
    // out[r, :] = x[r, :] - bias (the encoder's input, centred by the decoder bias).
    virtual void sub_rows(float* out, const float* x, const float* bias, int64_t rows,
                          int64_t cols) = 0;
    // out[r, :] = bias for every row r (the decoder bias before the decoder GEMM adds z W_dec).
    virtual void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) = 0;

    // err = x_hat - x in place of x_hat, then derr = grad_scale * err (dL/dx_hat for
    // L = grad_scale/2 * sum ||err||^2). Adds SSE and sum ||x||^2 to stats; writes the column
    // sums of x into x_col_sum[d] (for the batch variance) and of derr into db_dec[d].
    virtual void residual(float* x_hat_to_derr, const float* x, int64_t rows, int64_t d,
                          float grad_scale, float* x_col_sum, float* db_dec, float* stats) = 0;

    // --- the selection ops: TopK, BatchTopK, Switch and AuxK --------------------------------
    // TopK: for each row of pre + b_enc keep the k largest (ties: lower index), ReLU them
    // (`relu` false: keep their values as they are, AuxK's selection). idx [rows, k] latent
    // ids, val [rows, k] activations (0 where the ReLU cut). The sparse ops below treat an
    // entry with val == 0 as absent.
    virtual void topk_forward(const float* pre, const float* b_enc, int64_t rows, int64_t n,
                              int64_t k, int32_t* idx, float* val, bool relu) = 0;
    // AuxK's selection: per row the k largest of pre + bias among the columns `cols` (`count`
    // of them, ascending, in backend memory; k <= count), exactly as topk_forward selects them
    // with every other column's bias at -inf. scratch: n floats. Default: that masked bias
    // (bias + 0 or -inf) and topk_forward over all n columns; the CUDA backend gathers the
    // columns into a [rows, count] block first, so few dead latents cost little.
    virtual void topk_forward_columns(const float* pre, const float* bias, int64_t rows, int64_t n,
                                      const int32_t* cols, int64_t count, int64_t k, int32_t* idx,
                                      float* val, bool relu, float* scratch);
    // x_hat[r] += sum_j val[r,j] * w_dec[idx[r,j]] (x_hat holds b_dec already).
    virtual void sparse_decode(const int32_t* idx, const float* val, const float* w_dec,
                               int64_t rows, int64_t k, int64_t d, float* x_hat) = 0;
    // The same for a layered decoder (a cross-layer transcoder's W_dec [n, d], block
    // upper-triangular): latent i, of layer l = i / (n / layers), holds zeros in its row's
    // columns [0, l d / layers), which a backend may skip. Default: sparse_decode (the zeros
    // add nothing).
    virtual void sparse_decode_layered(const int32_t* idx, const float* val, const float* w_dec,
                                       int64_t rows, int64_t k, int64_t d, int64_t n,
                                       int64_t layers, float* x_hat) {
        (void)n, (void)layers;
        sparse_decode(idx, val, w_dec, rows, k, d, x_hat);
    }
    // Sparse backward: with derr [rows, d] and the selection, writes every row of
    //   dw_dec[l] = sum_{(r,j): idx=l} val[r,j] * derr[r]
    //   dw_enc[l] = sum dval[r,j] * x[r],  db_enc[l] = sum dval[r,j],
    // where dval[r,j] = (val != 0) * derr[r] . w_dec[l]; untouched latents get zeros. w_enc and
    // w_dec gradients are [n, d] (latent-major; a layered encoder's [n, d / enc_layers] on its
    // layer's block of x: SparseBackward::enc_layers). fires[l] counts non-zero activations;
    // adds L0.
    virtual void topk_backward(const SparseBackward& a) = 0;

    // The decorrelation penalty (train.decorr_coeff): R = the RMS over pairs of distinct latents
    // of the Pearson correlation of their activations over the rows. z is dense [rows, n]
    // (idx null) or `width` (idx, val) pairs per row (val 0: unused) and dz has z's shape;
    // writes R into stats[kStatDecorr] and adds scale * dR/dz to dz (for pairs: at each pair,
    // the entry being the activation there). Latents constant over the rows have no
    // correlation and get no gradient.
    virtual void decorr_grad(const float* z, const int32_t* idx, int64_t width, int64_t rows,
                             int64_t n, float scale, float* dz, float* stats) = 0;

    // idx[i] += offset for i < count (a Switch expert's or a latent shard's own latent ids to
    // the SAE's).
    virtual void offset_indices(int32_t* idx, int64_t count, int32_t offset) = 0;

    // y = a * x + b * y over n elements.
    virtual void axpby(float* y, const float* x, float a, float b, int64_t n) = 0;
    // Exchanges a[0, n) and b[0, n), bit for bit.
    virtual void swap(float* a, float* b, int64_t n) = 0;

    // norms[i] = ||w[i, :]||.
    virtual void row_norms(const float* w, int64_t rows, int64_t cols, float* norms) = 0;
    // g[i] -= (g[i] . w[i]) w[i] / ||w[i]||^2: drop the part of a decoder row's gradient that
    // only changes its norm (the rows are renormalized after the step anyway).
    virtual void project_out_parallel(const float* w, float* g, int64_t rows, int64_t cols) = 0;
    // w[i] /= ||w[i]|| (rows of zero norm are left alone).
    virtual void normalize_rows(float* w, int64_t rows, int64_t cols) = 0;
    // g[i, :] += scale * coeff[i] * w[i, :] / ||w[i]||: the gradient of
    // scale * sum_i coeff_i ||w_i|| (the decoder-norm weighted L1 term).
    virtual void add_norm_grad(const float* w, const float* coeff, float scale, float* g,
                               int64_t rows, int64_t cols) = 0;

    // --- for reports (metrics.jsonl, the sweep table); the defaults describe the host CPU ---
    // The accelerator's name as its driver reports it ("NVIDIA H100 80GB HBM3"), which selects
    // the peak MFU is measured against (perfmodel.h); empty: the host CPU, no table peak.
    virtual std::string device_name() const { return {}; }
    // Precision the GEMMs run in: "fp32", "tf32" or "bf16" (the peak depends on it).
    virtual std::string gemm_precision() const { return "fp32"; }
    // High-water mark of the device memory this backend has allocated, in bytes; 0 when its
    // memory is the host's (the process's peak RSS covers it then).
    virtual int64_t device_memory_peak_bytes() const { return 0; }

    // --- an architecture's own ops (arch_ops.h) ---------------------------------------------
    // This backend's implementation of `set`, made on first use and kept as long as the
    // backend; null when it has none (arch_check_backend then refuses the architecture at
    // start-up). Default: the set's CPU reference when host_memory(), else null. A backend with
    // its own implementations overrides this and keeps what it makes with keep_arch_ops.
    virtual ArchOps* arch_ops(const ArchOpSet& set);

protected:
    // The ops made for `set` before, or make() (null: none) kept for the next call.
    ArchOps* keep_arch_ops(const ArchOpSet& set,
                           const std::function<std::unique_ptr<ArchOps>()>& make);

private:
    std::map<const ArchOpSet*, std::unique_ptr<ArchOps>> arch_ops_;
};

// Typed, owning device array; frees through its backend.
template <typename T>
class DeviceArray {
public:
    DeviceArray() = default;
    DeviceArray(Backend& be, int64_t n)
        : be_(&be),
          n_(n),
          p_(static_cast<T*>(be.alloc_bytes(n * static_cast<int64_t>(sizeof(T))))) {}
    ~DeviceArray() { reset(); }
    DeviceArray(DeviceArray&& o) noexcept : be_(o.be_), n_(o.n_), p_(o.p_) { o.p_ = nullptr; }
    DeviceArray& operator=(DeviceArray&& o) noexcept {
        if (this != &o) {
            reset();
            be_ = o.be_, n_ = o.n_, p_ = o.p_;
            o.p_ = nullptr;
        }
        return *this;
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* data() { return p_; }
    const T* data() const { return p_; }
    int64_t size() const { return n_; }
    int64_t bytes() const { return n_ * static_cast<int64_t>(sizeof(T)); }
    void reset() {
        if (p_) be_->free_bytes(p_);
        p_ = nullptr;
    }

private:
    Backend* be_ = nullptr;
    int64_t n_ = 0;
    T* p_ = nullptr;
};

// Backend factories (backend_registry.h picks one from the config). `threads` <= 0 means all
// cores the process may use.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace saetrain
