// evaluation.cpp — held-out evaluation, the training window's quality gates and reconstructions
// (see evaluation.h): the trainer's forward pass, nothing that changes the SAE.
#include "saetrain/evaluation.h"

#include <algorithm>
#include <cstring>

#include "saetrain/comm.h"
#include "saetrain/error.h"
#include "saetrain/trainer.h"

namespace saetrain {

// --- the pieces --------------------------------------------------------------------------------

HostActivations activations_download(Backend& be, const Activations& a, int64_t rows, int64_t n) {
    HostActivations h;
    h.dense = a.dense != nullptr;
    h.per_row = h.dense ? n : a.width;
    h.val.resize(static_cast<size_t>(rows * h.per_row));
    if (h.dense) {
        be.download(h.val.data(), a.dense, rows * n * int64_t{sizeof(float)});
    } else {
        h.idx.resize(h.val.size());
        be.download(h.val.data(), a.val, rows * h.per_row * int64_t{sizeof(float)});
        be.download(h.idx.data(), a.idx, rows * h.per_row * int64_t{sizeof(int32_t)});
    }
    return h;
}

double decorrelation_over_latent_shards(const ParamStore& store, const HostActivations& a,
                                        int64_t rows) {
    const LatentShard& latent_shard = store.latent_shard();
    const int64_t n = latent_shard.n_local(), width = a.per_row;
    const float* dense = a.dense ? a.val.data() : nullptr;
    const float* val = a.val.data();
    const int32_t* idx = a.idx.data();
    if (!store.latent_sharded()) return decorrelation_rms(dense, idx, val, width, rows, n);
    // Every latent shard's non-zero activations of the rows decorrelation_rms looks at, as (global
    // id, value) pairs, W per row (W: the most any latent shard has in a row; value 0 pads).
    rows = std::min<int64_t>(rows, 2048);
    const int64_t per_row = dense ? n : width;
    auto value = [&](int64_t r, int64_t j) {
        return dense ? dense[r * n + j] : val[r * width + j];
    };
    auto latent = [&](int64_t r, int64_t j) { return dense ? j : int64_t{idx[r * width + j]}; };
    int64_t W = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t c = 0;
        for (int64_t j = 0; j < per_row; ++j) c += value(r, j) != 0.0f;
        W = std::max(W, c);
    }
    latent_shard.group->allreduce_max(&W, 1);
    if (W == 0) return 0.0;
    std::vector<int32_t> my_idx(static_cast<size_t>(rows * W), 0);
    std::vector<float> my_val(static_cast<size_t>(rows * W), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0, c = 0; j < per_row; ++j)
            if (value(r, j) != 0.0f) {
                my_idx[r * W + c] = static_cast<int32_t>(latent_shard.first() + latent(r, j));
                my_val[r * W + c++] = value(r, j);
            }
    const int64_t S = latent_shard.count, block = rows * W;
    std::vector<int32_t> all_idx(static_cast<size_t>(S * block)), pairs_idx(all_idx.size());
    std::vector<float> all_val(all_idx.size()), pairs_val(all_idx.size());
    latent_shard.group->allgather(my_idx.data(), all_idx.data(), block * int64_t{sizeof(int32_t)});
    latent_shard.group->allgather(my_val.data(), all_val.data(), block * int64_t{sizeof(float)});
    for (int64_t q = 0; q < S; ++q)  // row r: every latent shard's W pairs side by side
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < W; ++j) {
                pairs_idx[(r * S + q) * W + j] = all_idx[q * block + r * W + j];
                pairs_val[(r * S + q) * W + j] = all_val[q * block + r * W + j];
            }
    return decorrelation_rms(nullptr, pairs_idx.data(), pairs_val.data(), S * W, rows,
                             latent_shard.n_total);
}

EvalSums::EvalSums(int64_t d, int64_t n_local, int64_t layers, int64_t first_latent,
                   int64_t n_total)
    : d_(d),
      n_(n_local),
      layers_(std::max<int64_t>(layers, 1)),
      first_(first_latent),
      n_total_(n_total > 0 ? n_total : n_local),
      sums_(static_cast<size_t>(4 + d + n_local + (layers_ > 1 ? 3 * layers_ : 0)), 0.0) {}

void EvalSums::add(int64_t rows, const float* stats, const std::vector<float>& x_col_sum,
                   const HostActivations& a, const float* x_hat, const float* x) {
    double* x_sum = sums_.data() + 4;
    double* fired = x_sum + d_;
    double* per_layer = fired + n_;  // [sse, sum ||x_l||^2, l0] a layer
    sums_[0] += static_cast<double>(rows), sums_[1] += stats[kStatSse];
    sums_[2] += stats[kStatSumSqX];
    for (int64_t c = 0; c < d_; ++c) x_sum[c] += x_col_sum[c];
    const int64_t per_layer_latents = n_total_ / layers_;
    // Which latents fired: the dense activations or the (latent, value) pairs.
    for (int64_t i = 0; i < rows * a.per_row; ++i) {
        if (!(a.val[i] > 0)) continue;
        sums_[3] += 1;
        const int64_t latent = a.dense ? i % n_ : a.idx[i];
        fired[latent] += 1;
        if (layers_ > 1) per_layer[3 * ((first_ + latent) / per_layer_latents) + 2] += 1;
    }
    if (layers_ == 1) return;
    SAE_ENFORCE(x_hat && x, "EvalSums::add: a layered model's x_hat and x are needed");
    const int64_t dl = d_ / layers_;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < d_; ++c) {
            const double v = x[r * d_ + c], e = double(x_hat[r * d_ + c]) - v;
            per_layer[3 * (c / dl)] += e * e, per_layer[3 * (c / dl) + 1] += v * v;
        }
}

EvalResult EvalSums::result(Communicator& replicas, const ParamStore& store,
                            std::vector<double> decorr) const {
    std::vector<double> sums = sums_;
    replicas.allreduce_sum(decorr.data(), 2);
    replicas.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
    store.sum_over_latent_shards(&sums[3], 1);  // L0: each latent shard its latents'
    double* per_layer = sums.data() + 4 + d_ + n_;
    // Each layer's L0 likewise (the squared errors are every latent shard's whole x_hat's).
    for (int64_t l = 0; layers_ > 1 && l < layers_; ++l)
        store.sum_over_latent_shards(&per_layer[3 * l + 2], 1);
    const double* x_sum = sums.data() + 4;
    const double* fired = x_sum + d_;
    const std::vector<double> fired_all = store.all_latents(std::vector<double>(fired, fired + n_));
    const int64_t n = store.latent_shard().n_total;
    EvalResult e;
    e.rows = static_cast<int64_t>(sums[0]);
    if (e.rows == 0) return e;
    double mean_sq = 0;
    for (int64_t c = 0; c < d_; ++c) mean_sq += x_sum[c] * x_sum[c];
    const double sst = sums[2] - mean_sq / sums[0];
    const double elements = sums[0] * static_cast<double>(d_);
    e.fvu = fvu_from_sums(sums[1], sst, sums[2], elements);
    e.l0 = sums[3] / sums[0];
    int64_t dead = 0, dense = 0;
    for (double f : fired_all) dead += f == 0, dense += f > 0.1 * sums[0];
    e.dead_fraction = static_cast<double>(dead) / static_cast<double>(n);
    e.dense_fraction = static_cast<double>(dense) / static_cast<double>(n);
    quality_from_sums(e.quality, e.rows, elements, sums[1], sst, sums[2], sums[3], fired_all);
    e.quality.held_out = true;
    e.quality.decorr_rms = decorr[1] > 0 ? decorr[0] / decorr[1] : 0.0;
    if (layers_ == 1) return e;
    const int64_t dl = d_ / layers_, nl = n / layers_;
    for (int64_t l = 0; l < layers_; ++l) {
        double block_mean_sq = 0;
        for (int64_t c = l * dl; c < (l + 1) * dl; ++c) block_mean_sq += x_sum[c] * x_sum[c];
        const double sse = per_layer[3 * l], sum_sq = per_layer[3 * l + 1];
        e.layer_fvu.push_back(fvu_from_sums(sse, sum_sq - block_mean_sq / sums[0], sum_sq,
                                            sums[0] * static_cast<double>(dl)));
        e.layer_l0.push_back(per_layer[3 * l + 2] / sums[0]);
        int64_t dead_l = 0;
        for (int64_t i = l * nl; i < (l + 1) * nl; ++i) dead_l += fired_all[i] == 0;
        e.layer_dead.push_back(static_cast<double>(dead_l) / static_cast<double>(nl));
    }
    return e;
}

QualityWindow::QualityWindow(int64_t total_steps, int64_t n_local, int64_t d)
    : start_(total_steps - std::max<int64_t>(1, total_steps / 10)),
      d_(d),
      fired_(static_cast<size_t>(n_local), 0.0) {}

void QualityWindow::add(int64_t step, int64_t rows, double sse, double sst, double sum_sq_x,
                        double l0, const std::vector<int32_t>& fires,
                        const std::vector<double>& arch_sums) {
    if (step < start_) return;
    rows_ += rows, sse_ += sse, sst_ += sst, sum_sq_ += sum_sq_x;
    l0_ += l0;
    for (size_t i = 0; i < fired_.size(); ++i) fired_[i] += fires[i];
    if (arch_sums_.size() != arch_sums.size()) arch_sums_.assign(arch_sums.size(), 0.0);
    for (size_t i = 0; i < arch_sums.size(); ++i) arch_sums_[i] += arch_sums[i];
}

QualityGates QualityWindow::gates(const ParamStore& store) const {
    QualityGates q;
    quality_from_sums(q, rows_, static_cast<double>(rows_ * d_), sse_, sst_, sum_sq_, l0_,
                      store.all_latents(fired_));
    return q;
}

// --- the trainer's evaluation passes -----------------------------------------------------------

BatchView SaeTrainer::first_latent_shard_rows(BatchView x_host, int64_t r0, int64_t rows,
                                              std::vector<char>& buf) const {
    if (!latent_sharded()) return x_host.rows_from(r0, row_width());
    const LatentShard& latent_shard = store_->latent_shard();
    // The element type is the first latent shard's: the others may pass no rows at all.
    int64_t type = static_cast<int64_t>(x_host.dtype);
    latent_shard.group->bcast(&type, sizeof(type), 0);
    const auto t = static_cast<DType>(type);
    const int64_t bytes = rows * row_width() * dtype_size(t);
    buf.resize(static_cast<size_t>(bytes));
    if (latent_shard.index == 0)
        std::memcpy(buf.data(), x_host.rows_from(r0, row_width()).data, static_cast<size_t>(bytes));
    latent_shard.group->bcast(buf.data(), bytes, 0);
    return {buf.data(), t};
}

EvalResult SaeTrainer::evaluate(BatchView x_host, int64_t rows, int64_t batch_rows) {
    SAE_ENFORCE(state_ == StepState::idle, "SaeTrainer::evaluate during a step");
    SAE_ENFORCE(batch_rows >= 1, "SaeTrainer::evaluate: batch_rows must be >= 1");
    rest();                               // signum: the SAE is the average
    batch_rows = chunk_rows(batch_rows);  // train.accum_steps: a step's chunk at most
    const int64_t d = d_;
    // Sums over this replica's rows, then over the replicas, in one all-reduce.
    // A layered model's figures per layer need x_hat and the target on the host.
    const int64_t layers = arch_.rows().per_layer ? cfg_.layers : 1;
    EvalSums sums(d, n_, layers, store_->latent_shard().first(), n_total_);
    std::vector<float> x_hat_host, y_host;
    std::vector<float> xcol(static_cast<size_t>(d));
    std::vector<double> local_decorr = {0.0, 0.0};  // [decorr_rms, 1 when measured]
    DeviceArray<float> db_dec_scratch(be_, d);
    std::vector<char> shared;  // latent shards: the first latent shard's batch, broadcast
    for (int64_t r0 = 0; r0 < rows; r0 += batch_rows) {
        const int64_t B = std::min(batch_rows, rows - r0);
        upload_batch(first_latent_shard_rows(x_host, r0, B, shared), B);
        forward(x_.data(), B, false);
        if (layers > 1) {
            x_hat_host.resize(static_cast<size_t>(B * d)), y_host.resize(x_hat_host.size());
            be_.download(x_hat_host.data(), xhat_.data(), B * d * int64_t{sizeof(float)});
            be_.download(y_host.data(), target(), B * d * int64_t{sizeof(float)});
        }
        be_.fill(stats_.data(), kStatCount, 0.0f);
        be_.residual(xhat_.data(), target(), B, d, 0.0f, xcol_.data(), db_dec_scratch.data(),
                     stats_.data());
        float st[kStatCount];
        be_.download(st, stats_.data(), sizeof(st));
        be_.download(xcol.data(), xcol_.data(), d * static_cast<int64_t>(sizeof(float)));
        const HostActivations a = activations_download(be_, pass_->activations(), B, n_);
        sums.add(B, st, xcol, a, x_hat_host.data(), y_host.data());
        if (r0 == 0)  // the first batch's latent correlations (quality.h)
            local_decorr = {decorrelation_over_latent_shards(*store_, a, B), 1.0};
    }
    return sums.result(comm_, *store_, local_decorr);
}

void SaeTrainer::reconstruct(BatchView x_host, int64_t rows, int64_t batch_rows,
                             float* x_hat_host) {
    SAE_ENFORCE(state_ == StepState::idle, "SaeTrainer::reconstruct during a step");
    SAE_ENFORCE(batch_rows >= 1, "SaeTrainer::reconstruct: batch_rows must be >= 1");
    batch_rows = chunk_rows(batch_rows);
    for (int64_t r0 = 0; r0 < rows; r0 += batch_rows) {
        const int64_t B = std::min(batch_rows, rows - r0);
        upload_batch(x_host.rows_from(r0, row_width()), B);
        forward(x_.data(), B, false);
        be_.download(x_hat_host + r0 * d_, xhat_.data(), B * d_ * int64_t{sizeof(float)});
    }
    if (input_scale_ != 1.0f)
        for (int64_t i = 0; i < rows * d_; ++i) x_hat_host[i] /= input_scale_;
}

void SaeTrainer::activations(
    BatchView x_host, int64_t rows, int64_t batch_rows,
    const std::function<void(int64_t, int64_t, const HostActivations&)>& sink) {
    SAE_ENFORCE(state_ == StepState::idle, "SaeTrainer::activations during a step");
    SAE_ENFORCE(batch_rows >= 1, "SaeTrainer::activations: batch_rows must be >= 1");
    batch_rows = chunk_rows(batch_rows);
    for (int64_t r0 = 0; r0 < rows; r0 += batch_rows) {
        const int64_t B = std::min(batch_rows, rows - r0);
        upload_batch(x_host.rows_from(r0, row_width()), B);
        forward(x_.data(), B, false);
        sink(r0, B, activations_download(be_, pass_->activations(), B, n_));
    }
}

QualityGates SaeTrainer::training_quality() {
    QualityGates q = window_.gates(*store_);
    // The last step's activations, still in the architecture's buffers.
    std::vector<double> decorr = {0.0, 0.0};
    if (last_rows_ > 0 && step_ > 0) {
        const int64_t rows = std::min<int64_t>(last_rows_, 2048);
        const HostActivations a = activations_download(be_, pass_->activations(), rows, n_);
        decorr = {decorrelation_over_latent_shards(*store_, a, rows), 1.0};
    }
    comm_.allreduce_sum(decorr.data(), 2);
    q.decorr_rms = decorr[1] > 0 ? decorr[0] / decorr[1] : 0.0;
    return q;
}

std::vector<std::pair<std::string, double>> SaeTrainer::arch_summary() const {
    return pass_->summarize(window_.arch_sums(), window_.fired());
}

}  // namespace saetrain
