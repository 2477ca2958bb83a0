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

// The four tensors an SAE file has always held as datasets of their own (W_enc, W_dec, b_enc,
// b_dec): the others are "extra", listed by name in the file's `extra` attribute and hashed
// with their names (the format's rule, whatever an architecture declares).
bool sae_file_base_tensor(const std::string& name);

// Whether `shape` is W_enc's in a file of an `arch` SAE of d_model d and n latents: [d, n], or a
// cross-layer transcoder's compact [n, d_l] (its L layers of d_l values each, d = L d_l).
bool sae_encoder_shape(const std::string& arch, const std::vector<int64_t>& shape, int64_t d,
                       int64_t n);

// The attributes of an SAE file of d_model d x n latents; `extra_names`: the extra datasets'
// names, comma separated ("" writes no `extra` attribute).
void write_sae_attributes(hid_t file, const SaeMeta& meta, int64_t d, int64_t n,
                          const std::string& extra_names);

// The checksum of a checkpoint pair: the bytes of its tensors (each one's element count first,
// an extra tensor's name before that), then the reader cursors, step, tokens and iteration,
// fed in that order in pieces of any size. XXH3-64, stored as "xxh3:" and 16 hex digits;
// checkpoints written before it hold an FNV-1a 64 (16 hex digits alone; from a nonstandard
// basis, checksum.cpp) and still verify.
class Checksum {
public:
    enum class Kind { xxh3, fnv1a };
    explicit Checksum(Kind kind = Kind::xxh3);
    ~Checksum();
    Checksum(const Checksum&) = delete;
    Checksum& operator=(const Checksum&) = delete;
    // The kind a stored checksum was made with.
    static Kind kind_of(const std::string& stored);

    void add(const void* data, size_t bytes);
    // Before a tensor's values: its name (an extra tensor's; "" for the others), its element
    // count.
    void begin_tensor(uint64_t elements, const std::string& name = "") {
        add(name.data(), name.size());
        add(&elements, sizeof(elements));
    }
    // The reader cursors, step, tokens and iteration: the end of the stream.
    void add_header(const TrainState& s);
    std::string text() const;  // as stored

private:
    Kind kind_;
    uint64_t fnv_;
    void* xxh_ = nullptr;  // XXH3_state_t
};

// A state file's data_cursors and attributes, with the checksum finished from `sum` (fed the
// weights, the moments and since_fired).
void write_train_state_attributes(hid_t file, const TrainState& s, Checksum& sum);

// A state file's step, tokens, iteration and cursors into `s`; its checksum attribute.
void read_train_state_header(hid_t file, const std::string& path, TrainState& s);
std::string stored_checksum(hid_t file, const std::string& path);

// An SAE file's attributes (write_sae_attributes'), and the names its `extra` attribute lists,
// each checked to be a dataset there.
SaeMeta read_sae_meta(hid_t file);
std::vector<std::string> read_extra_names(hid_t file, const std::string& path);

}  // namespace saetrain
