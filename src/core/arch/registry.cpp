// registry.cpp — the one list of architectures.
#include <algorithm>

#include "common.h"
#include "saetrain/error.h"

namespace saetrain {

std::string default_arch_name() { return kDefaultArch; }

const std::vector<const Architecture*>& architectures() {
    static const std::vector<const Architecture*> all = {
        &arch::relu_arch(),
        &arch::topk_arch(),
        &arch::batchtopk_arch(),
        &arch::jumprelu_arch(),
        &arch::gated_arch(),
        &arch::switch_arch(),
        &arch::matryoshka_batchtopk_arch(),
        &arch::transcoder_arch(),
        &arch::skip_transcoder_arch(),
        &arch::clt_arch(),
    };
    return all;
}

std::vector<std::string> arch_names() {
    std::vector<std::string> names;
    for (const Architecture* a : architectures()) names.emplace_back(a->name());
    return names;
}

std::vector<const ArchKeyDecl*> arch_config_keys() {
    std::vector<const ArchKeyDecl*> keys;
    for (const Architecture* a : architectures())
        for (const ArchKeyDecl* k : a->config_keys())
            if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    return keys;
}

std::vector<std::string> arch_summary_keys() {
    std::vector<std::string> keys;
    for (const Architecture* a : architectures())
        for (const std::string& k : a->summary_keys())
            if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    return keys;
}

std::vector<const ArchOpSet*> arch_op_sets() {
    std::vector<const ArchOpSet*> sets;
    for (const Architecture* a : architectures())
        for (const ArchOpSet* s : a->op_sets())
            if (std::find(sets.begin(), sets.end(), s) == sets.end()) sets.push_back(s);
    return sets;
}

const Architecture* arch_find(const std::string& name) {
    for (const Architecture* a : architectures())
        if (name == a->name()) return a;
    return nullptr;
}

const Architecture& arch_get(const std::string& name) {
    if (const Architecture* a = arch_find(name)) return *a;
    std::string known;
    for (const std::string& n : arch_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(fmt::format("unknown SAE architecture '{}'; known: {}", name, known));
}

void Architecture::validate(const SaeConfig&, int64_t, const std::string&) const {}

void arch_check_backend(const SaeConfig& cfg, int64_t d, int64_t n, Backend& be) {
    const Architecture& arch = arch_get(cfg.arch);
    for (const ArchOpSet* set : arch.op_sets()) {
        try {
            require_arch_ops(be, *set);
        } catch (const Error& e) {
            // A set it shares with another architecture (Matryoshka BatchTopK runs BatchTopK's)
            // is named by that one: the line names the architecture asked for.
            const std::string prefix = "sae.arch = " + set->name + ":";
            const std::string m = e.what();
            if (set->name == cfg.arch || m.rfind(prefix, 0) != 0) throw;
            throw Error("sae.arch = " + cfg.arch + ":" + m.substr(prefix.size()));
        }
    }
    for (const Architecture::OpUse& use : arch.limited_ops(cfg, d, n)) {
        std::string why;
        SAE_ENFORCE(be.supports(use.op, use.shape, &why),
                    "{} = {}: the {} backend cannot train this {} SAE: {}; lower {}", use.key,
                    use.shape.k, be.name(), cfg.arch, why, use.key);
    }
}

void ArchPass::set_buffer(const std::string& name, const std::vector<float>&) {
    throw Error(fmt::format("this architecture keeps no tensor called '{}'", name));
}

}  // namespace saetrain
