// config_keys.cpp — every config key lives in one table (fields(), config_table.h): its
// section, name, kind, allowed values, the struct member it fills, a doc line, the rule its value
// must meet and whether it changes results. Parsing, overrides, suggestions, sweeps, validation,
// emission and the resume check (config_key_changes_results) all walk that table, so a new key
// is one line here. The keys an architecture declares (ArchKey, config.h) join the table from
// the registry (arch.h): one line beside their architecture, none here.
#include <algorithm>
#include <limits>
#include <variant>

#include "config_table.h"
#include "saetrain/arch.h"
#include "saetrain/error.h"

namespace saetrain::config_table {

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::integer:
            return "an integer";
        case Kind::unsigned_integer:
            return "a non-negative integer";
        case Kind::number:
            return "a number";
        case Kind::boolean:
            return "a boolean (true or false)";
        case Kind::string:
            return "a string";
        case Kind::integer_list:
            return "a list of integers";
        case Kind::string_list:
            return "a list of strings";
    }
    return "a value";
}

std::string compact(double v) { return fmt::format("{}", v); }

std::string value_text(const Value& v) {
    if (auto ints = std::get_if<IntList>(&v)) return list_text(*ints);
    if (auto strings = std::get_if<StringList>(&v)) return list_text(*strings);
    if (auto d = std::get_if<double>(&v)) return compact(*d);
    if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
    if (auto s = std::get_if<std::string>(&v)) return *s;
    if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
    return std::to_string(std::get<uint64_t>(v));
}

const std::vector<std::string> kSections = {"run",     "data", "sae", "train",     "parallel",
                                            "backend", "gpu",  "log", "checkpoint"};

namespace {

template <class T>
Value to_value(const T& v) {
    return Value(v);
}

template <class T>
void from_value(T& dst, const Value& v) {
    dst = std::get<T>(v);
}

template <class Access>
Field make_field(const char* section, const char* key, const char* doc, Access access,
                 std::vector<std::string> choices) {
    using T = std::remove_reference_t<decltype(access(std::declval<Config&>(),
                                                      std::declval<SaeConfig&>()))>;
    Field f;
    f.section = section;
    f.key = key;
    f.doc = doc;
    f.kind = kind_of<T>();
    f.choices = std::move(choices);
    // The accessor only reads here; the casts let one accessor serve both directions.
    f.get = [access](const Config& c, const SaeConfig& s) {
        return to_value(access(const_cast<Config&>(c), const_cast<SaeConfig&>(s)));
    };
    f.set = [access](Config& c, SaeConfig& s, const Value& v) { from_value(access(c, s), v); };
    return f;
}

// A key's rule, written beside it in the table. `ok` sees the key's value and the config (for a
// rule relative to another key); a rejected value reads "<key> <says> (got <value>)", or
// "<key> <says>" where the value would say nothing (an empty string).
template <class Ok>
struct Rule {
    Ok ok;
    std::string says;
    bool shows_value = true;
};

template <class Ok>
Rule<Ok> must_be(std::string text, Ok ok) {
    return {ok, "must be " + text};
}

auto at_least(int lo, const char* note = "") {
    return must_be(fmt::format(">= {}{}", lo, note),
                   [lo](const auto& v, const Config&) { return v >= lo; });
}

auto above(int lo) {
    return must_be(fmt::format("> {}", lo), [lo](const auto& v, const Config&) { return v > lo; });
}

// [lo, hi] when `closed`, else [lo, hi).
template <class T>
auto within(T lo, T hi, bool closed = true) {
    return must_be(
        fmt::format("in [{}, {}{}", lo, hi, closed ? "]" : ")"),
        [=](const auto& v, const Config&) { return v >= lo && (closed ? v <= hi : v < hi); });
}

auto not_empty(std::string says = "must not be empty") {
    auto ok = [](const std::string& v, const Config&) { return !v.empty(); };
    return Rule<decltype(ok)>{ok, std::move(says), /*shows_value=*/false};
}

// A list of paths: at least one, none empty.
auto paths_required(const char* what) {
    auto ok = [](const StringList& v, const Config&) {
        return !v.empty() &&
               std::none_of(v.begin(), v.end(), [](const auto& p) { return p.empty(); });
    };
    return Rule<decltype(ok)>{ok, fmt::format("is required: {}", what), /*shows_value=*/false};
}
auto no_empty_path() {
    auto ok = [](const StringList& v, const Config&) {
        return std::none_of(v.begin(), v.end(), [](const auto& p) { return p.empty(); });
    };
    return Rule<decltype(ok)>{ok, "lists an empty path", /*shows_value=*/false};
}

template <class Access, class Ok>
Field make_field(const char* section, const char* key, const char* doc, Access access,
                 std::vector<std::string> choices, Rule<Ok> rule) {
    Field f = make_field(section, key, doc, access, std::move(choices));
    f.problem = [access, rule, full = f.full()](const Config& c, const SaeConfig& s) {
        const auto& v = access(const_cast<Config&>(c), const_cast<SaeConfig&>(s));
        if (rule.ok(v, c)) return std::string();
        if (!rule.shows_value) return fmt::format("{} {}", full, rule.says);
        return fmt::format("{} {} (got {})", full, rule.says, value_text(to_value(v)));
    };
    return f;
}

const std::vector<std::string> kAny;
const std::vector<std::string> kArchChoices = arch_names();
const std::vector<std::string> kDecayChoices = {"auto", "cosine", "linear", "constant",
                                                "cosine_restarts"};
const std::vector<std::string> kEncoderInitChoices = {"fitted", "transpose"};
const std::vector<std::string> kOptimizerChoices = {"auto", "adam", "signum"};
const std::vector<std::string> kNonfiniteChoices = {"skip", "stop"};
const std::vector<std::string> kNormalizeChoices = {"none", "expected_average_only_in"};
const std::vector<std::string> kS3AddressingChoices = {"auto", "path", "virtual"};
const std::vector<std::string> kBDecInitChoices = {"mean", "geometric_median", "zeros"};
const std::vector<std::string> kModeChoices = {"sweep", "data_parallel", "hybrid"};
const std::vector<std::string> kSweepDataChoices = {"shared", "disjoint"};
const std::vector<std::string> kBackendChoices = {"auto", "cpu", "cuda"};
const std::vector<std::string> kGemmChoices = {"fp32", "tf32", "bf16"};

// A key whose value a resumed run may change: where files go, how often it reports, the
// devices and numerics it runs on; the SAE trained is the same.
Field same_results(Field f) {
    f.changes_results = false;
    return f;
}

// An architecture's declared key (ArchKey, config.h) as a row of the table; its value lives in
// SaeConfig::arch_values.
Field arch_field(const ArchKeyDecl& k) {
    Field f;
    f.section = k.section();
    f.key = k.name();
    f.doc = k.doc();
    f.changes_results = k.changes_results();
    std::visit([&](const auto& v) { f.kind = kind_of<std::decay_t<decltype(v)>>(); },
               k.default_value());
    f.get = [&k](const Config&, const SaeConfig& s) { return k.value(s); };
    f.set = [full = k.full()](Config&, SaeConfig& s, const Value& v) { s.arch_values[full] = v; };
    if (k.rule().ok)
        f.problem = [&k, full = k.full()](const Config&, const SaeConfig& s) {
            const Value& v = k.value(s);
            if (k.rule().ok(v)) return std::string();
            return fmt::format("{} {} (got {})", full, k.rule().says, value_text(v));
        };
    return f;
}

// Appends the keys the registered architectures declare in `section`, in registry order.
void append_arch_keys(std::vector<Field>& table, const std::string& section) {
    for (const ArchKeyDecl* k : arch_config_keys()) {
        if (k->section() != section) continue;
        table.push_back(arch_field(*k));
    }
}

// KEY(section, name, doc, allowed values[, rule]).
#define SAE_KEY(section, name, doc, ...) \
    make_field(                          \
        section, #name, doc, [](Config&, SaeConfig & s) -> auto& { return s.name; }, __VA_ARGS__)
#define CFG_KEY(section, name, doc, ...)                                                      \
    make_field(                                                                               \
        #section, #name, doc, [](Config & c, SaeConfig&) -> auto& { return c.section.name; }, \
        __VA_ARGS__)

// Table order is emission order and sweep order (sae keys, then train keys, last fastest). The
// architectures' keys sit at the end of their section's architecture keys (after sae.l1_coeff
// and after train.l0_coeff), so config.yaml lists the keys in the order it always has.
std::vector<Field> make_fields() {
    std::vector<Field> t = {
        same_results(CFG_KEY(run, out_dir, "the run's directory: config, metrics, checkpoints",
                             kAny, not_empty())),
        CFG_KEY(run, seed, "seeds the weights' initialization and the data's shuffling", kAny),
        CFG_KEY(
            data, path,
            "a directory or glob of .h5 activation shards, or s3://bucket/prefix/ (clt: a list, "
            "one per layer)",
            kAny, paths_required("a directory or glob of .h5 shards")),
        CFG_KEY(data, target_path,
                "transcoders: the target set (an MLP's output), row for row with data.path (clt: "
                "a list, one per layer)",
                kAny, no_empty_path()),
        CFG_KEY(data, layers,
                "clt: its layers (0: counted from the data, data.path's sets or a multi-layer "
                "paired set's [rows, L, d])",
                kAny, within(int64_t{0}, int64_t{4096})),
        // The upper bounds keep every count made from these (rows x epochs, steps, buffer
        // bytes) far from int64's limit, each far above any real run.
        CFG_KEY(data, batch_size, "rows (tokens) per rank per optimizer step", kAny,
                within(int64_t{1}, kMaxBatchRows)),
        CFG_KEY(data, epochs, "passes over the data (unless data.max_tokens > 0)", kAny,
                must_be(fmt::format(">= 1 unless data.max_tokens > 0, and at most {}", kMaxEpochs),
                        [](int64_t v, const Config& c) {
                            return (v >= 1 || c.data.max_tokens > 0) && v <= kMaxEpochs;
                        })),
        CFG_KEY(data, max_tokens, "a token budget instead of data.epochs (0: epochs)", kAny,
                within(int64_t{0}, kMaxTokens)),
        CFG_KEY(data, shuffle_buffer_rows, "rows mixed in memory for shuffling (0: in order)", kAny,
                at_least(0, " (0: no shuffling)")),
        CFG_KEY(data, shuffle_buffer_bytes,
                "the shuffle buffer in bytes instead of rows, as many rows as fit (0: rows)", kAny,
                must_be(">= 0, and 0 unless data.shuffle_buffer_rows keeps its default (size the "
                        "buffer one way)",
                        [](int64_t v, const Config& c) {
                            return v == 0 || (v > 0 && c.data.shuffle_buffer_rows ==
                                                           DataConfig{}.shuffle_buffer_rows);
                        })),
        CFG_KEY(data, dataset, "the dataset's name inside each shard", kAny, not_empty()),
        same_results(CFG_KEY(data, stage_dir,
                             "copy the rank's shards here first (node-local disk; $TMPDIR)", kAny)),
        CFG_KEY(data, read_bytes, "bytes of one sequential read request", kAny,
                at_least(4096, " (one sequential request)")),
        same_results(CFG_KEY(data, prefetch_bytes, "converted rows buffered ahead of the trainer",
                             kAny, at_least(1 << 20))),
        CFG_KEY(data, nonfinite, "a batch holding NaN/Inf: skip (and count) or stop",
                kNonfiniteChoices),
        same_results(CFG_KEY(
            data, eval_path,
            "held-out shards of their own (same d_model; a CLT: one multi-layer paired set)",
            kAny)),
        same_results(CFG_KEY(data, eval_target_path,
                             "transcoders: the held-out target set, row for row with eval_path",
                             kAny)),
        CFG_KEY(
            data, eval_rows, "held-out rows: of data.eval_path (0: all), or the last of data.path",
            kAny,
            at_least(0, " (held-out rows; 0: all of data.eval_path, or no evaluation without it)")),
        CFG_KEY(data, normalize,
                "expected_average_only_in: train on c x with E||c x||^2 = d_model (SAELens)",
                kNormalizeChoices),
        same_results(CFG_KEY(data, s3_endpoint,
                             "s3:// data: the store's URL (\"\": AWS_ENDPOINT_URL, else AWS)",
                             kAny)),
        same_results(CFG_KEY(data, s3_region,
                             "s3:// data: the region (\"\": AWS_REGION, the profile, us-east-1)",
                             kAny)),
        same_results(CFG_KEY(data, s3_addressing,
                             "s3:// data: path-style or virtual-hosted URLs (auto: path on "
                             "s3_endpoint)",
                             kS3AddressingChoices)),
        same_results(CFG_KEY(data, s3_anonymous,
                             "s3:// data: unsigned requests (a public bucket; no credentials)",
                             kAny)),
        same_results(CFG_KEY(data, s3_connections, "s3:// data: concurrent range GETs per rank",
                             kAny, within(int64_t{1}, int64_t{1024}))),
        same_results(CFG_KEY(data, s3_request_bytes, "s3:// data: bytes of one range GET", kAny,
                             within(int64_t{4096}, int64_t{1} << 30))),
        same_results(CFG_KEY(data, s3_retries,
                             "s3:// data: attempts of a request on timeouts, 5xx and SlowDown "
                             "(backoff 0.1 s doubling to 5 s)",
                             kAny, within(int64_t{1}, int64_t{1000}))),
        same_results(CFG_KEY(data, s3_timeout_s,
                             "s3:// data: seconds without progress before a request is retried",
                             kAny, above(0))),
        SAE_KEY("sae", arch, "the SAE architecture (docs/architectures.md)", kArchChoices),
        SAE_KEY("sae", expansion, "n_latents = expansion x d_model (unless sae.n_latents > 0)",
                kAny, at_least(1)),
        SAE_KEY("sae", n_latents, "the latents, exactly (0: sae.expansion x d_model)", kAny,
                at_least(0, " (0: use sae.expansion)")),
        SAE_KEY("sae", k, "latents kept per token (TopK, BatchTopK on average, Switch)", kAny,
                at_least(1)),
        SAE_KEY("sae", l1_coeff, "the L1 penalty's weight (ReLU, Gated)", kAny, at_least(0)),
    };
    append_arch_keys(t, "sae");
    const std::vector<Field> more = {
        SAE_KEY("sae", b_dec_init, "b_dec at init: the first batch's mean or geometric median",
                kBDecInitChoices),
        SAE_KEY("train", lr, "the learning rate after the warmup (0: the optimizer's default)",
                kAny, at_least(0, " (0: the optimizer's default)")),
        SAE_KEY("train", warmup_steps, "linear LR warmup steps (0: train.warmup_fraction)", kAny,
                at_least(0)),
        SAE_KEY("train", warmup_fraction, "linear LR warmup over this fraction of the steps", kAny,
                within(0, 1, /*closed=*/false)),
        SAE_KEY("train", lr_decay,
                "the LR decay after train.decay_start (auto: constant for signum, else cosine)",
                kDecayChoices),
        SAE_KEY("train", decay_start, "the fraction of the run after which the LR decays", kAny,
                within(0, 1)),
        SAE_KEY("train", restart_steps, "cosine_restarts: the first cycle's steps", kAny,
                at_least(0, " (0: a quarter of the run)")),
        SAE_KEY("train", restart_mult, "cosine_restarts: each cycle this much longer", kAny,
                within(1, 100)),
        SAE_KEY("train", lr_min_ratio, "the final LR as a fraction of train.lr", kAny,
                within(0, 1)),
        SAE_KEY("train", l1_warmup_steps,
                "the sparsity coefficient ramps in over these steps (0: the fraction)", kAny,
                at_least(0)),
        SAE_KEY("train", l1_warmup_fraction,
                "the sparsity coefficient ramps in over this fraction of the steps", kAny,
                within(0, 1)),
        SAE_KEY("train", l0_coeff, "the L0 penalty's weight (JumpReLU)", kAny, at_least(0)),
    };
    t.insert(t.end(), more.begin(), more.end());
    append_arch_keys(t, "train");
    const std::vector<Field> rest = {
        SAE_KEY("train", decorr_coeff, "the latents' decorrelation penalty's weight (0: off)", kAny,
                at_least(0, " (0: off)")),
        SAE_KEY("train", grad_clip, "clip the global gradient norm to this (0: off)", kAny,
                at_least(0, " (0 disables clipping)")),
        SAE_KEY("train", accum_steps, "chunks each batch's gradient is accumulated over", kAny,
                at_least(1)),
        SAE_KEY("train", optimizer,
                "adam (AdamW), signum (schedule-free sign descent; the SAE is the average) or "
                "auto (the architecture's choice when train.lr is unset, else adam)",
                kOptimizerChoices),
        SAE_KEY("train", momentum,
                "signum: the gradient's point between the average and the iterate", kAny,
                within(0, 1, /*closed=*/false)),
        SAE_KEY("train", beta1, "Adam's beta1", kAny, within(0, 1, /*closed=*/false)),
        SAE_KEY("train", beta2, "Adam's beta2", kAny, within(0, 1, /*closed=*/false)),
        SAE_KEY("train", eps, "Adam's epsilon", kAny, above(0)),
        SAE_KEY("train", weight_decay, "AdamW's decoupled weight decay (weights, not biases)", kAny,
                at_least(0)),
        SAE_KEY("train", normalize_decoder, "unit-norm decoder rows after every step", kAny),
        SAE_KEY("train", encoder_init, "W_enc at init: fitted (c W_dec^T) or transpose",
                kEncoderInitChoices),
        SAE_KEY("train", dead_tokens, "a latent silent for this many tokens is dead", kAny,
                at_least(1)),
        SAE_KEY("train", max_bad_steps, "stop after this many non-finite steps in a row", kAny,
                at_least(1)),
        CFG_KEY(parallel, mode, "sweep, data_parallel or hybrid", kModeChoices),
        CFG_KEY(parallel, sweep_data, "a sweep's SAEs share the stream, or each reads its own",
                kSweepDataChoices),
        CFG_KEY(parallel, replicas, "replicas of each SAE (hybrid)", kAny, at_least(1)),
        // The same SAE on any number of latent shards (a checkpoint holds the whole SAE).
        same_results(CFG_KEY(parallel, latent_shards, "ranks each replica's latents are split over",
                             kAny, at_least(1, " (1: no latent sharding)"))),
        same_results(CFG_KEY(parallel, timeout_s,
                             "a collective waiting longer than this ends the job (0: never)", kAny,
                             at_least(0, " (0: no watchdog)"))),
        same_results(make_field(
            "backend", "", "the compute backend: auto, cpu or cuda",
            [](Config & c, SaeConfig&) -> auto& { return c.backend; }, kBackendChoices)),
        same_results(CFG_KEY(gpu, gemm, "CUDA GEMM operands (fp32 accumulation)", kGemmChoices)),
        same_results(
            CFG_KEY(gpu, deterministic, "CUDA: the TopK backward without float atomics", kAny)),
        same_results(
            CFG_KEY(log, every_steps, "a metrics line per SAE every N steps", kAny, at_least(1))),
        same_results(
            CFG_KEY(log, peak_tflops, "one device's peak TFLOP/s for MFU (0: the GPU table)", kAny,
                    at_least(0, " (TFLOP/s of one device; 0: the peak table by GPU name)"))),
        // Checked after log.every_steps (table order), so the division is by at least 1.
        same_results(CFG_KEY(log, eval_every_steps,
                             "evaluate on the held-out rows every N steps (0: at the end)", kAny,
                             must_be("a multiple of log.every_steps (0: only at the end)",
                                     [](int64_t v, const Config& c) {
                                         return v >= 0 && v % c.log.every_steps == 0;
                                     }))),
        same_results(
            CFG_KEY(checkpoint, every_steps, "a checkpoint every N steps", kAny, at_least(1))),
        same_results(CFG_KEY(checkpoint, keep, "committed checkpoints kept", kAny, at_least(1))),
    };
    t.insert(t.end(), rest.begin(), rest.end());
    for (const ArchKeyDecl* k : arch_config_keys())
        SAE_ENFORCE(k->section() == "sae" || k->section() == "train",
                    "config key {}: an architecture declares sae.* and train.* keys only",
                    k->full());
    for (size_t i = 0; i < t.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            SAE_ENFORCE(t[i].full() != t[j].full(), "config key {} is declared twice", t[i].full());
    return t;
}

}  // namespace

const std::vector<Field>& fields() {
    static const std::vector<Field> table = make_fields();
    return table;
}

namespace {

#undef SAE_KEY
#undef CFG_KEY

}  // namespace

int find_field(const std::string& section, const std::string& key) {
    const auto& fs = fields();
    for (size_t i = 0; i < fs.size(); ++i)
        if (fs[i].section == section && fs[i].key == key) return static_cast<int>(i);
    return -1;
}

bool is_section(const std::string& name) {
    return std::find(kSections.begin(), kSections.end(), name) != kSections.end();
}

std::string join(const std::vector<std::string>& v, const char* sep) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
    return out;
}

// ---- suggestions -------------------------------------------------------------------------------

namespace {

// Optimal string alignment distance: Levenshtein plus adjacent transpositions ("expnasion").
size_t edit_distance(const std::string& a, const std::string& b) {
    const size_t n = a.size(), m = b.size();
    std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
    for (size_t i = 0; i <= n; ++i) d[i][0] = i;
    for (size_t j = 0; j <= m; ++j) d[0][j] = j;
    for (size_t i = 1; i <= n; ++i) {
        for (size_t j = 1; j <= m; ++j) {
            const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    }
    return d[n][m];
}

// Edits we still call a typo: 1 for short names, about a third of the name for long ones.
size_t typo_budget(const std::string& s) { return std::max<size_t>(1, (s.size() + 1) / 3); }

// The nearest valid full key for `section.key`: a typo in the same section, or the same (or a
// near) key in another section (`train.k` -> `sae.k`). Empty when nothing is close.
std::string suggest_key(const std::string& section, const std::string& key) {
    size_t best = std::numeric_limits<size_t>::max();
    std::string best_key;
    for (int pass = 0; pass < 2; ++pass) {  // same section first, so it wins ties
        for (const Field& f : fields()) {
            if (f.key.empty() || (f.section == section) != (pass == 0)) continue;
            const size_t d = edit_distance(key, f.key) + (pass == 0 ? 0 : 1);
            if (d < best) best = d, best_key = f.full();
        }
    }
    return best <= typo_budget(key) ? best_key : std::string();
}

}  // namespace

// For an unknown top-level name: a section typo (`trian`), or a key written outside its section
// (`lr` -> `train.lr`).
std::string suggest_section(const std::string& name) {
    size_t best = std::numeric_limits<size_t>::max();
    std::string best_name;
    for (const std::string& s : kSections) {
        const size_t d = edit_distance(name, s);
        if (d < best) best = d, best_name = s;
    }
    if (best <= typo_budget(name)) return best_name;
    for (const Field& f : fields())
        if (!f.key.empty() && f.key == name) return f.full();
    return {};
}

std::string section_keys(const std::string& section) {
    std::vector<std::string> keys;
    for (const Field& f : fields())
        if (f.section == section) keys.push_back(f.key);
    return join(keys);
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
    std::string msg = fmt::format("unknown key '{}.{}'", section, key);
    const std::string hint = suggest_key(section, key);
    if (!hint.empty()) return msg + fmt::format(" (did you mean {}?)", hint);
    return msg + fmt::format(" (valid keys in {}: {})", section, section_keys(section));
}

std::string unknown_section_message(const std::string& name) {
    std::string msg = fmt::format("unknown section '{}'", name);
    const std::string hint = suggest_section(name);
    if (!hint.empty()) msg += fmt::format(" (did you mean {}?)", hint);
    return msg + fmt::format("; sections are {}", join(kSections));
}

}  // namespace saetrain::config_table

namespace saetrain {

using namespace config_table;

// ---- public API --------------------------------------------------------------------------------

KeyRule key_at_least(int lo, const std::string& note) {
    KeyRule r;
    r.says = fmt::format("must be >= {}{}", lo, note);
    r.ok = [lo](const ConfigValue& v) {
        return std::visit(
            [lo](const auto& x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
                    return x >= lo;
                else
                    return true;
            },
            v);
    };
    return r;
}

KeyRule key_one_of(std::vector<std::string> choices) {
    KeyRule r;
    r.says = "must be ";
    for (size_t i = 0; i < choices.size(); ++i)
        r.says += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
    r.ok = [choices = std::move(choices)](const ConfigValue& v) {
        const auto* s = std::get_if<std::string>(&v);
        return s && std::find(choices.begin(), choices.end(), *s) != choices.end();
    };
    return r;
}

SaeConfig& SaeConfig::set_value(const std::string& key, const ConfigValue& value) {
    const size_t dot = key.find('.');
    const int i =
        dot == std::string::npos ? -1 : find_field(key.substr(0, dot), key.substr(dot + 1));
    SAE_ENFORCE(i >= 0 && fields()[static_cast<size_t>(i)].sweepable(),
                "SaeConfig::set: '{}' is not an sae.* or train.* key", key);
    const Field& f = fields()[static_cast<size_t>(i)];
    Value v = value;
    if (f.kind == Kind::number && std::holds_alternative<int64_t>(v))
        v = static_cast<double>(std::get<int64_t>(v));
    Config unused;
    const bool fits = std::visit(
        [&](const auto& x) { return kind_of<std::decay_t<decltype(x)>>() == f.kind; }, v);
    SAE_ENFORCE(fits, "SaeConfig::set: {} expects {}, got '{}'", key, kind_name(f.kind),
                value_text(v));
    if (!f.choices.empty())
        SAE_ENFORCE(std::find(f.choices.begin(), f.choices.end(), value_text(v)) != f.choices.end(),
                    "SaeConfig::set: {}: unknown value '{}'; allowed: {}", key, value_text(v),
                    join(f.choices));
    f.set(unused, *this, v);
    return *this;
}

std::vector<ConfigKeyInfo> config_keys() {
    const Config defaults;
    std::vector<ConfigKeyInfo> out;
    for (const Field& f : fields()) {
        ConfigKeyInfo k;
        k.name = f.full();
        k.default_text = value_text(f.get(defaults, defaults.sae));
        k.doc = f.doc;
        k.sweepable = f.sweepable();
        k.changes_results = f.changes_results;
        for (const Architecture* a : architectures()) {
            for (const ArchKeyDecl* d : a->config_keys())
                if (d->full() == k.name)
                    k.declared_by += (k.declared_by.empty() ? "" : ", ") + std::string(a->name());
            for (const auto& [key, value] : a->key_defaults())
                if (key == k.name) k.doc += fmt::format(" ({}: {})", a->name(), value_text(value));
        }
        out.push_back(std::move(k));
    }
    return out;
}

bool config_key_changes_results(const std::string& key) {
    for (const Field& f : fields())
        if (f.full() == key) return f.changes_results;
    return true;
}

}  // namespace saetrain
