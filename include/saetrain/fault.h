// fault.h — the fault-injection hook of tests and tools/fault-matrix.sh (SAETRAIN_FAULT).
#pragma once

#include <cstdint>

namespace saetrain {

// Test hook: SAETRAIN_FAULT="rank:when[:action[:phase]]" makes that rank throw (action `error`,
// the default) or send itself a signal (TERM, USR1, INT, KILL, STOP; INTx2: SIGINT twice, 0.3 s
// apart, as a user pressing Ctrl-C twice), so tests of failures and signals land where they mean to
// by construction, not by racing the clock (test_cli, test_resume, tools/fault-matrix.sh). `when`
// is a loop iteration, `startup` (during set-up, while the other ranks wait in the start-up
// agreement) or `connect` (before the communicators are made, while the other ranks wait in
// their first split). Phase `step` (the default) fires at the start of that iteration;
// `checkpoint` inside the checkpoint taken after that many iterations: a rank that writes files
// (an SAE's replica 0) dies halfway through its weights temp file (KILL only, through
// SAETRAIN_FAULT_KILL_IN_WRITE, see atomic_file.cpp), any other rank on entering the
// checkpoint's collectives; `written` right after that checkpoint's write is done: at the start of
// the iteration after it the rank waits for its background write to finish, and it fires at the
// start of the next one, when every rank has agreed (in between) that nothing is being written:
// a checkpoint committed at the next step is on disk then, one committed only when the next
// checkpoint starts is not. Unset in normal runs.
struct Fault {
    static constexpr int64_t kStartup = -2;
    static constexpr int64_t kConnect = -3;
    int rank = -1;
    int64_t iteration = -1;
    int signal = 0;  // 0: throw
    int repeat = 1;  // times the signal is raised (INTx2: 2)
    bool at_checkpoint = false;
    bool after_write = false;  // phase `written`
    bool fires(int r, int64_t iter, bool checkpoint) const {
        return rank == r && iteration == iter && at_checkpoint == checkpoint && !after_write;
    }
    // Phase `written`: true on that rank from the iteration of the checkpoint on; the caller waits
    // there for the write and fires at the next iteration.
    bool watches_write(int r, int64_t iter) const {
        return after_write && rank == r && iter >= iteration;
    }
    // Raises the signal, or throws saetrain::Error naming the iteration (or start-up, connect).
    void fire(int64_t iter) const;
};
// The fault SAETRAIN_FAULT describes (none when unset); throws Error on a malformed value.
Fault fault_from_env();

}  // namespace saetrain
