#include "common.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/perfmodel.h"
#include "saetrain/schedule.h"

namespace saetrain::arch {

void encode(PassContext& c) {
    if (c.encode_x)
        c.be.axpby(c.xc, c.x, 1.0f, 0.0f, c.B * c.d);
    else
        c.be.sub_rows(c.xc, c.x, c.seg("b_dec"), c.B, c.d);
    if (c.layers > 1) {
        // pre[:, layer l's latents] = x_l W_enc[l's latents]^T, layer by layer (W_enc [n, d_l]).
        const int64_t dl = c.d / c.layers, nl = c.n / c.layers;
        for (int64_t l = 0; l < c.layers; ++l)
            c.be.gemm(false, true, c.B, nl, dl, 1.0f, c.xc + l * dl, c.d,
                      c.seg("W_enc") + l * nl * dl, dl, 0.0f, c.pre + l * nl, c.n);
    } else {
        c.be.gemm(false, true, c.B, c.n, c.d, 1.0f, c.xc, c.d, c.seg("W_enc"), c.d, 0.0f, c.pre,
                  c.n);
    }
    start_reconstruction(c, c.xhat);
}

void start_reconstruction(PassContext& c, float* out) {
    if (c.latent_shard && c.latent_shard->index > 0)
        c.be.fill(out, c.B * c.d, 0.0f);
    else
        c.be.broadcast_rows(out, c.seg("b_dec"), c.B, c.d);
}

void select_topk(PassContext& c, const float* bias, int64_t k, int32_t* idx, float* val, bool relu,
                 ShardedTopkScratch& scratch) {
    select_topk(c, c.pre, bias, k, idx, val, relu, scratch);
}

void select_topk(PassContext& c, const float* pre, const float* bias, int64_t k, int32_t* idx,
                 float* val, bool relu, ShardedTopkScratch& scratch) {
    if (c.latent_shard)
        sharded_topk_own(c.be, *c.latent_shard, pre, bias, c.B, k, idx, val, relu, scratch);
    else
        c.be.topk_forward(pre, bias, c.B, c.n, k, idx, val, relu);
}

void sum_over_latent_shards(PassContext& c, float* data, int64_t count) {
    if (c.latent_shard) c.latent_shard->backend_group->allreduce_sum(data, count);
}

void encoder_input_grad(PassContext& c, const float* dpre_col_sum) {
    if (c.encode_x) return;
    SAE_ENFORCE(c.layers == 1, "encoder_input_grad: a layered encoder reads x as it is (encode_x)");
    c.be.gemm(false, false, 1, c.d, c.n, -1.0f, dpre_col_sum, c.n, c.seg("W_enc"), c.d, 1.0f,
              c.grad("b_dec"), c.d);
}

void decode_sparse(PassContext& c, const int32_t* idx, const float* val, int64_t rows,
                   int64_t width, float* out) {
    if (c.layers > 1)
        c.be.sparse_decode_layered(idx, val, c.seg("W_dec"), rows, width, c.d, c.n, c.layers, out);
    else
        c.be.sparse_decode(idx, val, c.seg("W_dec"), rows, width, c.d, out);
}

void decode_dense(PassContext& c, const float* z) {
    c.be.gemm(false, false, c.B, c.d, c.n, 1.0f, z, c.n, c.seg("W_dec"), c.d, 1.0f, c.xhat, c.d);
}

void decoder_backward_dense(PassContext& c, const float* z, float* dz) {
    c.be.gemm(true, false, c.n, c.d, c.B, 1.0f, z, c.n, c.xhat, c.d, 0.0f, c.grad("W_dec"), c.d);
    c.be.gemm(false, true, c.B, c.n, c.d, 1.0f, c.xhat, c.d, c.seg("W_dec"), c.d, 0.0f, dz, c.n);
}

void encoder_weight_grad(PassContext& c, const float* dpre) {
    if (c.layers > 1) {
        // G.W_enc[l's latents] = dpre_l^T x_l (W_enc [n, d_l]).
        const int64_t dl = c.d / c.layers, nl = c.n / c.layers;
        for (int64_t l = 0; l < c.layers; ++l)
            c.be.gemm(true, false, nl, dl, c.B, 1.0f, dpre + l * nl, c.n, c.xc + l * dl, c.d, 0.0f,
                      c.grad("W_enc") + l * nl * dl, dl);
        return;
    }
    c.be.gemm(true, false, c.n, c.d, c.B, 1.0f, dpre, c.n, c.xc, c.d, 0.0f, c.grad("W_enc"), c.d);
}

void KSelection::validate(const SaeConfig& cfg, int64_t n, const std::string& where) const {
    SAE_ENFORCE(n == 0 || cfg.k <= n, "{}sae.k = {} exceeds the SAE's {} latents", where, cfg.k, n);
}

std::string KSelection::id_suffix(const SaeConfig& cfg) const { return fmt::format("k{}", cfg.k); }

double KSelection::flops_per_token(const SaeConfig& cfg, int64_t d, int64_t n) const {
    return sae_flops_per_token(SaeKind::topk, d, n, cfg.k);
}

std::vector<ExportTensor> saelens_base(const SaeWeights& w, const char* b_enc_name) {
    const int64_t d = w.d_model, n = w.n_latents;
    return {{"W_enc", {d, n}, w.at("W_enc")},
            {b_enc_name, {n}, w.at("b_enc")},
            {"W_dec", {n, d}, w.at("W_dec")},
            {"b_dec", {d}, w.at("b_dec")}};
}

const std::vector<float>& extra_tensor(const SaeWeights& w, const std::string& name) {
    const WeightTensor* t = w.find(name);
    if (!t) throw Error(fmt::format("the SAE's weights have no '{}' tensor", name));
    return t->data;
}

std::string l1_suffix(const SaeConfig& cfg) {
    const double t = target_l0_key()(cfg);
    return t > 0 ? fmt::format("target_l0_{}", t) : fmt::format("l1_{}", cfg.l1_coeff);
}

const ArchKey<double>& target_l0_key() {
    static const ArchKey<double> key{
        "sae", "target_l0", 0.0,
        "the training L0 the sparsity penalty's coefficient is adapted to reach (0: the fixed "
        "sae.l1_coeff or train.l0_coeff)",
        key_at_least(0, " (0: a fixed coefficient)")};
    return key;
}

const ArchKey<double>& target_l0_rate_key() {
    static const ArchKey<double> key{
        "sae", "target_l0_rate", 0.1,
        "with sae.target_l0: how fast the controller's target falls from the first step's L0, in "
        "log L0 a step (it takes log(first L0 / target) / rate steps, at least half the L1 ramp "
        "and at most all of it; 0: the whole L1 ramp)",
        key_at_least(0, " (0: the whole L1 ramp)")};
    return key;
}

std::vector<double> thresholds_at_l0(const float* v, int64_t rows, int64_t n, double l0,
                                     Communicator& replicas,
                                     const SumOverLatentShards& over_latent_shards) {
    std::vector<double> rms(static_cast<size_t>(n) + 1, 0.0);  // sums of squares, rows
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) rms[i] += double(v[r * n + i]) * v[r * n + i];
    rms[n] = static_cast<double>(rows);
    replicas.allreduce_sum(rms.data(), n + 1);
    const double all_rows = rms[n];
    if (all_rows <= 0) return {};
    for (int64_t i = 0; i < n; ++i) rms[i] = std::sqrt(rms[i] / all_rows);
    std::vector<float> u(static_cast<size_t>(rows * n));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i)
            u[r * n + i] = rms[i] > 0 ? static_cast<float>(v[r * n + i] / rms[i]) : 0.0f;
    double n_all = static_cast<double>(n);  // over the latent shards
    over_latent_shards(&n_all, 1);
    const double want = std::min(l0, 0.5 * n_all) * all_rows;
    auto above = [&](double s) {  // values above s over all replicas and latent shards
        double c = 0;
        for (float x : u) c += x > s ? 1.0 : 0.0;
        replicas.allreduce_sum(&c, 1);
        over_latent_shards(&c, 1);
        return c;
    };
    double lo = 0, hi = 1;
    while (above(hi) > want && hi < 1e6) lo = hi, hi *= 2;
    for (int it = 0; it < 40; ++it) {
        const double mid = 0.5 * (lo + hi);
        (above(mid) > want ? lo : hi) = mid;
    }
    const double s = std::max(hi, 1e-3);
    std::vector<double> theta(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) theta[i] = rms[i] > 0 ? s * rms[i] : 0.0;
    return theta;
}

SparsityCoefficient::SparsityCoefficient(const SaeConfig& cfg, double configured, std::string name)
    : ramp_(cfg),
      target_(target_l0_key()(cfg)),
      name_(std::move(name)),
      rate_(target_l0_rate_key()(cfg)),
      configured_(configured),
      coeff_(static_cast<float>(configured)) {}

double SparsityCoefficient::at(int64_t step, int64_t total_steps) const {
    if (!adaptive()) return configured_ * ramp_.fraction(step, total_steps);
    return coeff_;
}

int64_t SparsityCoefficient::descent_steps(int64_t total_steps) const {
    const int64_t ramp = ramp_.steps(total_steps);
    if (rate_ <= 0 || start_l0_ <= target_) return ramp;
    const double distance = std::log(static_cast<double>(start_l0_)) - std::log(target_);
    return std::clamp(static_cast<int64_t>(std::ceil(distance / rate_)), (ramp + 1) / 2, ramp);
}

double SparsityCoefficient::target_at(int64_t step, int64_t total_steps) const {
    const int64_t descent = descent_steps(total_steps);
    if (start_l0_ <= target_ || descent <= 0 || step + 1 >= descent) return target_;
    const double f = static_cast<double>(step + 1) / static_cast<double>(descent);
    return std::exp(std::log(static_cast<double>(start_l0_)) +
                    f * (std::log(target_) - std::log(static_cast<double>(start_l0_))));
}

double SparsityCoefficient::after_update(const StepTotals& t) {
    if (!adaptive() || t.rows <= 0) return 0.0;
    const double l0 = t.l0 / static_cast<double>(t.rows);
    if (start_l0_ == 0) start_l0_ = static_cast<float>(std::max(l0, target_));
    const auto frozen_from = static_cast<int64_t>(
        std::llround((1.0 - kFrozenFraction) * static_cast<double>(t.total_steps)));
    if (t.total_steps > 0 && t.step >= frozen_from) return 0.0;
    // Never below a hundredth of the target: an SAE with nothing firing counts as an error of
    // -log(100), not an unbounded one.
    const double err =
        std::log(std::max(l0, 0.01 * target_)) - std::log(target_at(t.step, t.total_steps));
    const double next = std::log(static_cast<double>(coeff_)) + kGain * err +
                        kDamping * (err - static_cast<double>(prev_err_));
    prev_err_ = static_cast<float>(err);
    coeff_ = static_cast<float>(std::clamp(std::exp(next), 1e-30, 1e30));
    return err;
}

std::vector<NamedTensor> SparsityCoefficient::buffers() const {
    if (!adaptive()) return {};
    return {
        {name_, {coeff_}}, {name_ + "_start_l0", {start_l0_}}, {name_ + "_prev_err", {prev_err_}}};
}

bool SparsityCoefficient::set_buffer(const std::string& name, const std::vector<float>& v) {
    float* slot = !adaptive()                   ? nullptr
                  : name == name_               ? &coeff_
                  : name == name_ + "_start_l0" ? &start_l0_
                  : name == name_ + "_prev_err" ? &prev_err_
                                                : nullptr;
    if (!slot) return false;
    SAE_ENFORCE(v.size() == 1, "the SAE's '{}' buffer holds one value, not {}", name, v.size());
    *slot = v[0];
    return true;
}

std::vector<std::pair<std::string, double>> SparsityCoefficient::summarize() const {
    if (!adaptive()) return {};
    return {{name_ + "_final", static_cast<double>(coeff_)}};
}

void Decorrelation::dense(PassContext& c, const float* z, float* dz) {
    rows_ = 0;
    if (coeff_ <= 0) return;
    rows_ = static_cast<double>(c.B);
    c.be.decorr_grad(z, nullptr, 0, c.B, c.n, scale(c), dz, c.stats);
}

const float* Decorrelation::sparse(PassContext& c, const int32_t* idx, const float* val,
                                   int64_t width) {
    rows_ = 0;
    if (coeff_ <= 0) return nullptr;
    rows_ = static_cast<double>(c.B);
    ensure(extra_, c.be, c.B * width);
    c.be.fill(extra_.data(), c.B * width, 0.0f);
    c.be.decorr_grad(val, idx, width, c.B, c.n, scale(c), extra_.data(), c.stats);
    return extra_.data();
}

double penalized_signum_lr(double rule_lr, double factor) {
    return std::min(factor * rule_lr, 0.025);
}

const AuxKKeys& auxk_keys() {
    static const AuxKKeys keys;
    return keys;
}

std::vector<const ArchKeyDecl*> L1Penalized::config_keys() const {
    std::vector<const ArchKeyDecl*> k = {&target_l0_key(), &target_l0_rate_key()};
    for (const ArchKeyDecl* a : auxk_config_keys()) k.push_back(a);
    return k;
}

std::vector<const ArchKeyDecl*> auxk_config_keys() {
    return {&auxk_keys().k_aux, &auxk_keys().coeff};
}

int64_t resolved_k_aux(const SaeConfig& cfg, int64_t d, int64_t latents) {
    const int64_t k_aux = auxk_keys().k_aux(cfg);
    return std::min(k_aux > 0 ? k_aux : std::clamp<int64_t>(d / 2, 1, kDefaultKAuxMax), latents);
}

double auxk_weight(double coeff, int64_t n_dead, int64_t k_aux) {
    return coeff * std::min(1.0, static_cast<double>(n_dead) / static_cast<double>(k_aux));
}

void dead_only_bias(PassContext& c, float* bias, std::vector<float>& host, bool with_b_enc) {
    const int64_t n = c.n;
    const float inf = std::numeric_limits<float>::infinity();
    host.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[i] = (*c.dead)[i] ? 0.0f : -inf;
    c.be.upload(bias, host.data(), n * static_cast<int64_t>(sizeof(float)));
    if (with_b_enc) c.be.axpby(bias, c.seg("b_enc"), 1.0f, 1.0f, n);
}

SparseBackward sparse_backward(const PassContext& c, const float* x, const float* derr,
                               const int32_t* idx, const float* val, int64_t rows, int64_t k) {
    SparseBackward a;
    a.x = x, a.derr = derr, a.idx = idx, a.val = val, a.w_dec = c.seg("W_dec");
    a.rows = rows, a.n = c.n, a.k = k, a.d = c.d;
    a.dw_enc = c.grad("W_enc"), a.dw_dec = c.grad("W_dec");
    a.db_enc = c.grad("b_enc");
    a.enc_layers = c.layers;  // a CLT's compact W_enc [n, d_l]
    a.fires = c.fires, a.stats = c.stats;
    return a;
}

std::vector<Architecture::OpUse> topk_uses(const SaeConfig& cfg, int64_t k, int64_t d,
                                           int64_t latents) {
    std::vector<Architecture::OpUse> uses;
    if (k > 0) uses.push_back({BackendOp::topk_forward, OpShape{0, latents, k, d}, "sae.k"});
    if (auxk_keys().coeff(cfg) > 0)
        uses.push_back({BackendOp::topk_forward,
                        OpShape{0, latents, resolved_k_aux(cfg, d, latents), d}, "sae.k_aux"});
    return uses;
}

AuxK::AuxK(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be)
    : k_aux_(resolved_k_aux(cfg, d, n)),
      coeff_(auxk_keys().coeff(cfg)),
      bias_(be, n),
      stats_(be, kStatCount),
      fires_(be, n) {}

void AuxK::backward(PassContext& c, const float* pre, bool pre_has_b_enc) {
    weight_ = 0;
    if (!active(c)) return;
    Backend& be = c.be;
    const int64_t B = c.B, d = c.d;
    const int64_t k = std::min(k_aux_, c.n_dead);
    weight_ = auxk_weight(coeff_, c.n_dead, k_aux_);
    ensure(ehat_, be, B * d), ensure(target_, be, B * d), ensure(scratch_, be, 2 * d);
    ensure(val_, be, B * k), ensure(idx_, be, B * k);
    // The selected pre-activations as they are, negative ones included (as OpenAI's AuxK): with
    // a ReLU, a dead latent whose pre-activations the auxiliary loss pushed below zero would get
    // no gradient again and stay dead for good. Among the dead latents only: on a latent shard
    // through the masked bias and the sharded top-k, else by their ids (the backend may then
    // look at those columns alone).
    if (c.latent_shard) {
        dead_only_bias(c, bias_.data(), mask_host_, !pre_has_b_enc);
        select_topk(c, pre, bias_.data(), k, idx_.data(), val_.data(), false, scratch_host_);
    } else {
        dead_ids_host_.clear();
        for (int64_t i = 0; i < c.n; ++i)
            if ((*c.dead)[i]) dead_ids_host_.push_back(static_cast<int32_t>(i));
        const auto count = static_cast<int64_t>(dead_ids_host_.size());
        ensure(dead_ids_, be, count);
        be.upload(dead_ids_.data(), dead_ids_host_.data(), count * int64_t{sizeof(int32_t)});
        const float* b_enc = c.seg("b_enc");
        if (pre_has_b_enc) {
            if (zeros_.size() < c.n) {
                zeros_ = DeviceArray<float>(be, c.n);
                be.fill(zeros_.data(), c.n, 0.0f);
            }
            b_enc = zeros_.data();
        }
        be.topk_forward_columns(pre, b_enc, B, c.n, dead_ids_.data(), count, k, idx_.data(),
                                val_.data(), false, bias_.data());
    }
    be.fill(ehat_.data(), B * d, 0.0f);
    decode_sparse(c, idx_.data(), val_.data(), B, k, ehat_.data());
    sum_over_latent_shards(c, ehat_.data(), B * d);  // the latent shards' partial e_hat
    // e = x - x_hat = -(dL/dx_hat) / grad_scale; then e_hat - e in place, scaled to its gradient.
    be.axpby(target_.data(), c.xhat, -1.0f / c.grad_scale, 0.0f, B * d);
    be.fill(stats_.data(), kStatCount, 0.0f);
    const auto aux_scale = static_cast<float>(weight_ * c.grad_scale);
    be.residual(ehat_.data(), target_.data(), B, d, aux_scale, scratch_.data(), scratch_.data() + d,
                stats_.data());
    be.axpby(c.stats + kStatAuxK, stats_.data() + kStatSse, 1.0f, 1.0f, 1);
    SparseBackward a = sparse_backward(c, c.xc, ehat_.data(), idx_.data(), val_.data(), B, k);
    a.fires = fires_.data(), a.stats = stats_.data(), a.accumulate = true;
    be.topk_backward(a);
}

void SelectionPass::backward(PassContext& c, int64_t, int64_t) {
    const float* extra = decorr_.sparse(c, idx_.data(), val_.data(), width_);
    SparseBackward a = sparse_backward(c, c.xc, c.xhat, idx_.data(), val_.data(), c.B, width_);
    a.dval_extra = extra;
    c.be.topk_backward(a);
    auxk_.backward(c, c.pre);
    extra_backward(c);
    encoder_input_grad(c, c.grad("b_enc"));
}

}  // namespace saetrain::arch
