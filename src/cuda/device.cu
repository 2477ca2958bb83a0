#include <cuda_runtime.h>
#include <fmt/format.h>

#include "saetrain/cuda_device.h"

namespace saetrain {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error for later calls
        return 0;
    }
    return n;
}

std::string cuda_device_description(int device) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return {};
    return fmt::format("{} (sm_{}{}, {:.1f} GiB)", p.name, p.major, p.minor,
                       static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

std::string cuda_device_name(int device) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return {};
    return p.name;
}

std::string cuda_device_uuid(int device) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError();
        return {};
    }
    return std::string(p.uuid.bytes, sizeof(p.uuid.bytes));
}

}  // namespace saetrain
