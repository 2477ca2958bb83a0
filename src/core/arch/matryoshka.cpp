// matryoshka.cpp — Matryoshka BatchTopK (Bussmann et al. 2025): a BatchTopK SAE whose nested
// prefixes of the dictionary, the latents [0, m_1) within [0, m_2) ... within [0, n), are each
// trained to reconstruct the input. The selection, its running threshold, inference and export
// are BatchTopK's (batchtopk_pass.h); the loss adds to the full dictionary's summed squared
// error, for each inner prefix m_i of sae.matryoshka_prefixes, that of b_dec plus the selected
// latents below m_i. The terms are summed, not averaged, as SAELens sums its inner losses
// onto the full one: each prefix's reconstruction weighs as much as the whole SAE's. Its own
// op (arch/matryoshka.h): a selection masked to a prefix, with its CPU reference here.
//
// The gradient of a prefix's term flows through the same selection (straight through, as the
// full term's): per prefix, its reconstruction D_i = b_dec + the masked selection's decode
// (summed over the latent shards), the residual r_i = grad_scale (D_i - x), b_dec's direct term
// (its column sums, once: on the first latent shard) and topk_backward on the masked selection,
// accumulating into the gradients before b_dec's path through the encoder input sees G.b_enc.
#include "saetrain/arch/matryoshka.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "batchtopk_pass.h"
#include "common.h"
#include "saetrain/error.h"
#include "saetrain/perfmodel.h"
#include "saetrain/quality.h"  // defines: rows_have_variance

namespace saetrain::arch {
namespace {

// --- the op's CPU reference (arch_ops.h) --------------------------------------------------------
class CpuMatryoshkaOps final : public MatryoshkaOps {
public:
    void prefix_mask(const int32_t* idx, const float* val, int64_t count, int64_t prefix,
                     float* out) override {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < count; ++i) out[i] = idx[i] < prefix ? val[i] : 0.0f;
    }
};

// The op through a ForwardingBackend's hook.
class ForwardedMatryoshkaOps final : public MatryoshkaOps {
public:
    ForwardedMatryoshkaOps(MatryoshkaOps& inner, OpHook hook)
        : inner_(inner), hook_(std::move(hook)) {}
    void prefix_mask(const int32_t* idx, const float* val, int64_t count, int64_t prefix,
                     float* out) override {
        hook_("prefix_mask", [&] { inner_.prefix_mask(idx, val, count, prefix, out); });
    }

private:
    MatryoshkaOps& inner_;
    OpHook hook_;
};

// --- the architecture -------------------------------------------------------------------------

KeyRule increasing_positive() {
    KeyRule r;
    r.says = "must list latent counts > 0 in strictly increasing order";
    r.ok = [](const ConfigValue& v) {
        const auto* list = std::get_if<IntList>(&v);
        if (list == nullptr) return false;
        for (size_t i = 0; i < list->size(); ++i)
            if ((*list)[i] <= 0 || (i > 0 && (*list)[i] <= (*list)[i - 1])) return false;
        return true;
    };
    return r;
}

struct MatryoshkaKeys {
    ArchKey<IntList> prefixes{"sae", "matryoshka_prefixes", IntList{},
                              "the nested prefixes' latent counts, increasing (the whole "
                              "dictionary is always the last; required by matryoshka_batchtopk)",
                              increasing_positive()};
};
const MatryoshkaKeys& keys() {
    static const MatryoshkaKeys k;
    return k;
}

// The prefixes below the whole dictionary of n latents (n itself, when listed, is the SAE's own
// reconstruction, which the trainer's loss has already).
std::vector<int64_t> inner_prefixes(const IntList& listed, int64_t n) {
    std::vector<int64_t> inner;
    for (int64_t m : listed)
        if (m < n) inner.push_back(m);
    return inner;
}

class MatryoshkaPass final : public BatchTopkPass {
public:
    MatryoshkaPass(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
        : BatchTopkPass(cfg, d, n, be),
          mops_(arch_ops<MatryoshkaOps>(be, matryoshka_op_set())),
          listed_(keys().prefixes(cfg)),
          d_(d) {
        // Scratch for every listed prefix: on a latent shard n is this shard's latents, so which
        // are inner is known at the first pass (resolve).
        const auto P = static_cast<int64_t>(listed_.size());
        if (P == 0) return;
        stats_ = DeviceArray<float>(be, P * kStatCount);
        col_ = DeviceArray<float>(be, 2 * d);
        sel_stats_ = DeviceArray<float>(be, kStatCount);
        fires_ = DeviceArray<int32_t>(be, n);
        host_stats_.assign(static_cast<size_t>(P * kStatCount), 0.0f);
        host_col_.assign(static_cast<size_t>(d), 0.0f);
        eval_sse_.assign(static_cast<size_t>(P), 0.0);
        eval_xsum_.assign(static_cast<size_t>(d), 0.0);
    }

    void forward(PassContext& c, bool training) override {
        BatchTopkPass::forward(c, training);
        resolve(c);
        if (prefixes_.empty()) return;
        if (training)
            reset_eval();  // the figures are of the evaluation after the last training step
        else
            add_eval(c);
    }

    double penalty(const float* st) const override {
        double sse = 0;
        if (!prefixes_.empty()) {
            refresh();
            for (size_t i = 0; i < prefixes_.size(); ++i)
                sse += host_stats_[i * kStatCount + kStatSse];
        }
        return BatchTopkPass::penalty(st) + sse;
    }

    // BatchTopK's {threshold, 1}, then this step's SST (sum ||x - mean||^2), sum ||x||^2 and
    // values (rows x d), and each inner prefix's squared error: the training window's prefix
    // FVUs (summarize).
    std::vector<double> step_sums() const override {
        std::vector<double> s = BatchTopkPass::step_sums();
        if (prefixes_.empty()) return s;
        refresh();
        s.push_back(step_sst_);
        s.push_back(host_stats_[kStatSumSqX]);
        s.push_back(static_cast<double>(rows_ * d_));
        for (size_t i = 0; i < prefixes_.size(); ++i)
            s.push_back(host_stats_[i * kStatCount + kStatSse]);
        return s;
    }
    void after_step(const std::vector<double>& sums) override {
        if (sums.size() >= 2) BatchTopkPass::after_step({sums[0], sums[1]});
    }

    // Each inner prefix's FVU: `fvu_prefix<m>` over the training window (the last tenth of the
    // steps), `eval_fvu_prefix<m>` over the held-out rows of the evaluation after the last
    // training step, when there was one (this replica's share of them). Rows of no variance
    // have no FVU (fvu_from_sums, quality.h): the figures are left out.
    std::vector<std::pair<std::string, double>> summarize(
        const std::vector<double>& w, const std::vector<double>&) const override {
        std::vector<std::pair<std::string, double>> out;
        const size_t P = prefixes_.size();
        if (P == 0) return out;
        if (w.size() == 5 + P && rows_have_variance(w[2], w[3], w[4]))
            for (size_t i = 0; i < P; ++i)
                out.emplace_back(fmt::format("fvu_prefix{}", prefixes_[i]), w[5 + i] / w[2]);
        if (eval_rows_ > 0) {
            double mean_sq = 0;
            for (double v : eval_xsum_) mean_sq += v * v;
            const double sst = eval_sumsq_ - mean_sq / eval_rows_;
            if (rows_have_variance(sst, eval_sumsq_, eval_rows_ * static_cast<double>(d_)))
                for (size_t i = 0; i < P; ++i)
                    out.emplace_back(fmt::format("eval_fvu_prefix{}", prefixes_[i]),
                                     eval_sse_[i] / sst);
        }
        return out;
    }

private:
    // The inner prefixes: those below the whole SAE's latents (all latent shards').
    void resolve(const PassContext& c) {
        if (resolved_) return;
        prefixes_ = inner_prefixes(listed_, c.latent_shard ? c.latent_shard->n_total : c.n);
        resolved_ = true;
    }

    // Prefix m's bound in this pass's latent ids (a latent shard's are local).
    static int64_t local_prefix(const PassContext& c, int64_t m) {
        if (!c.latent_shard) return m;
        return std::clamp<int64_t>(m - c.latent_shard->first(), 0, c.n);
    }

    // recon_ = b_dec + the selection's latents below prefix i, decoded (the whole SAE's, summed
    // over the latent shards); masked_ holds the masked selection.
    void prefix_reconstruction(PassContext& c, size_t i) {
        const int64_t count = c.B * width_;
        ensure(masked_, c.be, count);
        ensure(recon_, c.be, c.B * c.d);
        mops_.prefix_mask(idx_.data(), val_.data(), count, local_prefix(c, prefixes_[i]),
                          masked_.data());
        start_reconstruction(c, recon_.data());
        c.be.sparse_decode(idx_.data(), masked_.data(), c.seg("W_dec"), c.B, width_, c.d,
                           recon_.data());
        sum_over_latent_shards(c, recon_.data(), c.B * c.d);
    }

    void extra_backward(PassContext& c) override {
        if (prefixes_.empty()) return;
        Backend& be = c.be;
        const bool first_latent_shard = !c.latent_shard || c.latent_shard->index == 0;
        be.fill(stats_.data(), stats_.size(), 0.0f);
        for (size_t i = 0; i < prefixes_.size(); ++i) {
            prefix_reconstruction(c, i);
            float* st = stats_.data() + static_cast<int64_t>(i) * kStatCount;
            // recon_ becomes dL_i/dD_i; col_ + d its column sums, b_dec's direct term.
            be.residual(recon_.data(), c.y, c.B, c.d, c.grad_scale, col_.data(), col_.data() + c.d,
                        st);
            if (first_latent_shard) be.axpby(c.grad("b_dec"), col_.data() + c.d, 1.0f, 1.0f, c.d);
            SparseBackward a =
                sparse_backward(c, c.xc, recon_.data(), idx_.data(), masked_.data(), c.B, width_);
            // The main pass counted the firings and the L0 already.
            a.fires = fires_.data(), a.stats = sel_stats_.data(), a.accumulate = true;
            be.topk_backward(a);
        }
        rows_ = c.B;
        stale_ = true;
    }

    // The last backward's prefix statistics and x column sums, read back once per step (after
    // the trainer has read its own, so the queue has run).
    void refresh() const {
        if (!stale_) return;
        be_.download(host_stats_.data(), stats_.data(),
                     static_cast<int64_t>(host_stats_.size() * sizeof(float)));
        be_.download(host_col_.data(), col_.data(), d_ * int64_t{sizeof(float)});
        double mean_sq = 0;
        for (float v : host_col_) mean_sq += double(v) * v;
        step_sst_ =
            host_stats_[kStatSumSqX] - mean_sq / static_cast<double>(std::max<int64_t>(rows_, 1));
        stale_ = false;
    }

    void reset_eval() {
        eval_rows_ = 0, eval_sumsq_ = 0;
        std::fill(eval_sse_.begin(), eval_sse_.end(), 0.0);
        std::fill(eval_xsum_.begin(), eval_xsum_.end(), 0.0);
    }

    // An inference pass (the held-out evaluation): every prefix's squared error on its rows.
    void add_eval(PassContext& c) {
        Backend& be = c.be;
        be.fill(stats_.data(), stats_.size(), 0.0f);
        for (size_t i = 0; i < prefixes_.size(); ++i) {
            prefix_reconstruction(c, i);
            be.residual(recon_.data(), c.y, c.B, c.d, 0.0f, col_.data(), col_.data() + c.d,
                        stats_.data() + static_cast<int64_t>(i) * kStatCount);
        }
        std::vector<float> st(host_stats_.size()), col(static_cast<size_t>(c.d));
        be.download(st.data(), stats_.data(), static_cast<int64_t>(st.size() * sizeof(float)));
        be.download(col.data(), col_.data(), c.d * int64_t{sizeof(float)});
        eval_rows_ += static_cast<double>(c.B);
        eval_sumsq_ += st[kStatSumSqX];
        for (int64_t j = 0; j < c.d; ++j) eval_xsum_[j] += col[j];
        for (size_t i = 0; i < prefixes_.size(); ++i) eval_sse_[i] += st[i * kStatCount + kStatSse];
    }

    MatryoshkaOps& mops_;
    IntList listed_;                 // sae.matryoshka_prefixes
    std::vector<int64_t> prefixes_;  // the inner ones, increasing, each < n (global ids)
    bool resolved_ = false;
    int64_t d_;
    DeviceArray<float> masked_, recon_, stats_, col_, sel_stats_;
    DeviceArray<int32_t> fires_;
    int64_t rows_ = 0;
    // Read back lazily (penalty and step_sums are const, and the first of them reads).
    mutable std::vector<float> host_stats_, host_col_;
    mutable double step_sst_ = 0;
    mutable bool stale_ = false;
    // The held-out evaluation's sums since the last training step.
    double eval_rows_ = 0, eval_sumsq_ = 0;
    std::vector<double> eval_sse_, eval_xsum_;
};

class MatryoshkaBatchTopk final : public KSelection {
public:
    const char* name() const override { return "matryoshka_batchtopk"; }
    const char* describe() const override {
        return "BatchTopK whose nested dictionary prefixes (sae.matryoshka_prefixes) each "
               "reconstruct the input too; AuxK on dead latents";
    }
    std::vector<const ArchKeyDecl*> config_keys() const override {
        std::vector<const ArchKeyDecl*> k = auxk_config_keys();
        k.push_back(&keys().prefixes);
        return k;
    }
    std::vector<std::string> summary_keys() const override {
        return {"sae.k", "sae.matryoshka_prefixes"};
    }
    // Signum: lower held-out FVU than Adam on the MiniLM rows at k 16 and 32
    // (docs/architectures.md, "The optimizer").
    const char* default_optimizer() const override { return "signum"; }
    void validate(const SaeConfig& cfg, int64_t n, const std::string& where) const override {
        KSelection::validate(cfg, n, where);
        const IntList& p = keys().prefixes(cfg);
        SAE_ENFORCE(!p.empty(),
                    "{}sae.matryoshka_prefixes is required for sae.arch matryoshka_batchtopk: "
                    "list the nested prefixes' latent counts, e.g. [128, 512] (the whole "
                    "dictionary is always the last)",
                    where);
        if (n > 0)
            for (int64_t m : p)
                SAE_ENFORCE(m <= n, "{}sae.matryoshka_prefixes: {} exceeds the SAE's {} latents",
                            where, m, n);
    }
    double flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        // Each inner prefix decodes at most k latents a token and runs their backward: about
        // 2 k d + 4 k d more (the perf model's sparse decoder and backward per selection).
        const auto inner = static_cast<double>(inner_prefixes(keys().prefixes(cfg), n).size());
        return KSelection::flops_per_token(cfg, d, n) +
               inner * 6.0 * static_cast<double>(cfg.k) * static_cast<double>(d);
    }
    ArchExport export_fields(const SaeWeights& w, const SaeConfig&) const override {
        return batchtopk_export(w);
    }
    std::unique_ptr<ArchPass> make_pass(const SaeConfig& cfg, int64_t d, int64_t n,
                                        Backend& be) const override {
        return std::make_unique<MatryoshkaPass>(cfg, d, n, be);
    }
    bool latent_shardable() const override { return true; }
    std::vector<const ArchOpSet*> op_sets() const override {
        return {&batchtopk_op_set(), &matryoshka_op_set()};
    }
    std::vector<OpUse> limited_ops(const SaeConfig& cfg, int64_t d, int64_t n) const override {
        return topk_uses(cfg, 0, d, n);
    }
};

}  // namespace

const Architecture& matryoshka_batchtopk_arch() {
    static const MatryoshkaBatchTopk a;
    return a;
}

}  // namespace saetrain::arch

const saetrain::ArchOpSet& saetrain::matryoshka_op_set() {
    static const ArchOpSet set{"matryoshka_batchtopk",
                               {"prefix_mask"},
                               [](Backend&) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::CpuMatryoshkaOps>();
                               },
                               [](ArchOps& inner, OpHook hook) -> std::unique_ptr<ArchOps> {
                                   return std::make_unique<arch::ForwardedMatryoshkaOps>(
                                       static_cast<MatryoshkaOps&>(inner), std::move(hook));
                               }};
    return set;
}
