// config.cpp — YAML in, typed structs out: overrides, unknown-key suggestions, type and value
// checks, sweep expansion, readable SAE ids and the resolved YAML written back out.
//
// Every key lives in one table (fields()): its section, name, kind, allowed values, the struct
// member it fills, a doc line, the rule its value must meet and whether it changes results.
// Parsing, overrides, suggestions, sweeps, validation, emission and the resume check
// (config_key_changes_results) all walk that table, so a new key is one line there. The keys an
// architecture declares (ArchKey, config.h) join the table from the registry (arch.h): one
// line beside their architecture, none here.
#include "saetrain/config.h"

#include <yaml-cpp/depthguard.h>  // YAML::DeepRecursion
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "saetrain/arch.h"
#include "saetrain/error.h"
#include "saetrain/host_alloc.h"  // defines: machine_memory_bytes

namespace saetrain {

namespace {

// ---- values and keys ---------------------------------------------------------------------------

using Value = ConfigValue;
enum class Kind { integer, unsigned_integer, number, boolean, string, integer_list, string_list };

bool is_list(Kind k) { return k == Kind::integer_list || k == Kind::string_list; }
// The kind of a list's elements.
Kind element_kind(Kind k) {
    return k == Kind::integer_list ? Kind::integer : k == Kind::string_list ? Kind::string : k;
}

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

// The Kind of each of Value's types.
template <class T>
constexpr Kind kind_of() {
    if constexpr (std::is_same_v<T, int64_t>)
        return Kind::integer;
    else if constexpr (std::is_same_v<T, uint64_t>)
        return Kind::unsigned_integer;
    else if constexpr (std::is_same_v<T, double>)
        return Kind::number;
    else if constexpr (std::is_same_v<T, bool>)
        return Kind::boolean;
    else if constexpr (std::is_same_v<T, IntList>)
        return Kind::integer_list;
    else if constexpr (std::is_same_v<T, StringList>)
        return Kind::string_list;
    else {
        static_assert(std::is_same_v<T, std::string>, "a Value type");
        return Kind::string;
    }
}

template <class T>
Value to_value(const T& v) {
    return Value(v);
}

template <class T>
void from_value(T& dst, const Value& v) {
    dst = std::get<T>(v);
}

// Shortest text that reads back as the same double ("5", "0.5", "0.001", "1e-05").
std::string compact(double v) { return fmt::format("{}", v); }

// A list as "[a, b]" (elements joined by `sep` between the brackets, or bare when `bare`).
template <class T>
std::string list_text(const std::vector<T>& list, const char* sep = ", ", bool bare = false) {
    std::string out = bare ? "" : "[";
    for (size_t i = 0; i < list.size(); ++i) out += (i ? sep : "") + fmt::format("{}", list[i]);
    return bare ? out : out + "]";
}

std::string value_text(const Value& v) {
    if (auto ints = std::get_if<IntList>(&v)) return list_text(*ints);
    if (auto strings = std::get_if<StringList>(&v)) return list_text(*strings);
    if (auto d = std::get_if<double>(&v)) return compact(*d);
    if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
    if (auto s = std::get_if<std::string>(&v)) return *s;
    if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
    return std::to_string(std::get<uint64_t>(v));
}

struct Field {
    std::string section;
    std::string key;  // empty for the scalar section `backend`
    Kind kind = Kind::string;
    std::vector<std::string> choices;  // allowed values of an enum-like string; empty: any
    std::function<Value(const Config&, const SaeConfig&)> get;
    std::function<void(Config&, SaeConfig&, const Value&)> set;
    // What is wrong with the value, as "<key> must be ... (got ...)"; "" when it meets its rule
    // (or the key has none).
    std::function<std::string(const Config&, const SaeConfig&)> problem;
    std::string doc;              // one line: what it sets (config_keys, saetrain --list-keys)
    bool changes_results = true;  // false: a resume may change it (Checkpointer)

    std::string full() const { return key.empty() ? section : section + "." + key; }
    bool sweepable() const { return section == "sae" || section == "train"; }
};

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

const std::vector<std::string> kSections = {"run",     "data", "sae", "train",     "parallel",
                                            "backend", "gpu",  "log", "checkpoint"};

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
        CFG_KEY(data, dataset, "the dataset's name inside each shard", kAny, not_empty()),
        same_results(CFG_KEY(data, stage_dir,
                             "copy the rank's shards here first (node-local disk; $TMPDIR)", kAny)),
        CFG_KEY(data, read_bytes, "bytes of one sequential read request", kAny,
                at_least(4096, " (one sequential request)")),
        same_results(CFG_KEY(data, prefetch_bytes, "converted rows buffered ahead of the trainer",
                             kAny, at_least(1 << 20))),
        CFG_KEY(data, nonfinite, "a batch holding NaN/Inf: skip (and count) or stop",
                kNonfiniteChoices),
        same_results(CFG_KEY(data, eval_path, "held-out shards of their own (same d_model)", kAny)),
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

const std::vector<Field>& fields() {
    static const std::vector<Field> table = make_fields();
    return table;
}

#undef SAE_KEY
#undef CFG_KEY

int find_field(const std::string& section, const std::string& key) {
    const auto& fs = fields();
    for (size_t i = 0; i < fs.size(); ++i)
        if (fs[i].section == section && fs[i].key == key) return static_cast<int>(i);
    return -1;
}

bool is_section(const std::string& name) {
    return std::find(kSections.begin(), kSections.end(), name) != kSections.end();
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
    return out;
}

// ---- suggestions -------------------------------------------------------------------------------

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

// ---- scalar conversion -------------------------------------------------------------------------

std::string strip_plus(const std::string& s) {
    return (s.size() > 1 && s[0] == '+' && s[1] != '-') ? s.substr(1) : s;
}

bool parse_double(const std::string& text, double& out) {
    const std::string s = strip_plus(text);
    if (s.empty()) return false;
    const char* end = s.data() + s.size();
    auto r = std::from_chars(s.data(), end, out);
    return r.ec == std::errc() && r.ptr == end && std::isfinite(out);
}

template <class Int>
bool parse_integer(const std::string& text, Int& out) {
    const std::string s = strip_plus(text);
    if (s.empty()) return false;
    const char* end = s.data() + s.size();
    auto r = std::from_chars(s.data(), end, out);
    if (r.ec == std::errc() && r.ptr == end) return true;
    // Accept integral numbers written as floats: `max_tokens: 1.0e9`.
    double d = 0;
    if (!parse_double(s, d) || d != std::floor(d)) return false;
    if (d < static_cast<double>(std::numeric_limits<Int>::min()) ||
        d >= static_cast<double>(std::numeric_limits<Int>::max()))
        return false;
    out = static_cast<Int>(d);
    return true;
}

// ---- the parser --------------------------------------------------------------------------------

// The line (from 1) where a second YAML document starts in `text`, or 0 when it holds at most
// one. Document markers are lexical in YAML: "---" or "..." at the start of a line, followed by
// a blank or the line's end, is a marker wherever it stands (a block scalar ends there too), so
// one pass over the lines finds them. A leading "---" (after directives and comments only) and a
// final "..." mark the one document.
int64_t second_document_line(const std::string& text) {
    bool content = false, ended = false;
    int64_t line_no = 0;
    for (size_t a = 0; a < text.size();) {
        size_t b = text.find('\n', a);
        if (b == std::string::npos) b = text.size();
        std::string_view line(text.data() + a, b - a);
        a = b + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        const auto marker = [&](std::string_view m) {
            return line.substr(0, 3) == m &&
                   (line.size() == 3 || line[3] == ' ' || line[3] == '\t');
        };
        const auto has_content = [](std::string_view rest) {
            const size_t p = rest.find_first_not_of(" \t");
            return p != std::string_view::npos && rest[p] != '#';
        };
        if (marker("---")) {
            if (content || ended) return line_no;
            content = has_content(line.substr(3));
        } else if (marker("...")) {
            ended = true;
        } else if (has_content(line) && !(line[0] == '%' && !content)) {
            if (ended) return line_no;
            content = true;
        }
    }
    return 0;
}

class Parser {
public:
    explicit Parser(std::string source) : source_(std::move(source)) {}

    Config run(const std::string& text, const std::vector<std::string>& overrides) {
        YAML::Node root = load(text);
        for (const std::string& ov : overrides) apply_override(root, ov);
        walk(root);
        Config cfg = build();
        validate(cfg);
        return cfg;
    }

private:
    std::string source_;
    std::map<std::string, std::string> override_of_;  // full key -> the --set that set it
    std::map<std::string, int> line_of_;              // full key -> 1-based line in the file
    std::map<int, std::vector<Value>> given_;         // field index -> values (several: a sweep)

    // "file:12: ", "file: --set sae.k=0: " or "file: ": where a key's value came from.
    std::string loc(const std::string& full_key) const {
        auto o = override_of_.find(full_key);
        if (o != override_of_.end()) return fmt::format("{}: --set {}: ", source_, o->second);
        auto l = line_of_.find(full_key);
        if (l != line_of_.end()) return fmt::format("{}:{}: ", source_, l->second);
        return source_ + ": ";
    }
    std::string loc_mark(const YAML::Mark& m) const {
        return m.is_null() ? source_ + ": " : fmt::format("{}:{}: ", source_, m.line + 1);
    }

    YAML::Node load(const std::string& text) const {
        YAML::Node root;
        try {
            root = YAML::Load(text);
        } catch (const YAML::DeepRecursion& e) {
            throw Error(fmt::format(
                "{}:{}:{}: YAML nested too deeply for the parser; a saetrain config is a "
                "mapping of sections, each a mapping of keys (lists at most one level down)",
                source_, e.mark.line + 1, e.mark.column + 1));
        } catch (const YAML::Exception& e) {
            throw Error(fmt::format("{}:{}:{}: YAML syntax error: {}", source_, e.mark.line + 1,
                                    e.mark.column + 1, e.msg));
        }
        // yaml-cpp's Load reads the first document and ignores the rest: a config pasted twice,
        // or two concatenated, would train on the first alone.
        if (const int64_t line = second_document_line(text); line > 0)
            throw Error(fmt::format(
                "{}:{}: a second YAML document ('---' after the first): a saetrain config is "
                "one document, and the rest would be ignored; merge them or keep one",
                source_, line));
        if (root.IsNull()) return YAML::Node(YAML::NodeType::Map);  // empty file: all defaults
        SAE_ENFORCE(root.IsMap(), "{}the config must be a mapping of sections ({}), not a {}",
                    loc_mark(root.Mark()), join(kSections), root.IsSequence() ? "list" : "scalar");
        return root;
    }

    void apply_override(YAML::Node& root, const std::string& ov) {
        const std::string where = fmt::format("{}: --set {}: ", source_, ov);
        const size_t eq = ov.find('=');
        SAE_ENFORCE(eq != std::string::npos,
                    "{}an override must look like section.key=value (e.g. --set sae.k=64)", where);
        const std::string lhs = ov.substr(0, eq);
        const std::string rhs = ov.substr(eq + 1);
        const size_t dot = lhs.find('.');
        std::string section, key;
        if (dot == std::string::npos) {
            if (lhs != "backend") {
                const std::string hint = suggest_section(lhs);
                throw Error(fmt::format(
                    "{}'{}' is not section.key; an override must look like section.key=value{}",
                    where, lhs,
                    hint.empty() ? std::string() : fmt::format(" (did you mean {}?)", hint)));
            }
            section = lhs;
        } else {
            section = lhs.substr(0, dot);
            key = lhs.substr(dot + 1);
            if (!is_section(section)) throw Error(where + unknown_section_message(section));
            if (find_field(section, key) < 0) {
                SAE_ENFORCE(section != "backend", "{}backend is a single value: use backend={}",
                            where, rhs);
                throw Error(where + unknown_key_message(section, key));
            }
        }
        YAML::Node value;
        try {
            value = YAML::Load(rhs);
        } catch (const YAML::Exception& e) {
            throw Error(fmt::format("{}cannot read the value '{}' as YAML: {}", where, rhs, e.msg));
        }
        override_of_[lhs] = ov;
        if (key.empty()) {
            root[section] = value;
            return;
        }
        const YAML::Node existing = root[section];
        if (!existing.IsDefined() || existing.IsNull())
            root[section] = YAML::Node(YAML::NodeType::Map);
        YAML::Node sec = root[section];
        SAE_ENFORCE(sec.IsMap(), "{}section '{}' must be a mapping of keys", loc_mark(sec.Mark()),
                    section);
        sec[key] = value;
    }

    void walk(const YAML::Node& root) {
        std::map<std::string, int> seen_sections;
        for (const auto& kv : root) {
            const std::string name = kv.first.Scalar();
            const std::string where = loc_mark(kv.first.Mark());
            if (!seen_sections.emplace(name, kv.first.Mark().line + 1).second)
                throw Error(fmt::format("{}section '{}' appears twice (first at line {})", where,
                                        name, seen_sections[name]));
            if (!is_section(name)) throw Error(where + unknown_section_message(name));
            if (name == "backend") {
                take(find_field("backend", ""), kv.first, kv.second);
                continue;
            }
            if (kv.second.IsNull()) continue;  // `log:` with nothing under it: defaults
            SAE_ENFORCE(kv.second.IsMap(),
                        "{}section '{}' must be a mapping of keys (valid keys: {}), not a {}",
                        where, name, section_keys(name),
                        kv.second.IsSequence() ? "list" : "scalar");
            std::map<std::string, int> seen;
            for (const auto& item : kv.second) {
                const std::string key = item.first.Scalar();
                const std::string kwhere = loc_mark(item.first.Mark());
                if (!seen.emplace(key, item.first.Mark().line + 1).second)
                    throw Error(fmt::format("{}key '{}.{}' appears twice (first at line {})",
                                            kwhere, name, key, seen[key]));
                const int idx = find_field(name, key);
                if (idx < 0) throw Error(kwhere + unknown_key_message(name, key));
                take(idx, item.first, item.second);
            }
        }
    }

    // Records the value(s) of one key.
    void take(int idx, const YAML::Node& key_node, const YAML::Node& node) {
        const Field& f = fields()[static_cast<size_t>(idx)];
        const std::string full = f.full();
        if (!key_node.Mark().is_null()) line_of_[full] = key_node.Mark().line + 1;
        std::vector<Value> values;
        if (is_list(f.kind)) {
            values = list_values(f, node);
        } else if (node.IsSequence()) {
            SAE_ENFORCE(f.sweepable(),
                        "{}{}: got a list, but only sae.* and train.* keys can be swept (lists "
                        "expand to a sweep); give one value",
                        loc(full), full);
            SAE_ENFORCE(node.size() > 0, "{}{}: empty list; a swept key needs at least one value",
                        loc(full), full);
            // A repeat is found among the values of the same text (linear in the list).
            std::unordered_map<std::string, std::vector<size_t>> by_text;
            for (const auto& item : node) {
                Value v = convert(f, item);
                std::vector<size_t>& same_text = by_text[value_text(v)];
                for (size_t prev : same_text)
                    SAE_ENFORCE(!(values[prev] == v), "{}{}: the list has {} twice", loc(full),
                                full, value_text(v));
                same_text.push_back(values.size());
                values.push_back(std::move(v));
            }
        } else {
            values.push_back(convert(f, node));
        }
        given_[idx] = std::move(values);
    }

    // The value(s) of a list-valued key: a list of lists is a sweep of them (sae.* and train.*
    // keys only); a list of scalars, a single scalar (a list of one) or nothing (the empty list)
    // is one value.
    std::vector<Value> list_values(const Field& f, const YAML::Node& node) const {
        const std::string full = f.full();
        const bool nested = node.IsSequence() && node.size() > 0 &&
                            std::any_of(node.begin(), node.end(),
                                        [](const YAML::Node& i) { return i.IsSequence(); });
        if (!nested) return {convert(f, node)};
        SAE_ENFORCE(f.sweepable(),
                    "{}{}: got a list of lists, but only sae.* and train.* keys can be swept; give "
                    "one list",
                    loc(full), full);
        std::vector<Value> values;
        for (const auto& item : node) {
            SAE_ENFORCE(item.IsSequence(),
                        "{}{}: a sweep of lists must list lists only (got '{}' among them); write "
                        "a list of one as [{}]",
                        loc(full), full, item.IsScalar() ? item.Scalar() : "a mapping",
                        item.IsScalar() ? item.Scalar() : "...");
            Value v = convert(f, item);
            for (const Value& prev : values)
                SAE_ENFORCE(!(prev == v), "{}{}: the list has {} twice", loc(full), full,
                            value_text(v));
            values.push_back(std::move(v));
        }
        return values;
    }

    Value convert(const Field& f, const YAML::Node& node) const {
        if (!is_list(f.kind)) return convert_scalar(f, f.kind, node);
        const std::string full = f.full();
        if (node.IsNull()) return f.kind == Kind::integer_list ? Value(IntList{}) : StringList{};
        if (node.IsMap())
            throw Error(fmt::format("{}{}: expected {}, got a mapping", loc(full), full,
                                    kind_name(f.kind)));
        std::vector<YAML::Node> items;
        if (node.IsSequence())
            for (const YAML::Node& item : node) items.push_back(item);
        else
            items.push_back(node);  // a scalar: a list of one
        IntList ints;
        StringList strings;
        for (const YAML::Node& item : items) {
            if (item.IsSequence())
                throw Error(fmt::format("{}{}: expected {}, got a list nested deeper", loc(full),
                                        full, kind_name(f.kind)));
            const Value v = convert_scalar(f, element_kind(f.kind), item);
            if (auto i = std::get_if<int64_t>(&v))
                ints.push_back(*i);
            else
                strings.push_back(std::get<std::string>(v));
        }
        return f.kind == Kind::integer_list ? Value(std::move(ints)) : Value(std::move(strings));
    }

    // One scalar of kind `kind` (f's, or its elements' for a list-valued key).
    Value convert_scalar(const Field& f, Kind kind, const YAML::Node& node) const {
        const std::string full = f.full();
        const std::string where = loc(full);
        const char* what = kind_name(f.kind);
        if (node.IsNull() && kind == Kind::string && f.choices.empty()) return std::string();
        if (node.IsNull())
            throw Error(
                fmt::format("{}{}: no value given; expected {}", where, full,
                            f.choices.empty() ? std::string(what) : "one of " + join(f.choices)));
        if (!node.IsScalar())
            throw Error(fmt::format("{}{}: expected {}, got a {}", where, full, what,
                                    node.IsSequence() ? "nested list" : "mapping"));
        const std::string s = node.Scalar();
        const std::string bad = fmt::format("{}{}: expected {}, got '{}'", where, full, what, s);
        switch (kind) {
            case Kind::integer: {
                int64_t v = 0;
                SAE_ENFORCE(parse_integer(s, v), "{}", bad);
                return v;
            }
            case Kind::unsigned_integer: {
                uint64_t v = 0;
                SAE_ENFORCE(!s.empty() && s[0] != '-' && parse_integer(s, v), "{}", bad);
                return v;
            }
            case Kind::number: {
                double v = 0;
                SAE_ENFORCE(parse_double(s, v), "{}", bad);
                return v;
            }
            case Kind::boolean: {
                bool v = false;
                SAE_ENFORCE(YAML::convert<bool>::decode(node, v), "{}", bad);
                return v;
            }
            case Kind::string:
            case Kind::integer_list:
            case Kind::string_list:
                break;
        }
        if (!f.choices.empty() &&
            std::find(f.choices.begin(), f.choices.end(), s) == f.choices.end()) {
            throw Error(fmt::format("{}{}: unknown value '{}'; allowed: {}", where, full, s,
                                    join(f.choices)));
        }
        return s;
    }

    Config build() const {
        Config cfg;
        cfg.source = source_;
        SaeConfig base;
        std::vector<std::pair<int, const std::vector<Value>*>> swept;  // in table order
        for (const auto& [idx, values] : given_) {
            const Field& f = fields()[static_cast<size_t>(idx)];
            if (values.size() == 1)
                f.set(cfg, base, values[0]);
            else
                swept.emplace_back(idx, &values);
        }
        size_t points = 1;
        for (const auto& s : swept) {
            points *= s.second->size();
            SAE_ENFORCE(points <= 100000, "{}: the sweep has more than 100000 points", source_);
        }
        cfg.sweep.reserve(points);
        for (size_t p = 0; p < points; ++p) {
            SaeConfig point = base;
            size_t rest = p;
            for (auto it = swept.rbegin(); it != swept.rend(); ++it) {  // last key fastest
                const auto& values = *it->second;
                fields()[static_cast<size_t>(it->first)].set(cfg, point,
                                                             values[rest % values.size()]);
                rest /= values.size();
            }
            point.normalize = cfg.data.normalize;
            point.layers = std::max<int64_t>(1, static_cast<int64_t>(cfg.data.path.size()));
            cfg.sweep.push_back(point);
        }
        cfg.sae = cfg.sweep.front();
        return cfg;
    }

    // Each key's rule in table order, the sae.* and train.* ones at every sweep point; then the
    // rules that span keys or need the architecture.
    void validate(const Config& c) const {
        for (const Field& f : fields())
            if (!f.sweepable()) enforce(f, c, c.sae);
        SAE_ENFORCE(c.parallel.mode != "data_parallel" || c.sweep.size() == 1,
                    "{}parallel.mode: data_parallel trains one SAE, but the config sweeps {} "
                    "points; use mode: sweep or hybrid, or give single values",
                    loc("parallel.mode"), c.sweep.size());
        for (const SaeConfig& s : c.sweep) {
            for (const Field& f : fields())
                if (f.sweepable()) enforce(f, c, s);
            arch_get(s.arch).validate(s, 0, loc("sae.arch"));
            // A transcoder reads paired rows, an SAE single ones: one stream cannot feed both.
            const bool transcodes = arch_get(s.arch).transcodes();
            SAE_ENFORCE(!transcodes || !c.data.target_path.empty(),
                        "{}sae.arch: {} reads an MLP's input (data.path) and its output; set "
                        "data.target_path to the output's shards, row for row with data.path",
                        loc("sae.arch"), s.arch);
            SAE_ENFORCE(transcodes || c.data.target_path.empty(),
                        "{}data.target_path is set, but sae.arch {} reconstructs its input; use "
                        "transcoder or skip_transcoder, or remove data.target_path",
                        loc("data.target_path"), s.arch);
            // A CLT reads one input and one target set per layer; everything else one of each.
            const auto sets = static_cast<int64_t>(c.data.path.size());
            if (arch_get(s.arch).layered()) {
                SAE_ENFORCE(
                    c.data.target_path.size() == c.data.path.size(),
                    "{}data.target_path lists {} dataset(s), but data.path lists {}: sae.arch "
                    "{} reads one input and one target set per layer, in layer order",
                    loc("data.target_path"), c.data.target_path.size(), sets, s.arch);
                // Each layer's sets once: a repeated one would train a layer on another's
                // activations (or a layer's output as a later one's).
                for (const auto* list : {&c.data.path, &c.data.target_path}) {
                    const std::string key = list == &c.data.path ? "data.path" : "data.target_path";
                    std::map<std::string, size_t> first;
                    for (size_t i = 0; i < list->size(); ++i) {
                        const std::string& p = (*list)[i];
                        const std::string norm =
                            p.rfind("s3://", 0) == 0
                                ? p
                                : std::filesystem::path(p).lexically_normal().string();
                        const auto [it, fresh] = first.emplace(norm.size() > 1 && norm.back() == '/'
                                                                   ? norm.substr(0, norm.size() - 1)
                                                                   : norm,
                                                               i);
                        SAE_ENFORCE(fresh,
                                    "{}{} lists '{}' for layers {} and {}: sae.arch {} reads one "
                                    "set per layer, in layer order; list each layer's once",
                                    loc(key), key, p, it->second, i, s.arch);
                    }
                }
                SAE_ENFORCE(c.data.eval_path.empty(),
                            "{}data.eval_path is not supported for sae.arch {} yet; hold out the "
                            "last rows of data.path with data.eval_rows instead",
                            loc("data.eval_path"), s.arch);
            } else {
                SAE_ENFORCE(
                    sets == 1,
                    "{}data.path lists {} datasets, but sae.arch {} reads one; only sae.arch "
                    "clt reads one per layer",
                    loc("data.path"), sets, s.arch);
                SAE_ENFORCE(c.data.target_path.size() <= 1,
                            "{}data.target_path lists {} datasets, but sae.arch {} reads one",
                            loc("data.target_path"), c.data.target_path.size(), s.arch);
            }
        }
        SAE_ENFORCE(c.data.eval_path.empty() || c.data.target_path.empty() ||
                        !c.data.eval_target_path.empty(),
                    "{}data.eval_path is set for a transcoder: set data.eval_target_path to the "
                    "held-out targets, row for row with it",
                    loc("data.eval_path"));
        SAE_ENFORCE(c.data.eval_target_path.empty() ||
                        (!c.data.eval_path.empty() && !c.data.target_path.empty()),
                    "{}data.eval_target_path needs data.eval_path and data.target_path",
                    loc("data.eval_target_path"));
    }

    void enforce(const Field& f, const Config& c, const SaeConfig& point) const {
        const std::string problem = f.problem ? f.problem(c, point) : std::string();
        if (!problem.empty()) throw Error(loc(f.full()) + problem);
    }
};

const std::vector<SaeConfig>& points_of(const Config& cfg, std::vector<SaeConfig>& scratch) {
    if (!cfg.sweep.empty()) return cfg.sweep;
    scratch = {cfg.sae};
    return scratch;
}

// A double as YAML text that reads back exactly and is a float to YAML 1.1 readers too (PyYAML
// wants a dot: "5.0", "0.0004", "1.0e-08").
std::string yaml_double(double v) {
    std::string s = compact(v);
    if (s.find_first_of(".n") != std::string::npos) return s;
    const size_t e = s.find('e');
    return e == std::string::npos ? s + ".0" : s.insert(e, ".0");
}

void emit_value(YAML::Emitter& out, const Value& v) {
    if (auto ints = std::get_if<IntList>(&v))
        out << YAML::Flow << *ints;
    else if (auto strings = std::get_if<StringList>(&v))
        out << YAML::Flow << *strings;
    else if (auto d = std::get_if<double>(&v))
        out << yaml_double(*d);
    else if (auto b = std::get_if<bool>(&v))
        out << *b;
    else if (auto s = std::get_if<std::string>(&v))
        out << *s;
    else if (auto i = std::get_if<int64_t>(&v))
        out << *i;
    else
        out << std::get<uint64_t>(v);
}

}  // namespace

// A list value in an SAE id (a directory name): its elements joined by '_' ("empty" for none).
std::string id_list_text(const Value& v) {
    std::string s;
    if (auto ints = std::get_if<IntList>(&v)) s = list_text(*ints, "_", true);
    if (auto strings = std::get_if<StringList>(&v)) s = list_text(*strings, "_", true);
    return s.empty() ? "empty" : s;
}

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

std::string SaeConfig::id(int64_t /*d_model: ids use the expansion as written*/) const {
    std::string s = arch;
    s += n_latents > 0 ? fmt::format("-n{}", n_latents) : fmt::format("-x{}", expansion);
    return s + "-" + arch_get(arch).id_suffix(*this);
}

SaeConfig SaeConfig::with_optimizer_defaults(int64_t d_model) const {
    SaeConfig c = *this;
    if (c.optimizer == "auto") c.optimizer = lr > 0 ? "adam" : arch_get(arch).default_optimizer();
    if (c.lr <= 0) {
        const auto n = static_cast<double>(resolved_latents(d_model));
        c.lr = c.optimizer == "signum"
                   ? arch_get(arch).signum_lr(kSignumLr * std::sqrt(16384.0 / n))
                   : kAdamLr;
    }
    if (c.lr_decay == "auto") c.lr_decay = c.optimizer == "signum" ? "constant" : "cosine";
    for (const auto& [key, value] : arch_get(arch).key_defaults())
        if (!c.arch_values.count(key)) c.arch_values[key] = value;
    return c;
}

std::vector<std::string> sweep_ids(const Config& cfg, int64_t d_model) {
    std::vector<SaeConfig> scratch;
    const std::vector<SaeConfig>& points = points_of(cfg, scratch);
    std::vector<std::string> ids;
    for (const SaeConfig& p : points) ids.push_back(p.id(d_model));
    // Points sharing a base id get every key whose value differs inside their group appended
    // (to each of them: a key differs for one point exactly when the group is not all one value).
    // Linear in the points: a group is found by its base id, and its keys compared once.
    std::unordered_map<std::string, std::vector<size_t>> groups;
    for (size_t i = 0; i < points.size(); ++i) groups[ids[i]].push_back(i);
    std::vector<std::string> suffixes(points.size());
    for (const auto& [base, group] : groups) {
        if (group.size() < 2) continue;
        for (const Field& f : fields()) {
            if (!f.sweepable()) continue;
            const Value first = f.get(cfg, points[group[0]]);
            bool differs = false;
            for (size_t j : group) differs = differs || !(f.get(cfg, points[j]) == first);
            if (!differs) continue;
            for (size_t i : group) {
                const Value mine = f.get(cfg, points[i]);
                const bool numeric = !std::holds_alternative<std::string>(mine) &&
                                     !std::holds_alternative<bool>(mine);
                if (is_list(f.kind))  // a path component: "-matryoshka_prefixes_128_512"
                    suffixes[i] += fmt::format("-{}_{}", f.key, id_list_text(mine));
                else
                    suffixes[i] +=
                        fmt::format("-{}{}{}", f.key, numeric ? "" : "_", value_text(mine));
            }
        }
    }
    for (size_t i = 0; i < ids.size(); ++i) ids[i] += suffixes[i];
    // Identical points (possible only in a hand-built Config) get their index.
    std::unordered_set<std::string> seen;
    for (size_t j = 0; j < ids.size(); ++j) {
        while (seen.count(ids[j])) ids[j] += fmt::format("-p{}", j);
        seen.insert(ids[j]);
    }
    return ids;
}

std::string sae_key_text(const Config& cfg, const SaeConfig& point, const std::string& key) {
    const size_t dot = key.find('.');
    const int i =
        dot == std::string::npos ? -1 : find_field(key.substr(0, dot), key.substr(dot + 1));
    SAE_ENFORCE(i >= 0 && fields()[static_cast<size_t>(i)].sweepable(),
                "sae_key_text: '{}' is not an sae.* or train.* key", key);
    return value_text(fields()[static_cast<size_t>(i)].get(cfg, point));
}

Config config_parse(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source) {
    return Parser(source).run(yaml_text, overrides);
}

Config config_load(const std::string& path, const std::vector<std::string>& overrides) {
    require_regular_file(path, "config file");
    std::ifstream in(path, std::ios::binary);
    SAE_ENFORCE(in.good(), "cannot read config file '{}': {}", path, std::strerror(errno));
    // A config is a page of YAML; a file that keeps growing is not one.
    constexpr std::streamsize kMaxConfigBytes = 4 << 20;
    std::string text(static_cast<size_t>(kMaxConfigBytes) + 1, '\0');
    in.read(text.data(), kMaxConfigBytes + 1);
    text.resize(static_cast<size_t>(in.gcount()));
    SAE_ENFORCE(static_cast<std::streamsize>(text.size()) <= kMaxConfigBytes,
                "config file {} is larger than {} MiB; a config is a short YAML file", path,
                kMaxConfigBytes >> 20);
    return config_parse(text, overrides, path);
}

std::string config_to_yaml(const Config& cfg) {
    std::vector<SaeConfig> scratch;
    const std::vector<SaeConfig>& points = points_of(cfg, scratch);
    YAML::Emitter out;
    out << YAML::BeginMap;
    std::string open;  // the section whose map is open
    for (const Field& f : fields()) {
        if (f.section != open) {
            if (!open.empty()) out << YAML::EndMap;
            open.clear();
            out << YAML::Key << f.section << YAML::Value;
            if (!f.key.empty()) {
                out << YAML::BeginMap;
                open = f.section;
            }
        }
        if (!f.key.empty()) out << YAML::Key << f.key << YAML::Value;
        // A swept key lists its distinct values in sweep order: parsing that list back
        // rebuilds the same cartesian product.
        std::vector<Value> values;
        for (const SaeConfig& p : points) {
            Value v = f.get(cfg, p);
            if (std::find(values.begin(), values.end(), v) == values.end())
                values.push_back(std::move(v));
            if (!f.sweepable()) break;
        }
        const auto* one_path = std::get_if<StringList>(&values[0]);
        if (values.size() == 1 && one_path && one_path->size() == 1 && !f.sweepable()) {
            out << one_path->front();  // data.path of one dataset, as it was always written
        } else if (values.size() == 1) {
            emit_value(out, values[0]);
        } else {
            out << YAML::Flow << YAML::BeginSeq;
            for (const Value& v : values) emit_value(out, v);
            out << YAML::EndSeq;
        }
    }
    if (!open.empty()) out << YAML::EndMap;
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
}

void config_validate_for_data(const Config& cfg, int64_t d_model) {
    SAE_ENFORCE(d_model >= 1, "{}: the data's d_model must be >= 1 (got {})", cfg.source, d_model);
    {
        // One step's rows as float32 are held in host memory whatever the backend: a batch
        // larger than the machine's memory is named here, not met as std::bad_alloc.
        const double step_bytes =
            static_cast<double>(cfg.data.batch_size) * static_cast<double>(d_model) * sizeof(float);
        const double machine = machine_memory_bytes();
        SAE_ENFORCE(machine <= 0 || step_bytes < machine,
                    "{}: data.batch_size {} x d_model {} needs {:.1f} GiB for one step's rows, "
                    "more than this machine's {:.1f} GiB of memory; lower data.batch_size",
                    cfg.source, cfg.data.batch_size, d_model, step_bytes / (1 << 30),
                    machine / (1 << 30));
    }
    std::vector<SaeConfig> scratch;
    const std::vector<SaeConfig>& points = points_of(cfg, scratch);
    for (const SaeConfig& s : points) {
        if (s.n_latents == 0)
            SAE_ENFORCE(s.expansion <= std::numeric_limits<int64_t>::max() / d_model,
                        "{}: sae.expansion {} x d_model {} overflows", cfg.source, s.expansion,
                        d_model);
        const int64_t n = s.resolved_latents(d_model);
        const std::string size =
            s.n_latents > 0 ? fmt::format("sae.n_latents = {}", s.n_latents)
                            : fmt::format("sae.expansion {} x d_model {}", s.expansion, d_model);
        arch_get(s.arch).validate(
            s, n, fmt::format("{}: SAE {} ({}): ", cfg.source, s.id(d_model), size));
    }
}

}  // namespace saetrain
