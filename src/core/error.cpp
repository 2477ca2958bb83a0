#include "saetrain/error.h"

#include <unistd.h>

namespace saetrain {

[[noreturn]] void throw_check_failure(const char* lib, const char* stmt, const std::string& detail,
                                      const char* file, int line) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::string msg = fmt::format("{} call failed: {}", lib, stmt);
    if (!detail.empty()) msg += fmt::format(" ({})", detail);
    msg += fmt::format(" at {}:{} on {}", file, line, host);
    throw Error(msg);
}

}  // namespace saetrain
