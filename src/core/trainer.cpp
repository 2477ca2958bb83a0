// trainer.cpp — one SAE's training step (see trainer.h), top-down: construction, init, the step
// and its pieces in the order they run, the step's state, restore. Elsewhere: the placements of
// the parameters (param_store.cpp), evaluation and quality (evaluation.cpp), the checkpoint
// tensors (src/io/trainer_io.cpp).
#include "saetrain/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "arch/common.h"
#include "saetrain/error.h"
#include "saetrain/optimizer.h"  // defines: Optimizer (clip, lr, apply)
#include "saetrain/schedule.h"

namespace saetrain {

// --- construction --------------------------------------------------------------------------------

namespace {

LatentShard latent_shard_or_whole(const LatentShard* latent_shard, int64_t n_total) {
    if (latent_shard && latent_shard->count > 1) return *latent_shard;
    LatentShard whole;
    whole.n_total = n_total;
    return whole;
}

}  // namespace

namespace {

// SplitMix64's finalizer: a bijection of 64-bit words that scatters nearby inputs.
uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

}  // namespace

void random_unit_rows(uint64_t seed, int64_t first, int64_t count, int64_t d, float* out,
                      int threads) {
    // Row i's stream: SplitMix64 from mix(seed) + mix(i), standard normals by Box-Muller in
    // double (two per pair of uniforms in (0, 1]). One serial stream for the whole SAE (the
    // old mt19937 and std::normal_distribution) took 0.4-0.7 s for 18.9M draws on one core;
    // rows on their own streams spread over the cores and a latent shard skips the others'.
    constexpr double kTwoPi = 6.283185307179586;
    const uint64_t base = mix64(seed ^ 0x5ae1a17d0c0ffee5ULL);
    threads = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (count * d >= (1 << 16))
    for (int64_t r = 0; r < count; ++r) {
        uint64_t state = base + mix64(static_cast<uint64_t>(first + r) + 0x632be59bd9b4e019ULL);
        auto uniform = [&state] {  // (0, 1], 53 bits
            state += 0x9e3779b97f4a7c15ULL;
            return (static_cast<double>(mix64(state) >> 11) + 1.0) * 0x1.0p-53;
        };
        float* row = out + r * d;
        double s = 0;
        for (int64_t c = 0; c < d; c += 2) {
            const double radius = std::sqrt(-2.0 * std::log(uniform())), angle = kTwoPi * uniform();
            row[c] = static_cast<float>(radius * std::cos(angle));
            if (c + 1 < d) row[c + 1] = static_cast<float>(radius * std::sin(angle));
            s += double(row[c]) * row[c] + (c + 1 < d ? double(row[c + 1]) * row[c + 1] : 0.0);
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(s));
        for (int64_t c = 0; c < d; ++c) row[c] *= inv;
    }
}

SaeTrainer::SaeTrainer(const SaeConfig& cfg, int64_t d_model, int64_t total_steps, uint64_t seed,
                       Backend& backend, Communicator& grad_comm, const LatentShard* latent_shard)
    : cfg_(cfg.with_optimizer_defaults(d_model)),
      d_(d_model),
      n_total_(cfg.resolved_latents(d_model)),
      n_(latent_shard_or_whole(latent_shard, n_total_).n_local()),
      total_steps_(total_steps),
      seed_(seed),
      be_(backend),
      comm_(grad_comm),
      arch_(arch_get(cfg.arch)),
      pass_(arch_.make_pass(cfg, d_, n_, backend)),
      transcodes_(arch_.rows().target),
      dec_norms_(backend, n_),
      zsum_(backend, n_),
      xcol_(backend, d_),
      stats_(backend, kStatCount),
      fires_(backend, n_),
      since_fired_(static_cast<size_t>(n_), 0),
      dead_(static_cast<size_t>(n_), 0),
      fires_host_(static_cast<size_t>(n_), 0),
      window_(total_steps, n_, d_) {
    const LatentShard placement = latent_shard_or_whole(latent_shard, n_total_);
    arch_.validate(cfg, n_total_, fmt::format("SAE of d_model {} x {} latents: ", d_, n_total_));
    check_latent_sharding(cfg, d_, n_total_, placement.count, "");
    arch_check_backend(cfg, d_, n_, be_);
    SAE_ENFORCE(!transcodes_ || cfg.normalize == "none",
                "data.normalize: {} is not supported for {} (it would need one scale for the "
                "input and one for the target); use none",
                cfg.normalize, cfg.arch);
    store_ = make_param_store(cfg, ParamLayout(arch_.tensors(cfg, n_, d_)),
                              ParamLayout(arch_.tensors(cfg, n_total_, d_)), placement, be_, comm_);
    opt_ = Optimizer::make(cfg_, be_, *store_, total_steps_);
}

SaeTrainer::~SaeTrainer() = default;

void SaeTrainer::ensure_batch(int64_t rows) {
    if (rows <= batch_cap_) return;
    batch_cap_ = rows;
    x_ = DeviceArray<float>(be_, rows * d_);
    if (transcodes_) y_ = DeviceArray<float>(be_, rows * d_);
    xc_ = DeviceArray<float>(be_, rows * d_);
    xhat_ = DeviceArray<float>(be_, rows * d_);
    if (pass_->uses_dense_pre()) pre_ = DeviceArray<float>(be_, rows * n_);
    pass_->reserve(rows);
}

PassContext SaeTrainer::context(const float* x, int64_t rows, const float* y) {
    PassContext c{be_, store_->layout()};
    c.B = rows, c.d = d_, c.n = n_;
    c.p = store_->params(), c.g = store_->grads();
    c.x = x, c.y = y ? y : x, c.xc = xc_.data(), c.pre = pre_.data(), c.xhat = xhat_.data();
    c.stats = stats_.data(), c.fires = fires_.data();
    c.dec_norms = dec_norms_.data(), c.col_scratch = zsum_.data();
    c.dead = &dead_, c.n_dead = n_dead_total_;
    c.latent_shard = latent_sharded() ? &store_->latent_shard() : nullptr;
    c.encode_x = transcodes_;
    return c;
}

void SaeTrainer::upload_batch(BatchView x_host, int64_t rows) {
    ensure_batch(rows);
    if (transcodes_) {  // [x | y] rows: each half into its own buffer, in one strided copy
        be_.upload_columns(x_.data(), x_host.data, x_host.dtype, rows, d_, 2 * d_);
        const char* y_host = static_cast<const char*>(x_host.data) + d_ * dtype_size(x_host.dtype);
        be_.upload_columns(y_.data(), y_host, x_host.dtype, rows, d_, 2 * d_);
        return;  // data.normalize is refused for transcoders
    }
    be_.upload_rows(x_.data(), x_host.data, x_host.dtype, rows * d_);
    if (input_scale_ != 1.0f) be_.axpby(x_.data(), x_.data(), input_scale_, 0.0f, rows * d_);
}

// --- init --------------------------------------------------------------------------------------

std::vector<double> SaeTrainer::mean_over_replicas(const float* x, int64_t rows, const char* what) {
    const int64_t d = d_;
    std::vector<double> sums(static_cast<size_t>(d) + 1, 0.0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < d; ++c) sums[c] += x[r * d + c];
    sums[d] = static_cast<double>(rows);
    comm_.allreduce_sum(sums.data(), d + 1);
    SAE_ENFORCE(sums[d] > 0, "cannot initialize the {} from an empty batch", what);
    std::vector<double> m(static_cast<size_t>(d));
    for (int64_t c = 0; c < d; ++c) m[c] = sums[c] / sums[d];
    return m;
}

std::vector<float> SaeTrainer::initial_b_dec(const float* x, int64_t rows) {
    const int64_t d = d_;
    std::vector<float> b(static_cast<size_t>(d), 0.0f);
    if (cfg_.b_dec_init == "zeros") return b;
    std::vector<double> m = mean_over_replicas(x, rows, "SAE");
    if (cfg_.b_dec_init == "geometric_median") {
        std::vector<double> sums(static_cast<size_t>(d) + 1, 0.0);
        // Weiszfeld from the mean: m <- sum_i x_i / ||x_i - m|| / sum_i 1 / ||x_i - m||, the
        // sums all-reduced over the replicas (so every replica gets the same point).
        for (int it = 0; it < 100; ++it) {
            std::fill(sums.begin(), sums.end(), 0.0);
            for (int64_t r = 0; r < rows; ++r) {
                double dist = 0;
                for (int64_t c = 0; c < d; ++c)
                    dist += (x[r * d + c] - m[c]) * (x[r * d + c] - m[c]);
                const double w = 1.0 / std::max(std::sqrt(dist), 1e-8);
                for (int64_t c = 0; c < d; ++c) sums[c] += w * x[r * d + c];
                sums[d] += w;
            }
            comm_.allreduce_sum(sums.data(), d + 1);
            double moved = 0, norm = 0;
            for (int64_t c = 0; c < d; ++c) {
                const double next = sums[c] / sums[d];
                moved += (next - m[c]) * (next - m[c]), norm += next * next;
                m[c] = next;
            }
            if (moved <= 1e-12 * std::max(norm, 1e-30)) break;
        }
    }
    for (int64_t c = 0; c < d; ++c) b[c] = static_cast<float>(m[c]);
    return b;
}

void SaeTrainer::init(BatchView x_host, int64_t rows, int threads) {
    // The statistics below read floats on the host: 16-bit rows are widened once, here.
    std::vector<float> wide;
    const float* x_raw = static_cast<const float*>(x_host.data);
    if (x_host.dtype != DType::f32) {
        wide.resize(static_cast<size_t>(rows * row_width()));
        widen_to_f32(x_host.dtype, x_host.data, wide.data(), rows * row_width());
        x_raw = wide.data();
    }
    // A transcoder's rows are [x | y]: the input and the target, apart (b_dec, the scales and
    // the fitted encoder read the target; normalize is refused for transcoders).
    std::vector<float> input, target;
    if (transcodes_) {
        input.resize(static_cast<size_t>(rows * d_)), target.resize(input.size());
        for (int64_t r = 0; r < rows; ++r) {
            std::copy_n(x_raw + r * 2 * d_, d_, input.data() + r * d_);
            std::copy_n(x_raw + r * 2 * d_ + d_, d_, target.data() + r * d_);
        }
        x_raw = input.data();
    }
    // data.normalize: c = sqrt(d / mean ||x||^2) over all replicas' rows of this batch.
    std::vector<float> scaled;
    const float* x = x_raw;
    if (cfg_.normalize == "expected_average_only_in") {
        double s[2] = {0, static_cast<double>(rows)};
        for (int64_t i = 0; i < rows * d_; ++i) s[0] += double(x_raw[i]) * x_raw[i];
        comm_.allreduce_sum(s, 2);
        SAE_ENFORCE(s[1] > 0 && s[0] > 0,
                    "data.normalize: the first batch has no non-zero row to estimate the scale");
        input_scale_ = static_cast<float>(std::sqrt(static_cast<double>(d_) * s[1] / s[0]));
        scaled.assign(x_raw, x_raw + rows * d_);
        for (float& v : scaled) v *= input_scale_;
        x = scaled.data();
    }
    std::vector<float> p(static_cast<size_t>(store_->size()), 0.0f);
    // Decoder rows: random directions, unit norm. The same seed on every replica gives the
    // same start, so replicas begin (and, with averaged gradients, stay) identical; a latent
    // shard draws its own rows of the whole SAE's start.
    float* w_dec = p.data() + off("W_dec");
    random_unit_rows(seed_, store_->latent_shard().first(), n_, d_, w_dec, threads);
    // W_enc = W_dec^T (latent-major) where the two have one shape; a layered model's compact
    // encoder (a CLT's [n, d_l]) is its architecture's to start (init_extra).
    const bool square_encoder = store_->layout().segment("W_enc").size() == n_ * d_;
    if (square_encoder) std::copy(w_dec, w_dec + n_ * d_, p.data() + off("W_enc"));
    const float* y = transcodes_ ? target.data() : x;  // what x_hat approximates
    const std::vector<float> b_dec = initial_b_dec(y, rows);
    InitInputs in;
    in.seed = seed_;
    if (transcodes_) {
        // The encoder reads x itself, whose mean would dominate every pre-activation (the same
        // few latents would win every row and the rest never fire): b_enc = -W_enc mean(x), the
        // mean over all replicas' rows, starts the pre-activations centred, as x - b_dec does
        // an SAE's.
        const std::vector<double> mean = mean_over_replicas(x, rows, "transcoder");
        in.input_mean = mean;
        float* b_enc = p.data() + off("b_enc");
        const float* w_enc = p.data() + off("W_enc");
        for (int64_t l = 0; square_encoder && l < n_; ++l) {
            double a = 0;
            for (int64_t c = 0; c < d_; ++c) a += double(w_enc[l * d_ + c]) * mean[c];
            b_enc[l] = static_cast<float>(-a);
        }
    }
    std::copy(b_dec.begin(), b_dec.end(), p.begin() + off("b_dec"));
    {
        double s[2] = {0, static_cast<double>(rows)};  // sum ||y - b_dec||^2, rows
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d_; ++c) {
                const double v = double(y[r * d_ + c]) - b_dec[c];
                s[0] += v * v;
            }
        comm_.allreduce_sum(s, 2);
        if (s[1] > 0) in.centred_rms = std::sqrt(s[0] / s[1]);
    }
    arch_.init_extra(cfg_, store_->layout(), p, in);
    arch_.init_from_rows(cfg_, store_->layout(), p, x, rows, comm_);
    set_params_host(p);
    // A transcoder's random encoder and decoder rows are unrelated at the start, so the fitted
    // scale has nothing to fit (on planted pairs it shrank the encoder and left half the
    // latents never firing): its encoder starts as W_dec^T.
    const bool fitted = cfg_.encoder_init == "fitted" && !transcodes_;
    if (fitted) fit_encoder_scale(x, rows, p);
    if (arch_.inits_from_preactivations(cfg_)) {
        init_from_preactivations(x, rows, p);
        if (fitted && arch_.refits_encoder_scale()) fit_encoder_scale(x, rows, p, true);
    }
}

void SaeTrainer::init_from_preactivations(const float* x, int64_t rows, std::vector<float>& p) {
    // This replica's first rows, at most ~16 Mi pre-activations on the host, through the
    // forward pass in chunks of a step's chunk size (train.accum_steps does not change them).
    const int64_t B =
        std::min(rows, std::max<int64_t>(256, (int64_t{1} << 24) / std::max<int64_t>(n_, 1)));
    std::vector<float> v(static_cast<size_t>(B * n_));
    const int64_t chunk = chunk_rows(std::max<int64_t>(B, 1));
    for (int64_t r0 = 0; r0 < B; r0 += chunk) {
        const int64_t b = std::min(chunk, B - r0);
        ensure_batch(b);
        be_.upload(x_.data(), x + r0 * d_, b * d_ * static_cast<int64_t>(sizeof(float)));
        forward(x_.data(), b, false);
        be_.download(v.data() + r0 * n_, pre_.data(), b * n_ * static_cast<int64_t>(sizeof(float)));
    }
    arch_.init_from_preactivations(
        cfg_, store_->layout(), p, v.data(), B, n_, comm_,
        [&](double* sums, int64_t count) { store_->sum_over_latent_shards(sums, count); });
    set_params_host(p);
}

void SaeTrainer::fit_encoder_scale(const float* x, int64_t rows, std::vector<float>& p,
                                   bool with_bias) {
    // With b_enc = 0, scaling W_enc by c scales every activation by c (ReLU and TopK are
    // positively homogeneous), so x_hat - b_dec = c * u with u the reconstruction at c = 1.
    // The c minimizing sum ||c u - (x - b_dec)||^2 over the batch is <u, x - b_dec> / ||u||^2:
    // random unit decoder rows start the reconstruction at its best scale instead of
    // (n_latents / d_model)-fold too large (ReLU) or off by the batch's norm (TopK). with_bias:
    // b_enc is scaled with W_enc, which scales every activation of an architecture homogeneous
    // in the two (Architecture::refits_encoder_scale) by c as well.
    const float* b_dec = p.data() + off("b_dec");
    double uv[2] = {0, 0};  // <u, x - b_dec>, ||u||^2 over all replicas' rows
    // In chunks of a step's chunk size (train.accum_steps): no buffer larger than a step's.
    const int64_t chunk = chunk_rows(rows);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t B = std::min(chunk, rows - r0);
        const float* xr = x + r0 * d_;
        ensure_batch(B);  // x is scaled already: uploaded as it is
        be_.upload(x_.data(), xr, B * d_ * static_cast<int64_t>(sizeof(float)));
        forward(x_.data(), B, true);
        std::vector<float> xhat(static_cast<size_t>(B * d_));
        be_.download(xhat.data(), xhat_.data(), B * d_ * static_cast<int64_t>(sizeof(float)));
        for (int64_t r = 0; r < B; ++r)
            for (int64_t c = 0; c < d_; ++c) {
                const double u = double(xhat[r * d_ + c]) - b_dec[c];
                uv[0] += u * (double(xr[r * d_ + c]) - b_dec[c]), uv[1] += u * u;
            }
    }
    comm_.allreduce_sum(uv, 2);
    if (!(uv[0] > 0 && uv[1] > 0)) return;  // nothing fired, or pointing away: keep c = 1
    const auto scale = static_cast<float>(uv[0] / uv[1]);
    const ParamSegment& enc = store_->layout().segment("W_enc");
    float* w_enc = p.data() + enc.offset;
    for (int64_t i = 0; i < enc.size(); ++i) w_enc[i] *= scale;
    if (with_bias)
        for (int64_t i = 0; i < n_; ++i) p[off("b_enc") + i] *= scale;
    set_params_host(p);
}

// --- the step ----------------------------------------------------------------------------------
//
// One step reads the same in every parallel mode; the ParamStore decides what reduce, the norm
// and Adam touch (the whole gradient, this replica's owned ranges, this latent shard's latents):
//   step_begin  upload -> forward -> loss -> backward        (queued on the backend)
//   step_end    collect -> reduce -> clip -> lr -> Adam -> finish
// Gradients are of the summed loss: they and the step's sums are summed over the replicas, then
// divided by the rows of all replicas through Adam's grad_scale.

StepResult SaeTrainer::step(BatchView x_host, int64_t rows) {
    step_begin(x_host, rows);
    return step_end();
}

void SaeTrainer::step_begin(BatchView x_host, int64_t rows) {
    SAE_ENFORCE(state_ == StepState::idle,
                "SaeTrainer::step_begin: the previous step has not ended");
    opt_->begin_step();
    last_rows_ = rows;
    if (rows > 1 && cfg_.accum_steps > 1) {
        accumulate_gradients(x_host, rows);  // -> accumulated
    } else if (rows > 0) {
        upload_batch(x_host, rows);
        // Gradient of the summed loss: replicas with different row counts then add up to the
        // gradient of the mean over all rows once step_end divides by the total.
        launch_gradients(x_.data(), rows, 1, target());  // -> queued
    } else {
        be_.fill(store_->grads(), store_->size(), 0.0f);  // an idle replica joins the reduce
        std::fill(fires_host_.begin(), fires_host_.end(), 0);
        transition(StepState::idle, StepState::no_rows, "step_begin");
    }
}

StepResult SaeTrainer::step_end() {
    // collect: the passes' sums (this replica's)
    StepResult r = end_passes();
    if (r.rows == 0 && store_->replicas() == 1) return r;  // nothing to learn, no one to join
    std::vector<double> arch_sums = step_arch_sums(r.rows);
    // reduce: the gradient and the step's sums over the replicas
    if (store_->replicas() > 1) reduce_over_replicas(r, arch_sums);
    if (r.rows == 0) return r;  // no replica had data: nothing to learn from
    // clip: by the norm of the summed gradient, the unit decoder rows' radial part projected out
    const GradClip clip = opt_->clip(static_cast<double>(r.rows));
    r.grad_norm = clip.grad_norm;
    r.clipped = clip.clipped;
    if (skip_nonfinite(r)) return r;
    // lr
    r.lr = opt_->lr(step_);
    // apply: on the owned ranges, the unit decoder rows renormalized after it
    opt_->apply(clip, r.lr, step_ + 1);
    // finish: the architecture's after_step, the quality window, dead latents, the counters
    finish_step(r, arch_sums);
    return r;
}

// --- the step's pieces, in the order it runs them ----------------------------------------------

StepResult SaeTrainer::compute_gradients(const float* x, int64_t rows, int64_t norm_rows,
                                         const float* y) {
    SAE_ENFORCE(!transcodes_ || y != nullptr,
                "SaeTrainer::compute_gradients: a transcoder needs its target rows");
    launch_gradients(x, rows, norm_rows, y);
    return collect_gradients();
}

void SaeTrainer::launch_gradients(const float* x, int64_t rows, int64_t norm_rows, const float* y) {
    const int64_t B = rows, d = d_;
    if (norm_rows <= 0) norm_rows = rows;
    transition(StepState::idle, StepState::queued, "launch_gradients");
    queued_rows_ = rows;
    ensure_batch(B);
    store_->new_gradient();
    be_.fill(stats_.data(), kStatCount, 0.0f);
    PassContext c = context(x, B, y);
    // d/dx_hat of sum_t ||err_t||^2 / norm_rows
    c.grad_scale = 2.0f / static_cast<float>(norm_rows);
    c.norm_rows = static_cast<float>(norm_rows);
    // forward: the activations and x_hat (summed over latent shards)
    pass_->forward(c, true);
    reduce_x_hat(B);
    // loss: err = x_hat - y (y: x, or a transcoder's target) and its sums; dL/dx_hat in place
    // of x_hat, b_dec's residual term
    be_.residual(c.xhat, c.y, B, d, c.grad_scale, xcol_.data(), c.grad("b_dec"), stats_.data());
    // On a latent shard b_dec's gradient is the residual's term (once, on the first latent shard)
    // plus every latent shard's term through its encoder input, summed below.
    if (store_->latent_shard().index > 0) be_.fill(c.grad("b_dec"), d, 0.0f);
    // backward: every gradient into store_->grads()
    pass_->backward(c, step_, total_steps_);
    store_->sum_over_latent_shards_on_backend(c.grad("b_dec"), d);
}

void SaeTrainer::forward(const float* x, int64_t B, bool training) {
    PassContext c = context(x, B);
    pass_->forward(c, training);
    reduce_x_hat(B);
}

void SaeTrainer::reduce_x_hat(int64_t rows) {
    store_->sum_over_latent_shards_on_backend(xhat_.data(), rows * d_);
}

void SaeTrainer::accumulate_gradients(BatchView x_host, int64_t rows) {
    const int64_t chunks = std::min(cfg_.accum_steps, rows), d = d_;
    const int64_t n_params = store_->size();
    float* grads = store_->grads();
    if (accum_grads_.size() < n_params) accum_grads_ = DeviceArray<float>(be_, n_params);
    StepResult sum;
    double loss_sum = 0;
    std::vector<double> xcol(static_cast<size_t>(d), 0.0), arch_sums;
    std::vector<int64_t> fired(static_cast<size_t>(n_), 0);
    for (int64_t a = 0; a < chunks; ++a) {
        const int64_t r0 = rows * a / chunks, r1 = rows * (a + 1) / chunks;
        upload_batch(x_host.rows_from(r0, row_width()), r1 - r0);
        launch_gradients(x_.data(), r1 - r0, 1, target());  // the summed loss: chunks add up
        last_rows_ = r1 - r0;                               // the activations the pass now holds
        const StepResult c = collect_gradients();
        be_.axpby(accum_grads_.data(), grads, 1.0f, a == 0 ? 0.0f : 1.0f, n_params);
        sum.rows += c.rows, sum.sse += c.sse, sum.l1 += c.l1, sum.l0 += c.l0, sum.aux += c.aux;
        sum.sum_sq_x += c.sum_sq_x;
        loss_sum += c.loss * static_cast<double>(c.rows);
        for (int64_t j = 0; j < d; ++j) xcol[j] += xcol_host_[j];
        for (int64_t i = 0; i < n_; ++i) fired[i] += fires_host_[i];
        if (arch_sums.empty()) arch_sums.assign(pending_arch_sums_.size(), 0.0);
        for (size_t i = 0; i < arch_sums.size(); ++i) arch_sums[i] += pending_arch_sums_[i];
    }
    be_.axpby(grads, accum_grads_.data(), 1.0f, 0.0f, n_params);
    double mean_sq = 0;
    for (double v : xcol) mean_sq += v * v;
    sum.sst = sum.sum_sq_x - mean_sq / static_cast<double>(sum.rows);
    sum.loss = loss_sum / static_cast<double>(sum.rows);
    for (int64_t i = 0; i < n_; ++i) fires_host_[i] = static_cast<int32_t>(fired[i]);
    pending_arch_sums_ = arch_sums;
    accumulated_ = sum;
    transition(StepState::idle, StepState::accumulated, "step_begin");
}

StepResult SaeTrainer::end_passes() {
    SAE_ENFORCE(state_ != StepState::idle, "SaeTrainer::step_end without step_begin");
    if (state_ == StepState::queued) return collect_gradients();
    const StepResult r = state_ == StepState::accumulated ? accumulated_ : StepResult{};
    transition(state_, StepState::idle, "step_end");
    return r;
}

StepResult SaeTrainer::collect_gradients() {
    transition(StepState::queued, StepState::idle, "collect_gradients");
    const int64_t B = queued_rows_, d = d_, n = n_;
    float st[kStatCount];
    std::vector<float>& xcol = xcol_host_;
    xcol.resize(static_cast<size_t>(d));
    be_.download(st, stats_.data(), sizeof(st));
    be_.download(xcol.data(), xcol_.data(), d * static_cast<int64_t>(sizeof(float)));
    be_.download(fires_host_.data(), fires_.data(), n * static_cast<int64_t>(sizeof(int32_t)));
    // Sums over latents: on a latent shard each latent shard holds its own latents' part.
    double part[2] = {st[kStatL1], st[kStatL0]};
    store_->sum_over_latent_shards(part, 2);
    st[kStatL1] = static_cast<float>(part[0]), st[kStatL0] = static_cast<float>(part[1]);
    pending_arch_sums_ = pass_->step_sums();
    StepResult r;
    r.rows = B;
    r.sse = st[kStatSse];
    double mean_sq = 0;
    for (float v : xcol) mean_sq += double(v) * v;
    r.sst = st[kStatSumSqX] - mean_sq / static_cast<double>(B);
    r.l1 = st[kStatL1];
    r.l0 = st[kStatL0];
    r.aux = st[kStatAux] + st[kStatAuxK];
    r.sum_sq_x = st[kStatSumSqX];
    r.loss = (r.sse + pass_->penalty(st)) / static_cast<double>(B);
    return r;
}

std::vector<double> SaeTrainer::step_arch_sums(int64_t rows) {
    std::vector<double> arch_sums = pass_->step_sums();
    if (rows == 0)
        std::fill(arch_sums.begin(), arch_sums.end(), 0.0);
    else
        arch_sums = pending_arch_sums_;
    return arch_sums;
}

void SaeTrainer::reduce_over_replicas(StepResult& r, std::vector<double>& arch_sums) {
    std::vector<double> m = {
        double(r.rows), r.loss * double(r.rows), r.sse, r.sst, r.l1, r.l0, r.aux, r.sum_sq_x};
    const size_t a0 = m.size();
    m.insert(m.end(), arch_sums.begin(), arch_sums.end());
    m.insert(m.end(), fires_host_.begin(), fires_host_.end());
    store_->reduce(m, a0);  // the node split's squared norm travels at m[a0]
    r.rows = static_cast<int64_t>(m[0]);
    r.loss = m[1] / m[0], r.sse = m[2], r.sst = m[3], r.l1 = m[4], r.l0 = m[5], r.aux = m[6];
    r.sum_sq_x = m[7];
    std::copy(m.begin() + a0, m.begin() + a0 + arch_sums.size(), arch_sums.begin());
    const size_t f0 = a0 + arch_sums.size();
    for (int64_t i = 0; i < n_; ++i) fires_host_[i] = static_cast<int32_t>(m[f0 + i]);
}

bool SaeTrainer::skip_nonfinite(StepResult& r) {
    // A non-finite gradient (every replica sees the same all-reduced value, so all decide
    // alike): apply nothing, count it, and give up after max_bad_steps in a row.
    if (std::isfinite(r.grad_norm) && std::isfinite(r.loss)) {
        bad_in_a_row_ = 0;
        return false;
    }
    r.skipped = true;
    ++bad_in_a_row_;
    SAE_ENFORCE(bad_in_a_row_ < cfg_.max_bad_steps,
                "the loss or gradient was not finite for {} steps in a row (at step {}; "
                "train.max_bad_steps); lower train.lr or check the data. The last committed "
                "checkpoint predates the problem",
                bad_in_a_row_, step_);
    return true;
}

void SaeTrainer::rest() { opt_->rest(); }

void SaeTrainer::finish_step(const StepResult& r, const std::vector<double>& arch_sums) {
    pass_->after_step(arch_sums);
    pass_->after_update({step_, total_steps_, r.rows, r.l0, &fires_host_});
    window_.add(step_, r.rows, r.sse, r.sst, r.sum_sq_x, r.l0, fires_host_, arch_sums);
    n_dead_ = 0;
    for (int64_t i = 0; i < n_; ++i) {
        since_fired_[i] = fires_host_[i] > 0 ? 0 : since_fired_[i] + r.rows;
        dead_[i] = since_fired_[i] >= cfg_.dead_tokens;
        n_dead_ += dead_[i];
    }
    count_dead_over_latent_shards();
    ++step_;
    tokens_ += r.rows;
}

// --- the step's state ----------------------------------------------------------------------------

const char* SaeTrainer::state_name(StepState s) {
    switch (s) {
        case StepState::idle:
            return "idle";
        case StepState::queued:
            return "queued (passes launched, not collected)";
        case StepState::accumulated:
            return "accumulated (step begun, not ended)";
        case StepState::no_rows:
            return "begun without rows (not ended)";
    }
    return "?";
}

void SaeTrainer::transition(StepState from, StepState to, const char* call) {
    SAE_ENFORCE(state_ == from, "SaeTrainer::{}: the trainer is {}, expected {}", call,
                state_name(state_), state_name(from));
    state_ = to;
}

double SaeTrainer::dead_fraction() const {
    return static_cast<double>(n_dead_total_) / static_cast<double>(n_total_);
}

void SaeTrainer::count_dead_over_latent_shards() {
    double dead = static_cast<double>(n_dead_);
    store_->sum_over_latent_shards(&dead, 1);
    n_dead_total_ = static_cast<int64_t>(dead);
}

// --- host copies, and restore ------------------------------------------------------------------

std::vector<float> SaeTrainer::params_host() const {
    return store_->host(ParamStore::Buffer::params);
}

std::vector<float> SaeTrainer::grads_host() const {
    return store_->host(ParamStore::Buffer::grads);
}

void SaeTrainer::set_params_host(const std::vector<float>& p) {
    store_->write(ParamStore::Buffer::params, p);
    opt_->params_set(p);
}

void SaeTrainer::restore(CheckpointPart part, int64_t step, int64_t tokens) {
    input_scale_ = part.input_scale;
    for (const auto& [name, value] : part.buffers) pass_->set_buffer(name, value);
    store_->write(ParamStore::Buffer::params, part.params);
    store_->write(ParamStore::Buffer::opt_m, part.opt_m);
    store_->write(ParamStore::Buffer::opt_v, part.opt_v);
    since_fired_ = std::move(part.since_fired);
    n_dead_ = 0;
    for (int64_t i = 0; i < n_; ++i) {
        dead_[i] = since_fired_[i] >= cfg_.dead_tokens;
        n_dead_ += dead_[i];
    }
    count_dead_over_latent_shards();
    step_ = step;
    tokens_ = tokens;
    opt_->restored(step);
}

}  // namespace saetrain
