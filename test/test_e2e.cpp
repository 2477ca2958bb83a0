// End to end on the library: sae-synth data with planted features -> shuffled shard loader ->
// TopK SAE -> the decoder must recover the planted features.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/backend.h"
#include "saetrain/checkpointer.h"
#include "saetrain/comm.h"
#include "saetrain/forwarding_backend.h"
#include "saetrain/loader.h"
#include "saetrain/synth.h"
#include "saetrain/train_loop.h"
#include "saetrain/trainer_io.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct TempDir : saetrain::testing::TempDir {
    TempDir() : saetrain::testing::TempDir("saetrain_e2e") {}
};

// Small synthetic shards in `dir` (d_model 16, 32 planted features), opened.
DatasetInfo small_data(const std::string& dir, int64_t rows, int shards, uint64_t seed) {
    SynthOptions so;
    so.out_dir = dir;
    so.d_model = 16;
    so.n_features = 32;
    so.rows = rows;
    so.shards = shards;
    so.seed = seed;
    synth_write(so);
    return dataset_open(dir);
}

// Trains `cfg` for `epochs` passes over the sae-synth data in `dir` (a transcoder on its paired
// target set in dir/target) at batch 256 and scores the decoder against the planted features (mean
// over the true features of the best cosine with a decoder row).
struct PlantedRun {
    LoopResult res;
    SaeWeights weights;
    double recovery = 0;
};
PlantedRun train_planted(const SaeConfig& cfg, const fs::path& dir, int64_t epochs = 2,
                         int64_t batch = 256) {
    const bool transcodes = arch_get(cfg.arch).rows().target;
    const DatasetInfo data = dataset_open(dir.string());
    std::vector<DatasetInfo> parts = {data};
    if (transcodes) parts.push_back(dataset_open((dir / "target").string()));
    LoaderOptions lo;
    lo.epochs = epochs;
    lo.shuffle_rows = 16384;
    lo.seed = 1;
    ShardBatchSource source(parts, {0, data.total_rows}, lo);
    auto be = make_cpu_backend(2);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, data.d_model, total_steps_for(source.total_rows(), batch), 0, *be, *self);
    LoopOptions opt;
    opt.batch_size = batch;
    opt.sae_id = cfg.arch;
    PlantedRun run;
    run.res = train_loop(tr, source, opt);
    tr.rest();  // train.optimizer: signum's SAE is its average
    int64_t m = 0, d = 0;
    const auto truth = synth_read_features(
        ((transcodes ? dir / "target" : dir) / "ground_truth.h5").string(), &m, &d);
    run.weights = trainer_weights(tr);
    run.recovery =
        feature_recovery(truth.data(), m, run.weights.at("W_dec").data(), run.weights.n_latents, d);
    std::printf("%s: steps %lld fvu %.4f l0 %.3f recovery %.4f dead %.4f\n", cfg.arch.c_str(),
                static_cast<long long>(run.res.steps), run.res.last.fvu, run.res.last.l0,
                run.recovery, run.res.last.dead_fraction);
    return run;
}

// The planted-feature data of the recovery tests: 48-wide rows of 3 (Poisson) of 128 features
// (magnitudes 0.5-2) plus noise 0.02, 60000 rows, in `dir`; callers change what they need.
SynthOptions planted_options(const fs::path& dir) {
    SynthOptions so;
    so.out_dir = dir.string();
    so.d_model = 48;
    so.n_features = 128;  // overcomplete: the features cannot be orthogonal
    so.active_per_row = 3.0;
    so.rows = 60000;
    so.shards = 2;
    so.noise_std = 0.02;
    so.seed = 7;
    return so;
}

TEST(EndToEnd, TopkRecoversPlantedFeatures) {
    TempDir tmp;
    SynthOptions so = planted_options(tmp.path);
    so.shards = 3;
    so.dtype = DType::f16;  // exercise conversion on the way in
    so.chunked = true;
    synth_write(so);

    SaeConfig cfg;
    cfg.arch = "topk";
    cfg.expansion = 4;  // 192 latents for 128 features
    cfg.k = 6;
    cfg.lr = 1e-2;  // a small SAE on easy data: a high rate converges in few steps
    cfg.warmup_steps = 20;
    const PlantedRun run = train_planted(cfg, tmp.path, 3);
    const LoopResult& res = run.res;
    const double recovery = run.recovery;
    EXPECT_GE(recovery, 0.9);
    // The bound on fvu: the noise alone is d * noise_std^2 = 0.0128 per row against a signal
    // variance of about active * E[a^2] = 3 * 1.35 = 4.05 (a log-uniform on [0.5, 2]), i.e. 0.3%;
    // rows with more than k = 6 active features (Poisson(3): 3.4% of rows) and the encoder's
    // interference between non-orthogonal features add more. 0.15 leaves room for those while
    // an SAE that learned nothing (fvu ~ 1) or only a few features fails.
    EXPECT_LT(res.last.fvu, 0.15);
    EXPECT_NEAR(res.last.l0, 6.0, 0.5);
    EXPECT_EQ(res.tokens, 3 * so.rows);

    // Throughput and memory: model FLOPs of a TopK SAE with sparse kernels, 2*d*n + 8*k*d
    // (d = 48, n = 192, k = 6), times the measured rates; host memory only on the CPU, and no
    // MFU from the loop (the reporter adds it when a peak is known).
    const double flops_per_token = 2.0 * 48 * 192 + 8.0 * 6 * 48;
    EXPECT_GT(res.tflops, 0);
    EXPECT_NEAR(res.tflops, flops_per_token * res.tokens_per_s / 1e12, 1e-9 * res.tflops);
    EXPECT_NEAR(res.last.tflops, flops_per_token * res.last.tokens_per_s / 1e12,
                1e-9 * res.last.tflops);
    EXPECT_GT(res.last.host_mem_peak_GB, 1e-3);
    EXPECT_EQ(res.last.gpu_mem_peak_GB, 0.0);
    EXPECT_LT(res.last.mfu, 0.0);
}

// train.optimizer: signum (schedule-free sign descent) trains TopK and BatchTopK to the planted
// features at a constant lr, sparsify's default scaled to this width (5e-3 / sqrt(n / 2^14)).
TEST(EndToEnd, SignumRecoversPlantedFeatures) {
    TempDir tmp;
    synth_write(planted_options(tmp.path));
    for (const std::string arch : {"topk", "batchtopk"}) {
        SaeConfig cfg;
        cfg.arch = arch;
        cfg.expansion = 4;
        cfg.k = 6;
        cfg.optimizer = "signum";
        cfg.lr = 5e-3 / std::sqrt(192.0 / 16384.0);
        cfg.lr_decay = "constant";
        cfg.warmup_steps = 20;
        const PlantedRun run = train_planted(cfg, tmp.path);
        EXPECT_GE(run.recovery, 0.9) << arch;
        EXPECT_LT(run.res.last.fvu, 0.15) << arch;
    }
}

// The loop's batch comes from LoopOptions::batch_allocator when one is given (pinned memory on
// a CUDA rank): one buffer of batch x d floats, freed once, and the same training as without.
TEST(EndToEnd, BatchBufferFromTheGivenAllocator) {
    TempDir tmp;
    const DatasetInfo data = small_data(tmp.path.string(), 3000, 2, 3);
    auto train = [&](const HostAllocator& alloc) {
        LoaderOptions lo;
        lo.shuffle_rows = 1024;
        ShardBatchSource source(data, {0, data.total_rows}, lo);
        SaeConfig cfg;
        cfg.arch = "topk";
        cfg.expansion = 2;
        cfg.k = 4;
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, data.d_model, total_steps_for(source.total_rows(), 100), 0, *be, *self);
        LoopOptions opt;
        opt.batch_size = 100;
        opt.batch_allocator = alloc;
        train_loop(tr, source, opt);
        return tr.params_host();
    };
    int allocs = 0, frees = 0;
    size_t bytes_seen = 0;
    std::vector<char> arena;
    HostAllocator counting;
    counting.name = "counting";
    counting.alloc = [&](size_t bytes) -> void* {
        ++allocs, bytes_seen = bytes;
        arena.assign(bytes + 4096, 0);
        return arena.data();
    };
    counting.free = [&](void* p, size_t bytes) {
        ++frees;
        EXPECT_EQ(p, arena.data());
        EXPECT_EQ(bytes, bytes_seen);
    };
    const std::vector<float> with = train(counting);
    EXPECT_EQ(allocs, 1);
    EXPECT_EQ(frees, 1);
    EXPECT_EQ(bytes_seen, size_t{100} * 16 * sizeof(float));
    EXPECT_EQ(with, train(HostAllocator{}));
}

// 16-bit shards delivered as stored (LoaderOptions::widen = false, as saetrain reads) train
// the same SAE, bit for bit, as the float32 rows the widening reader delivers: bf16 and
// chunked f16, shuffled, over two epochs. The loop's batch buffer holds 2 bytes a value.
TEST(EndToEnd, SixteenBitRowsTrainBitwiseAsTheWidenedRows) {
    for (DType t : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(dtype_name(t));
        TempDir tmp;
        SynthOptions so;
        so.out_dir = tmp.path.string();
        so.d_model = 16;
        so.n_features = 32;
        so.rows = 3000;
        so.shards = 3;
        so.dtype = t;
        so.chunked = t == DType::f16;
        so.chunk_rows = 70;
        so.seed = 3;
        synth_write(so);
        const DatasetInfo data = dataset_open(so.out_dir);
        size_t batch_bytes = 0;
        auto train = [&](bool widen) {
            LoaderOptions lo;
            lo.epochs = 2;
            lo.shuffle_rows = 1024;
            lo.seed = 2;
            lo.widen = widen;
            ShardBatchSource source(data, {0, data.total_rows}, lo);
            EXPECT_EQ(source.dtype(), widen ? DType::f32 : t);
            SaeConfig cfg;
            cfg.arch = "topk";
            cfg.expansion = 2;
            cfg.k = 4;
            cfg.normalize = "expected_average_only_in";
            auto be = make_cpu_backend(1);
            auto self = make_self_comm();
            SaeTrainer tr(cfg, data.d_model, total_steps_for(source.total_rows(), 100), 0, *be,
                          *self);
            LoopOptions opt;
            opt.batch_size = 100;
            HostAllocator counting = host_allocator_default();
            counting.alloc = [&batch_bytes](size_t bytes) {
                batch_bytes = bytes;
                return host_allocator_default().alloc(bytes);
            };
            opt.batch_allocator = counting;
            const LoopResult res = train_loop(tr, source, opt);
            EXPECT_EQ(res.tokens, 2 * so.rows);
            return tr.params_host();
        };
        const std::vector<float> kept = train(false);
        EXPECT_EQ(batch_bytes, size_t{100} * 16 * 2);
        const std::vector<float> wide = train(true);
        EXPECT_EQ(batch_bytes, size_t{100} * 16 * 4);
        ASSERT_EQ(kept.size(), wide.size());
        EXPECT_EQ(std::memcmp(kept.data(), wide.data(), kept.size() * 4), 0);
    }
}

}  // namespace

// LoopOptions::overlap fetches batch i+1 between step i's begin and end: the same batches in
// the same order, so the trained parameters are bit-identical with and without it, and a
// checkpoint callback sees the source's cursor count only trained batches (no batch is fetched
// ahead of a checkpoint).
// Holds the backend to upload_rows's promise that the host rows may be reused once it returns
// (what fetching ahead relies on: the next batch is read into the same buffer while the device
// trains): after each upload the rows are overwritten with NaN, so a trainer or loop that read
// them again would train on NaN or on the wrong batch.
class PoisonAfterUpload final : public ForwardingBackend {
public:
    explicit PoisonAfterUpload(Backend& be) : ForwardingBackend(be) {}
    int64_t poisoned = 0;
    void upload_rows(float* dst, const void* src, DType t, int64_t n) override {
        ForwardingBackend::upload_rows(dst, src, t, n);
        // The test owns these rows (the loop's batch buffer); const only in the interface.
        std::memset(const_cast<void*>(src), 0xff, static_cast<size_t>(n) * dtype_size(t));
        poisoned += n;
    }
};

TEST(EndToEnd, FetchingAheadChangesNothing) {
    TempDir tmp;
    const DatasetInfo data = small_data(tmp.path.string(), 5000, 2, 3);
    const int64_t batch = 128;
    auto run = [&](bool overlap, std::vector<int64_t>* cursor_rows) {
        LoaderOptions lo;
        lo.epochs = 2;
        lo.shuffle_rows = 1024;
        lo.seed = 4;
        ShardBatchSource source(data, {0, data.total_rows}, lo);
        SaeConfig cfg;
        cfg.expansion = 2;
        cfg.k = 4;
        auto cpu = make_cpu_backend(1);
        PoisonAfterUpload be(*cpu);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, data.d_model, total_steps_for(source.total_rows(), batch), 0, be, *self);
        LoopOptions opt;
        opt.batch_size = batch;
        opt.overlap = overlap;
        opt.checkpoint_every = 7;
        opt.checkpoint = [&](SaeTrainer& t, int64_t iterations) {
            const ReaderCursor c = source.cursor();
            cursor_rows->push_back(c.epoch * data.total_rows + c.offset);
            EXPECT_EQ(c.epoch * data.total_rows + c.offset, iterations * batch);
            EXPECT_EQ(t.tokens(), iterations * batch);
        };
        const LoopResult res = train_loop(tr, source, opt);
        EXPECT_EQ(res.tokens, source.total_rows());
        EXPECT_EQ(res.skipped_steps, 0);
        EXPECT_GE(be.poisoned, source.total_rows() * data.d_model);  // every batch was uploaded
        return tr.params_host();
    };
    std::vector<int64_t> cursors_on, cursors_off;
    const auto on = run(true, &cursors_on), off = run(false, &cursors_off);
    EXPECT_TRUE(std::all_of(on.begin(), on.end(), [](float v) { return std::isfinite(v); }));
    EXPECT_EQ(on, off);
    EXPECT_EQ(cursors_on, cursors_off);
    EXPECT_EQ(cursors_on.size(), static_cast<size_t>(10000 / batch / 7));
}

// The ETA after a resume (issue 34: "ETA 2s" with about 55 s to go, low for most of the run):
// from the steps this process took, not from the step count the checkpoint brought along.
TEST(EndToEnd, EtaAfterAResumeComesFromThisProcesssSteps) {
    TempDir tmp;
    const DatasetInfo data = small_data(tmp.path.string(), 6400, 1, 3);
    LoaderOptions lo;
    lo.shuffle_rows = 0;
    SaeConfig cfg;
    cfg.expansion = 2;
    cfg.k = 4;
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    SaeTrainer tr(cfg, data.d_model, 100, 0, *be, *self);  // 6400 rows / 64: 100 steps
    // The first process: stopped (as by a signal) after 90 steps.
    ShardBatchSource first(data, {0, data.total_rows}, lo);
    LoopOptions a;
    a.batch_size = 64;
    a.log_every = 0;
    a.overlap = false;
    int polls = 0;
    a.stop_requested = [&] { return ++polls > 90; };
    const LoopResult ra = train_loop(tr, first, a);
    ASSERT_EQ(ra.steps, 90);
    // The next process: the trainer as the checkpoint restores it, the reader from its cursor.
    ShardBatchSource second(data, {0, data.total_rows}, lo, first.cursor());
    LoopOptions b;
    b.batch_size = 64;
    b.log_every = 4;
    b.start_iteration = ra.iterations;
    b.initialized = true;
    std::vector<MetricsRow> rows;
    b.report = [&](const MetricsRow& m) { rows.push_back(m); };
    train_loop(tr, second, b);
    ASSERT_FALSE(rows.empty());
    const MetricsRow& m = rows.front();
    ASSERT_EQ(m.step, 92);
    ASSERT_EQ(m.total_steps, 100);
    ASSERT_GT(m.elapsed_s, 0.0);
    // 2 steps in elapsed_s here, 8 to go: 4 x elapsed_s (not 8/92 of it).
    EXPECT_NEAR(m.eta_s, 4 * m.elapsed_s, 1e-9 * m.eta_s) << "elapsed " << m.elapsed_s;
}

// A checkpoint written in the background is committed at the first step after its write
// finished (issue 34: it was committed only when the next checkpoint started, so a hard kill lost
// one to two checkpoint.every_steps intervals). The loop waits, at the start of the iteration
// after each checkpoint, until its write is done; at the start of the next one it must be
// committed.
TEST(EndToEnd, CheckpointIsCommittedTheStepAfterItsWriteFinished) {
    TempDir tmp;
    const DatasetInfo data = small_data((tmp.path / "data").string(), 3000, 1, 3);
    LoaderOptions lo;
    lo.shuffle_rows = 1024;
    ShardBatchSource source(data, {0, data.total_rows}, lo);
    SaeConfig cfg;
    cfg.expansion = 2;
    cfg.k = 4;
    auto be = make_cpu_backend(1);
    auto self = make_self_comm();
    const int64_t batch = 100;  // 30 steps
    SaeTrainer tr(cfg, data.d_model, total_steps_for(data.total_rows, batch), 0, *be, *self);
    const fs::path out = tmp.path / "run", sae_dir = out / "sae" / "e2e";
    fs::create_directories(sae_dir);
    SaeMeta meta;
    meta.arch = "topk", meta.id = "e2e", meta.k = 4;
    Checkpointer checkpoints(*self, *self, out.string(), sae_dir.string(), meta, /*keep=*/2);
    LoopOptions opt;
    opt.batch_size = batch;
    opt.checkpoint_every = 7;
    opt.checkpoint = [&](SaeTrainer& t, int64_t iterations) {
        const ReaderCursor c = source.cursor();
        checkpoints.save(t, iterations, c.epoch, c.offset, /*wait=*/false);
    };
    opt.write_in_flight = [&] { return checkpoints.write_in_flight(); };
    opt.commit_written = [&](bool busy) { checkpoints.commit_when_written(busy); };
    std::vector<std::pair<int64_t, int64_t>> seen;  // (iteration, newest committed step)
    opt.on_iteration = [&](int64_t it) {
        if (it > 0 && it % 7 == 0)
            while (checkpoints.write_in_flight())
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (it > 1 && it % 7 == 1) seen.emplace_back(it, checkpoints.newest_committed());
    };
    train_loop(tr, source, opt);
    const std::vector<std::pair<int64_t, int64_t>> want = {{8, 7}, {15, 14}, {22, 21}, {29, 28}};
    EXPECT_EQ(seen, want);
    EXPECT_EQ(Checkpointer::committed_steps(out.string()), (std::vector<int64_t>{28, 21}));
}

// SaeTrainer::evaluate against the SAE computed here from its weights, on rows it never saw;
// and evaluating every few steps leaves training bit-identical. The parameter: the architecture,
// and "_signum" for train.optimizer: signum (whose SAE, the average, is exchanged into the
// parameter buffer for each evaluation and back for the next step).
class Evaluation : public ::testing::TestWithParam<std::string> {};

TEST_P(Evaluation, MatchesTheWeightsAndChangesNoTraining) {
    TempDir tmp;
    const DatasetInfo data = small_data(tmp.path.string(), 6000, 2, 5);
    const int64_t held = 1000, train_rows = data.total_rows - held, batch = 128, d = 16;
    const std::vector<float> x = read_rows(data, {train_rows, data.total_rows});
    ASSERT_EQ(static_cast<int64_t>(x.size()), held * d);

    SaeConfig cfg;
    cfg.arch = GetParam().substr(0, GetParam().find('_'));
    if (GetParam().find("_signum") != std::string::npos) cfg.optimizer = "signum";
    cfg.expansion = 4;
    cfg.k = 3;
    cfg.l1_coeff = 0.05;
    cfg.lr = 5e-3;
    auto run = [&](bool eval_during, EvalResult* final_eval) {
        LoaderOptions lo;
        lo.shuffle_rows = 1024;
        lo.seed = 2;
        ShardBatchSource source(data, {0, train_rows}, lo);
        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, d, total_steps_for(source.total_rows(), batch), 0, *be, *self);
        LoopOptions opt;
        opt.batch_size = batch;
        opt.log_every = 5;
        int calls = 0;
        if (eval_during) {
            opt.evaluate = [&](SaeTrainer& t) {
                ++calls;
                return t.evaluate(x.data(), held, 300);  // batches of 300: a partial last one
            };
            opt.eval_every = 10;
        }
        const LoopResult res = train_loop(tr, source, opt);
        EXPECT_EQ(res.tokens, train_rows);
        if (eval_during) {
            // 40 steps: evaluations after steps 10, 20, 30 and 40 (the end's, not repeated).
            EXPECT_EQ(calls, 4);
            EXPECT_EQ(res.eval.rows, held);
            EXPECT_EQ(res.last.eval_rows, held);
            EXPECT_EQ(res.last.eval_fvu, res.eval.fvu);
            *final_eval = res.eval;
        }
        if (cfg.optimizer == "signum" && !eval_during) {
            // Training left the point of the next gradient in the parameters and the SAE (the
            // average) in opt_v: rest() exchanges them.
            const std::vector<float> y = tr.params_host(),
                                     avg = tr.store().host(ParamStore::Buffer::opt_v);
            EXPECT_NE(y, avg);
            tr.rest();
            EXPECT_EQ(tr.params_host(), avg);
            EXPECT_EQ(tr.store().host(ParamStore::Buffer::opt_v), y);
        }
        tr.rest();  // signum: the SAE (an evaluation left it there; the other run did not)
        return std::make_pair(tr.params_host(), trainer_weights(tr));
    };
    EvalResult e;
    const auto [with, w] = run(true, &e);
    const auto [without, w_unused] = run(false, nullptr);
    EXPECT_EQ(with, without);

    // The reference: the SAE's forward pass from its file-layout weights, in double.
    const int64_t n = w.n_latents;
    std::vector<double> mean(static_cast<size_t>(d), 0.0);
    for (int64_t r = 0; r < held; ++r)
        for (int64_t c = 0; c < d; ++c) mean[c] += x[r * d + c] / double(held);
    double sse = 0, sst = 0, l0 = 0;
    std::vector<int64_t> fired(static_cast<size_t>(n), 0);
    for (int64_t r = 0; r < held; ++r) {
        std::vector<double> z(static_cast<size_t>(n));
        for (int64_t l = 0; l < n; ++l) {
            double a = w.at("b_enc")[l];
            for (int64_t c = 0; c < d; ++c)
                a += (x[r * d + c] - w.at("b_dec")[c]) * w.at("W_enc")[c * n + l];
            z[l] = std::max(a, 0.0);
        }
        if (cfg.arch == "topk") {
            std::vector<double> sorted = z;
            std::nth_element(sorted.begin(), sorted.begin() + (cfg.k - 1), sorted.end(),
                             std::greater<>());
            const double kth = sorted[cfg.k - 1];
            for (double& v : z) v = v >= kth ? v : 0.0;
        }
        for (int64_t l = 0; l < n; ++l) l0 += z[l] > 0, fired[l] += z[l] > 0;
        for (int64_t c = 0; c < d; ++c) {
            double xh = w.at("b_dec")[c];
            for (int64_t l = 0; l < n; ++l) xh += z[l] * w.at("W_dec")[l * d + c];
            sse += (xh - x[r * d + c]) * (xh - x[r * d + c]);
            sst += (x[r * d + c] - mean[c]) * (x[r * d + c] - mean[c]);
        }
    }
    int64_t dead = 0, dense = 0;
    for (int64_t f : fired) dead += f == 0, dense += f > held / 10;
    EXPECT_EQ(e.rows, held);
    EXPECT_NEAR(e.fvu, sse / sst, 1e-4 * sse / sst);
    EXPECT_NEAR(e.l0, l0 / held, 1e-3);
    EXPECT_NEAR(e.dead_fraction, double(dead) / double(n), 1e-9);
    EXPECT_NEAR(e.dense_fraction, double(dense) / double(n), 1e-9);
    EXPECT_GT(e.fvu, 0.0);
    EXPECT_LT(e.fvu, 1.0);  // it learned something on rows it never saw
}

INSTANTIATE_TEST_SUITE_P(Archs, Evaluation,
                         ::testing::Values(std::string("relu"), std::string("topk"),
                                           std::string("topk_signum")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// Every architecture recovers the planted features of sae-synth data (mean over the true
// features of the best cosine with a decoder row), its sparsity coefficient chosen for this
// data's scale (rows of norm ~2.5: 3 active features of magnitude 0.5-2). Measured (2 epochs,
// 469 steps): recovery 0.996 relu (l0 7.4), 0.996 topk, 0.969 batchtopk, 0.993 jumprelu
// (l0 2.7), 0.996 gated (l0 3.1); a transcoder recovers the target set's features.
class PlantedRecovery : public ::testing::TestWithParam<std::string> {};

TEST_P(PlantedRecovery, EveryArchitectureFindsThePlantedFeatures) {
    static TempDir tmp;  // one dataset for all architectures (with a paired target set)
    static const bool written = [] {
        SynthOptions so = planted_options(tmp.path);
        so.target_dir = (tmp.path / "target").string();
        synth_write(so);
        return true;
    }();
    ASSERT_TRUE(written);
    // A transcoder reads the input and the target set row for row and recovers the target's
    // planted features (the same codes through another dictionary) in its decoder.
    const bool transcodes = arch_get(GetParam()).rows().target;
    SaeConfig cfg;
    cfg.arch = GetParam();
    cfg.expansion = 4;
    cfg.k = 6;
    cfg.l1_coeff = cfg.arch == "gated" ? 1.0 : 0.3;  // L0 ~3 (Gated) and ~7 (ReLU)
    // JumpReLU: the defaults (bandwidth and initial threshold 0.001, sized for activations
    // normalized to E||x||^2 = d_model and long runs) leave it dense in a run this short: a
    // threshold learns only from the pre-activations within bandwidth / 2 of it.
    cfg.l0_coeff = 0.1;
    cfg.set("sae.jumprelu_bandwidth", 0.05).set("sae.jumprelu_init_threshold", 0.05);
    // Switch: 4 experts of 48 latents. Planted features are independent of each other, so
    // every expert's tokens carry features of every kind: the data least suited to experts.
    cfg.set("sae.n_experts", 4);
    // Matryoshka BatchTopK: one inner prefix as wide as the planted features. A narrower one
    // must reconstruct with fewer latents than there are independent features, so its latents
    // mix them (prefixes {16, 64}: recovery 0.79).
    cfg.set("sae.matryoshka_prefixes", IntList{128});
    cfg.lr = 1e-2;
    // Transcoders: the encoder has to find the input's features from a start unrelated to the
    // decoder's. Measured here: lr 1e-2 recovery 0.73 (FVU 0.44), lr 3e-3 0.83 (0.35); the
    // skip-transcoder 0.64 and 0.71 (FVU 0.19, 0.18). On the 64-wide pair of configs/
    // transcoder.yaml (4 of 256 features a row, k 6-12, lr 3e-3) the transcoder reaches 0.99:
    // on this data it does not yet, a known gap (issue 29), so its bar is lower (below).
    if (transcodes) cfg.lr = 3e-3;
    cfg.warmup_steps = 20;
    const PlantedRun run = train_planted(cfg, tmp.path);
    // Transcoders: the lower bar of the note above (random decoder rows score about 0.45).
    EXPECT_GE(run.recovery, transcodes ? 0.65 : 0.9) << cfg.arch;
    EXPECT_LT(run.res.last.fvu, transcodes ? 0.45 : 0.3) << cfg.arch;
    EXPECT_LT(run.res.last.l0, 30.0) << cfg.arch << ": sparse, not dense";
}

INSTANTIATE_TEST_SUITE_P(Archs, PlantedRecovery, ::testing::ValuesIn(arch_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// sae.target_l0 at the defaults (no coefficient chosen for the data): the controller brings the
// training L0 to the target and the SAE recovers the planted features, on sae-synth data of two
// shapes: 3 active of 128 features (magnitudes 0.5-2, d 48) and 2 active of 96 (magnitudes
// 0.2-3 around a mean of norm 4, d 32); 469 steps, an L1 ramp of 94.
// At every default (signum with AuxK; ReLU at twice the rule's lr and Gated at 1.5 times (twice
// when measured), both capped at 0.025 for these 192 and 128 latents, so unchanged, JumpReLU at
// the rule's; the controller damped, its target falling
// at sae.target_l0_rate 0.1 but over at least half the ramp, here 47 steps from L0 about 96 / 64),
// measured 2026-11-28: relu L0 4.14 / 2.62, recovery 0.950 / 0.965; gated 4.05 / 2.36, 0.946 /
// 0.976; jumprelu 4.00 / 2.58, 0.922 / 0.940 (JumpReLU starts at its target: its thresholds come
// from the first batch, and its threshold shift holds the L0). Over the whole ramp
// (sae.target_l0_rate 0): relu 0.997 / 0.980, gated 0.991 / 0.951; falling in 32 steps (no
// floor): relu 0.846 / 0.919, gated 0.850 / 0.903. The undamped controller of 2026-11-27 gave
// relu 0.951 / 0.943 and gated 0.913 / 0.917 over the whole ramp. Those gated figures are from
// before Gated started at its target (its gate biases from the first batch, no descent): since,
// gated L0 4.06 / 2.46, recovery 0.970 / 0.975; under AdamW at 1e-2 3.92 / 2.65, 0.988 / 0.974.
// The other cases set lr 1e-2 (so AdamW, train.optimizer auto) and use the whole ramp
// (sae.target_l0_rate 0, the rate's other path): relu L0 3.96 / 2.67, recovery 0.986 / 0.992;
// gated 3.85 / 2.70, 0.992 / 0.976; jumprelu 3.80 / 2.52, 0.944 / 0.964 (before the threshold
// shift, JumpReLU reached L0 6.2 / 1.4 and recovered 0.63 / 0.85). With AdamW at 1e-2 and the
// default rate ReLU recovered 0.897 / 0.966 (FVU 0.315 on shape 0), Gated 0.961 / 0.970. Earlier:
// at the rule's lr (0.034 / 0.042) ReLU and Gated recovered 0.955 / 0.933 and 0.938 / 0.874, at
// 0.06 gated 0.853 / 0.829; at AdamW's default lr 0.54 / 0.65 (relu, L0 6.3 / 10.2) and 0.49 / 0.77
// (gated). The bounds are issue 30's: the L0 within 10% of the target, recovery at least 0.9.
struct TargetCase {
    std::string arch;
    int shape;
    bool defaults = false;  // every key at its default (else AdamW at 1e-2, whole ramp)
};
void PrintTo(const TargetCase& c, std::ostream* os) {
    *os << c.arch << " shape " << c.shape << (c.defaults ? " defaults" : "");
}

class TargetL0Recovery : public ::testing::TestWithParam<TargetCase> {};

// The planted data of shape 0 or 1 (above), written once per test process.
SynthOptions two_shapes(int shape) {
    static TempDir tmp;
    SynthOptions so;
    so.out_dir = (tmp.path / std::to_string(shape)).string();
    so.rows = 60000;
    so.shards = 2;
    if (shape == 0) {
        so.d_model = 48, so.n_features = 128, so.active_per_row = 3.0, so.seed = 7;
    } else {
        so.d_model = 32, so.n_features = 96, so.active_per_row = 2.0, so.seed = 3;
        so.min_scale = 0.2, so.max_scale = 3.0, so.mean_norm = 4.0;
    }
    if (!fs::exists(fs::path(so.out_dir) / "ground_truth.h5")) synth_write(so);
    return so;
}

TEST_P(TargetL0Recovery, ControllerReachesTheTargetAndRecoversTheFeatures) {
    const int shape = GetParam().shape;
    const SynthOptions so = two_shapes(shape);
    const double target = shape == 0 ? 4.0 : 2.5;
    SaeConfig cfg;
    cfg.arch = GetParam().arch;
    cfg.expansion = 4;
    cfg.set("sae.target_l0", target);
    if (!GetParam().defaults) {
        cfg.lr = 1e-2;
        cfg.set("sae.target_l0_rate", 0.0);
    }
    cfg.warmup_steps = 20;
    const PlantedRun run = train_planted(cfg, so.out_dir);
    const LoopResult& res = run.res;
    const SaeWeights& w = run.weights;
    // The L0 of the last steps, where the coefficient is frozen.
    EXPECT_NEAR(res.last.l0, target, 0.1 * target);
    EXPECT_GE(run.recovery, 0.9);
    EXPECT_LT(res.last.fvu, 0.3);
    EXPECT_LE(res.last.dead_fraction, 0.05);
    // The adapted coefficient is in the weights' buffers, moved off the configured one.
    const bool l0_penalty = cfg.arch == "jumprelu";
    const std::string name = l0_penalty ? "l0_coeff" : "l1_coeff";
    const WeightTensor* coeff = w.find(name);
    ASSERT_NE(coeff, nullptr);
    EXPECT_NE(coeff->data.at(0), static_cast<float>(l0_penalty ? cfg.l0_coeff : cfg.l1_coeff));
}

INSTANTIATE_TEST_SUITE_P(
    Archs, TargetL0Recovery,
    ::testing::Values(TargetCase{"relu", 0}, TargetCase{"relu", 1}, TargetCase{"gated", 0},
                      TargetCase{"gated", 1}, TargetCase{"jumprelu", 0}, TargetCase{"jumprelu", 1},
                      TargetCase{"relu", 0, true}, TargetCase{"relu", 1, true},
                      TargetCase{"gated", 0, true}, TargetCase{"gated", 1, true},
                      TargetCase{"jumprelu", 0, true}, TargetCase{"jumprelu", 1, true}),
    [](const ::testing::TestParamInfo<TargetCase>& p) {
        return p.param.arch + "_shape" + std::to_string(p.param.shape) +
               (p.param.defaults ? "_defaults" : "");
    });

// Switch at its defaults (signum, the k-means router start) on independent planted features
// (the data least suited to experts: every expert's tokens carry features of every kind), with 4
// and 8 experts each wider than the features: the FLOP-matched width a Switch SAE is for (each
// token's encoder is one expert's). Batches of 1024 rows, 4 epochs: 235 steps. Measured
// (2026-11-28): shape 0 recovery 0.982 (4 experts) / 0.950 (8), shape 1 0.969 / 0.956. What
// decides it is the rows an expert sees a step: at batch 256 (32 rows an expert with 8) the
// signs of signum's steps are noise, and 8 experts reached 0.891 / 0.883 in 469 steps and 0.875 /
// 0.801 in twice as many; 4 experts 0.961 / 0.925. At the TopK's width (x4: 48 latents an
// expert for 128 features) shape 0 reaches 0.904 with 4 experts and 0.782 with 8: an expert
// narrower than the features its tokens carry mixes them.
struct SwitchCase {
    int shape;
    int64_t experts, expansion;
};
void PrintTo(const SwitchCase& c, std::ostream* os) {
    *os << "shape " << c.shape << " experts " << c.experts << " x" << c.expansion;
}
class SwitchPlanted : public ::testing::TestWithParam<SwitchCase> {};

TEST_P(SwitchPlanted, WideExpertsRecoverIndependentFeatures) {
    const SwitchCase p = GetParam();
    const SynthOptions so = two_shapes(p.shape);
    SaeConfig cfg;
    cfg.arch = "switch";
    cfg.expansion = p.expansion;
    cfg.k = p.shape == 0 ? 6 : 4;
    cfg.set("sae.n_experts", p.experts);
    const PlantedRun run = train_planted(cfg, so.out_dir, 4, 1024);
    EXPECT_GE(run.recovery, 0.9);
    EXPECT_LT(run.res.last.fvu, 0.3);
    EXPECT_LE(run.res.last.dead_fraction, 0.05);
}

// 128 features (shape 0) in experts of 144 latents, 96 (shape 1) in experts of 96.
INSTANTIATE_TEST_SUITE_P(Experts, SwitchPlanted,
                         ::testing::Values(SwitchCase{0, 4, 12}, SwitchCase{0, 8, 24},
                                           SwitchCase{1, 4, 12}, SwitchCase{1, 8, 24}),
                         [](const ::testing::TestParamInfo<SwitchCase>& p) {
                             return "shape" + std::to_string(p.param.shape) + "_e" +
                                    std::to_string(p.param.experts);
                         });

// A rank runs on the cores other processes leave it (cores.h, CoreShare), so its CPU thread
// count may change between any two steps: it must change no bit. Each architecture trains twice
// on a 3-thread CPU backend, once as it is and once with its threads set to 1, 2, 3, 1, ...
// before each step. A pass or GEMM whose result depended on its thread count (a reduction split
// by threads, a GEMM split by OpenBLAS's threading: its last bits change) fails here.
class LoopThreads : public ::testing::TestWithParam<std::string> {};

TEST_P(LoopThreads, ChangingThemBetweenStepsChangesNoBit) {
    static TempDir tmp;
    static const bool written = [] {
        SynthOptions so = planted_options(tmp.path);
        so.rows = 6144;
        so.target_dir = (tmp.path / "target").string();
        synth_write(so);
        return true;
    }();
    ASSERT_TRUE(written);
    SaeConfig cfg;
    cfg.arch = GetParam();
    cfg.expansion = 8;  // 384 latents: two of the backend's 256-column reduction blocks
    cfg.k = 6;
    cfg.l1_coeff = 0.3, cfg.l0_coeff = 0.1, cfg.lr = 3e-3, cfg.warmup_steps = 4;
    // AuxK on the latents silent for 2,048 tokens, so that its pass runs too.
    cfg.set("train.auxk_coeff", 1.0 / 32).set("train.dead_tokens", 2048);
    cfg.set("sae.n_experts", 4).set("sae.matryoshka_prefixes", IntList{96});
    const bool transcodes = arch_get(cfg.arch).rows().target;
    const auto train = [&](bool vary) {
        std::vector<DatasetInfo> parts = {dataset_open(tmp.path.string())};
        if (transcodes) parts.push_back(dataset_open((tmp.path / "target").string()));
        LoaderOptions lo;
        lo.epochs = 2;
        lo.shuffle_rows = 4096;
        lo.seed = 1;
        ShardBatchSource source(parts, {0, parts[0].total_rows}, lo);
        auto be = make_cpu_backend(3);
        auto self = make_self_comm();
        SaeTrainer tr(cfg, parts[0].d_model, total_steps_for(source.total_rows(), 512), 0, *be,
                      *self);
        LoopOptions opt;
        opt.batch_size = 512;
        opt.threads = 3;
        int step = 0;
        if (vary)
            opt.cpu_threads = [&] {
                const int t = 1 + step++ % 3;
                be->set_host_threads(t);
                return t;
            };
        const LoopResult res = train_loop(tr, source, opt);
        EXPECT_EQ(res.min_threads, vary ? 1 : 3) << cfg.arch;
        return trainer_weights(tr);
    };
    const SaeWeights fixed = train(false), varied = train(true);
    ASSERT_EQ(fixed.tensors.size(), varied.tensors.size());
    for (size_t i = 0; i < fixed.tensors.size(); ++i) {
        const std::vector<float>& a = fixed.tensors[i].data;
        const std::vector<float>& b = varied.tensors[i].data;
        ASSERT_EQ(a.size(), b.size()) << fixed.tensors[i].name;
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << cfg.arch << ": " << fixed.tensors[i].name << " differs";
    }
}

INSTANTIATE_TEST_SUITE_P(Architectures, LoopThreads,
                         ::testing::Values("relu", "topk", "batchtopk", "jumprelu", "gated",
                                           "switch", "matryoshka_batchtopk", "transcoder",
                                           "skip_transcoder"));
