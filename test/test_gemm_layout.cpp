// The row-major -> column-major GEMM mapping (gemm_layout.h) that the CUDA backend hands to
// cuBLASLt, checked on the CPU: a naive column-major GEMM driven by the mapping must equal a
// naive row-major GEMM, for every transpose combination and every call the trainer makes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "saetrain/error.h"
#include "saetrain/gemm_layout.h"

using namespace saetrain;

namespace {

std::vector<float> randu(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
}

// Column-major reference, as BLAS defines it: X(i, j) = x[i + j * ld].
void gemm_col_major_ref(const ColMajorGemm& g, float alpha, const float* a, const float* b,
                        float beta, float* c) {
    for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
            double s = 0;
            for (int64_t p = 0; p < g.k; ++p) {
                const float av = g.trans_a ? a[p + i * g.a.ld] : a[i + p * g.a.ld];
                const float bv = g.trans_b ? b[j + p * g.b.ld] : b[p + j * g.b.ld];
                s += double(av) * bv;
            }
            float& cv = c[i + j * g.c.ld];
            cv = static_cast<float>(alpha * s + beta * double(cv));
        }
    }
}

// Row-major reference, as Backend::gemm documents it.
void gemm_row_major_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                        float* c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p)
                s += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                     (tb ? b[j * ldb + p] : b[p * ldb + j]);
            float& cv = c[i * ldc + j];
            cv = static_cast<float>(alpha * s + beta * double(cv));
        }
    }
}

struct Call {
    const char* what;
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
};

void check_call(const Call& c) {
    SCOPED_TRACE(c.what);
    const ColMajorGemm g = to_col_major_gemm(c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc);
    // The stored operands must fit their buffers as cuBLASLt layouts (rows <= ld).
    EXPECT_LE(g.a.rows, g.a.ld);
    EXPECT_LE(g.b.rows, g.b.ld);
    EXPECT_LE(g.c.rows, g.c.ld);
    EXPECT_EQ(g.c.rows, c.n);
    EXPECT_EQ(g.c.cols, c.m);
    // op(A) of the column-major call is m x k, op(B) is k x n.
    EXPECT_EQ(g.trans_a ? g.a.cols : g.a.rows, g.m);
    EXPECT_EQ(g.trans_a ? g.a.rows : g.a.cols, g.k);
    EXPECT_EQ(g.trans_b ? g.b.cols : g.b.rows, g.k);
    EXPECT_EQ(g.trans_b ? g.b.rows : g.b.cols, g.n);

    const int64_t a_rows = c.ta ? c.k : c.m, b_rows = c.tb ? c.n : c.k;
    const auto a = randu(a_rows * c.lda, 1), b = randu(b_rows * c.ldb, 2);
    auto want = randu(c.m * c.ldc, 3);
    auto got = want;
    gemm_row_major_ref(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), c.lda, b.data(), c.ldb, c.beta,
                       want.data(), c.ldc);
    ASSERT_TRUE(g.swap_operands);
    gemm_col_major_ref(g, c.alpha, b.data(), a.data(), c.beta, got.data());
    // Same products summed in the same order in double: the results agree exactly, including
    // the padding columns between n and ldc, which neither reference may touch.
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

}  // namespace

TEST(GemmLayout, EveryTransposeCombinationWithPaddedLeadingDimensions) {
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            const int64_t m = 7, n = 5, k = 9;
            const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 4;
            check_call({ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"), ta, tb, m, n, k, lda, ldb,
                        ldc, 1.5f, -0.5f});
        }
    }
}

TEST(GemmLayout, EveryCallTheTrainerMakes) {
    // Shapes from SaeTrainer::compute_gradients (B rows, d = d_model, n = n_latents; W_enc and
    // W_dec latent-major [n, d]). Odd sizes so a swapped m/n or ld shows up.
    const int64_t B = 6, d = 5, n = 11;
    const Call calls[] = {
        {"pre = xc W_enc^T", false, true, B, n, d, d, d, n, 1.0f, 0.0f},
        {"x_hat += z W_dec (ReLU)", false, false, B, d, n, n, d, d, 1.0f, 1.0f},
        {"dW_dec = z^T derr", true, false, n, d, B, n, d, d, 1.0f, 0.0f},
        {"dz = derr W_dec^T", false, true, B, n, d, d, d, n, 1.0f, 0.0f},
        {"dW_enc = dpre^T xc", true, false, n, d, B, n, d, d, 1.0f, 0.0f},
        {"db_dec -= db_enc W_enc (m = 1)", false, false, 1, d, n, n, d, d, -1.0f, 1.0f},
    };
    for (const Call& c : calls) check_call(c);
}

TEST(GemmLayout, RejectsLeadingDimensionShorterThanARow) {
    EXPECT_THROW(to_col_major_gemm(false, false, 4, 5, 6, 5, 5, 5), Error);  // lda < k
    EXPECT_THROW(to_col_major_gemm(false, true, 4, 5, 6, 6, 5, 5), Error);   // ldb < k
    EXPECT_THROW(to_col_major_gemm(false, false, 4, 5, 6, 6, 5, 4), Error);  // ldc < n
    EXPECT_NO_THROW(to_col_major_gemm(true, false, 4, 5, 6, 4, 5, 5));
}
