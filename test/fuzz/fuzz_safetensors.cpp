// fuzz_safetensors.cpp — libFuzzer target: bytes -> safetensors_one (see fuzz_entry.h). A
// saetrain::Error is a correct rejection; a crash, another exception, a hang or a sanitizer report
// is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    (void)saetrain::fuzz::safetensors_one(data, size);
    return 0;
}
