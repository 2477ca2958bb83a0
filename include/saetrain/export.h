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
//             TopK transcoders too (transcode: true, W_skip for a skip-transcoder).
//   circuit_tracer: a BatchTopK or JumpReLU transcoder as circuit-tracer's single-layer
//             transcoder (layer_<L>.safetensors, a JumpReLU) and config.yaml, its transcoder set
//             of every layer exported into the directory. Loads with load_relu_transcoder or
//             load_transcoder_set.
// All compute the same function as saetrain: z = act((x - b_dec) W_enc + b_enc),
// x_hat = z W_dec + b_dec, on unnormalized activations (a transcoder: z = act(x W_enc + b_enc),
// y_hat = z W_dec + b_dec + x W_skip^T).
#pragma once

#include <string>
#include <vector>

#include "saetrain/checkpoint.h"

namespace saetrain {

enum class ExportFormat { saelens, sparsify, circuit_tracer };
// "saelens" | "sparsify" | "circuit_tracer"; throws Error naming the accepted values.
ExportFormat export_format_parse(const std::string& s);

struct ExportSource {  // what the SAE was trained on, for the consumers' metadata ("" unknown)
    std::string model_name, hook_name, dataset_path;
    // circuit_tracer: the transcoder's layer (-1 unknown: refused) and the set's hook points,
    // in TransformerLens's names as circuit-tracer's own configs give them.
    int64_t layer = -1;
    std::string input_hook = "ln2.hook_normalized", output_hook = "hook_mlp_out";
};

// Writes the SAE into `dir` (created if needed; files written atomically) and returns the
// paths written. Throws Error when the format cannot hold the SAE.
std::vector<std::string> sae_export(const SaeWeights& w, const SaeMeta& meta, ExportFormat format,
                                    const std::string& dir, const ExportSource& source);

}  // namespace saetrain
