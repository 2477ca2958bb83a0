// export.h — an SAE written for the tools the field already uses.
//
//   saelens:  cfg.json + sae_weights.safetensors in the SAELens v6 layout, the architecture
//             and its tensors given by the SAE's Architecture::export_fields (arch.h): standard
//             (ReLU), topk with k, jumprelu with its threshold (JumpReLU, and BatchTopK with
//             its learned inference threshold for every latent), gated (b_gate, r_mag, b_mag).
//             Loads with SAE.load_from_disk(dir), and through SAELens in SAEBench,
//             SAEDashboard and Neuronpedia's upload pipeline.
//   sparsify: cfg.json + sae.safetensors (EleutherAI sparsify: encoder.weight [n, d_in],
//             encoder.bias [n], W_dec [n, d_in], b_dec [d_in]); TopK SAEs only, as sparsify has
//             no threshold, gated or ReLU-L1 activation. Loads with SparseCoder.load_from_disk.
// Both compute the same function as saetrain: z = act((x - b_dec) W_enc + b_enc),
// x_hat = z W_dec + b_dec, on unnormalized activations.
#pragma once

#include <string>
#include <vector>

#include "saetrain/checkpoint.h"

namespace saetrain {

enum class ExportFormat { saelens, sparsify };
// "saelens" | "sparsify"; throws Error naming the accepted values.
ExportFormat export_format_parse(const std::string& s);

struct ExportSource {  // what the SAE was trained on, for the consumers' metadata ("" unknown)
    std::string model_name, hook_name, dataset_path;
};

// Writes the SAE into `dir` (created if needed; files written atomically) and returns the
// paths written. Throws Error when the format cannot hold the SAE.
std::vector<std::string> sae_export(const SaeWeights& w, const SaeMeta& meta, ExportFormat format,
                                    const std::string& dir, const ExportSource& source);

}  // namespace saetrain
