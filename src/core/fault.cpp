// SAETRAIN_FAULT: parse it, and fire where it says (fault.h).
#include "saetrain/fault.h"

#include <fmt/format.h>
#include <time.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "saetrain/error.h"

namespace saetrain {

void Fault::fire(int64_t iter) const {
    if (signal != 0) {
        // The wall-clock time of the signal, for tools/fault-matrix.sh's time to exit.
        timespec now{};
        ::clock_gettime(CLOCK_REALTIME, &now);
        const std::string where = iter == kStartup   ? "start-up"
                                  : iter == kConnect ? "connect"
                                                     : fmt::format("iteration {}", iter);
        std::fprintf(stderr, "saetrain: SAETRAIN_FAULT: rank %d raises signal %d (%s) at %.3f\n",
                     rank, signal, where.c_str(),
                     static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec));
        std::fflush(stderr);
        for (int i = 0; i < repeat; ++i) {
            // INTx2: two presses 0.3 s apart (one Ctrl-C passed on twice arrives closer).
            if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
            std::raise(signal);
        }
        return;
    }
    if (iter == kStartup) throw Error("injected fault during start-up (SAETRAIN_FAULT)");
    if (iter == kConnect) throw Error("injected fault while connecting (SAETRAIN_FAULT)");
    throw Error(fmt::format("injected fault at iteration {} (SAETRAIN_FAULT)", iter));
}

Fault fault_from_env() {
    Fault f;
    const char* v = std::getenv("SAETRAIN_FAULT");
    if (!v) return f;
    char when[16] = "", action[16] = "error", phase[16] = "step";
    const int got = std::sscanf(v, "%d:%15[^:]:%15[^:]:%15s", &f.rank, when, action, phase);
    const std::map<std::string, int> signals = {
        {"error", 0},      {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"INT", SIGINT},
        {"INTx2", SIGINT}, {"KILL", SIGKILL}, {"STOP", SIGSTOP}};
    const auto it = signals.find(action);
    char* end = nullptr;
    f.iteration = std::string(when) == "startup"   ? Fault::kStartup
                  : std::string(when) == "connect" ? Fault::kConnect
                                                   : std::strtoll(when, &end, 10);
    SAE_ENFORCE(
        got >= 2 && it != signals.end() && (end == nullptr || (*end == 0 && end != when)) &&
            (std::string(phase) == "step" || std::string(phase) == "checkpoint" ||
             std::string(phase) == "written"),
        "SAETRAIN_FAULT='{}': expected rank:iteration|startup|connect[:error|TERM|USR1|INT|INTx2|"
        "KILL|STOP[:step|checkpoint|written]]",
        v);
    f.signal = it->second;
    f.repeat = std::string(action) == "INTx2" ? 2 : 1;
    f.at_checkpoint = std::string(phase) == "checkpoint";
    f.after_write = std::string(phase) == "written";
    return f;
}

}  // namespace saetrain
