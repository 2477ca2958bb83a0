// test_synth — planted-feature generator: unit features, determinism, the statistics the
// options promise (recovered exactly by least squares), and the feature_recovery metric.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/shards.h"
#include "saetrain/synth.h"
#include "saetrain/trainer.h"
#include "shard_oracle.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_test_synth") {}
};

std::vector<float> read_rows(const std::string& dir, DatasetInfo* info_out = nullptr) {
    DatasetInfo info = dataset_open(dir);
    saetrain::testing::ShardOracle r(info, RowRange{0, info.total_rows});
    std::vector<float> v(static_cast<size_t>(info.total_rows * info.d_model));
    EXPECT_EQ(r.read(v.data(), info.total_rows), info.total_rows);
    if (info_out) *info_out = info;
    return v;
}

// Solves the m x m symmetric positive definite system G a = b in place (Cholesky).
std::vector<double> spd_solve(std::vector<double> g, std::vector<double> b, int m) {
    for (int j = 0; j < m; ++j) {
        for (int k = 0; k < j; ++k) g[j * m + j] -= g[j * m + k] * g[j * m + k];
        g[j * m + j] = std::sqrt(g[j * m + j]);
        for (int i = j + 1; i < m; ++i) {
            for (int k = 0; k < j; ++k) g[i * m + j] -= g[i * m + k] * g[j * m + k];
            g[i * m + j] /= g[j * m + j];
        }
    }
    for (int i = 0; i < m; ++i) {  // L y = b
        for (int k = 0; k < i; ++k) b[i] -= g[i * m + k] * b[k];
        b[i] /= g[i * m + i];
    }
    for (int i = m - 1; i >= 0; --i) {  // L^T a = y
        for (int k = i + 1; k < m; ++k) b[i] -= g[k * m + i] * b[k];
        b[i] /= g[i * m + i];
    }
    return b;
}

}  // namespace

// The SAE's random start must not be the planted features: a trainer that drew its decoder
// rows from sae-synth's stream with the same seed (both seeds are 0 by default) would start
// at the answer and show a recovery it did not earn. It once did, by coincidence (one
// mt19937_64 and normal draws in both), and the quickstart reported 0.996 after two steps.
// Random unit vectors in 64 dimensions have a best cosine of about 0.4 among 512 rows; at the
// features it would be 1.
TEST(Synth, TheTrainersRandomStartIsNotThePlantedFeatures) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp.path.string();
    o.rows = 100;
    o.shards = 1;
    synth_write(o);  // the quickstart's data: sae-synth's defaults (d 64, 256 features, seed 0)
    int64_t m = 0, d = 0;
    const std::vector<float> truth = synth_read_features(tmp / "ground_truth.h5", &m, &d);
    for (uint64_t seed : {uint64_t{0}, uint64_t{o.seed}, uint64_t{1}}) {
        std::vector<float> dec(static_cast<size_t>(2 * m * d));
        random_unit_rows(seed, 0, 2 * m, d, dec.data(), 1);
        EXPECT_LT(feature_recovery(truth.data(), m, dec.data(), 2 * m, d), 0.6) << "seed " << seed;
    }
}

TEST(Synth, FeaturesAreUnitNormAndRoundTrip) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp.path.string();
    o.d_model = 20;
    o.n_features = 33;
    o.rows = 50;
    o.shards = 2;
    synth_write(o);
    int64_t m = 0, d = 0;
    std::vector<float> f = synth_read_features(tmp / "ground_truth.h5", &m, &d);
    ASSERT_EQ(m, 33);
    ASSERT_EQ(d, 20);
    ASSERT_EQ(f.size(), 33u * 20u);
    for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t j = 0; j < d; ++j) s += double(f[i * d + j]) * f[i * d + j];
        EXPECT_NEAR(std::sqrt(s), 1.0, 1e-6) << "feature " << i;
    }
    // Distinct features (a generator stuck on one direction would still be unit norm).
    EXPECT_LT(feature_recovery(f.data(), 1, f.data() + d, m - 1, d), 0.999);
    EXPECT_THROW(synth_read_features(tmp / "shard_00000.h5", &m, &d), Error);
}

TEST(Synth, SameSeedSameDataDifferentSeedDifferentData) {
    TempDir tmp;
    SynthOptions o;
    o.d_model = 16;
    o.n_features = 32;
    o.rows = 777;
    o.shards = 3;
    o.seed = 42;
    o.out_dir = tmp / "a";
    synth_write(o);
    o.out_dir = tmp / "b";
    synth_write(o);
    // Shard count and chunking change the files, not the row stream.
    o.out_dir = tmp / "c";
    o.shards = 5;
    o.chunked = true;
    o.chunk_rows = 64;
    synth_write(o);
    o.out_dir = tmp / "d";
    o.seed = 43;
    synth_write(o);
    std::vector<float> a = read_rows(tmp / "a"), b = read_rows(tmp / "b"), c = read_rows(tmp / "c"),
                       d = read_rows(tmp / "d");
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    ASSERT_EQ(a.size(), c.size());
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0);
    size_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == d[i];
    EXPECT_LT(same, a.size() / 100);
    int64_t m, dm;
    EXPECT_EQ(synth_read_features(tmp / "a/ground_truth.h5", &m, &dm),
              synth_read_features(tmp / "b/ground_truth.h5", &m, &dm));
    EXPECT_NE(synth_read_features(tmp / "a/ground_truth.h5", &m, &dm),
              synth_read_features(tmp / "d/ground_truth.h5", &m, &dm));
}

// With no noise and no mean, each row is exactly F^T a; with m < d, F has full row rank and
// the coefficients a are recovered by least squares (G a = F x, G = F F^T), so the test sees
// the generator's hidden draws directly.
TEST(Synth, RowStatisticsMatchTheOptions) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp.path.string();
    o.d_model = 32;
    o.n_features = 8;
    o.active_per_row = 2.0;  // p = 0.25 per feature
    o.min_scale = 0.5;
    o.max_scale = 2.0;
    o.noise_std = 0.0;
    o.mean_norm = 0.0;
    o.rows = 20000;
    o.shards = 2;
    o.seed = 5;
    synth_write(o);
    int64_t m = 0, d = 0;
    std::vector<float> f = synth_read_features(tmp / "ground_truth.h5", &m, &d);
    std::vector<float> x = read_rows(tmp.path.string());
    const int M = 8;
    std::vector<double> g(M * M, 0.0);
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j)
            for (int k = 0; k < d; ++k) g[i * M + j] += double(f[i * d + k]) * f[j * d + k];

    const int64_t n = o.rows;
    double count_sum = 0, mag_sum = 0, logmag_sum = 0;
    int64_t n_active = 0;
    std::vector<int64_t> per_feature(M, 0);
    for (int64_t r = 0; r < n; ++r) {
        std::vector<double> b(M, 0.0);
        for (int i = 0; i < M; ++i)
            for (int k = 0; k < d; ++k) b[i] += double(f[i * d + k]) * x[r * d + k];
        std::vector<double> a = spd_solve(g, b, M);
        for (int i = 0; i < M; ++i) {
            // Rows are stored in float32: coefficients come back within ~1e-5 of the draw.
            if (std::fabs(a[i]) < 1e-3) continue;
            // An active feature has a magnitude in [min, max]; a feature picked twice in a
            // row (a sampling bug) would show up as up to 2 * max.
            ASSERT_GE(a[i], 0.5 - 1e-3) << "row " << r;
            ASSERT_LE(a[i], 2.0 + 1e-3) << "row " << r;
            ++per_feature[i];
            ++n_active;
            count_sum += 1;
            mag_sum += a[i];
            logmag_sum += std::log(a[i]);
        }
    }
    // Active count per row ~ Binomial(8, 0.25): variance 8 * 0.25 * 0.75 = 1.5, so the mean
    // over 20000 rows has standard error sqrt(1.5 / 20000) = 0.0087; allow 5 SE = 0.043.
    EXPECT_NEAR(count_sum / double(n), 2.0, 0.043);
    // Each feature alone: Bernoulli(0.25), SE sqrt(0.1875 / 20000) = 0.0031; 5 SE = 0.015.
    for (int i = 0; i < M; ++i)
        EXPECT_NEAR(double(per_feature[i]) / double(n), 0.25, 0.015) << "feature " << i;
    // Log-uniform on [0.5, 2]: ln a ~ U(-ln 2, ln 2), mean 0, sd ln4/sqrt(12) = 0.40; with
    // ~40000 draws the SE is 0.002; allow 0.01. E[a] = (2 - 0.5) / ln 4 = 1.0820, sd 0.43,
    // SE 0.0021; allow 0.011.
    EXPECT_NEAR(logmag_sum / double(n_active), 0.0, 0.01);
    EXPECT_NEAR(mag_sum / double(n_active), 1.5 / std::log(4.0), 0.011);
}

TEST(Synth, MeanAndNoiseMatchTheOptions) {
    TempDir tmp;
    SynthOptions o;
    o.out_dir = tmp.path.string();
    o.d_model = 16;
    o.n_features = 4;
    o.active_per_row = 0.0;  // rows are mu + noise only
    o.noise_std = 0.1;
    o.mean_norm = 3.0;
    o.rows = 10000;
    o.shards = 1;
    synth_write(o);
    std::vector<float> x = read_rows(tmp.path.string());
    const int d = 16;
    std::vector<double> mu(d, 0.0);
    for (int64_t r = 0; r < o.rows; ++r)
        for (int k = 0; k < d; ++k) mu[k] += x[r * d + k] / double(o.rows);
    double norm = 0, var = 0;
    for (int k = 0; k < d; ++k) norm += mu[k] * mu[k];
    for (int64_t r = 0; r < o.rows; ++r)
        for (int k = 0; k < d; ++k) var += std::pow(x[r * d + k] - mu[k], 2);
    var /= double(o.rows * d);
    // Each mean component has SE 0.1 / sqrt(10000) = 0.001, so the norm is within ~0.005.
    EXPECT_NEAR(std::sqrt(norm), 3.0, 0.01);
    // Variance of 160000 N(0, 0.01) draws: relative SE sqrt(2 / 160000) = 0.35%; allow 2%.
    EXPECT_NEAR(var, 0.01, 0.0002);
}

TEST(FeatureRecovery, SelfRandomAndHandComputed) {
    const int64_t m = 20, d = 24;
    std::mt19937 rng(3);
    std::normal_distribution<float> g;
    std::vector<float> truth(m * d), rnd(m * d);
    for (auto& v : truth) v = g(rng);
    for (auto& v : rnd) v = g(rng);
    EXPECT_NEAR(feature_recovery(truth.data(), m, truth.data(), m, d), 1.0, 1e-12);
    // Permuted, positively scaled rows plus extra rows: still 1.
    std::vector<float> dec;
    for (int64_t i = m - 1; i >= 0; --i)
        for (int64_t k = 0; k < d; ++k) dec.push_back(3.0f * truth[i * d + k]);
    dec.insert(dec.end(), rnd.begin(), rnd.end());
    EXPECT_NEAR(feature_recovery(truth.data(), m, dec.data(), 2 * m, d), 1.0, 1e-6);
    // Random directions in 24-d: best cosine of 20 tries is typically ~0.4-0.5.
    double r = feature_recovery(truth.data(), m, rnd.data(), m, d);
    EXPECT_LT(r, 0.8);
    EXPECT_GT(r, 0.0);
    // Hand-computed: e1, e2 against the diagonal [1, 1] and -e1: cos = 1/sqrt(2) for both
    // (the sign matters: -e1 has cosine -1 with e1).
    const float t2[] = {1, 0, 0, 1};
    const float d2[] = {1, 1, -1, 0};
    EXPECT_NEAR(feature_recovery(t2, 2, d2, 2, 2), 1.0 / std::sqrt(2.0), 1e-12);
    const float d3[] = {2, 0};
    EXPECT_NEAR(feature_recovery(t2, 2, d3, 1, 2), 0.5, 1e-12);  // (1 + 0) / 2
}
