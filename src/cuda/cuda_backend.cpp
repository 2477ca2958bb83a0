// CudaBackend: the Backend seam on one GPU. One stream orders the computation (a second one
// carries the batch uploads, event-ordered against it: upload_rows); GEMMs go through
// cuBLASLt (lt_gemm.h), the SAE ops through the kernels in kernels.cu, topk_select.cu and
// topk.cu; the architectures' own ops through the implementations arch_ops.cpp registers.
#include "saetrain/cuda_backend.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "arch_ops.h"
#include "cuda_check.h"
#include "gradient_comm.h"
#include "handles.h"
#include "kernels.h"
#include "lt_gemm.h"
#include "saetrain/backend_registry.h"
#include "saetrain/comm.h"
#include "saetrain/cuda_device.h"
#include "saetrain/cuda_pinned.h"
#include "saetrain/mpi_world.h"  // defines: mpi_cuda_aware

namespace saetrain {
namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }
double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(const CudaBackendOptions& o)
        : opt_(o),
          device_(select_device(o.device)),
          stream_(cuda::make_stream()),
          copy_stream_(cuda::make_stream()),
          copied_(cuda::make_event()),
          staging_free_(cuda::make_event()),
          gemm_(stream_.get(), o.gemm),
          ws_(stream_.get()) {
        // Debug and benchmark switch: the batch copy on the compute stream, after everything
        // queued before it (the path before the copy stream; an A/B for bench_step).
        const char* sync = std::getenv("SAETRAIN_DEBUG_SYNC_UPLOAD");
        sync_upload_ = sync != nullptr && std::string(sync) == "1";
    }
    ~CudaBackend() override {
        cudaStreamSynchronize(copy_stream_.get());
        staging_.reset();  // freed on the stream, before the stream goes
        cudaStreamSynchronize(stream_.get());
    }

    std::string name() const override {
        return fmt::format(
            "cuda:{} {}{}", device_, cuda_device_description(device_),
            opt_.gemm == MathMode::fp32 ? "" : fmt::format(" {} GEMMs", math_mode_name(opt_.gemm)));
    }
    cudaStream_t stream() const { return stream_.get(); }

    // --- memory ----------------------------------------------------------------------------
    // Stream-ordered: no device-wide synchronization when the trainer grows its batch buffers.
    void* alloc_bytes(int64_t bytes) override {
        void* p = nullptr;
        const cudaError_t e =
            cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), stream());
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw Error(fmt::format(
                "out of GPU memory on device {}: allocating {:.1f} MiB with {:.1f} of {:.1f} MiB "
                "free ({}); reduce data.batch_size or the SAE size",
                device_, mib(bytes), mib(free_b), mib(total_b), cudaGetErrorString(e)));
        }
        return p;
    }
    void free_bytes(void* p) override {
        if (p) SAE_CUDA_CHECK(cudaFreeAsync(p, stream()));
    }
    // The host side may be pageable and may be reused as soon as the call returns, so both
    // copies wait for the stream (pinned-buffer double buffering belongs to the loader path).
    void upload(void* dst, const void* src, int64_t bytes) override {
        if (bytes <= 0) return;
        SAE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                       stream()));
        SAE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    void download(void* dst, const void* src, int64_t bytes) override {
        if (bytes <= 0) return;
        SAE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                       stream()));
        SAE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    // The batch crosses PCIe as stored (16-bit rows at half of float32's bytes) on a copy
    // stream of its own, into a staging buffer kept and grown to the largest batch; the compute
    // stream waits for the copy's event, then widens it (cuda::widen_16bit) or copies it
    // (float32) into dst. The host waits for the copy only, not for the compute stream, so the
    // DMA of step i+1's batch runs while step i's optimizer pass still runs on the GPU (the
    // trainer calls this at step_begin, right after step_end queued AdamW). The copy engine
    // writes the staging buffer only after the compute stream has consumed the previous batch
    // from it (staging_free_). The host buffer is free again on return, as upload() promises.
    void upload_rows(float* dst, const void* src, DType t, int64_t n) override {
        if (n <= 0) return;
        const int64_t bytes = n * dtype_size(t);
        uint16_t* staged = staging_words((bytes + 1) / 2);
        cudaStream_t copy = sync_upload_ ? stream() : copy_stream_.get();
        SAE_CUDA_CHECK(cudaStreamWaitEvent(copy, staging_free_.get(), 0));
        SAE_CUDA_CHECK(
            cudaMemcpyAsync(staged, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, copy));
        SAE_CUDA_CHECK(cudaEventRecord(copied_.get(), copy));
        SAE_CUDA_CHECK(cudaEventSynchronize(copied_.get()));
        SAE_CUDA_CHECK(cudaStreamWaitEvent(stream(), copied_.get(), 0));
        if (t == DType::f32)
            SAE_CUDA_CHECK(cudaMemcpyAsync(dst, staged, static_cast<size_t>(bytes),
                                           cudaMemcpyDeviceToDevice, stream()));
        else
            cuda::widen_16bit(stream(), staged, dst, n, t == DType::bf16);
        SAE_CUDA_CHECK(cudaEventRecord(staging_free_.get(), stream()));
    }
    // One strided copy of the block (as stored), then the widening kernel for 16-bit rows.
    void upload_columns(float* dst, const void* src, DType t, int64_t rows, int64_t cols,
                        int64_t stride) override {
        if (rows <= 0 || cols <= 0) return;
        const auto size = static_cast<size_t>(dtype_size(t));
        void* to = dst;
        if (t != DType::f32) to = staging_words(rows * cols);
        SAE_CUDA_CHECK(
            cudaMemcpy2DAsync(to, static_cast<size_t>(cols) * size, src,
                              static_cast<size_t>(stride) * size, static_cast<size_t>(cols) * size,
                              static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream()));
        SAE_CUDA_CHECK(cudaStreamSynchronize(stream()));
        if (t != DType::f32)
            cuda::widen_16bit(stream(), staging_.data(), dst, rows * cols, t == DType::bf16);
        SAE_CUDA_CHECK(cudaEventRecord(staging_free_.get(), stream()));  // see upload_rows
    }
    void fill(float* x, int64_t n, float value) override { cuda::fill(stream(), x, n, value); }
    void zero_block(float* x, int64_t rows, int64_t cols, int64_t ld) override {
        if (rows <= 0 || cols <= 0) return;
        SAE_CUDA_CHECK(cudaMemset2DAsync(x, static_cast<size_t>(ld) * sizeof(float), 0,
                                         static_cast<size_t>(cols) * sizeof(float),
                                         static_cast<size_t>(rows), stream()));
    }
    void copy_block(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                    int64_t row_bytes, int64_t rows) override {
        if (rows <= 0 || row_bytes <= 0) return;
        SAE_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                                         static_cast<size_t>(src_pitch),
                                         static_cast<size_t>(row_bytes), static_cast<size_t>(rows),
                                         cudaMemcpyDeviceToDevice, stream()));
    }
    void synchronize() override { SAE_CUDA_CHECK(cudaStreamSynchronize(stream())); }
    bool supports(BackendOp op, const OpShape& shape, std::string* why) const override {
        if (op != BackendOp::topk_forward || shape.k <= cuda::kMaxTopk) return true;
        if (why) *why = fmt::format("its top-k keeps at most {} latents per row", cuda::kMaxTopk);
        return false;
    }
    HostAllocator host_allocator() const override { return cuda_pinned_allocator(); }
    void* native_stream() const override { return stream(); }
    CommFacts comm_facts() const override {
        CommFacts f;
        f.device_uuid = cuda_device_uuid(device_);
        // Unreadable (never seen): all zeros, so that such GPUs on one host count as one shared
        // GPU and never get NCCL on a guess. Not a throw: this rank would leave its group
        // waiting in the agreement.
        if (f.device_uuid.size() != 16) f.device_uuid.assign(16, '\0');
        f.device = device_;
        f.nccl = SAETRAIN_HAVE_NCCL != 0;
        f.mpi_cuda_aware = mpi_cuda_aware();
        return f;
    }
    std::unique_ptr<Communicator> gradient_comm(std::unique_ptr<Communicator> group, int world_rank,
                                                const std::string& host, double timeout_s,
                                                CommChoice* choice) override {
        CommFacts mine = comm_facts();
        mine.world_rank = world_rank;
        mine.host = host;
        return cuda::gradient_comm(std::move(group), stream(), mine, timeout_s, choice);
    }

    // --- dense algebra ---------------------------------------------------------------------
    void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
        gemm_.run(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    double sum_squares(const float* x, int64_t n) override {
        return cuda::sum_squares(stream(), ws_, x, n);
    }

    // --- SAE ops ---------------------------------------------------------------------------
    void sub_rows(float* out, const float* x, const float* bias, int64_t rows,
                  int64_t cols) override {
        cuda::sub_rows(stream(), out, x, bias, rows, cols);
    }
    void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) override {
        cuda::broadcast_rows(stream(), out, bias, rows, cols);
    }
    void residual(float* xh, const float* x, int64_t rows, int64_t d, float grad_scale,
                  float* x_col_sum, float* db_dec, float* stats) override {
        cuda::residual(stream(), ws_, xh, x, rows, d, grad_scale, x_col_sum, db_dec, stats);
    }
    void topk_forward(const float* pre, const float* b_enc, int64_t rows, int64_t n, int64_t k,
                      int32_t* idx, float* val, bool relu) override {
        cuda::topk_forward(stream(), ws_, pre, b_enc, rows, n, k, idx, val, relu);
    }
    void topk_forward_columns(const float* pre, const float* bias, int64_t rows, int64_t n,
                              const int32_t* cols, int64_t count, int64_t k, int32_t* idx,
                              float* val, bool relu, float* /*scratch*/) override {
        cuda::topk_forward_columns(stream(), ws_, pre, bias, rows, n, cols, count, k, idx, val,
                                   relu);
    }
    void sparse_decode(const int32_t* idx, const float* val, const float* w_dec, int64_t rows,
                       int64_t k, int64_t d, float* x_hat) override {
        cuda::sparse_decode(stream(), idx, val, w_dec, rows, k, d, x_hat);
    }
    void topk_backward(const SparseBackward& a) override {
        if (a.enc_layers <= 1) return cuda::topk_backward(stream(), ws_, opt_.deterministic, a);
        // A layered encoder (a CLT's W_enc [n, d_l]): the kernels write whole [n, d] rows, so
        // they write a dense gradient (stream-ordered, freed on return) and each layer's latents
        // keep their block of it; with `accumulate` the blocks are placed there first.
        const int64_t L = a.enc_layers, de = a.d / L, nl = a.n / L, f = sizeof(float);
        DeviceArray<float> dense(*this, a.n * a.d);
        auto block = [&](int64_t l) { return dense.data() + l * nl * a.d + l * de; };
        for (int64_t l = 0; a.accumulate && l < L; ++l)
            copy_block(block(l), a.d * f, a.dw_enc + l * nl * de, de * f, de * f, nl);
        SparseBackward whole = a;
        whole.dw_enc = dense.data(), whole.enc_layers = 1;
        cuda::topk_backward(stream(), ws_, opt_.deterministic, whole);
        for (int64_t l = 0; l < L; ++l)
            copy_block(a.dw_enc + l * nl * de, de * f, block(l), a.d * f, de * f, nl);
    }
    // The CPU backend's algorithm (cpu_backend.cpp) on the device: U standardized per column,
    // C = U^T U and dU = U G through this->gemm (so gpu.gemm's precision applies; G's scalar
    // factor, known only on the device, is applied after the GEMM), column sums in a fixed
    // order, R computed and used on the device (no host synchronization). The buffers
    // ([rows, n] twice, [n, n]) are stream-ordered and freed on return.
    void decorr_grad(const float* z, const int32_t* idx, int64_t width, int64_t rows, int64_t n,
                     float scale, float* dz, float* stats) override {
        if (rows < 2 || n < 2) return;
        DeviceArray<float> u(*this, rows * n), c(*this, n * n), col(*this, n + 1);
        float *inv_norm = col.data(), *factor = col.data() + n;
        cuda::decorr_standardize(stream(), ws_, z, idx, width, rows, n, u.data(), inv_norm);
        gemm(true, false, n, n, rows, 1.0f, u.data(), n, u.data(), n, 0.0f, c.data(), n);
        const bool grad = scale != 0.0f;
        cuda::decorr_gram(stream(), ws_, c.data(), n, grad, stats + kStatDecorr, factor);
        if (!grad) return;
        DeviceArray<float> du(*this, rows * n);
        gemm(false, false, rows, n, n, 1.0f, u.data(), n, c.data(), n, 0.0f, du.data(), n);
        cuda::decorr_apply(stream(), ws_, z, idx, width, rows, n, u.data(), du.data(), inv_norm,
                           factor, scale, dz);
    }
    void offset_indices(int32_t* idx, int64_t count, int32_t offset) override {
        cuda::offset_indices(stream(), idx, count, offset);
    }
    void axpby(float* y, const float* x, float a, float b, int64_t n) override {
        cuda::axpby(stream(), y, x, a, b, n);
    }
    void swap(float* a, float* b, int64_t n) override { cuda::swap(stream(), a, b, n); }
    void row_norms(const float* w, int64_t rows, int64_t cols, float* norms) override {
        cuda::row_norms(stream(), w, rows, cols, norms);
    }
    void project_out_parallel(const float* w, float* g, int64_t rows, int64_t cols) override {
        cuda::project_out_parallel(stream(), w, g, rows, cols);
    }
    void normalize_rows(float* w, int64_t rows, int64_t cols) override {
        cuda::normalize_rows(stream(), w, rows, cols);
    }
    void add_norm_grad(const float* w, const float* coeff, float scale, float* g, int64_t rows,
                       int64_t cols) override {
        cuda::add_norm_grad(stream(), w, coeff, scale, g, rows, cols);
    }

    // --- an architecture's own ops: the implementations arch_ops.cpp registers --------------
    ArchOps* arch_ops(const ArchOpSet& set) override {
        for (const cuda::ArchOpsImpl& impl : cuda::arch_ops_impls())
            if (impl.set == &set)
                return keep_arch_ops(set, [&] { return impl.make({stream(), &ws_}); });
        return nullptr;
    }

    // --- for reports ------------------------------------------------------------------------
    std::string device_name() const override { return cuda_device_name(device_); }
    std::string gemm_precision() const override { return math_mode_name(opt_.gemm); }
    // Every buffer the trainer and the kernels' scratch space allocate comes from the device's
    // stream-ordered pool (cudaMallocAsync), whose high-water mark of bytes in use the driver
    // keeps; the cuBLASLt workspace is the one cudaMalloc beside it. Not counted: the CUDA
    // context and NCCL's own buffers (as in other frameworks' "max allocated" figures).
    int64_t device_memory_peak_bytes() const override {
        cudaMemPool_t pool = nullptr;
        uint64_t high = 0;  // the attribute is a cuuint64_t
        if (cudaDeviceGetMemPool(&pool, device_) != cudaSuccess ||
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) != cudaSuccess) {
            cudaGetLastError();  // a report must not fail the run; 0 reads as "unknown"
            return 0;
        }
        return static_cast<int64_t>(high) + static_cast<int64_t>(cuda::LtGemm::kWorkspaceBytes);
    }

    void widen_16bit(const uint16_t* src, float* dst, int64_t n, bool bf16) {
        cuda::widen_16bit(stream(), src, dst, n, bf16);
    }

private:
    // The staging buffer, at least `words` 16-bit words. Grown on the compute stream (the old
    // one freed there after its last reader); the copy stream is made to wait for the new
    // allocation through staging_free_, recorded right after it.
    uint16_t* staging_words(int64_t words) {
        if (staging_.size() < words) {
            SAE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
            staging_ = DeviceArray<uint16_t>(*this, words);
            SAE_CUDA_CHECK(cudaEventRecord(staging_free_.get(), stream()));
        }
        return staging_.data();
    }

    static int select_device(int device) {
        const int count = cuda_device_count();
        SAE_ENFORCE(count > 0,
                    "backend cuda: no CUDA device is visible (driver missing, no GPU, "
                    "or CUDA_VISIBLE_DEVICES empty); use backend: cpu or auto");
        SAE_ENFORCE(device >= 0 && device < count,
                    "backend cuda: device {} does not exist ({} visible); check the rank's local "
                    "rank and CUDA_VISIBLE_DEVICES",
                    device, count);
        SAE_CUDA_CHECK(cudaSetDevice(device));
        return device;
    }

    // Declaration order is destruction order reversed: the workspace and GEMM plans go before
    // the stream they were ordered on.
    CudaBackendOptions opt_;
    int device_;
    cuda::Stream stream_;
    cuda::Stream copy_stream_;  // upload_rows: host-to-device copies beside the compute stream
    cuda::Event copied_;        // the last batch copy's end, on copy_stream_
    cuda::Event staging_free_;  // on stream_: staging_ may be written again after this point
    bool sync_upload_ = false;  // SAETRAIN_DEBUG_SYNC_UPLOAD=1: copies on stream_ instead
    cuda::LtGemm gemm_;
    cuda::Workspace ws_;
    DeviceArray<uint16_t> staging_;  // upload_rows/columns: the batch as stored, on the device
};

CudaBackend& as_cuda(Backend& b) {
    auto* c = dynamic_cast<CudaBackend*>(&b);
    SAE_ENFORCE(c != nullptr, "backend '{}' is not the CUDA backend", b.name());
    return *c;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
    return std::make_unique<CudaBackend>(options);
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
    CudaBackendOptions o;
    o.device = device;
    return make_cuda_backend(o);
}

void* cuda_backend_stream(Backend& backend) { return as_cuda(backend).stream(); }

const BackendKind& cuda_backend_kind() {
    static const BackendKind kind{
        "cuda", "CUDA", [] { return cuda_device_count(); },
        "this rank sees no CUDA device (check CUDA_VISIBLE_DEVICES and the job's GPU request), "
        "or set backend: cpu",
        [](const BackendRequest& r, std::string* /*note*/) {
            CudaBackendOptions o;
            o.device = r.local_rank % cuda_device_count();
            o.gemm = math_mode_parse(r.gemm);
            o.deterministic = r.deterministic;
            return make_cuda_backend(o);
        }};
    return kind;
}

void cuda_widen_16bit(Backend& backend, const uint16_t* src, float* dst, int64_t n, bool bf16) {
    as_cuda(backend).widen_16bit(src, dst, n, bf16);
}

}  // namespace saetrain
