// The collective-delay debug mode (cuda_collective_delay.h): NaN poison and a spin kernel queued
// before each collective on a device buffer.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "cuda_check.h"
#include "handles.h"
#include "saetrain/cuda_collective_delay.h"
#include "saetrain/cuda_staged_comm.h"  // defines: cuda_is_device_pointer

namespace saetrain {
namespace {

// --- kernels -----------------------------------------------------------------------------------
__device__ uint64_t global_time_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread busy for `ns` of wall time (%globaltimer, in ns on every GPU since Volta): the
// stream it is queued on stays occupied that long, whatever the clock rate.
__global__ void spin_kernel(uint64_t ns) {
    const uint64_t t0 = global_time_ns();
    while (global_time_ns() - t0 < ns) {
    }
}

constexpr int64_t kMaxDelayUs = 60'000'000;  // a minute per collective is plenty for a debug run

// --- the wrapper -------------------------------------------------------------------------------
class DelayComm final : public Communicator {
public:
    DelayComm(std::unique_ptr<Communicator> inner, cudaStream_t stream, int64_t delay_us)
        : inner_(std::move(inner)),
          stream_(stream),
          delay_us_(delay_us),
          poisoned_(cuda::make_event()) {}
    ~DelayComm() override {
        if (stream_) cudaStreamSynchronize(stream_);  // the restore reads scratch_
    }

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string name() const override {
        return fmt::format("{} (debug: {} us NaN delay before collectives)", inner_->name(),
                           delay_us_);
    }

    void allreduce_sum(float* data, int64_t n) override {
        poison(data, n * 4);
        inner_->allreduce_sum(data, n);
    }
    void allreduce_sum(double* data, int64_t n) override {
        poison(data, n * 8);
        inner_->allreduce_sum(data, n);
    }
    void allreduce_max(int64_t* data, int64_t n) override {
        poison(data, n * 8);
        inner_->allreduce_max(data, n);
    }
    void allgather(const void* send, void* recv, int64_t bytes) override {
        poison(send, bytes);
        inner_->allgather(send, recv, bytes);
    }
    void bcast(void* data, int64_t bytes, int root) override {
        poison(data, bytes);
        inner_->bcast(data, bytes, root);
    }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key) override {
        std::unique_ptr<Communicator> part = inner_->split(color, key);
        if (!part) return nullptr;  // NCCL: this rank asked for no group
        return std::make_unique<DelayComm>(std::move(part), stream_, delay_us_);
    }

private:
    // Queues save, poison, spin, restore on the producing stream; returns once the poison is in
    // place (so the inner collective cannot start before it, and an unordered read lands inside
    // the spin).
    void poison(const void* data, int64_t bytes) {
        if (bytes <= 0 || !cuda_is_device_pointer(data)) return;
        void* p = const_cast<void*>(data);  // restored before anything reads it in order
        const auto n = static_cast<size_t>(bytes);
        if (n > scratch_bytes_) {
            SAE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old scratch may be in use
            scratch_ = cuda::make_device_buffer(n);
            scratch_bytes_ = n;
        }
        SAE_CUDA_CHECK(cudaMemcpyAsync(scratch_.get(), p, n, cudaMemcpyDeviceToDevice, stream_));
        SAE_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, n, stream_));
        SAE_CUDA_CHECK(cudaEventRecord(poisoned_.get(), stream_));
        spin_kernel<<<1, 1, 0, stream_>>>(static_cast<uint64_t>(delay_us_) * 1000u);
        SAE_CUDA_LAUNCH_CHECK();
        SAE_CUDA_CHECK(cudaMemcpyAsync(p, scratch_.get(), n, cudaMemcpyDeviceToDevice, stream_));
        SAE_CUDA_CHECK(cudaEventSynchronize(poisoned_.get()));
    }

    std::unique_ptr<Communicator> inner_;
    cudaStream_t stream_;
    int64_t delay_us_;
    cuda::Event poisoned_;
    cuda::DeviceBuffer scratch_;
    size_t scratch_bytes_ = 0;
};

}  // namespace

int64_t collective_delay_us_from_env() {
    const char* name = "SAETRAIN_DEBUG_COLLECTIVE_DELAY_US";
    const char* v = std::getenv(name);
    if (!v || !*v) return 0;
    char* end = nullptr;
    errno = 0;
    const long long us = std::strtoll(v, &end, 10);
    SAE_ENFORCE(errno == 0 && *end == '\0' && us >= 0 && us <= kMaxDelayUs,
                "{}='{}': expected the delay in microseconds, a whole number from 0 to {} (unset "
                "it for a normal run)",
                name, v, kMaxDelayUs);
    return us;
}

std::unique_ptr<Communicator> make_cuda_collective_delay_comm(std::unique_ptr<Communicator> inner,
                                                              void* stream, int64_t delay_us) {
    SAE_ENFORCE(stream != nullptr && delay_us > 0,
                "make_cuda_collective_delay_comm needs the producing stream and a delay > 0");
    return std::make_unique<DelayComm>(std::move(inner), static_cast<cudaStream_t>(stream),
                                       delay_us);
}

}  // namespace saetrain
