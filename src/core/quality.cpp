#include "saetrain/quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>

#include "saetrain/error.h"

namespace saetrain {

bool QualityGates::pass() const { return measured && failures().empty(); }

std::string QualityGates::failures() const {
    if (!measured) return "not measured";
    std::string f;
    auto fail = [&](bool bad, const std::string& what) {
        if (bad) f += (f.empty() ? "" : "; ") + what;  // no comma: a summary.csv cell
    };
    fail(no_variance, "no variance in the rows (FVU undefined)");
    fail(!(rel_recon_err < kMaxRelReconErr),
         fmt::format("rel_recon_err {:.3g} >= {:g}", rel_recon_err, kMaxRelReconErr));
    fail(!(zeros_frac > kMinZerosFrac),
         fmt::format("zeros_frac {:.3g} <= {:g}", zeros_frac, kMinZerosFrac));
    fail(!(decorr_rms < kMaxDecorrRms),
         fmt::format("decorr_rms {:.3g} >= {:g}", decorr_rms, kMaxDecorrRms));
    fail(!(dead_fraction < kMaxDeadFraction),
         fmt::format("dead {:.1f}% >= {:g}%", 100 * dead_fraction, 100 * kMaxDeadFraction));
    fail(!(dense_fraction < kMaxDenseFraction),
         fmt::format("dense {:.1f}% >= {:g}%", 100 * dense_fraction, 100 * kMaxDenseFraction));
    return f;
}

bool rows_have_variance(double sst, double sum_sq_x, double elements) {
    return sst > kFvuRelativeFloor * sum_sq_x &&
           sst > elements * static_cast<double>(std::numeric_limits<float>::min());
}

double fvu_from_sums(double sse, double sst, double sum_sq_x, double elements) {
    return rows_have_variance(sst, sum_sq_x, elements) ? sse / sst
                                                       : std::numeric_limits<double>::quiet_NaN();
}

void quality_from_sums(QualityGates& q, int64_t rows, double elements, double sse, double sst,
                       double sum_sq_x, double l0, const std::vector<double>& fired_rows) {
    q.rows = rows;
    q.measured = rows > 0 && !fired_rows.empty();
    if (!q.measured) return;
    q.no_variance = !rows_have_variance(sst, sum_sq_x, elements);
    const auto n = static_cast<double>(fired_rows.size()), r = static_cast<double>(rows);
    q.rel_recon_err = sum_sq_x > 0 ? sse / sum_sq_x : 0.0;
    q.zeros_frac = 1.0 - l0 / (r * n);
    q.density.resize(fired_rows.size());
    int64_t dead = 0, dense = 0;
    for (size_t i = 0; i < fired_rows.size(); ++i) {
        q.density[i] = fired_rows[i] / r;
        dead += fired_rows[i] == 0;
        dense += q.density[i] > QualityGates::kDenseAbove;
    }
    q.dead_fraction = static_cast<double>(dead) / n;
    q.dense_fraction = static_cast<double>(dense) / n;
}

double decorrelation_rms(const float* dense, const int32_t* idx, const float* val, int64_t width,
                         int64_t rows, int64_t n) {
    constexpr int64_t kRows = 2048, kLatents = 256;
    rows = std::min(rows, kRows);
    auto for_each = [&](auto f) {  // f(row, latent, value) for every non-zero activation
        for (int64_t r = 0; r < rows; ++r) {
            if (dense) {
                for (int64_t l = 0; l < n; ++l)
                    if (dense[r * n + l] != 0.0f) f(r, l, dense[r * n + l]);
            } else {
                for (int64_t j = 0; j < width; ++j)
                    if (val[r * width + j] != 0.0f) f(r, idx[r * width + j], val[r * width + j]);
            }
        }
    };
    std::vector<int64_t> count(static_cast<size_t>(n), 0);
    for_each([&](int64_t, int64_t l, float) { ++count[l]; });
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return count[a] > count[b]; });
    std::vector<int64_t> column(static_cast<size_t>(n), -1);
    int64_t m = 0;
    for (int64_t l : order) {
        if (m == kLatents || count[l] < 2) break;
        column[l] = m++;
    }
    if (m < 2) return 0.0;
    std::vector<double> z(static_cast<size_t>(rows * m), 0.0);
    for_each([&](int64_t r, int64_t l, float v) {
        if (column[l] >= 0) z[r * m + column[l]] = v;
    });
    // Standardize the columns, then average the squared correlations of distinct pairs.
    for (int64_t c = 0; c < m; ++c) {
        double mean = 0, sq = 0;
        for (int64_t r = 0; r < rows; ++r) mean += z[r * m + c];
        mean /= static_cast<double>(rows);
        for (int64_t r = 0; r < rows; ++r) {
            z[r * m + c] -= mean;
            sq += z[r * m + c] * z[r * m + c];
        }
        const double inv = sq > 0 ? 1.0 / std::sqrt(sq) : 0.0;
        for (int64_t r = 0; r < rows; ++r) z[r * m + c] *= inv;
    }
    double sum = 0;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = a + 1; b < m; ++b) {
            double c = 0;
            for (int64_t r = 0; r < rows; ++r) c += z[r * m + a] * z[r * m + b];
            sum += c * c;
        }
    return std::sqrt(sum / (0.5 * static_cast<double>(m) * static_cast<double>(m - 1)));
}

void density_histogram_write(const std::string& path, const std::vector<double>& density) {
    constexpr int kBins = 16;  // 0.5 decades each, 1e-8 .. 1
    int64_t never = 0;
    std::vector<int64_t> bins(kBins, 0);
    for (double p : density) {
        if (!(p > 0)) {
            ++never;
            continue;
        }
        const int b = static_cast<int>(std::floor((std::log10(p) + 8.0) * 2.0));
        ++bins[static_cast<size_t>(std::clamp(b, 0, kBins - 1))];
    }
    std::ofstream out(path);
    out << "log10_density_lo,log10_density_hi,latents\n";
    out << "-inf,-inf," << never << "\n";
    for (int b = 0; b < kBins; ++b)
        out << fmt::format("{:g},{:g},{}\n", -8.0 + 0.5 * b, -8.0 + 0.5 * (b + 1), bins[b]);
    out.flush();
    SAE_ENFORCE(out.good(), "cannot write the feature-density histogram {}", path);
}

}  // namespace saetrain
