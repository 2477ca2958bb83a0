// evaluation.h — how good an SAE is: held-out evaluation, the end-of-run quality gates over the
// last tenth of training, and reconstructions to check exports against.
//
// SaeTrainer::evaluate, training_quality and reconstruct (src/core/evaluation.cpp) run the
// trainer's forward pass and change no parameter or optimizer state, so training after them is
// bitwise the same. What they need beyond the forward pass is here: the activations brought to
// the host, the decorrelation over a latent-sharded SAE's latent shards, the held-out sums, and the
// window of training steps the end-of-run gates are measured on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "saetrain/arch.h"         // defines: Activations
#include "saetrain/backend.h"      // defines: Backend
#include "saetrain/param_store.h"  // defines: ParamStore (its latent shards)
#include "saetrain/quality.h"      // defines: QualityGates

namespace saetrain {

class Communicator;

// The SAE on held-out rows (SaeTrainer::evaluate), over all replicas' rows.
struct EvalResult {
    int64_t rows = 0;  // 0: nothing was evaluated
    // sum ||x_hat - x||^2 / sum ||x - mean||^2, mean over the set; NaN (undefined) when the set
    // has no variance (fvu_from_sums, quality.h)
    double fvu = 0;
    double l0 = 0;              // non-zero activations per row
    double dead_fraction = 0;   // latents that fire on no row of the set
    double dense_fraction = 0;  // latents that fire on more than 10% of its rows
    QualityGates quality;       // the quality gates on these rows (quality.h)
    // A layered model's (a cross-layer transcoder's) figures per layer, in layer order: the FVU
    // of that layer's target block, the non-zero activations per row of its latents, the share
    // of its latents that fire on no row. Empty for a model of one layer.
    std::vector<double> layer_fvu, layer_l0, layer_dead;
};

// An ArchPass's activations of `rows` rows on the host: dense [rows, n] values (idx empty), or
// `per_row` (latent, value) pairs per row (value 0: unused).
struct HostActivations {
    std::vector<float> val;
    std::vector<int32_t> idx;
    int64_t per_row = 0;
    bool dense = false;
};
HostActivations activations_download(Backend& be, const Activations& a, int64_t rows, int64_t n);

// decorrelation_rms (quality.h) of `rows` rows of activations over the whole SAE: on a latent
// shard (collective over the latent shards) every latent shard's non-zero activations are
// gathered first.
double decorrelation_over_latent_shards(const ParamStore& store, const HostActivations& a,
                                        int64_t rows);

// Held-out evaluation's sums over batches: rows, squared error, sum ||x||^2, L0, the column sums
// of x and the rows each of this latent shard's latents fired on; with `layers` > 1 (a layered
// model: x's d values and the n_total latents in `layers` equal blocks) each layer's squared
// error, sum ||x_l||^2 and L0 as well. first_latent: this latent shard's first latent.
class EvalSums {
public:
    EvalSums(int64_t d, int64_t n_local, int64_t layers = 1, int64_t first_latent = 0,
             int64_t n_total = 0);
    // One batch: its stats (kStatCount, the residual's), the column sums of x, its activations;
    // with layers, x_hat and x on the host ([rows, d] each; ignored otherwise).
    void add(int64_t rows, const float* stats, const std::vector<float>& x_col_sum,
             const HostActivations& a, const float* x_hat = nullptr, const float* x = nullptr);
    // Summed over the replicas (collective), L0 and the latents over the latent shards; `decorr`:
    // this replica's [decorr_rms, 1 when measured], averaged over the replicas that measured.
    EvalResult result(Communicator& replicas, const ParamStore& store,
                      std::vector<double> decorr) const;

    int64_t layers() const { return layers_; }

private:
    int64_t d_, n_, layers_, first_, n_total_;
    // [rows, sse, sum ||x||^2, l0, column sums of x (d), firing rows per latent (n), then per
    // layer: sse, sum ||x_l||^2 and l0 (3 x layers, with layers > 1)]
    std::vector<double> sums_;
};

// The steps from 90% of total_steps on: their sums, for the end-of-run gates when a run has no
// held-out rows (SaeTrainer::training_quality) and the architecture's summary.
class QualityWindow {
public:
    // d: the values of a row the squared error is summed over (d_model).
    QualityWindow(int64_t total_steps, int64_t n_local, int64_t d);
    // A step's sums (over the replicas) when `step` is in the window; sst: its squared
    // deviation from its batch's mean.
    void add(int64_t step, int64_t rows, double sse, double sst, double sum_sq_x, double l0,
             const std::vector<int32_t>& fires, const std::vector<double>& arch_sums);
    // The gates over the window, the whole SAE's latents (gathered over latent shards).
    QualityGates gates(const ParamStore& store) const;
    const std::vector<double>& fired() const { return fired_; }  // this latent shard's latents
    const std::vector<double>& arch_sums() const { return arch_sums_; }  // ArchPass::step_sums

private:
    int64_t start_ = 0, rows_ = 0, d_ = 0;
    double sse_ = 0, sst_ = 0, sum_sq_ = 0, l0_ = 0;
    std::vector<double> fired_;
    std::vector<double> arch_sums_;
};

}  // namespace saetrain
