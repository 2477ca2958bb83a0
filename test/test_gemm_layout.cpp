// The row-major -> column-major GEMM mapping (gemm_layout.h) that the CUDA backend hands to
// cuBLASLt, checked on the CPU: a naive column-major GEMM driven by the mapping must equal a
// naive row-major GEMM, for every transpose combination and every call the trainer makes
// (recorded from training steps of every architecture, not listed by hand).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/backend_registry.h"
#include "saetrain/comm.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/forwarding_backend.h"
#include "saetrain/gemm_layout.h"
#include "saetrain/trainer.h"

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

// Records the GEMM calls a backend is asked for (row-major, as Backend::gemm documents them).
class GemmRecorder final : public ForwardingBackend {
public:
    explicit GemmRecorder(Backend& be) : ForwardingBackend(be) {}
    std::vector<Call> calls;
    void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) override {
        calls.push_back({"", ta, tb, m, n, k, lda, ldb, ldc, alpha, beta});
        ForwardingBackend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
};

// Every GEMM call the trainer makes, as it makes them: a few steps of every architecture on the
// CPU backend, with AuxK (latents die after one batch without firing) and the decorrelation
// penalty on (where the architecture has it), recorded and each distinct call replayed through the
// mapping. Odd sizes (B 7, d 6, 12 latents) so a swapped m/n or leading dimension shows up.
TEST(GemmLayout, EveryCallTheTrainerMakes) {
    const int64_t B = 7, d = 6, steps = 3;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(B * 2 * d));  // wide enough for [x | y] rows
    for (float& v : x) v = normal(rng);
    auto cpu = make_cpu_backend(1);
    size_t replayed = 0;
    for (const std::string& arch : arch_names()) {
        SCOPED_TRACE(arch);
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.n_latents = 12;
        cfg.k = 3;
        cfg.set("sae.n_experts", 2);
        cfg.set("sae.matryoshka_prefixes", IntList{4});
        cfg.l1_coeff = 0.1;
        cfg.dead_tokens = B;
        cfg.decorr_coeff = arch == "switch" ? 0.0 : 0.01;  // Switch has no decorrelation
        GemmRecorder rec(*cpu);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, d, steps, 0, rec, *self);
        tr.init(x.data(), B);
        for (int64_t s = 0; s < steps; ++s) tr.step(x.data(), B);
        ASSERT_FALSE(rec.calls.empty());
        std::vector<Call> distinct;
        for (const Call& c : rec.calls) {
            const auto same = [&](const Call& o) {
                return o.ta == c.ta && o.tb == c.tb && o.m == c.m && o.n == c.n && o.k == c.k &&
                       o.lda == c.lda && o.ldb == c.ldb && o.ldc == c.ldc && o.alpha == c.alpha &&
                       o.beta == c.beta;
            };
            if (std::none_of(distinct.begin(), distinct.end(), same)) distinct.push_back(c);
        }
        for (Call& c : distinct) {
            c.what = arch.c_str();
            check_call(c);
        }
        replayed += distinct.size();
    }
    EXPECT_GE(replayed, arch_names().size());
}

TEST(GemmLayout, RejectsLeadingDimensionShorterThanARow) {
    EXPECT_THROW(to_col_major_gemm(false, false, 4, 5, 6, 5, 5, 5), Error);  // lda < k
    EXPECT_THROW(to_col_major_gemm(false, true, 4, 5, 6, 6, 5, 5), Error);   // ldb < k
    EXPECT_THROW(to_col_major_gemm(false, false, 4, 5, 6, 6, 5, 4), Error);  // ldc < n
    EXPECT_NO_THROW(to_col_major_gemm(true, false, 4, 5, 6, 4, 5, 5));
}
