// config_table.h — the table of config keys (config_keys.cpp) as the parser, the emitter and
// the public API (config.cpp) read it: each key's section, name, kind, allowed values, the
// struct member it fills, its doc line, the rule its value must meet and whether it changes
// results. Private to src/core.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "saetrain/config.h"

namespace saetrain::config_table {

using Value = ConfigValue;
enum class Kind { integer, unsigned_integer, number, boolean, string, integer_list, string_list };

inline bool is_list(Kind k) { return k == Kind::integer_list || k == Kind::string_list; }
// The kind of a list's elements.
inline Kind element_kind(Kind k) {
    return k == Kind::integer_list ? Kind::integer : k == Kind::string_list ? Kind::string : k;
}
// "an integer", "a list of strings", ...: what a message says a key expects.
const char* kind_name(Kind k);

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

// Shortest text that reads back as the same double ("5", "0.5", "0.001", "1e-05").
std::string compact(double v);

// A list as "[a, b]" (elements joined by `sep` between the brackets, or bare when `bare`).
template <class T>
std::string list_text(const std::vector<T>& list, const char* sep = ", ", bool bare = false) {
    std::string out = bare ? "" : "[";
    for (size_t i = 0; i < list.size(); ++i) out += (i ? sep : "") + fmt::format("{}", list[i]);
    return bare ? out : out + "]";
}

// A value as config.yaml and the messages write it.
std::string value_text(const Value& v);

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

// Every key, in table order: emission order and sweep order (sae keys, then train keys, last
// fastest).
const std::vector<Field>& fields();
// The index of section.key in fields(), or -1.
int find_field(const std::string& section, const std::string& key);
// The top-level sections, in config.yaml's order.
extern const std::vector<std::string> kSections;
bool is_section(const std::string& name);
std::string join(const std::vector<std::string>& v, const char* sep = ", ");
// For an unknown top-level name: a section typo (`trian`), or a key written outside its section
// (`lr` -> `train.lr`); empty when nothing is close.
std::string suggest_section(const std::string& name);
// The keys of `section`, joined for a message.
std::string section_keys(const std::string& section);
// "unknown key 'train.k' (did you mean sae.k?)", with the section's keys when nothing is close.
std::string unknown_key_message(const std::string& section, const std::string& key);
// "unknown section 'trian' (did you mean train?); sections are ...".
std::string unknown_section_message(const std::string& name);

}  // namespace saetrain::config_table
