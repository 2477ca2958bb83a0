// tensor_blocks.h (internal) — a checkpoint's tensors written, read and hashed a block at a
// time, so that no rank holds a whole tensor: what the gathered pair (gathered_checkpoint.cpp)
// and the latent shards' parts (checkpoint_parts.cpp) share.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "h5.h"
#include "sae_file.h"             // defines: Checksum
#include "saetrain/trainer_io.h"  // defines: TensorInfo, TensorChunk

namespace saetrain::blocks {

constexpr hsize_t kReadChunkElements = hsize_t{1} << 24;  // 64 MiB of floats

// The checksum (sae_file.h) built up chunk by chunk: before a tensor's first chunk, its name
// (the weights' extra tensors) and its element count, as train_state_checksum adds them.
struct ChunkHash {
    Checksum sum;
    explicit ChunkHash(Checksum::Kind kind = Checksum::Kind::xxh3) : sum(kind) {}
    void begin(const std::string& name, bool named, const std::vector<int64_t>& shape);
    void add(const TensorChunk& c);
};

// An f32 or i64 dataset of t's shape in `file`.
h5::Dataset create_dataset(hid_t file, const TensorInfo& t);
// Elements [offset, offset + count) of the tensor, whole rows of a 2-D one; throws naming
// `path` (a full disk, most likely).
void write_chunk(hid_t dset, const TensorInfo& t, const TensorChunk& c, const std::string& path);
// Reads the block [start, start + count) of dataset `name` as `type`, throwing naming the file.
void read_block(hid_t file, const std::string& path, const std::string& name,
                const std::vector<int64_t>& start, const std::vector<int64_t>& count, hid_t type,
                void* out);
// Hashes dataset `name` whole (its name first when `named`), a block of rows at a time.
void hash_dataset(hid_t file, const std::string& path, const std::string& name, bool named,
                  bool i64, ChunkHash& hash);

}  // namespace saetrain::blocks
