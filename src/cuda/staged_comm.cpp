// StagedComm: device buffers through host copies around a host Communicator; OrderedComm: device
// buffers handed to CUDA-aware MPI after the stream that wrote them (cuda_staged_comm.h).
#include <cuda_runtime.h>

#include <vector>

#include "cuda_check.h"
#include "saetrain/cuda_staged_comm.h"

namespace saetrain {
namespace {

class StagedComm final : public Communicator {
public:
    StagedComm(std::unique_ptr<Communicator> inner, void* stream)
        : inner_(std::move(inner)), stream_(static_cast<cudaStream_t>(stream)) {}

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string name() const override { return inner_->name() + " (GPU buffers staged on host)"; }

    void allreduce_sum(float* data, int64_t n) override {
        staged(data, n, [&](float* h) { inner_->allreduce_sum(h, n); });
    }
    void allreduce_sum(double* data, int64_t n) override {
        staged(data, n, [&](double* h) { inner_->allreduce_sum(h, n); });
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        staged(data, n, [&](int64_t* h) { inner_->allreduce_max(h, n); });
    }
    void allgather(const void* send, void* recv, int64_t bytes) override {
        const bool dev_send = cuda_is_device_pointer(send), dev_recv = cuda_is_device_pointer(recv);
        if (!dev_send && !dev_recv) return inner_->allgather(send, recv, bytes);
        std::vector<char> hs, hr;
        const void* s = send;
        if (dev_send) {
            hs.resize(static_cast<size_t>(bytes));
            copy(hs.data(), send, bytes, cudaMemcpyDeviceToHost);
            s = hs.data();
        }
        const int64_t total = bytes * size();
        void* r = recv;
        if (dev_recv) {
            hr.resize(static_cast<size_t>(total));
            r = hr.data();
        }
        inner_->allgather(s, r, bytes);
        if (dev_recv) copy(recv, hr.data(), total, cudaMemcpyHostToDevice);
    }
    void bcast(void* data, int64_t bytes, int root) override {
        staged(static_cast<char*>(data), bytes, [&](char* h) { inner_->bcast(h, bytes, root); });
    }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key) override {
        return std::make_unique<StagedComm>(inner_->split(color, key), stream_);
    }

private:
    template <typename T, typename F>
    void staged(T* data, int64_t n, F&& collective) {
        if (n <= 0 || !cuda_is_device_pointer(data)) return collective(data);
        std::vector<T> host(static_cast<size_t>(n));
        const auto bytes = n * static_cast<int64_t>(sizeof(T));
        copy(host.data(), data, bytes, cudaMemcpyDeviceToHost);
        collective(host.data());
        copy(data, host.data(), bytes, cudaMemcpyHostToDevice);
    }
    // Ordered on the stream that produced the buffer (a non-blocking stream does not wait for
    // the legacy default stream, so a plain cudaMemcpy could read a gradient still being
    // written), then waited for: the host copy is read or freed next.
    void copy(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
        SAE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream_));
        if (stream_)
            SAE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        else
            SAE_CUDA_CHECK(cudaDeviceSynchronize());
    }

    std::unique_ptr<Communicator> inner_;
    cudaStream_t stream_;
};

// CUDA-aware MPI on device buffers, each collective after the stream that produced them.
class OrderedComm final : public Communicator {
public:
    OrderedComm(std::unique_ptr<Communicator> inner, void* stream)
        : inner_(std::move(inner)), stream_(static_cast<cudaStream_t>(stream)) {}

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string name() const override { return inner_->name() + " (CUDA-aware, GPU buffers)"; }

    void allreduce_sum(float* data, int64_t n) override {
        order(data);
        inner_->allreduce_sum(data, n);
    }
    void allreduce_sum(double* data, int64_t n) override {
        order(data);
        inner_->allreduce_sum(data, n);
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        order(data);
        inner_->allreduce_max(data, n);
    }
    // recv too: a kernel queued earlier may still be reading what the gather overwrites.
    void allgather(const void* send, void* recv, int64_t bytes) override {
        order(send, recv);
        inner_->allgather(send, recv, bytes);
    }
    void bcast(void* data, int64_t bytes, int root) override {
        order(data);
        inner_->bcast(data, bytes, root);
    }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key) override {
        std::unique_ptr<Communicator> part = inner_->split(color, key);
        if (!part) return nullptr;
        return std::make_unique<OrderedComm>(std::move(part), stream_);
    }

private:
    // MPI reads device memory from this thread (through its own copies and streams), ordered
    // after nothing on ours: wait here until the kernels that wrote the buffer have finished.
    void order(const void* a, const void* b = nullptr) {
        if (!cuda_is_device_pointer(a) && !cuda_is_device_pointer(b)) return;
        if (stream_)
            SAE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        else
            SAE_CUDA_CHECK(cudaDeviceSynchronize());
    }

    std::unique_ptr<Communicator> inner_;
    cudaStream_t stream_;
};

}  // namespace

bool cuda_is_device_pointer(const void* p) {
    if (!p) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  // no driver or device, or plain host memory on old drivers
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

std::unique_ptr<Communicator> make_cuda_staged_comm(std::unique_ptr<Communicator> host_comm,
                                                    void* stream) {
    return std::make_unique<StagedComm>(std::move(host_comm), stream);
}

std::unique_ptr<Communicator> make_cuda_ordered_comm(std::unique_ptr<Communicator> device_comm,
                                                     void* stream) {
    return std::make_unique<OrderedComm>(std::move(device_comm), stream);
}

}  // namespace saetrain
