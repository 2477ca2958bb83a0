// saetrain — train sparse autoencoders on cached activations.
//
//   saetrain CONFIG.yaml [--set key=value ...]      (mpirun/srun: one rank per device)
//   saetrain --list-keys                           (every config key, its default and doc)
//
// Reads top-down: parse the command line (--version, --help, --list-keys and --dry-run need no
// MPI), check the resource limits, choose how waits share the cores, install the stop signals,
// start MPI, and run (run.h: start up, connect, resume or start fresh, train, write the
// outputs). A failure after start-up aborts the whole job so no rank is left waiting.
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "app_cli.h"             // defines: cli_parse (--version, usage errors: exit 2)
#include "saetrain/config.h"     // defines: config_keys
#include "saetrain/cores.h"      // defines: exec_with_run_environment, yield_mpi_waits_when_crowded
#include "saetrain/error.h"      // defines: printable
#include "saetrain/mpi_world.h"  // defines: MpiScope, make_mpi_world, world_abort
#include "saetrain/run.h"        // defines: run_training, run_dry, kExitStopped
#include "saetrain/s3.h"         // defines: s3_set_stop_check
#include "saetrain/stop_signals.h"  // defines: stop_signals_install (SIGTERM, SIGUSR1, Ctrl-C)

using namespace saetrain;

namespace {

// --list-keys: every key from its declaration (config_keys), in config.yaml's order.
void print_keys() {
    fmt::print("{:<36} {:<14} {:<7} {}\n", "key", "default", "resume", "what it sets");
    for (const ConfigKeyInfo& k : config_keys()) {
        std::string doc = k.doc;
        if (!k.declared_by.empty()) doc += " [" + k.declared_by + "]";
        fmt::print("{:<36} {:<14} {:<7} {}\n", k.name,
                   k.default_text.empty() ? "\"\"" : k.default_text,
                   k.changes_results ? "same" : "any", doc);
    }
    fmt::print(
        "\nresume: \"same\" keys must keep their value for a run to resume (or "
        "--allow-config-change); [...]: the architectures that read the key\n");
}

}  // namespace

// Resource limits too low for MPI, OpenMP and OpenBLAS to start, found before they start: under
// them MPI_Init segfaults or spins and libgomp fails to create threads, with no line of ours.
// Measured on the 2-core VM (1 rank, 2 threads): MPI start-up opens about 30 files and the
// process needs 0.8 GiB of address space; the floors leave room for shards and more threads.
// "" when the limits are fine.
static std::string limits_too_low() {
    constexpr rlim_t kMinFiles = 64;
    constexpr rlim_t kMinAddressSpace = rlim_t{1} << 30;
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < kMinFiles)
        return fmt::format(
            "the open-file limit (ulimit -n) is {}; MPI's start-up alone opens about 30 files and "
            "each rank reads shards beside them: raise it to at least {} (ulimit -n 1024)",
            r.rlim_cur, kMinFiles);
    if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY &&
        r.rlim_cur < kMinAddressSpace)
        return fmt::format(
            "the address-space limit (ulimit -v) is {} MiB; MPI, OpenMP and OpenBLAS need about "
            "0.8 GiB to start, before any data: raise it to at least {} MiB (ulimit -v unlimited)",
            r.rlim_cur >> 20, kMinAddressSpace >> 20);
    return "";
}

int main(int argc, char** argv) {
    RunRequest args;
    bool dry_run = false;
    int dry_run_ranks = 0;  // --dry-run's job size (0: the one the config asks for)
    CLI::App app{"saetrain: train sparse autoencoders on cached activations"};
    app.add_option("CONFIG", args.config, "YAML config file")->required();
    app.add_option("--set", args.sets, "override a config key: section.key=value (repeatable)");
    app.add_flag("--overwrite", args.overwrite,
                 "start over: replace the run in run.out_dir instead of resuming it");
    app.add_flag("--allow-config-change", args.allow_config_change,
                 "resume even though the config changed in keys that change the result");
    // Bounded: OpenMP and OpenBLAS make every thread asked for (100,000 ended in a segmentation
    // fault); 1024 is beyond any node's cores per rank. A word that is no number is left to the
    // conversion, whose message says so.
    app.add_option("--threads", args.threads,
                   "CPU threads per rank, at most 1024 (default: the rank's cores / ranks on its "
                   "node); fewer while other processes take its cores, unless --fixed-threads")
        ->check(CLI::Validator(
            [](std::string& value) -> std::string {
                long long n = 0;
                std::size_t used = 0;
                try {
                    n = std::stoll(value, &used);
                } catch (const std::exception&) {
                    return "";
                }
                if (used != value.size() || (n >= 0 && n <= 1024)) return "";
                return "Value " + value + " not in range 0 to 1024";
            },
            "0-1024"));
    app.add_flag("--fixed-threads", args.fixed_threads,
                 "run every step on --threads' count, even while other processes take the "
                 "rank's cores (by default a rank runs on the cores they leave it)");
    app.add_flag("--dry-run", dry_run,
                 "check the config, its --set overrides and the job size, say what would be "
                 "trained, and exit (no MPI, data or out_dir)");
    app.add_option("--ranks", dry_run_ranks, "with --dry-run: the job's rank count to check")
        ->check(CLI::PositiveNumber);
    app.add_flag_callback(
        "--list-keys",
        [] {
            print_keys();
            throw CLI::Success();
        },
        "print every config key with its default and doc, then exit");
    // Before MPI starts: --version, --help, --list-keys and a usage error need no MPI.
    if (const int code = cli_parse(app, "saetrain",
                                   "saetrain CONFIG.yaml [--set key=value ...] [--overwrite] "
                                   "[--allow-config-change] [--threads N] [--fixed-threads] "
                                   "[--dry-run [--ranks N]] "
                                   "| --list-keys",
                                   argc, argv);
        code >= 0)
        return code;
    if (dry_run) return run_dry(args, dry_run_ranks);
    if (const std::string low = limits_too_low(); !low.empty()) {
        std::fprintf(stderr, "saetrain: error: %s\n", low.c_str());
        return 1;
    }
    exec_with_run_environment(argv);
    if (yield_mpi_waits_when_crowded(args.threads)) ::setenv("SAETRAIN_YIELD_SET", "1", 1);
    // From here on a stop signal is a request: honoured at the first iteration if it arrives
    // during start-up, MPI's included (the default action would end the rank with the signal's
    // status, which Slurm does not requeue, and leave its peers waiting).
    stop_signals_install();
    // Test hook: SAETRAIN_FAULT_SIGNAL_BEFORE_MPI=TERM|INT|USR1 raises it here, before MPI starts.
    if (const char* f = std::getenv("SAETRAIN_FAULT_SIGNAL_BEFORE_MPI"))
        std::raise(std::string(f) == "INT" ? SIGINT : std::string(f) == "USR1" ? SIGUSR1 : SIGTERM);
    MpiScope mpi(&argc, &argv);
    stop_signals_install();  // again: MPI's start-up may have set handlers of its own
    s3_set_stop_check(&stop_signal_before_training);  // S3 waits of start-up end at a signal
    auto world = make_mpi_world();
    stop_signals_set_rank(world->rank());
    std::unique_ptr<RunStateFile> state;  // rank 0, once training starts: how the process ended
    try {
        const int code = run_training(args, *world, state);
        if (state) state->end(code);
        return code;
    } catch (const StopRequested&) {
        // A stop signal during start-up abandoned a wait for S3 data (s3_set_stop_check). Said
        // by the rank that caught it; with several, the job is ended (no rank left waiting).
        std::fprintf(stderr,
                     "saetrain: stopped by a signal before the first step; nothing to save. Run "
                     "the same command to start (exit code 75).\n");
        std::fflush(stderr);
        if (world->size() > 1) world_abort(kExitStopped);
        return kExitStopped;
    } catch (const std::exception& e) {
        if (state) state->end(1, e.what());
        // A failure after start-up: the other ranks may be waiting in a collective, so this
        // rank's message is the one printed and the whole job is aborted.
        if (world->size() > 1) {
            std::fprintf(stderr, "saetrain: error: rank %d: %s; stopping all %d ranks\n",
                         world->rank(), printable(e.what()).c_str(), world->size());
            std::fflush(stderr);
            world_abort(1);
        }
        std::fprintf(stderr, "saetrain: error: %s\n", printable(e.what()).c_str());
        return 1;
    }
}
