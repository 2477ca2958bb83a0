// sae-features — what each latent of a trained SAE responds to, from the cached activations in
// one pass, split across ranks like training (each rank its contiguous range of rows), merged
// on rank 0 into DIR/features.h5 (features_file.h: per latent its firing frequency, mean and
// largest activation, a log-spaced histogram, its top rows with their token windows, its
// nearest latents by decoder cosine, and with an unembedding the tokens each promotes and
// suppresses).
//
//   sae-features runs/x/sae/topk-x8-k32                        # the run's own data and dir
//   mpirun -np 4 sae-features runs/x/sae/topk-x8-k32/final.h5 --data data/other --out feats
// SAE is an SAE file (final.h5 or checkpoint-<step>.h5) or an SAE directory (its final.h5);
// --data defaults to the data the SAE was trained on (its config's data.path), --out to
// RUN/features/<id> for an SAE in a run's sae/<id>/ directory.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include "app_cli.h"                    // defines: cli_parse
#include "saetrain/backend_registry.h"  // defines: make_backend
#include "saetrain/checkpoint.h"        // defines: sae_read_h5, sae_is_checkpoint
#include "saetrain/comm.h"              // defines: make_self_comm
#include "saetrain/config.h"            // defines: config_parse, sweep_ids, input_dataset_names
#include "saetrain/cores.h"             // defines: exec_with_run_environment, cpu_threads_for_rank
#include "saetrain/error.h"
#include "saetrain/features.h"       // defines: FeatureStats, decoder_neighbours
#include "saetrain/features_file.h"  // defines: features_write_h5
#include "saetrain/mpi_world.h"      // defines: MpiScope, make_mpi_world, world_abort
#include "saetrain/s3.h"             // defines: s3_settings_from, is_s3_url
#include "saetrain/shards.h"         // defines: dataset_open, read_rows, read_row_ints
#include "saetrain/trainer.h"        // defines: SaeTrainer
#include "saetrain/trainer_io.h"     // defines: trainer_restore

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

struct Args {
    std::string sae, data, dataset, out, backend = "auto", unembedding;
    int64_t top = 20, samples = 20, context = 8, neighbours = 8, batch_rows = 4096, logits = 10;
    int threads = 0;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// "1.2M", "310K", "512": a count for progress lines.
std::string short_count(double v) {
    if (v >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
    if (v >= 1e3) return fmt::format("{:.1f}K", v / 1e3);
    return fmt::format("{:.0f}", v);
}

// The SAE, loaded into a trainer as its held-out evaluation runs it (test/sae_forward.cpp).
struct LoadedSae {
    std::string path;
    SaeMeta meta;
    SaeWeights w;
    Config cfg;
    SaeConfig sae;
};

LoadedSae load_sae(const std::string& given) {
    LoadedSae s;
    s.path = fs::is_directory(given) ? (fs::path(given) / "final.h5").string() : given;
    SAE_ENFORCE(fs::is_regular_file(s.path), "{}: no such SAE file", s.path);
    s.w = sae_read_h5(s.path, &s.meta);
    SAE_ENFORCE(s.w.has("W_dec"), "{}: not an SAE file (no W_dec)", s.path);
    s.cfg = config_parse(s.meta.config_yaml, {}, s.path);
    const std::vector<std::string> ids = sweep_ids(s.cfg, s.w.d_model);
    bool found = false;
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == s.meta.id) s.sae = s.cfg.sweep[i], found = true;
    SAE_ENFORCE(found, "{}: SAE id {} is not in its own config's sweep", s.path, s.meta.id);
    SAE_ENFORCE(s.sae.arch != "clt",
                "{}: a cross-layer transcoder (sae.arch clt): sae-features reads SAEs and "
                "single-layer transcoders",
                s.path);
    // final.h5 holds the SAE of the raw activations (data.normalize folded in); a checkpoint
    // keeps the scale as a tensor, which trainer_restore reads.
    if (!s.w.has("activation_scale")) s.sae.normalize = "none";
    return s;
}

// RUN/features/<id> for an SAE in RUN/sae/<id>/ (RUN holding run.json); "" otherwise.
std::string default_out(const LoadedSae& s) {
    const fs::path dir = fs::absolute(s.path).lexically_normal().parent_path();
    const fs::path run = dir.parent_path().parent_path();
    if (dir.parent_path().filename() != "sae" || !fs::exists(run / "run.json")) return "";
    return (fs::relative(run, fs::current_path()) / "features" / s.meta.id).string();
}

struct Setup {
    LoadedSae sae;
    DatasetInfo data;
    std::string out;
    Unembedding unembedding;  // vocab 0: none
    std::string logits;       // its file, or "none: " and why (features.h5's logits attribute)
};

// The unembedding for the logit tables: --unembedding's file, or unembedding.h5 beside the data
// (its directory, a glob's directory, or their parent, as the page finds vocab.json).
void find_unembedding(const Args& a, const std::string& data, int64_t d, Setup* s) {
    if (a.logits == 0 || a.unembedding == "none") {
        s->logits = "none: not asked for";
        return;
    }
    std::string path = a.unembedding;
    if (path.empty()) {
        if (is_s3_url(data)) {
            s->logits = "none: the data is in a store; give --unembedding FILE";
            return;
        }
        const fs::path base =
            fs::is_directory(data) ? fs::path(data) : fs::path(data).parent_path();
        for (const fs::path& dir : {base, base.lexically_normal().parent_path()}) {
            const fs::path f = dir / "unembedding.h5";
            if (path.empty() && fs::is_regular_file(f) && !fs::is_symlink(f)) path = f.string();
        }
        if (path.empty()) {
            s->logits =
                "none: no unembedding.h5 beside the data (tools/extract_activations.py "
                "--unembedding writes it; or give --unembedding FILE)";
            return;
        }
    }
    SAE_ENFORCE(fs::is_regular_file(path), "--unembedding {}: no such file", path);
    s->unembedding = unembedding_read(path, d);
    s->logits = fs::absolute(path).lexically_normal().string();
}

Setup set_up(const Args& a) {
    Setup s;
    s.sae = load_sae(a.sae);
    const Config& cfg = s.sae.cfg;
    const std::string path = a.data.empty() ? cfg.data.path.front() : a.data;
    const std::string dataset =
        a.dataset.empty()
            ? (a.data.empty() ? input_dataset_names(cfg).front() : std::string("activations"))
            : a.dataset;
    s.data = dataset_open(path, dataset, s3_settings_from(cfg.data));
    SAE_ENFORCE(s.data.layers == 0,
                "{}: a multi-layer set ([rows, {}, d]); sae-features reads one layer's "
                "activations",
                path, s.data.layers);
    SAE_ENFORCE(s.data.d_model == s.sae.w.d_model,
                "{}: the SAE reads d_model {} but dataset '{}' of {} holds rows of {} values",
                s.sae.path, s.sae.w.d_model, dataset, path, s.data.d_model);
    SAE_ENFORCE(a.context <= a.batch_rows,
                "--context {} is more than --batch-rows {}: a window must fit in the batches "
                "beside its row",
                a.context, a.batch_rows);
    find_unembedding(a, path, s.sae.w.d_model, &s);
    s.out = a.out.empty() ? default_out(s.sae) : a.out;
    SAE_ENFORCE(!s.out.empty(),
                "{} is not in a run's sae/<id>/ directory: give --out DIR for features.h5",
                s.sae.path);
    return s;
}

int features_main(const Args& a, Communicator& world) {
    const int rank = world.rank(), ranks = world.size();
    // Set-up, agreed on before any rank goes on: the lowest rank that failed says why.
    Setup s;
    std::string failed;
    try {
        s = set_up(a);
    } catch (const std::exception& e) {
        failed = e.what();
    }
    int64_t first_failed = failed.empty() ? std::numeric_limits<int64_t>::min() : -int64_t{rank};
    world.allreduce_max(&first_failed, 1);
    if (first_failed != std::numeric_limits<int64_t>::min()) {
        if (-first_failed == rank)
            std::fprintf(stderr, "sae-features: error: %s\n", failed.c_str());
        return 1;
    }
    const auto t0 = Clock::now();
    const NodePlacement place = node_placement();
    BackendRequest request;
    request.choice = a.backend;
    request.threads = a.threads > 0 ? a.threads : cpu_threads_for_rank(place.local_size);
    request.local_rank = place.local_rank;
    std::string note;
    auto be = make_backend(request, &note);
    auto self = make_self_comm();
    const int64_t d = s.sae.w.d_model, n = s.sae.w.n_latents;
    SaeTrainer trainer(s.sae.sae, d, 1, 0, *be, *self);
    TrainState st;
    const size_t n_params = trainer.params_host().size();
    st.opt_m.assign(n_params, 0.0f), st.opt_v.assign(n_params, 0.0f);
    st.since_fired.assign(static_cast<size_t>(n), 0);
    trainer_restore(trainer, s.sae.w, st);
    const int64_t width = trainer.row_width();  // a transcoder's rows: [x | y], y unread

    const RowRange mine = partition_rows(s.data.total_rows, rank, ranks);
    if (rank == 0)
        fmt::print("sae-features: {} ({}, {} latents) over {} rows of {} on {} rank(s), {}\n",
                   printable(s.sae.path), s.sae.meta.id, n, s.data.total_rows,
                   printable(s.data.source), ranks, be->name());
    // The rows in chunks of whole batches, the next chunk read while this one is encoded. This
    // rank encodes its own rows and the --context rows each side (their activations fill its
    // top rows' windows), in the data set's batches [j B, (j + 1) B) (B = --batch-rows), the
    // last one padded with zero rows: every row is encoded at the same place of a GEMM of the
    // same shape on any number of ranks (OpenBLAS's kernels round a row by where it falls).
    const int64_t B = a.batch_rows, W = a.context, total = s.data.total_rows;
    const int64_t lo = mine.size() > 0 ? std::max<int64_t>(0, mine.begin - W) / B * B : 0;
    const int64_t hi = mine.size() > 0 ? std::min(total, (mine.end + W + B - 1) / B * B) : 0;
    const int64_t chunk = std::max<int64_t>(1, (int64_t{32} << 20) / (d * 4) / B) * B;
    const auto chunk_end = [&](int64_t begin) { return std::min((begin / chunk + 1) * chunk, hi); };
    auto read_chunk = [&](int64_t begin) { return read_rows(s.data, {begin, chunk_end(begin)}); };
    FeatureStats stats(n, a.top, W, a.samples);
    // The batches encoded last (at most 3: a batch is counted once the next one is there, its
    // rows' windows reaching into both neighbours).
    std::deque<SparseRows> ring;
    const ActivationAt at = [&](int64_t latent, int64_t row) {
        for (const SparseRows& b : ring)
            if (row >= b.first_row && row < b.first_row + b.rows()) return b.value(row, latent);
        return 0.0f;  // outside the data set
    };
    const auto count = [&](const SparseRows& b) {
        stats.add(b, mine.begin, mine.end, at, request.threads);
    };
    std::vector<float> rows_wide, padded;
    std::future<std::vector<float>> next;
    if (lo < hi) next = std::async(std::launch::async, read_chunk, lo);
    auto last_print = Clock::now();
    for (int64_t begin = lo; begin < hi; begin = chunk_end(begin)) {
        std::vector<float> x = next.get();
        const int64_t rows = chunk_end(begin) - begin;
        if (chunk_end(begin) < hi)
            next = std::async(std::launch::async, read_chunk, chunk_end(begin));
        const float* feed = x.data();
        if (width != d) {
            rows_wide.assign(static_cast<size_t>(rows * width), 0.0f);
            for (int64_t r = 0; r < rows; ++r)
                std::copy_n(x.data() + r * d, d, rows_wide.data() + r * width);
            feed = rows_wide.data();
        }
        for (int64_t b0 = begin; b0 < begin + rows; b0 += B) {
            const int64_t b = std::min(B, begin + rows - b0);
            const float* part = feed + (b0 - begin) * width;
            if (b < B) {  // the data set's last batch
                padded.assign(static_cast<size_t>(B * width), 0.0f);
                std::copy_n(part, b * width, padded.data());
                part = padded.data();
            }
            trainer.activations(BatchView(part), B, B,
                                [&](int64_t, int64_t, const HostActivations& act) {
                                    ring.push_back(sparse_rows(act, 0, b, b0));
                                });
            if (ring.size() > 3) ring.pop_front();
            if (ring.size() >= 2) count(ring[ring.size() - 2]);
        }
        if (rank == 0 && seconds_since(last_print) >= 5.0) {
            last_print = Clock::now();
            const double done = static_cast<double>(begin + rows - lo);
            fmt::print("sae-features: {:.0f}% of rank 0's rows ({} rows/s)\n",
                       100.0 * done / static_cast<double>(hi - lo),
                       short_count(done / seconds_since(t0)));
            std::fflush(stdout);
        }
    }
    if (!ring.empty()) count(ring.back());
    const double pass_s = seconds_since(t0);
    stats.merge(world);
    FeaturesFile f;
    stats.sorted_top(&f.top_rows, &f.top_acts, &f.top_window_acts);
    stats.sorted_sample(&f.sample_rows, &f.sample_acts, &f.sample_window_acts);
    // Token windows: each rank fills those of its own top rows from its rows' token ids.
    f.context = a.context;
    std::string why;
    const RowRange span{std::max<int64_t>(0, mine.begin - a.context),
                        std::min(s.data.total_rows, mine.end + a.context)};
    std::vector<int32_t> tokens = read_row_ints(s.data, "token_ids", span, &why);
    std::vector<int32_t> positions;
    if (why.empty()) positions = read_row_ints(s.data, "positions", span, &why);
    const int64_t have = why.empty() ? 1 : 0;  // every rank's shards must carry both
    std::vector<int64_t> lacks = {-have};      // -1 after the max: no rank lacks them
    world.allreduce_max(lacks.data(), 1);
    if (lacks[0] == -1) {
        for (auto [rows, out] : {std::pair{&f.top_rows, &f.context_tokens},
                                 std::pair{&f.sample_rows, &f.sample_context_tokens}}) {
            fill_context_windows(*rows, a.context, mine.begin, mine.end, span.begin, tokens,
                                 positions, out);
            // Every rank's windows into rank 0's: -1 where a rank has none to give.
            std::vector<int64_t> wide(out->begin(), out->end());
            world.allreduce_max(wide.data(), static_cast<int64_t>(wide.size()));
            out->assign(wide.begin(), wide.end());
        }
        f.contexts = "token_ids";
    } else {
        // Some rank's shards lack them: which, said by the lowest such rank to rank 0.
        std::vector<char> msg(512, 0);
        if (!have) why.copy(msg.data(), msg.size() - 1);
        std::vector<char> all(msg.size() * static_cast<size_t>(ranks));
        world.allgather(msg.data(), all.data(), static_cast<int64_t>(msg.size()));
        for (int r = 0; r < ranks && f.contexts.empty(); ++r)
            if (all[static_cast<size_t>(r) * msg.size()] != 0)
                f.contexts = std::string(all.data() + static_cast<size_t>(r) * msg.size());
        f.contexts = "none: " + f.contexts;
    }
    // The logit tables, each rank those of its share of the latents, gathered bit for bit (an
    // entry's bits from the rank that computed it, INT64_MIN from the others, then the max).
    f.logits_source = s.logits;
    if (s.unembedding.vocab > 0) {
        const int64_t m = std::min(a.logits, s.unembedding.vocab);
        f.logits = m;
        for (auto* v : {&f.logit_pos_ids, &f.logit_neg_ids}) v->assign(n * m, -1);
        for (auto* v : {&f.logit_pos_values, &f.logit_neg_values}) v->assign(n * m, 0.0f);
        const RowRange own = partition_rows(n, rank, ranks);
        decoder_logits(*be, s.sae.w.at("W_dec").data(), n, d, s.unembedding.w.data(),
                       s.unembedding.vocab, m, own.begin, own.size(), &f.logit_pos_ids,
                       &f.logit_pos_values, &f.logit_neg_ids, &f.logit_neg_values);
        std::vector<int64_t> all(static_cast<size_t>(4 * n * m),
                                 std::numeric_limits<int64_t>::min());
        for (int64_t i = own.begin * m; i < own.end * m; ++i) {
            const auto u = static_cast<size_t>(i);
            uint32_t pv = 0, nv = 0;
            std::memcpy(&pv, &f.logit_pos_values[u], 4);
            std::memcpy(&nv, &f.logit_neg_values[u], 4);
            all[u] = f.logit_pos_ids[u], all[u + n * m] = f.logit_neg_ids[u];
            all[u + 2 * n * m] = pv, all[u + 3 * n * m] = nv;
        }
        world.allreduce_max(all.data(), static_cast<int64_t>(all.size()));
        for (size_t u = 0; u < static_cast<size_t>(n * m); ++u) {
            const auto pv = static_cast<uint32_t>(all[u + 2 * n * m]);
            const auto nv = static_cast<uint32_t>(all[u + 3 * n * m]);
            f.logit_pos_ids[u] = static_cast<int32_t>(all[u]);
            f.logit_neg_ids[u] = static_cast<int32_t>(all[u + n * m]);
            std::memcpy(&f.logit_pos_values[u], &pv, 4);
            std::memcpy(&f.logit_neg_values[u], &nv, 4);
        }
    }
    if (rank != 0) return 0;
    f.neighbours = std::min<int64_t>(a.neighbours, n - 1);
    decoder_neighbours(*be, s.sae.w.at("W_dec").data(), n, d, f.neighbours, &f.neighbour_idx,
                       &f.neighbour_cos);
    f.sae = s.sae.path, f.sae_id = s.sae.meta.id, f.arch = s.sae.sae.arch;
    // A directory or glob as an absolute path: where the page finds the vocabulary beside it.
    f.data = is_s3_url(s.data.source) ? s.data.source : fs::absolute(s.data.source).string();
    f.dataset = s.data.dataset, f.d_model = d, f.ranks = ranks;
    f.stats = &stats;
    const std::string file = (fs::path(s.out) / "features.h5").string();
    features_write_h5(file, f);
    int64_t dead = 0, dense = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t c = stats.fire_count()[static_cast<size_t>(i)];
        dead += c == 0;
        dense += static_cast<double>(c) > 0.1 * static_cast<double>(stats.rows());
    }
    fmt::print(
        "sae-features: {} rows in {:.1f} s ({} rows/s, the pass {:.1f} s); {} of {} latents "
        "dead, {} dense (> 10% of rows); {}; {}\n",
        stats.rows(), seconds_since(t0),
        short_count(static_cast<double>(stats.rows()) / seconds_since(t0)), pass_s, dead, n, dense,
        f.contexts == "token_ids" ? "token windows from token_ids" : f.contexts,
        f.logits > 0 ? fmt::format("logit tables from {}", printable(f.logits_source))
                     : "logit tables " + f.logits_source);
    fmt::print("wrote {}\n", printable(file));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    CLI::App app{"sae-features: each latent's statistics, top rows and neighbours, in one pass"};
    app.add_option("SAE", a.sae, "an SAE file (final.h5, checkpoint-<step>.h5) or directory")
        ->required();
    app.add_option("--data", a.data,
                   "activation shards (directory, glob or s3:// prefix; default: the data the "
                   "SAE was trained on)");
    app.add_option("--dataset", a.dataset,
                   "dataset inside each shard (default: the SAE's input, 'activations' with "
                   "--data)");
    app.add_option("--out", a.out,
                   "directory for features.h5 (default: RUN/features/<id> for a run's SAE)");
    app.add_option("--top", a.top, "rows kept per latent, largest activations first")
        ->check(CLI::Range(int64_t{1}, int64_t{10000}));
    app.add_option("--samples", a.samples,
                   "rows kept per latent from a uniform sample of its firings (0: none)")
        ->check(CLI::Range(int64_t{0}, int64_t{10000}));
    app.add_option("--context", a.context, "token window: rows each side of a top row")
        ->check(CLI::Range(int64_t{0}, int64_t{1000}));
    app.add_option("--neighbours", a.neighbours, "nearest latents by decoder cosine")
        ->check(CLI::Range(int64_t{0}, int64_t{1000}));
    app.add_option("--logits", a.logits,
                   "tokens each latent promotes and suppresses most, by its decoder row against "
                   "the unembedding (0: none)")
        ->check(CLI::Range(int64_t{0}, int64_t{1000}));
    app.add_option("--unembedding", a.unembedding,
                   "W_U [vocab, d] for the logit tables (default: unembedding.h5 beside the "
                   "data when there is one; none: no tables)");
    app.add_option("--batch-rows", a.batch_rows, "rows per encoder batch")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--backend", a.backend,
                   "auto | cpu | cuda (auto: CUDA when the rank sees a GPU)");
    app.add_option("--threads", a.threads, "CPU threads per rank (default: its cores / ranks)")
        ->check(CLI::Range(0, 1024));
    if (const int code = cli_parse(app, "sae-features",
                                   "sae-features SAE [--data DATA] [--out DIR] [--top N] "
                                   "[--context W] [--neighbours M]",
                                   argc, argv);
        code >= 0)
        return code;
    exec_with_run_environment(argv);
    MpiScope mpi(&argc, &argv);
    auto world = make_mpi_world();
    try {
        return features_main(a, *world);
    } catch (const std::exception& e) {
        // After set-up a rank that fails ends the job: no peer waits on it.
        std::fprintf(stderr, "sae-features: error: rank %d: %s\n", world->rank(), e.what());
        if (world->size() > 1) world_abort(1);
        return 1;
    }
}
