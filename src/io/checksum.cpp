// checksum.cpp — the checkpoint checksum (sae_file.h): XXH3-64, or the FNV-1a 64 of older files.
// GCC 12 warns of maybe-uninitialized values inside its own AVX-512 intrinsics as xxHash's
// inlined code uses them (a false positive); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "sae_file.h"
#include "saetrain/error.h"

namespace saetrain {

namespace {
constexpr char kXxh3Prefix[] = "xxh3:";
// The basis the first versions used, and older checkpoints need: FNV's published offset basis
// with its last decimal digit dropped (14695981039346656037 -> 1469598103934665603).
constexpr uint64_t kFnvBasis = 1469598103934665603ull;
}  // namespace

Checksum::Checksum(Kind kind) : kind_(kind), fnv_(kFnvBasis) {
    if (kind_ != Kind::xxh3) return;
    XXH3_state_t* st = XXH3_createState();
    SAE_ENFORCE(st != nullptr && XXH3_64bits_reset(st) == XXH_OK,
                "cannot set up the checkpoint checksum (out of memory)");
    xxh_ = st;
}

Checksum::~Checksum() {
    if (xxh_) XXH3_freeState(static_cast<XXH3_state_t*>(xxh_));
}

Checksum::Kind Checksum::kind_of(const std::string& stored) {
    return stored.rfind(kXxh3Prefix, 0) == 0 ? Kind::xxh3 : Kind::fnv1a;
}

void Checksum::add(const void* data, size_t bytes) {
    if (bytes == 0) return;
    if (kind_ == Kind::xxh3) {
        XXH3_64bits_update(static_cast<XXH3_state_t*>(xxh_), data, bytes);
        return;
    }
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) fnv_ = (fnv_ ^ b[i]) * 1099511628211ull;
}

void Checksum::add_header(const TrainState& s) {
    begin_tensor(s.cursors.size());
    add(s.cursors.data(), s.cursors.size() * sizeof(int64_t));
    for (int64_t x : {s.step, s.tokens, s.iteration}) add(&x, sizeof(x));
}

std::string Checksum::text() const {
    if (kind_ == Kind::fnv1a) return fmt::format("{:016x}", fnv_);
    return fmt::format("{}{:016x}", kXxh3Prefix,
                       XXH3_64bits_digest(static_cast<const XXH3_state_t*>(xxh_)));
}

}  // namespace saetrain
