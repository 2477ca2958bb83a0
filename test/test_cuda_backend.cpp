// What only the CUDA backend has, checked on the device: the 16-bit widening kernel against
// sae_math.h's conversions, every one of the 65,536 bit patterns. Every Backend op is checked
// against the CPU in test_backend_parity. Skips, with the reason, where no CUDA device is
// visible.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "saetrain/backend.h"
#include "saetrain/cuda_backend.h"
#include "saetrain/cuda_device.h"
#include "saetrain/sae_math.h"

using namespace saetrain;

TEST(CudaOnly, Widen16BitMatchesSaeMath) {
    if (cuda_device_count() == 0)
        GTEST_SKIP() << "no CUDA device visible (no driver, no GPU, or CUDA_VISIBLE_DEVICES "
                        "empty): GPU tests need a GPU node";
    auto be = make_cuda_backend(0);
    std::vector<uint16_t> bits(65536);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
    DeviceArray<uint16_t> gb(*be, static_cast<int64_t>(bits.size()));
    be->upload(gb.data(), bits.data(), gb.bytes());
    for (bool bf16 : {false, true}) {
        DeviceArray<float> out(*be, static_cast<int64_t>(bits.size()));
        cuda_widen_16bit(*be, gb.data(), out.data(), out.size(), bf16);
        std::vector<float> got(bits.size());
        be->download(got.data(), out.data(), out.bytes());
        for (size_t i = 0; i < bits.size(); ++i) {
            const float want =
                bf16 ? math::bf16_bits_to_float(bits[i]) : math::fp16_bits_to_float(bits[i]);
            if (std::isnan(want)) {
                EXPECT_TRUE(std::isnan(got[i])) << i;
            } else {
                ASSERT_EQ(got[i], want) << "bits " << i << (bf16 ? " bf16" : " fp16");
            }
        }
    }
}
