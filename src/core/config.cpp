// config.cpp — YAML in, typed structs out: overrides, unknown-key suggestions, type and value
// checks, sweep expansion, readable SAE ids and the resolved YAML written back out.
//
// Every key lives in one table (config_table.h, filled in config_keys.cpp); the parser, the
// sweep expansion and the emitter here walk it.
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

#include "config_table.h"
#include "saetrain/arch.h"
#include "saetrain/error.h"
#include "saetrain/host_alloc.h"  // defines: machine_memory_bytes

namespace saetrain {

using namespace config_table;

namespace {

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
            point.layers = cfg.data.layers > 0
                               ? cfg.data.layers
                               : std::max<int64_t>(1, static_cast<int64_t>(cfg.data.path.size()));
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
            const RowSpec rows = arch_get(s.arch).rows();
            const bool transcodes = rows.target;
            // A CLT's one data.path with no data.target_path: a multi-layer paired set, whose
            // shards hold both sides (`inputs` and `targets` [rows, L, d]).
            const bool layer_pairs = multi_layer_paired(c);
            SAE_ENFORCE(!transcodes || layer_pairs || !c.data.target_path.empty(),
                        "{}sae.arch: {} reads an MLP's input (data.path) and its output; set "
                        "data.target_path to the output's shards, row for row with data.path",
                        loc("sae.arch"), s.arch);
            SAE_ENFORCE(transcodes || c.data.target_path.empty(),
                        "{}data.target_path is set, but sae.arch {} reconstructs its input; use "
                        "transcoder or skip_transcoder, or remove data.target_path",
                        loc("data.target_path"), s.arch);
            // A CLT reads one input and one target set per layer; everything else one of each.
            const auto sets = static_cast<int64_t>(c.data.path.size());
            if (rows.per_layer) {
                SAE_ENFORCE(c.data.layers == 0 || layer_pairs || c.data.layers == sets,
                            "{}data.layers is {}, but data.path lists {} dataset(s), one a layer; "
                            "set it to {} or leave it 0 (counted from the data)",
                            loc("data.layers"), c.data.layers, sets, sets);
                SAE_ENFORCE(
                    layer_pairs || c.data.target_path.size() == c.data.path.size(),
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
                // Held-out shards of their own: one multi-layer paired set ('inputs' and
                // 'targets' [rows, L, d]; start-up checks its layers and width).
                SAE_ENFORCE(c.data.eval_target_path.empty(),
                            "{}data.eval_target_path is set, but sae.arch {} reads its held-out "
                            "targets from data.eval_path, one multi-layer paired set ('inputs' "
                            "and 'targets' [rows, layers, d_model]: tools/extract_activations.py "
                            "--layer-pairs); remove data.eval_target_path",
                            loc("data.eval_target_path"), s.arch);
            } else {
                SAE_ENFORCE(c.data.layers == 0,
                            "{}data.layers is {}, but sae.arch {} reads no layers; only sae.arch "
                            "clt does (leave data.layers 0)",
                            loc("data.layers"), c.data.layers, s.arch);
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
                        !c.data.eval_target_path.empty() || arch_get(c.sae.arch).rows().per_layer,
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

bool multi_layer_paired(const Config& cfg) {
    const Architecture* a = arch_find(cfg.sae.arch);
    return a && a->rows().per_layer && cfg.data.path.size() == 1 && cfg.data.target_path.empty();
}

std::vector<std::string> input_dataset_names(const Config& cfg) {
    if (multi_layer_paired(cfg)) return {"inputs", "targets"};
    return {cfg.data.dataset};
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
