// cuda_device.h — what CUDA devices this process can see (CUDA builds only).
//
// Used by `backend: auto` to choose, by the start-up line to say which device a rank got, and by
// the communicator decision to tell whether ranks share a GPU.
// On a machine without a driver or device these report zero devices rather than failing.
#pragma once

#include <string>

namespace saetrain {

// Visible devices (0 when no driver, no device, or CUDA_VISIBLE_DEVICES hides them all).
int cuda_device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB)"; empty when the device cannot be queried.
std::string cuda_device_description(int device);
// The name alone, "NVIDIA H100 80GB HBM3" (what the MFU peak table matches); empty when the
// device cannot be queried.
std::string cuda_device_name(int device);
// The device's 16-byte UUID as raw bytes (cudaDeviceProp::uuid, what nvidia-smi -L prints as
// GPU-xxxxxxxx-...): the same GPU gives the same bytes in every process of its host, whatever
// CUDA_VISIBLE_DEVICES numbers it, so ranks that share one are found by comparing them
// (comm_choice.h). Empty when the device cannot be queried.
std::string cuda_device_uuid(int device);

}  // namespace saetrain
