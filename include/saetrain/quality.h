// quality.h — the end-of-run quality gates of an SAE, and its feature-density histogram.
//
// Every run ends with these per SAE, in the console and summary.csv, measured on the held-out
// rows when the run has them (data.eval_path / data.eval_rows), else over the last 10% of the
// training steps (the decorrelation on the last training batch):
//   rel_recon_err   sum ||x - x_hat||^2 / sum ||x||^2                       pass: < 0.10
//   zeros_frac      fraction of (row, latent) activations that are zero     pass: > 0.85
//   decorr_rms      RMS of the Pearson correlations between distinct latents'
//                   activations (the 256 latents that fire most in a sample of
//                   up to 2048 rows; latents that never fire there are left out) pass: < 0.3
//   dead_fraction   latents that fire on none of the rows                   pass: < 0.10
//   dense_fraction  latents that fire on more than 10% of the rows          pass: < 0.10
// and `gates` is PASS when all five pass and the rows have variance: on rows of no variance
// (fvu_from_sums: FVU undefined) the gates FAIL, whatever the five say.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace saetrain {

struct QualityGates {
    bool measured = false;  // false: no rows were seen (nothing to judge)
    bool held_out = false;  // on the held-out rows, else on the end of training
    // The rows have (near) zero variance, so FVU is undefined and the five figures judge an SAE
    // that had nothing to learn (all-zero rows reconstruct with rel_recon_err 0).
    bool no_variance = false;
    int64_t rows = 0;
    double rel_recon_err = 0, zeros_frac = 0, decorr_rms = 0, dead_fraction = 0, dense_fraction = 0;
    std::vector<double> density;  // per latent: the fraction of rows it fires on

    static constexpr double kMaxRelReconErr = 0.10, kMinZerosFrac = 0.85, kMaxDecorrRms = 0.3,
                            kMaxDeadFraction = 0.10, kMaxDenseFraction = 0.10, kDenseAbove = 0.10;
    bool pass() const;
    // The gates that fail, e.g. "rel_recon_err 0.12 >= 0.1; dead 12.0% >= 10%"; "" when none.
    // The console's gates table, summary.csv's gates_failed and sae-report show this text.
    std::string failures() const;
};

// FVU, the fraction of the rows' variance the SAE leaves unexplained: sse / sst, from the sums
// over `elements` values (rows x d_model) of the squared error (sse), the squared deviation from
// the mean (sst) and the squared value (sum_sq_x). NaN (undefined) when the rows have no
// variance to explain, that is when sst <= kFvuRelativeFloor x sum_sq_x (a variance under 1e-5
// of the mean square: the float32 sums sst is the difference of carry about 1e-7 relative error
// each, so below that sst is mostly rounding; identical rows leave such a residue) or when
// sst <= elements x FLT_MIN (a variance per value below float32's smallest normal number: the
// squares of such data are denormal or flush to zero). All-zero, identical and denormal rows are
// undefined; data of any scale with real variance is not.
constexpr double kFvuRelativeFloor = 1e-5;
bool rows_have_variance(double sst, double sum_sq_x, double elements);
double fvu_from_sums(double sse, double sst, double sum_sq_x, double elements);

// Fills the gates from sums over `rows` rows: squared error, squared deviation from the mean,
// squared norm, non-zero activations, and per-latent firing rows (n of them); `elements`: the
// values summed (rows x d_model).
void quality_from_sums(QualityGates& q, int64_t rows, double elements, double sse, double sst,
                       double sum_sq_x, double l0, const std::vector<double>& fired_rows);

// decorr_rms of activations on host: dense [rows, n], or `width` (idx, val) pairs per row
// (val 0: unused). Uses at most 2048 rows and the 256 latents firing most among them; 0 when
// fewer than two latents fire.
double decorrelation_rms(const float* dense, const int32_t* idx, const float* val, int64_t width,
                         int64_t rows, int64_t n);

// The log10 feature-density histogram as CSV: one row for the latents that never fired, then
// bins of 0.5 decades from 1e-8 to 1 (lo, hi, latents).
void density_histogram_write(const std::string& path, const std::vector<double>& density);

}  // namespace saetrain
