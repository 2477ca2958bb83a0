// sae_file.h (internal) — what the SAE file writers share: the attributes of an SAE file
// (checkpoint.h's layout) and the FNV-1a 64 hash behind the checkpoint checksum.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "saetrain/checkpoint.h"
#include "saetrain/train_state.h"

namespace saetrain {

// The attributes of an SAE file of d_model d x n latents; `extra_names`: the extra datasets'
// names, comma separated ("" writes no `extra` attribute).
void write_sae_attributes(hid_t file, const SaeMeta& meta, int64_t d, int64_t n,
                          const std::string& extra_names);

// A state file's data_cursors and attributes, its checksum finished from `before_cursors` (the
// hash of the weights, the moments and since_fired).
void write_train_state_attributes(hid_t file, const TrainState& s, uint64_t before_cursors);

// The checksum of a state file from the hash of the weights, the moments and since_fired
// (`before_cursors`): the reader cursors, step, tokens and iteration added.
uint64_t checksum_from_cursors(const TrainState& s, uint64_t before_cursors);
// A state file's step, tokens, iteration and cursors into `s`; its checksum attribute.
void read_train_state_header(hid_t file, const std::string& path, TrainState& s);
std::string stored_checksum(hid_t file, const std::string& path);

// An SAE file's attributes (write_sae_attributes'), and the names its `extra` attribute lists,
// each checked to be a dataset there.
SaeMeta read_sae_meta(hid_t file);
std::vector<std::string> read_extra_names(hid_t file, const std::string& path);

inline constexpr uint64_t kFnvBasis = 1469598103934665603ull;

inline uint64_t fnv1a(const void* p, size_t bytes, uint64_t h) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

}  // namespace saetrain
