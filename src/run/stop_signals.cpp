#include "saetrain/stop_signals.h"

#include <fcntl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>

namespace saetrain {
namespace {

std::atomic<int> g_stop_signal{0};             // the first stop signal, 0: none
std::atomic<int> g_interrupts{0};              // Ctrl-Cs so far
std::atomic<int64_t> g_first_interrupt_ns{0};  // CLOCK_MONOTONIC of the first
std::atomic<int> g_rank{-1};  // -1: not known yet (before MPI), acknowledges like rank 0
// The newest committed step: -2 before training starts, -1 none committed yet.
std::atomic<int64_t> g_committed{-2};
char g_checkpoints_dir[1024] = "";  // set once, before g_committed leaves -2

// Appends `s` to buf[0, cap), keeping room for the terminating newline.
void append(char* buf, size_t cap, size_t& n, const char* s) {
    for (; *s && n + 1 < cap; ++s) buf[n++] = *s;
}
void append_int(char* buf, size_t cap, size_t& n, int64_t v) {
    char digits[24];
    int k = 0;
    do {
        digits[k++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v > 0 && k < 23);
    while (k > 0 && n + 1 < cap) buf[n++] = digits[--k];
}
void write_all(const char* buf, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(STDERR_FILENO, buf, n);
        if (w <= 0) return;
        buf += w, n -= static_cast<size_t>(w);
    }
}

// The second SIGINT: says what is kept, then dies of SIGINT (the shell's convention for Ctrl-C).
[[noreturn]] void stop_at_once() {
    char line[1400];
    size_t n = 0;
    const size_t cap = sizeof(line);
    append(line, cap, n, "saetrain: interrupted again: stopped at once; ");
    const int64_t committed = g_committed.load();
    if (committed == -2) {
        append(line, cap, n,
               "training had not started, run.out_dir's committed checkpoints are as they were");
    } else if (committed < 0) {
        append(line, cap, n,
               "no checkpoint was committed yet, so the same command starts from the beginning");
    } else {
        append(line, cap, n, "kept: the checkpoint at step ");
        append_int(line, cap, n, committed);
        append(line, cap, n, " in ");
        append(line, cap, n, g_checkpoints_dir);
        append(line, cap, n, "; the same command continues from it");
    }
    line[n++] = '\n';
    write_all(line, n);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, SIGINT);
    sigprocmask(SIG_UNBLOCK, &only, nullptr);  // blocked while its handler runs
    raise(SIGINT);
    _exit(130);  // not reached: SIGINT's default action ends the process
}

// Open MPI's mpirun gives each rank a pty for stdout and, at a Ctrl-C, stops reading it, sends
// SIGTERM and a second later SIGKILL (odls_base_sigkill_timeout): rank 0, blocked writing a
// console line into the full pty, never reached its stop (seen: the job killed with no stop
// checkpoint). So at SIGTERM or SIGINT a stdout that is a terminal but not this process's
// controlling one (a launcher's pty; a user's terminal is the controlling one) is pointed at
// /dev/null: the blocked write, restarted after this handler, completes there. Lines written to
// it after a stop would not have been shown anyway; stderr (the stop line) is a pipe.
void release_launcher_pty() {
    termios t{};
    if (tcgetattr(STDOUT_FILENO, &t) != 0 || tcgetpgrp(STDOUT_FILENO) != -1) return;
    const int fd = open("/dev/null", O_WRONLY);
    if (fd < 0) return;
    dup2(fd, STDOUT_FILENO);
    close(fd);
}

int64_t monotonic_ns() {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

// A SIGINT that follows the first by less than this is the same Ctrl-C passed on by a wrapper in
// the terminal's process group (GNU timeout forwards the SIGINT it gets to its command, which got
// one from the terminal too), not a second press: no one presses Ctrl-C twice in 0.1 s.
constexpr int64_t kSameCtrlCNs = 100'000'000;

extern "C" void on_stop_signal(int sig) {
    if (sig == SIGINT) {
        const int64_t now = monotonic_ns();
        if (g_interrupts.fetch_add(1) == 0) {
            g_first_interrupt_ns.store(now);
        } else {
            // 0: the first one's handler (another thread) has not stored its time yet.
            const int64_t first = g_first_interrupt_ns.load();
            if (first != 0 && now - first >= kSameCtrlCNs) stop_at_once();
            return;  // the first one, passed on
        }
    }
    int none = 0;
    g_stop_signal.compare_exchange_strong(none, sig);
    if (sig != SIGUSR1) release_launcher_pty();
    if (sig == SIGINT && g_rank.load() <= 0) {
        static const char ack[] =
            "saetrain: interrupted: stopping after this step and committing a checkpoint; "
            "Ctrl-C again stops at once, keeping the last committed one\n";
        static const char ack_start[] =
            "saetrain: interrupted during start-up: stopping before the first step\n";
        if (g_committed.load() == -2)
            write_all(ack_start, sizeof(ack_start) - 1);
        else
            write_all(ack, sizeof(ack) - 1);
    }
}

}  // namespace

void stop_signals_install() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // reads and writes under way go on; the flag is read per step
    for (const int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

bool stop_signal_received() { return g_stop_signal.load() != 0; }

bool stop_signal_before_training() { return stop_signal_received() && g_committed.load() == -2; }

void stop_signals_set_rank(int rank) { g_rank.store(rank); }

void stop_signals_training(const std::string& checkpoints_dir, int64_t committed) {
    if (g_committed.load() == -2) {  // the directory is written once, before the handler reads it
        const size_t n = std::min(checkpoints_dir.size(), sizeof(g_checkpoints_dir) - 1);
        std::memcpy(g_checkpoints_dir, checkpoints_dir.data(), n);
        g_checkpoints_dir[n] = '\0';
    }
    g_committed.store(committed < 0 ? -1 : committed);
}

void stop_signals_committed(int64_t step) { g_committed.store(step); }

}  // namespace saetrain
