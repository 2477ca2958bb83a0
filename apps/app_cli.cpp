#include "app_cli.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "saetrain/build_commit.h"  // defines: SAETRAIN_GIT_COMMIT
#include "saetrain/build_config.h"  // defines: SAETRAIN_VERSION, SAETRAIN_CUDA, SAETRAIN_NCCL, ...

namespace saetrain {
namespace {
const char* on_off(int flag) { return flag ? "on" : "off"; }
}  // namespace

std::string version_text(const std::string& program) {
    return fmt::format("{} {} (git {})\nbuild: {}, CUDA {}, NCCL {}, native {}", program,
                       SAETRAIN_VERSION, SAETRAIN_GIT_COMMIT, SAETRAIN_BUILD_TYPE,
                       on_off(SAETRAIN_CUDA), on_off(SAETRAIN_NCCL), on_off(SAETRAIN_NATIVE));
}

int cli_parse(CLI::App& app, const std::string& program, const std::string& usage, int argc,
              char** argv) {
    app.set_version_flag("--version", version_text(program),
                         "print the version, the git commit and the build options");
    try {
        app.parse(argc, argv);
        // The README check (tools/check-readme.py): the command line parses; nothing runs.
        const char* parse_only = std::getenv("SAETRAIN_PARSE_ONLY");
        if (parse_only != nullptr && std::string(parse_only) == "1") return 0;
        return -1;
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::Success& e) {  // an option that did its work (saetrain --list-keys)
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "%s: error: %s\nusage: %s (--help for every option)\n",
                     program.c_str(), e.what(), usage.c_str());
        return kExitUsage;
    }
}

}  // namespace saetrain
