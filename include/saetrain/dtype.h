// dtype.h — the element types of activation rows, and rows held in one of them.
//
// Shards store float32, float16 or bfloat16. A 16-bit row stays 16-bit from the disk to the
// device: the reader, the shuffle buffer, the output ring, the loop's batch, the shared-sweep
// all-gather and the latent-shard broadcast all move the stored bytes (half of float32's), and
// the rows are widened once, where they are consumed (Backend::upload_rows: on the GPU after
// the upload, on the CPU on the host). Widening is exact (every half and bfloat16 is a float),
// so where it happens changes no value. The non-finite check reads the stored bits.
#pragma once

#include <cstdint>
#include <string>

namespace saetrain {

enum class DType { f32, f16, bf16 };
const char* dtype_name(DType t);  // "float32", "float16", "bfloat16"
int dtype_size(DType t);          // bytes per element: 4 or 2
// Parses f32|float32, f16|float16|fp16, bf16|bfloat16; throws Error otherwise.
DType dtype_parse(const std::string& s);

// Widens n elements of type t at src to float32 at dst, exactly: sae_math.h's
// fp16_bits_to_float / bf16_bits_to_float (the conversion the GPU's widen kernel runs), or
// the CPU's F16C instructions where the build has them (the same bits, except that a
// signalling NaN comes out quiet); float32 is copied. The project's one host widening.
void widen_to_f32(DType t, const void* src, float* dst, int64_t n);

// The first of `rows` rows of d elements of type t holding a NaN or an Inf, or -1 when every
// value is finite. The test is on the stored bits (exponent all ones: 0x7f800000 for float32,
// 0x7c00 for float16, 0x7f80 for bfloat16), the same decision as testing the widened floats,
// at 2 bytes a value for 16-bit rows. The common all-finite case is one OR-reduction on up to
// `threads` threads; the row is looked for only when some value is bad.
int64_t first_nonfinite_row(DType t, const void* x, int64_t rows, int64_t d, int threads = 1);

// Rows [rows, d] in host memory in their element type: what a BatchSource delivers and what
// SaeTrainer uploads. A float32 pointer converts to a view of float32 rows, so code that holds
// float32 rows passes them as before.
struct BatchView {
    const void* data = nullptr;
    DType dtype = DType::f32;

    BatchView() = default;
    BatchView(const float* x) : data(x) {}  // NOLINT(google-explicit-constructor): see above
    BatchView(const void* x, DType t) : data(x), dtype(t) {}
    // The view from row r on, for rows of d elements (null stays null).
    BatchView rows_from(int64_t r, int64_t d) const {
        if (data == nullptr) return *this;
        return {static_cast<const char*>(data) + r * d * dtype_size(dtype), dtype};
    }
};

}  // namespace saetrain
