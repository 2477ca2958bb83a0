// run.out_dir and what a run writes there (run_parts.h): the fresh start, the banner, and at the
// end each SAE's final.h5, summary row and run.json record.
#include <fmt/format.h>

#include "run_parts.h"
#include "saetrain/arch.h"          // defines: arch_get, arch_summary_keys
#include "saetrain/build_config.h"  // defines: SAETRAIN_VERSION
#include "saetrain/error.h"         // defines: printable
#include "saetrain/metrics.h"       // defines: metrics_last_row
#include "saetrain/schedule.h"      // defines: warmup_steps_for
#include "saetrain/synth.h"         // defines: synth_read_features, feature_recovery
#include "saetrain/train_state.h"   // defines: write_gathered (latent-sharded SAE files)
#include "saetrain/trainer_io.h"    // defines: trainer_weights (the SAE in the file layout)

namespace saetrain::run_parts {

// --- open run.out_dir (rank 0) ------------------------------------------------------------------
void prepare_out_dir(const Setup& s) {
    const fs::path out = s.out();
    if (!s.resume)
        for (const char* f : {"metrics.jsonl", "summary.csv", "COMPLETE", "run.json", "checkpoints",
                              "sae", "tb", "report", "features"})
            fs::remove_all(out / f);
    fs::create_directories(out);
    remove_stale_files(out.string());
    // A resume keeps the config.yaml it was trained with until the checkpoint has accepted the
    // new config (resume_if_any): a refused resume leaves the run as it was.
    if (!s.resume) write_run_config(out.string(), config_to_yaml(s.cfg));
}

namespace {

// Settings that the run's length makes meaningless: said before training.
void warn_about_run_length(const Setup& s, int64_t steps) {
    const int64_t run_tokens = steps * s.cfg.data.batch_size * s.coords.replicas;
    for (size_t i = 0; i < s.cfg.sweep.size(); ++i) {
        const SaeConfig& c = s.cfg.sweep[i];
        const int64_t warmup = warmup_steps_for(c, steps);
        if (warmup * 10 > steps)
            fmt::print(stderr,
                       "saetrain: warning: {}: train.warmup_steps = {} is {:.0f}% of the "
                       "run's {} steps; the LR spends that long below train.lr\n",
                       s.ids[i], warmup, 100.0 * double(warmup) / double(steps), steps);
        if (c.dead_tokens * 2 > run_tokens)
            fmt::print(stderr,
                       "saetrain: warning: {}: train.dead_tokens = {} is more than half of the "
                       "run's {} tokens per SAE, so few latents can ever count as dead; lower "
                       "it{}\n",
                       s.ids[i], c.dead_tokens, run_tokens,
                       s.eval_rows() > 0 ? " (the held-out dead % does not depend on it)"
                                         : " or hold rows out (data.eval_rows) for a dead % "
                                           "over them");
    }
}

}  // namespace

void print_banner(const Setup& s, int world_size, int64_t steps) {
    fmt::print("saetrain {} | {} rank(s): {} | backend {}{}\n", SAETRAIN_VERSION, world_size,
               s.coords.describe(), s.backend->name(),
               s.backend_note.empty() ? "" : " | " + s.backend_note);
    const std::string width =
        s.data.layers > 0
            ? fmt::format("{} layers x d_model {}", s.data.layers, s.data.d_model / s.data.layers)
            : fmt::format("d_model {}", s.data.d_model);
    fmt::print(
        "data {} | {} shard(s), {} rows, {}, {} | {:.1f} MB\n", printable(s.data.source),
        s.data.shards.size(), s.data.total_rows, width, dtype_name(s.data.dtype),
        static_cast<double>(s.data.total_rows * s.data.d_model * dtype_size(s.data.dtype)) / 1e6);
    for (const DatasetInfo& more : s.more_inputs)
        fmt::print("data {} | the next layer's input, row for row beside it (CLT)\n",
                   printable(more.source));
    if (s.data.layers > 0)
        fmt::print(
            "target {} | its shards' 'targets', row for row beside 'inputs' (a "
            "multi-layer paired set: every layer's input, then every layer's target)\n",
            printable(s.target.source));
    else if (!s.target.shards.empty())
        fmt::print("target {} | {} shard(s), read row for row beside it (transcoder)\n",
                   printable(s.target.source), s.target.shards.size());
    for (const DatasetInfo& more : s.more_targets)
        fmt::print("target {} | the next layer's target, row for row beside it (CLT)\n",
                   printable(more.source));
    // Batches move as stored (reader, ring, exchanges, upload) and are widened on the backend;
    // a transcoder's rows are its input and its target side by side.
    const int64_t value_bytes = dtype_size(s.data.dtype);
    fmt::print(
        "{} step(s) of {} rows per SAE replica | batches move as {} ({} B per token, {:.1f} MB "
        "a batch), widened to float32 on upload\n",
        steps, s.cfg.data.batch_size, dtype_name(s.data.dtype), s.row_width() * value_bytes,
        static_cast<double>(s.cfg.data.batch_size * s.row_width() * value_bytes) / 1e6);
    if (s.shuffle_rows() > 0)
        fmt::print(
            "shuffle: windows of {} rows ({:.1f} MB as stored, data.{}; the reader holds "
            "two)\n",
            s.shuffle_rows(), static_cast<double>(s.shuffle_rows() * s.row_bytes()) / 1e6,
            s.cfg.data.shuffle_buffer_bytes > 0 ? "shuffle_buffer_bytes" : "shuffle_buffer_rows");
    warn_about_run_length(s, steps);
    if (s.eval_rows() > 0)
        fmt::print(
            "held-out: {} rows from {}, never trained on ({:.1f} MB in memory, split among "
            "an SAE's replicas)\n",
            s.eval_rows(), s.split.eval_source,
            static_cast<double>(s.eval_rows() * s.row_width() * 4) / 1e6);
}

SaeMeta sae_meta(const Setup& s, const SaeTrainer& t) {
    return SaeMeta{s.sae().arch, s.id(),         config_to_yaml(s.cfg),
                   s.sae().k,    t.step_count(), t.tokens()};
}

// --- write and report ---------------------------------------------------------------------------
SaeSummary summarize(const Setup& s, const LoopResult& res, SaeTrainer& trainer) {
    SaeSummary mine;
    mine.config = s.coords.config;
    mine.last = res.last;
    mine.steps = res.steps, mine.tokens = res.tokens;
    mine.tokens_per_s = res.tokens_per_s, mine.wait_fraction = res.wait_fraction;
    mine.tflops = res.tflops;
    mine.gates = res.eval.rows > 0 ? res.eval.quality : trainer.training_quality();
    mine.arch_figures = trainer.arch_summary();
    // A layered model's held-out figures per layer: summary.csv columns and a console table.
    for (const auto& [name, values] : {std::pair{"eval_fvu_layer", &res.eval.layer_fvu},
                                       {"eval_l0_layer", &res.eval.layer_l0},
                                       {"eval_dead_layer", &res.eval.layer_dead}})
        for (size_t l = 0; l < values->size(); ++l)
            mine.arch_figures.emplace_back(name + std::to_string(l), (*values)[l]);
    if (res.last.sae.empty()) {
        // Resumed with nothing left to train (stopped between the final checkpoint and
        // COMPLETE): report the SAE as the log last saw it, with that interval's rates, rather
        // than an empty interval of zeros.
        if (auto logged = metrics_last_row((s.out() / "metrics.jsonl").string(), s.id())) {
            mine.last = *logged;
            mine.tokens_per_s = logged->tokens_per_s, mine.wait_fraction = logged->wait_fraction;
            mine.tflops = logged->tflops;
        }
        if (res.eval.rows > 0) attach_eval(mine.last, res.eval);
    }
    return mine;
}

void write_sae(const Setup& s, SaeTrainer& trainer, SaeSummary& mine) {
    const fs::path sae_dir = s.out() / "sae" / s.id();
    const std::string final_h5 = (sae_dir / "final.h5").string();
    const fs::path truth =
        fs::path(s.target.shards.empty() ? s.data.source : s.target.source) / "ground_truth.h5";
    SaeWeights w;
    if (trainer.latent_sharded()) {
        // Streamed from every latent shard to the first, which writes it (no whole copy).
        write_gathered(trainer, s.coords.latent_shard == 0, final_h5, "", sae_meta(s, trainer), {},
                       /*folded=*/true);
        if (s.coords.latent_shard != 0) return;
        if (fs::is_regular_file(truth)) w = sae_read_h5(final_h5);  // for the recovery below
    } else {
        w = fold_activation_scale(trainer_weights(trainer),
                                  trainer.store().whole_layout().segments());
        sae_write_h5(final_h5, w, sae_meta(s, trainer));
    }
    if (mine.gates.measured)
        density_histogram_write((sae_dir / "feature_density.csv").string(), mine.gates.density);
    if (fs::is_regular_file(truth)) {
        int64_t m = 0, dt = 0;
        const std::vector<float> f = synth_read_features(truth.string(), &m, &dt);
        if (dt == w.d_model)
            mine.feature_recovery =
                feature_recovery(f.data(), m, w.at("W_dec").data(), w.n_latents, dt);
    }
}

void config_columns(const Setup& s, std::vector<std::string>& names,
                    std::vector<std::map<std::string, std::string>>& rows) {
    const std::vector<std::string> keys = arch_summary_keys();
    names = {"arch", "n_latents"};
    for (const std::string& k : keys) names.push_back(k.substr(k.find('.') + 1));
    names.emplace_back("lr");
    for (const SaeConfig& c : s.cfg.sweep) {
        std::map<std::string, std::string> row = {
            {"arch", c.arch},
            {"n_latents", std::to_string(c.resolved_latents(s.model_d()))},
            {"lr", fmt::format("{:g}", c.lr)}};
        for (const std::string& k : arch_get(c.arch).summary_keys())
            row[k.substr(k.find('.') + 1)] = sae_key_text(s.cfg, c, k);
        rows.push_back(std::move(row));
    }
}

RunRecord run_record(const Setup& s, int ranks, int hosts, int64_t steps, int64_t resumed_step) {
    RunRecord r;
    r.version = SAETRAIN_VERSION;
    r.backend = s.backend->name();
    r.ranks = ranks, r.hosts = hosts;
    r.total_steps = steps;
    r.tokens_per_step = s.cfg.data.batch_size * s.coords.replicas;
    r.resumed_from_step = resumed_step;
    for (size_t i = 0; i < s.cfg.sweep.size(); ++i) r.saes.emplace_back(s.ids[i], s.cfg.sweep[i]);
    return r;
}

}  // namespace saetrain::run_parts
