#include "saetrain/serve/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "saetrain/error.h"
#include "saetrain/serve/runs_root.h"  // defines: Fd, open_beneath, read_fd

extern char** environ;

namespace saetrain::serve {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size())
        s.replace(p, from.size(), to);
}

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// The signals a wrapper passes on to its launcher: every stop request saetrain honours, and
// those a launcher such as mpirun or srun forwards.
constexpr int kForwarded[] = {SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP};
volatile sig_atomic_t g_child = 0;

extern "C" void forward_signal(int sig) {
    const int saved = errno;
    if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
    errno = saved;
}

// Writes `text` to dir/name atomically (a temp file renamed onto it).
bool write_atomic(const std::string& dir, const std::string& name, const std::string& text) {
    const std::string tmp = dir + "/." + name + ".tmp";
    const std::string dst = dir + "/" + name;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return false;
    Fd owned(fd);
    if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return false;
    if (::fsync(fd) != 0) return false;
    return ::rename(tmp.c_str(), dst.c_str()) == 0;
}

}  // namespace

std::vector<std::string> launch_command(const std::string& tmpl, const std::string& saetrain,
                                        const std::string& config, int ranks,
                                        const std::vector<std::string>& extra) {
    const std::string t = tmpl.empty() ? (ranks > 1 ? kDefaultMultiRankLauncher : "") : tmpl;
    std::vector<std::string> argv;
    bool has_config = false, has_saetrain = false;
    std::istringstream words(t);
    for (std::string w; words >> w;) {
        if (w == "{config}") {
            has_config = true;
            argv.push_back(config);
            continue;
        }
        if (w == "{saetrain}") {
            has_saetrain = true;
            argv.push_back(saetrain);
            continue;
        }
        replace_all(w, "{ranks}", std::to_string(ranks));
        const size_t open = w.find('{');
        SAE_ENFORCE(open == std::string::npos || w.find('}', open) == std::string::npos,
                    "--launcher '{}': unknown placeholder in '{}' (known: {{ranks}}, {{saetrain}}, "
                    "{{config}})",
                    printable(t), printable(w));
        argv.push_back(w);
    }
    if (!has_config) {
        if (!has_saetrain) argv.push_back(saetrain);
        argv.push_back(config);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
}

pid_t launch_spawn(const std::string& self, const std::string& state_dir,
                   const std::vector<std::string>& argv, const std::string& cwd,
                   const std::vector<std::string>& env) {
    std::vector<std::string> args = {self, "--run-wrapper", state_dir, "--"};
    args.insert(args.end(), argv.begin(), argv.end());
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);

    // The server's environment, with `env` replacing variables of the same name.
    std::vector<std::string> envs;
    auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string kv = *e;
        bool replaced = false;
        for (const std::string& mine : env) replaced = replaced || name_of(mine) == name_of(kv);
        if (!replaced) envs.push_back(kv);
    }
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> cenv;
    for (std::string& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);

    const std::string log = state_dir + "/console.log";
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
    // The server's sockets and files stay with the server (a restarted server can bind its port
    // while the runs it launched go on).
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, self.c_str(), &fa, &attr, cargs.data(), cenv.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    SAE_ENFORCE(rc == 0, "cannot start {} (the run wrapper) in {}: {}", printable(self),
                printable(cwd), std::strerror(rc));
    return pid;
}

int wrapper_main(const std::string& state_dir, const std::vector<std::string>& argv) {
    if (argv.empty()) {
        std::fprintf(stderr, "sae-serve: error: --run-wrapper: no command after --\n");
        return 2;
    }
    sigset_t block, old;
    sigemptyset(&block);
    for (int s : kForwarded) sigaddset(&block, s);
    // Blocked until the child's pid is known, so that no stop request is lost in between.
    sigprocmask(SIG_BLOCK, &block, &old);
    std::vector<std::string> args = argv;
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::fprintf(stderr, "sae-serve: %s: starting:", utc_now().c_str());
    for (const std::string& a : argv) std::fprintf(stderr, " %s", printable(a).c_str());
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    const pid_t child = ::fork();
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &old, nullptr);
        ::execvp(cargs[0], cargs.data());
        std::fprintf(stderr, "sae-serve: error: cannot start %s: %s\n", printable(argv[0]).c_str(),
                     std::strerror(errno));
        _exit(127);
    }
    int code = 127;
    if (child > 0) {
        g_child = child;
        struct sigaction sa {};
        sa.sa_handler = forward_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        for (int s : kForwarded) sigaction(s, &sa, nullptr);
        sigprocmask(SIG_SETMASK, &old, nullptr);
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else {
        std::fprintf(stderr, "sae-serve: error: fork: %s\n", std::strerror(errno));
    }
    nlohmann::ordered_json j;
    j["exit_code"] = code;
    j["ended"] = utc_now();
    if (!write_atomic(state_dir, "exit", j.dump() + "\n"))
        std::fprintf(stderr, "sae-serve: warning: cannot write %s/exit: %s\n", state_dir.c_str(),
                     std::strerror(errno));
    std::fprintf(stderr, "sae-serve: %s: the run's command exited with code %d\n",
                 utc_now().c_str(), code);
    return code;
}

std::optional<int> wrapper_exit_code(int state_dir_fd) {
    std::string why;
    Fd fd = open_beneath(state_dir_fd, "exit", false, &why);
    if (!fd.valid()) return std::nullopt;
    const std::optional<std::string> text = read_fd(fd.get(), 4096, &why);
    if (!text) return std::nullopt;
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_object() || !j.contains("exit_code") || !j["exit_code"].is_number_integer())
        return std::nullopt;
    return j["exit_code"].get<int>();
}

// ---- processes ---------------------------------------------------------------------------------

namespace {
// /proc/PID/stat's state letter and start time; false when there is no such process.
bool proc_stat(pid_t pid, char* state, uint64_t* start) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(in)), {});
    // comm may hold spaces and parentheses: the fields after it follow the last ')'.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream rest(text.substr(close + 1));
    std::string field;
    rest >> *state;
    // Fields 4..21, then 22 (starttime): 18 fields to skip after the state (field 3).
    for (int i = 0; i < 18 && rest >> field; ++i) {
    }
    return static_cast<bool>(rest >> *start);
}
}  // namespace

uint64_t process_start_time(pid_t pid) {
    char state = 0;
    uint64_t start = 0;
    return pid > 0 && proc_stat(pid, &state, &start) ? start : 0;
}

bool process_alive(pid_t pid, uint64_t start_time) {
    if (pid <= 0) return false;
    char state = 0;
    uint64_t start = 0;
    if (!proc_stat(pid, &state, &start)) return false;
    if (state == 'Z' || state == 'X') return false;
    return start_time == 0 || start == start_time;
}

std::string process_name(pid_t pid) {
    std::ifstream in(fmt::format("/proc/{}/comm", pid));
    std::string name;
    std::getline(in, name);
    return name;
}

bool locks_text_has_flock(const std::string& locks, pid_t pid, dev_t dev, ino_t ino) {
    // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (a waiter's line has "->" after "1:").
    std::istringstream lines(locks);
    for (std::string line; std::getline(lines, line);) {
        std::istringstream f(line);
        std::string n, kind, mode, access, dev_ino;
        long long holder = 0;
        if (!(f >> n >> kind) || kind != "FLOCK") continue;
        if (!(f >> mode >> access >> holder >> dev_ino) || holder != pid) continue;
        unsigned maj = 0, min = 0;
        unsigned long long inode = 0;
        if (std::sscanf(dev_ino.c_str(), "%x:%x:%llu", &maj, &min, &inode) != 3) continue;
        if (inode == static_cast<unsigned long long>(ino) && maj == major(dev) && min == minor(dev))
            return true;
    }
    return false;
}

bool process_holds_flock(pid_t pid, int dir_fd, const std::string& name) {
    if (pid <= 0) return false;
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
        return false;
    std::ifstream in("/proc/locks");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    return locks_text_has_flock(text, pid, st.st_dev, st.st_ino);
}

int signal_from_name(const std::string& name) {
    std::string n = name;
    if (n.rfind("SIG", 0) == 0) n = n.substr(3);
    static const std::pair<const char*, int> kNames[] = {
        {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT}, {"HUP", SIGHUP}};
    for (const auto& [s, v] : kNames)
        if (n == s) return v;
    SAE_ENFORCE(false, "--stop-signal {}: not one of TERM, USR1, USR2, INT, HUP", printable(name));
    return 0;
}

std::string signal_name(int sig) {
    const char* abbrev = sigabbrev_np(sig);
    return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

}  // namespace saetrain::serve
