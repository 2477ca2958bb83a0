// The backends this build has, and the choice among them (backend_registry.h).
#include "saetrain/backend_registry.h"

#include <fmt/format.h>

#include "saetrain/build_config.h"  // defines: SAETRAIN_HAS_CUDA
#include "saetrain/error.h"

namespace saetrain {

const std::vector<const BackendKind*>& backend_kinds() {
    static const std::vector<const BackendKind*> kinds = {
#if SAETRAIN_HAS_CUDA
        &cuda_backend_kind(),
#endif
        &cpu_backend_kind(),
    };
    return kinds;
}

std::unique_ptr<Backend> make_backend(const BackendRequest& request, std::string* note) {
    const std::vector<const BackendKind*>& kinds = backend_kinds();
    const bool automatic = request.choice == "auto";
    std::string passed_over;  // kinds auto prefers that have no device here
    for (const BackendKind* kind : kinds) {
        if (!automatic && kind->name != request.choice) continue;
        const bool has_device = kind->devices() > 0;
        SAE_ENFORCE(automatic || has_device, "backend: {}, but {}", kind->name,
                    kind->no_device_hint);
        if (!has_device) {
            passed_over += (passed_over.empty() ? "" : ", ") + kind->label;
            continue;
        }
        if (automatic) {
            *note = "auto -> " + kind->name;
            if (!passed_over.empty())
                *note += " (no " + passed_over + " device visible)";
            else if (kinds.size() == 1)
                *note += " (built without a GPU backend)";
        }
        return kind->create(request, note);
    }
    throw Error(fmt::format(
        "backend: {} requested but this build has no {} backend (reconfigure with cmake "
        "--preset {}, or set backend: cpu)",
        request.choice, request.choice == "cuda" ? "CUDA" : request.choice, request.choice));
}

}  // namespace saetrain
