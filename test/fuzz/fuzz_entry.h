// fuzz_entry.h — one hostile input through each reader: the code the fuzzers and the
// regression test share.
//
// Each *_one function feeds raw bytes to one entry point (the config loader, the shard readers,
// the SAE checkpoint reader, the safetensors reader). A saetrain::Error is a correct rejection and
// comes back as Outcome::rejected; anything else (another exception, a crash, a hang, a sanitizer
// report) is a bug. Exceptions other than Error propagate: libFuzzer reports them as crashes
// (uncaught -> abort) and the regression test as failures. Extra oracles throw HarnessBug, which is
// not an Error on purpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace saetrain::fuzz {

enum class Outcome { accepted, rejected };

// An input that the library accepted but that breaks a property it promises (e.g. the resolved
// config does not load again). Deliberately not a saetrain::Error.
class HarnessBug : public std::logic_error {
public:
    explicit HarnessBug(const std::string& what) : std::logic_error(what) {}
};

// Float32 elements the shard harness reads at most per input (rows are cut to fit): a header
// that claims 2^40 rows must not make the harness itself allocate gigabytes. 1 MiB of floats.
constexpr int64_t kMaxShardElems = int64_t{1} << 18;

// Bytes as YAML config text. Text after a line "#--set" is one override ("section.key=value")
// per line. Accepted configs must survive config_to_yaml -> config_parse unchanged.
Outcome config_one(const uint8_t* data, size_t size);

// Bytes as one .h5 shard in a temp file: dataset_open, then every row (up to kMaxShardElems
// elements) through ShardOracle and through ShardBatchSource in disk order, which must agree
// bit for bit (NaNs compared as NaNs), then once more shuffled.
Outcome shard_one(const uint8_t* data, size_t size);

// Bytes as an SAE checkpoint in a temp file: sae_is_checkpoint, then sae_read_h5 with meta; an
// accepted checkpoint's vectors must match the shapes it reports.
Outcome checkpoint_one(const uint8_t* data, size_t size);

// Bytes as a .safetensors file (sae-export's format): safetensors_read with metadata; an
// accepted file's tensors must match their shapes and survive write -> read unchanged.
Outcome safetensors_one(const uint8_t* data, size_t size);

}  // namespace saetrain::fuzz
