// dtype.cpp — element type names and sizes, the host widening and the non-finite check on
// stored bits (dtype.h).
#include "saetrain/dtype.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include <cstring>

#include "saetrain/error.h"
#include "saetrain/sae_math.h"  // defines: fp16_bits_to_float, bf16_bits_to_float

namespace saetrain {

const char* dtype_name(DType t) {
    switch (t) {
        case DType::f32:
            return "float32";
        case DType::f16:
            return "float16";
        case DType::bf16:
            return "bfloat16";
    }
    return "?";
}

int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

DType dtype_parse(const std::string& s) {
    if (s == "f32" || s == "float32") return DType::f32;
    if (s == "f16" || s == "float16" || s == "fp16") return DType::f16;
    if (s == "bf16" || s == "bfloat16") return DType::bf16;
    throw Error(fmt::format("unknown dtype '{}'; use f32, f16 or bf16", s));
}

// --- widening ------------------------------------------------------------------------------

void widen_to_f32(DType t, const void* src, float* dst, int64_t n) {
    if (t == DType::f32) {
        std::memcpy(dst, src, static_cast<size_t>(n) * 4);
        return;
    }
    const auto* s = static_cast<const uint16_t*>(src);
    if (t == DType::f16) {
        int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
        // The CPU's own conversion (exact, NaN payloads kept: the tests check all inputs).
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
        }
#endif
        for (; i < n; ++i) dst[i] = math::fp16_bits_to_float(s[i]);
    } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = math::bf16_bits_to_float(s[i]);
    }
}

// --- the non-finite check ------------------------------------------------------------------

namespace {

// NaN and Inf are the values whose exponent bits are all ones: an integer OR-reduction over
// the bits vectorizes (a float reduction would not, without -ffast-math). Word is the stored
// word (uint32_t for float32, uint16_t for 16-bit), mask its exponent field. On several
// threads: one core reads a 12.6 MB float32 batch in about a millisecond, a GPU step's worth.
template <class Word>
bool all_finite(const void* x, int64_t n, Word mask, int threads) {
    const auto* bytes = static_cast<const char*>(x);
    uint32_t bad = 0;
    const bool parallel = n > (1 << 18);
    // clang-format off
#pragma omp parallel for simd schedule(static) num_threads(threads) reduction(|: bad) if (parallel)
    // clang-format on
    for (int64_t i = 0; i < n; ++i) {
        Word w;  // memcpy: the rows may be floats, read here as their bits
        std::memcpy(&w, bytes + i * int64_t{sizeof(Word)}, sizeof(Word));
        bad |= static_cast<uint32_t>((w & mask) == mask);
    }
    return bad == 0;
}

template <class Word>
int64_t first_bad_row(const void* x, int64_t rows, int64_t d, Word mask) {
    const auto* bytes = static_cast<const char*>(x);
    for (int64_t i = 0; i < rows * d; ++i) {
        Word w;
        std::memcpy(&w, bytes + i * int64_t{sizeof(Word)}, sizeof(Word));
        if ((w & mask) == mask) return i / d;
    }
    return -1;
}

}  // namespace

int64_t first_nonfinite_row(DType t, const void* x, int64_t rows, int64_t d, int threads) {
    const int64_t n = rows * d;
    threads = threads < 1 ? 1 : threads;
    if (n <= 0) return -1;
    switch (t) {
        case DType::f32:
            if (all_finite<uint32_t>(x, n, 0x7f800000u, threads)) return -1;
            return first_bad_row<uint32_t>(x, rows, d, 0x7f800000u);
        case DType::f16:
            if (all_finite<uint16_t>(x, n, uint16_t{0x7c00}, threads)) return -1;
            return first_bad_row<uint16_t>(x, rows, d, uint16_t{0x7c00});
        case DType::bf16:
            if (all_finite<uint16_t>(x, n, uint16_t{0x7f80}, threads)) return -1;
            return first_bad_row<uint16_t>(x, rows, d, uint16_t{0x7f80});
    }
    return -1;
}

}  // namespace saetrain
