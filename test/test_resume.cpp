// Kill-and-resume equivalence: a run killed with SIGKILL at random points and resumed (the
// same command again) ends with weights bitwise identical to an uninterrupted run, on one rank
// and under mpirun in sweep and data-parallel modes. Also: a signal stops all ranks with a
// committed checkpoint, a damaged newest checkpoint falls back to the previous one, and a
// changed config is refused.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "saetrain/checkpoint.h"
#include "saetrain/checkpoint_parts.h"
#include "saetrain/checkpointer.h"
#include "saetrain/train_state.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

using Result = saetrain::testing::CommandResult;
Result run(const std::string& cmd) { return saetrain::testing::run_command(cmd); }

std::string bin(const std::string& name) { return std::string(SAETRAIN_BIN_DIR) + "/" + name; }

const char* kMpi =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " SAETRAIN_MPIEXEC
    " --oversubscribe -np 2 ";

class Resume : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        dir = fs::temp_directory_path() /
              (std::string("saetrain_resume_") + std::to_string(getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir);
        fs::create_directories(dir);
        const Result r = run(bin("sae-synth") + " --out " + (dir / "data").string() +
                             " --d-model 64 --features 128 --rows 12000 --shards 3 --seed 5");
        ASSERT_EQ(r.code, 0) << r.out;
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    // A config whose run lasts long enough to be killed at many points: 3 epochs of 12000 rows
    // in steps of 64 rows (563 steps, 1-2 s here), a checkpoint every 7 steps.
    std::string config(const std::string& name, const std::string& extra = "") {
        const fs::path p = dir / (name + ".yaml");
        std::ofstream(p) << "run: {out_dir: " << (dir / name).string() << ", seed: 3}\n"
                         << "data: {path: " << (dir / "data").string()
                         << ", batch_size: 64, epochs: 3, shuffle_buffer_rows: 1500}\n"
                         << "sae: {arch: topk, expansion: 4, k: 6}\n"
                         << "train: {lr: 0.003, warmup_steps: 10}\n"
                         << "log: {every_steps: 10}\n"
                         << "checkpoint: {every_steps: 7, keep: 2}\n"
                         << extra;
        return p.string();
    }
    static SaeWeights final_of(const fs::path& run_dir, const std::string& id) {
        return sae_read_h5((run_dir / "sae" / id / "final.h5").string());
    }
};

// The (first) line saying "saetrain: error:", or "".
std::string error_line(const std::string& out) {
    const size_t at = out.find("saetrain: error:");
    return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// Lines saying "saetrain: error:": a failure is one line, printed once.
int errors_in(const std::string& out) {
    int n = 0;
    for (size_t at = out.find("saetrain: error:"); at != std::string::npos;
         at = out.find("saetrain: error:", at + 1))
        ++n;
    return n;
}

// The wall-clock time a fault hook printed as it raised its signal ("... at <seconds>"), or
// +inf (failing any bound) when no hook fired.
double fault_time(const std::string& out) {
    for (const char* hook : {"SAETRAIN_FAULT: rank", "SAETRAIN_FAULT_KILL_IN_WRITE:"}) {
        const size_t at = out.find(hook);
        if (at == std::string::npos) continue;
        const std::string line = out.substr(at, out.find('\n', at) - at);
        return std::stod(line.substr(line.rfind(" at ") + 4));
    }
    ADD_FAILURE() << "no fault hook fired:\n" << out;
    return std::numeric_limits<double>::infinity();
}

void expect_bitwise(const SaeWeights& a, const SaeWeights& b, const std::string& what) {
    EXPECT_TRUE(a == b) << what << ": weights differ from the uninterrupted run";
}

// Overwrites 4 bytes of `path` at `at`, as a failing disk or a stray write would.
void flip_bytes(const fs::path& path, uintmax_t at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write("\x13\x37\x13\x37", 4);
}

// Starts `cmd` and kills every process whose command line contains `marker` after a random
// delay, again and again (each start resumes from the last committed checkpoint) until `kills`
// kills have landed before the run completed; then lets it finish. Returns the kills landed.
int kill_and_resume(const std::string& cmd, const std::string& marker, const fs::path& run_dir,
                    std::mt19937& rng, int kills, double max_delay_s) {
    int landed = 0;
    std::uniform_real_distribution<double> delay(0.05, max_delay_s);
    for (int i = 0; landed < kills && i < 3 * kills && !fs::exists(run_dir / "COMPLETE"); ++i) {
        run(cmd + " > /dev/null 2>&1 &");
        std::this_thread::sleep_for(std::chrono::duration<double>(delay(rng)));
        run("pkill -KILL -f -- '" + marker + "'");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the job die
        landed += fs::exists(run_dir / "COMPLETE") ? 0 : 1;
    }
    // Finish: the same command, uninterrupted; it must complete (a hang would show as 124).
    if (!fs::exists(run_dir / "COMPLETE")) {
        const Result fin = run(cmd);
        EXPECT_EQ(fin.code, 0) << "the resumed run did not complete:\n" << fin.out;
    }
    return landed;
}

TEST_F(Resume, KilledSingleRankRunResumesBitwise) {
    const std::string ref_cfg = config("ref"), cfg = config("killed");
    ASSERT_EQ(run(bin("saetrain") + " " + ref_cfg + " --threads 1").code, 0);
    std::mt19937 rng(12345);
    const std::string cmd = "timeout 120 " + bin("saetrain") + " " + cfg + " --threads 1";
    const int landed = kill_and_resume(cmd, cfg, dir / "killed", rng, 8, 0.4);
    ASSERT_TRUE(fs::exists(dir / "killed" / "COMPLETE"));
    std::printf("single rank: %d kills landed mid-run\n", landed);
    EXPECT_GE(landed, 1);
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "killed", "topk-x4-k6"),
                   "single rank");
}

// train.optimizer: signum keeps three points per parameter; a checkpoint holds the SAE (the
// average) as its weights and the point of the next gradient in opt_v, and the average's
// weights are replayed from the schedule on resume: resumed runs end bitwise equal, under
// mpirun the data-parallel run's node-split update too (each replica exchanges its own range).
TEST_F(Resume, SignumKilledRunsResumeBitwise) {
    const std::string set = " --set train.optimizer=signum --set train.lr=0.01 --threads 1";
    for (const bool mpi : {false, true}) {
        const std::string tag = mpi ? "dp" : "one";
        const std::string extra = mpi ? "parallel: {mode: data_parallel, timeout_s: 30}\n" : "";
        const std::string launch = mpi ? std::string(kMpi) : std::string("timeout 120 ");
        const std::string ref_cfg = config("ref-" + tag, extra),
                          cfg = config("killed-" + tag, extra);
        ASSERT_EQ(run(launch + bin("saetrain") + " " + ref_cfg + set).code, 0) << tag;
        std::mt19937 rng(mpi ? 31 : 32);
        const int landed = kill_and_resume(launch + bin("saetrain") + " " + cfg + set, cfg,
                                           dir / ("killed-" + tag), rng, 4, 0.5);
        ASSERT_TRUE(fs::exists(dir / ("killed-" + tag) / "COMPLETE")) << tag;
        std::printf("signum %s: %d kills landed mid-run\n", tag.c_str(), landed);
        EXPECT_GE(landed, 1) << tag;
        expect_bitwise(final_of(dir / ("ref-" + tag), "topk-x4-k6"),
                       final_of(dir / ("killed-" + tag), "topk-x4-k6"), "signum " + tag);
    }
}

TEST_F(Resume, KilledMpiSweepAndDataParallelRunsResumeBitwise) {
    for (const std::string mode : {"sweep", "data_parallel"}) {
        const std::string extra = mode == "sweep"
                                      ? "parallel: {mode: sweep, timeout_s: 30}\n"
                                      : "parallel: {mode: data_parallel, timeout_s: 30}\n";
        const std::string sets = mode == "sweep" ? " --set 'sae.k=[4,6]'" : "";
        const std::string ref_cfg = config("ref-" + mode, extra),
                          cfg = config("killed-" + mode, extra);
        ASSERT_EQ(
            run(std::string(kMpi) + bin("saetrain") + " " + ref_cfg + " --threads 1" + sets).code,
            0);
        std::mt19937 rng(mode == "sweep" ? 7 : 8);
        const std::string cmd =
            std::string(kMpi) + bin("saetrain") + " " + cfg + " --threads 1" + sets;
        const int landed = kill_and_resume(cmd, cfg, dir / ("killed-" + mode), rng, 6, 0.5);
        ASSERT_TRUE(fs::exists(dir / ("killed-" + mode) / "COMPLETE")) << mode;
        std::printf("%s: %d kills landed mid-run\n", mode.c_str(), landed);
        EXPECT_GE(landed, 1) << mode;
        const std::vector<std::string> ids =
            mode == "sweep" ? std::vector<std::string>{"topk-x4-k4", "topk-x4-k6"}
                            : std::vector<std::string>{"topk-x4-k6"};
        for (const std::string& id : ids)
            expect_bitwise(final_of(dir / ("ref-" + mode), id),
                           final_of(dir / ("killed-" + mode), id), mode + " " + id);
    }
}

TEST_F(Resume, SignalStopsAllRanksWithACommittedCheckpoint) {
    const std::string cfg = config("sig", "parallel: {mode: data_parallel}\n");
    const std::string cmd = std::string(kMpi) + bin("saetrain") + " " + cfg + " --threads 1";
    // SIGUSR1 to one rank only (as Slurm's --signal may reach ranks at different times), at
    // iteration 20 of 281: mid-run by construction (SAETRAIN_FAULT), not by racing the clock.
    const Result r = run("SAETRAIN_FAULT=1:20:USR1 " + cmd);
    EXPECT_EQ(r.code, 75) << r.out;
    EXPECT_NE(r.out.find("stopped by a signal"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "sig" / "COMPLETE"));
    const auto steps = Checkpointer::committed_steps((dir / "sig").string());
    ASSERT_FALSE(steps.empty());
    EXPECT_LT(steps.back(), 281) << "the checkpoint is the stop's, mid-run";
    // Running the same command again continues and completes.
    EXPECT_EQ(run(cmd).code, 0);
    EXPECT_TRUE(fs::exists(dir / "sig" / "COMPLETE"));
}

// The line that `prefix` starts, up to its end (the first such), or "". Compared whole; the
// prefix may follow part of a line of stdout (a pipe's stdout is flushed in blocks).
std::string line_with(const std::string& out, const std::string& prefix) {
    const size_t at = out.find(prefix);
    return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// The line a stop by a signal (SIGTERM, SIGUSR1 or Ctrl-C) ends with, after `steps` steps.
std::string stop_line(const fs::path& run_dir, int64_t steps) {
    return fmt::format(
        "saetrain: stopped by a signal after {} steps; checkpoint committed in {}. Run the same "
        "command to continue (exit code 75).",
        steps, (run_dir / "checkpoints").string());
}

// Ctrl-C (SIGINT) is handled like SIGTERM on every rank (issue 34: it had no handler, so a
// single-process run died with nothing committed since the last checkpoint): the ranks stop at the
// next step, commit a checkpoint and exit 75 with SIGTERM's line, and the same command resumes
// from the step they stopped at, bitwise equal to an uninterrupted run. On one rank (a first
// Ctrl-C is acknowledged at once), and on rank 1 of 2 (as srun delivers it to every task; mpirun
// passes the ranks' 75 through when they end on their own).
TEST_F(Resume, CtrlCStopsLikeSigtermAtOneAndTwoRanksAndResumesBitwise) {
    struct Case {
        std::string name, launcher, extra, fault;
    };
    for (const Case& c : {Case{"one", "", "", "0:20:INT"},
                          Case{"dp", kMpi, "parallel: {mode: data_parallel}\n", "1:20:INT"}}) {
        SCOPED_TRACE(c.name);
        const std::string tail = " --threads 1 --set data.epochs=1";
        ASSERT_EQ(
            run(c.launcher + bin("saetrain") + " " + config("ref-" + c.name, c.extra) + tail).code,
            0);
        const std::string cmd = c.launcher + bin("saetrain") + " " + config(c.name, c.extra) + tail;
        const Result r = run("SAETRAIN_FAULT=" + c.fault + " " + cmd);
        EXPECT_EQ(r.code, 75) << r.out;
        // Stopped after the step of iteration 20: 21 steps, the same line as SIGTERM's, once.
        EXPECT_EQ(line_with(r.out, "saetrain: stopped"), stop_line(dir / c.name, 21)) << r.out;
        EXPECT_EQ(errors_in(r.out), 0) << r.out;
        if (c.name == "one") {
            EXPECT_EQ(
                line_with(r.out, "saetrain: interrupted"),
                "saetrain: interrupted: stopping after this step and committing a checkpoint; "
                "Ctrl-C again stops at once, keeping the last committed one")
                << r.out;
        }
        EXPECT_EQ(Checkpointer::committed_steps((dir / c.name).string()).front(), 21);
        const Result again = run(cmd);
        ASSERT_EQ(again.code, 0) << again.out;
        EXPECT_NE(again.out.find("resumed from the checkpoint at step 21 "), std::string::npos)
            << again.out;
        expect_bitwise(final_of(dir / ("ref-" + c.name), "topk-x4-k6"),
                       final_of(dir / c.name, "topk-x4-k6"), c.name + ": Ctrl-C, then resumed");
    }
}

// A stop signal during start-up (Ctrl-C while the shards are opened) stops at the first
// iteration, before the SAE was initialized from its first batch: nothing is saved. (It used to
// commit a checkpoint of the uninitialized SAE at step 0, which the next run resumed from without
// the data-dependent initialization, ending with other weights than an uninterrupted run.)
TEST_F(Resume, StopSignalBeforeTheFirstStepSavesNothing) {
    const std::string tail = " --threads 1 --set data.epochs=1";
    ASSERT_EQ(run(bin("saetrain") + " " + config("ref") + tail).code, 0);
    const std::string cmd = bin("saetrain") + " " + config("early") + tail;
    const Result r = run("SAETRAIN_FAULT=0:startup:INT " + cmd);
    EXPECT_EQ(r.code, 75) << r.out;
    // Acknowledged as what it is: no step yet, so nothing to commit.
    EXPECT_EQ(line_with(r.out, "saetrain: interrupted"),
              "saetrain: interrupted during start-up: stopping before the first step")
        << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: stopped"),
              "saetrain: stopped by a signal before the first step; nothing to save. Run the same "
              "command to start (exit code 75).")
        << r.out;
    EXPECT_TRUE(Checkpointer::committed_steps((dir / "early").string()).empty());
    const Result again = run(cmd);
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_EQ(again.out.find("resumed"), std::string::npos) << again.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "early", "topk-x4-k6"),
                   "a Ctrl-C during start-up, then run again");
}

// A stop signal in the process's first moments, before MPI has started (it took ~0.3 s), is a
// stop request like any other: exit 75 (which Slurm requeues) with its line, not the signal's
// default death (143 for SIGTERM), on one rank and on every rank of a job.
TEST_F(Resume, StopSignalBeforeMpiStartsExits75) {
    const std::string tail = " --threads 1 --set data.epochs=1";
    for (const char* sig : {"TERM", "USR1", "INT"}) {
        const std::string out = std::string("before-mpi-") + sig;
        const Result r = run(std::string("SAETRAIN_FAULT_SIGNAL_BEFORE_MPI=") + sig + " " +
                             bin("saetrain") + " " + config(out) + tail);
        EXPECT_EQ(r.code, 75) << sig << ": " << r.out;
        EXPECT_EQ(line_with(r.out, "saetrain: stopped"),
                  "saetrain: stopped by a signal before the first step; nothing to save. Run the "
                  "same command to start (exit code 75).")
            << sig << ": " << r.out;
        EXPECT_TRUE(Checkpointer::committed_steps((dir / out).string()).empty());
    }
    const Result r =
        run("SAETRAIN_FAULT_SIGNAL_BEFORE_MPI=TERM " + std::string(kMpi) + bin("saetrain") + " " +
            config("before-mpi-2") + tail + " --set 'sae.k=[4,6]'");
    EXPECT_EQ(r.code, 75) << r.out;
    const std::string stopped = "saetrain: stopped by a signal before the first step";
    EXPECT_NE(r.out.find(stopped), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(stopped), r.out.rfind(stopped)) << "printed once, by rank 0: " << r.out;
}

// A second Ctrl-C stops the process at once, with one line naming the checkpoint kept: the newest
// committed one, which is what the same command then resumes from. The process ends by SIGINT
// (a shell sees 130).
TEST_F(Resume, SecondCtrlCStopsAtOnceNamingTheCommittedCheckpoint) {
    const std::string tail = " --threads 1 --set data.epochs=1";
    ASSERT_EQ(run(bin("saetrain") + " " + config("ref") + tail).code, 0);
    const std::string cmd = bin("saetrain") + " " + config("twice") + tail;
    // (A group, so that the 2>&1 run() adds covers saetrain too.)
    const Result r = run("{ SAETRAIN_FAULT=0:40:INTx2 " + cmd + "; echo \"exit $?\"; }");
    EXPECT_NE(r.out.find("\nexit 130\n"), std::string::npos) << r.out;
    const auto steps = Checkpointer::committed_steps((dir / "twice").string());
    ASSERT_FALSE(steps.empty()) << r.out;
    // Checkpoints every 7 steps, the 2nd Ctrl-C at iteration 40: 35 is committed unless its
    // write was still under way, then 28; the line names the one on disk.
    EXPECT_TRUE(steps.front() == 35 || steps.front() == 28) << steps.front();
    EXPECT_EQ(line_with(r.out, "saetrain: interrupted again"),
              fmt::format("saetrain: interrupted again: stopped at once; kept: the checkpoint at "
                          "step {} in {}; the same command continues from it",
                          steps.front(), (dir / "twice" / "checkpoints").string()))
        << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: stopped"), "") << "no stop checkpoint after the second";
    const Result again = run(cmd);
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_NE(again.out.find(fmt::format("resumed from the checkpoint at step {} ", steps.front())),
              std::string::npos)
        << again.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "twice", "topk-x4-k6"),
                   "two Ctrl-Cs, then resumed");
}

// A checkpoint is committed at the step after its background write finished, not when the next
// checkpoint starts (issue 34: a hard kill lost one to two checkpoint.every_steps intervals). A
// SIGKILL right after the write of the checkpoint at step 21 finished (SAETRAIN_FAULT phase
// `written`: the writer waits for it at iteration 21 and dies at the start of iteration 22) must
// leave step 21 committed, and the same command resumes from it, bitwise. On one rank and on the
// writer of 2 data-parallel replicas.
TEST_F(Resume, SigkillAfterACheckpointWriteFinishedResumesFromIt) {
    struct Case {
        std::string name, launcher, extra;
    };
    for (const Case& c : {Case{"one", "", ""},
                          Case{"dp", kMpi, "parallel: {mode: data_parallel, timeout_s: 3}\n"}}) {
        SCOPED_TRACE(c.name);
        const std::string tail = " --threads 1 --set data.epochs=1";
        ASSERT_EQ(
            run(c.launcher + bin("saetrain") + " " + config("ref-" + c.name, c.extra) + tail).code,
            0);
        const std::string cmd =
            c.launcher + bin("saetrain") + " " + config("kill-" + c.name, c.extra) + tail;
        const Result r = run("SAETRAIN_FAULT=0:21:KILL:written " + cmd);
        EXPECT_NE(r.code, 0) << r.out;
        EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
        // Killed at the start of iteration 22, long before the next checkpoint (28) begins.
        const std::string hook =
            line_with(r.out, "saetrain: SAETRAIN_FAULT: rank 0 raises signal 9");
        ASSERT_NE(hook, "") << r.out;
        const int64_t killed_at = std::stoll(hook.substr(hook.find("(iteration ") + 11));
        EXPECT_EQ(killed_at, 22) << hook;
        EXPECT_EQ(Checkpointer::committed_steps((dir / ("kill-" + c.name)).string()).front(), 21)
            << r.out;
        const Result again = run(cmd);
        ASSERT_EQ(again.code, 0) << again.out;
        EXPECT_NE(again.out.find("resumed from the checkpoint at step 21 "), std::string::npos)
            << again.out;
        expect_bitwise(final_of(dir / ("ref-" + c.name), "topk-x4-k6"),
                       final_of(dir / ("kill-" + c.name), "topk-x4-k6"),
                       c.name + ": SIGKILL after a write, then resumed");
    }
}

// A rank that stops answering (SIGSTOP) or dies (SIGKILL) must not leave the others waiting: the
// watchdog (parallel.timeout_s) or the launcher ends the job. `timeout 120` inside kMpi turns a
// hang into exit code 124, which fails the test. The last rank signals itself at iteration 20
// (SAETRAIN_FAULT), so every case lands mid-run and asserts.
TEST_F(Resume, StoppedOrKilledRankEndsTheJob) {
    const std::string cfg = config("hang", "parallel: {mode: data_parallel, timeout_s: 3}\n");
    for (const std::string sig : {"STOP", "KILL"}) {
        for (const int np : {2, 4}) {
            std::string mpi = kMpi;
            mpi.replace(mpi.find("-np 2"), 5, "-np " + std::to_string(np));
            const auto t0 = std::chrono::steady_clock::now();
            const Result r = run("SAETRAIN_FAULT=" + std::to_string(np - 1) + ":20:" + sig + " " +
                                 mpi + bin("saetrain") + " " + cfg + " --overwrite --threads 1");
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_FALSE(fs::exists(dir / "hang" / "COMPLETE")) << sig << " np " << np;
            EXPECT_NE(r.code, 0) << sig << " np " << np << ": " << r.out;
            EXPECT_NE(r.code, 124) << sig << " np " << np << ": the job hung\n" << r.out;
            if (sig == "STOP") {
                EXPECT_NE(r.out.find("has waited"), std::string::npos) << r.out;
            }
            std::printf("SIG%s to one of %d ranks: job ended after %.1f s (exit %d)\n", sig.c_str(),
                        np, secs, r.code);
        }
    }
}

// A rank that never arrives at the communicators' set-up (it stopped before the first split):
// the ranks waiting in MPI_Comm_split are under the watchdog too, so the job ends with the line
// naming the waiting rank and the call, not a hang (before issue 27 the splits, the NCCL id
// broadcast and its init were outside it).
TEST_F(Resume, RankMissingAtTheCommunicatorSetUpEndsTheJob) {
    const std::string cfg = config("split", "parallel: {mode: data_parallel, timeout_s: 3}\n");
    const Result r = run(std::string("SAETRAIN_FAULT=1:connect:STOP ") + kMpi + bin("saetrain") +
                         " " + cfg + " --overwrite --threads 1");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.code, 124) << "the job hung\n" << r.out;
    EXPECT_NE(r.out.find("rank 0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("MPI_Comm_split has waited"), std::string::npos) << r.out;
}

// A full disk while a checkpoint is written (SAETRAIN_FAULT_DISK_FULL: the 5th atomic write of
// a checkpoint file, i.e. the third checkpoint's weights, fails with ENOSPC after writing part
// of its temp file): one line naming the file, exit 1, the previous checkpoints intact and no
// temp file left; the same command afterwards resumes and ends bitwise equal to a run that
// never failed.
TEST_F(Resume, DiskFullAtACheckpointKeepsThePreviousOneAndResumesBitwise) {
    const std::string ref_cfg = config("ref"), cfg = config("full");
    ASSERT_EQ(run(bin("saetrain") + " " + ref_cfg + " --threads 1").code, 0);
    const std::string cmd = bin("saetrain") + " " + cfg + " --threads 1";
    const Result r = run("SAETRAIN_FAULT_DISK_FULL=checkpoint-:4 " + cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("checkpoint-21.h5.tmp"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::strerror(ENOSPC)), std::string::npos) << r.out;
    EXPECT_EQ(Checkpointer::committed_steps((dir / "full").string()),
              (std::vector<int64_t>{14, 7}));  // newest first
    for (const auto& e : fs::directory_iterator(dir / "full" / "sae" / "topk-x4-k6"))
        EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    ASSERT_EQ(run(cmd).code, 0);
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "full", "topk-x4-k6"),
                   "disk full, then resumed");
}

// A full disk while final.h5 is written (after the last checkpoint was committed): one line
// naming the temp file and ENOSPC, exit 1, no final.h5, no COMPLETE and no temp file; the
// committed checkpoints (the last one at the run's end) still load and verify; the same command
// afterwards resumes from the last one, writes final.h5 and ends bitwise equal to a clean run.
TEST_F(Resume, DiskFullWritingFinalWeightsKeepsTheCheckpointsAndResumes) {
    const std::string ref_cfg = config("ref"), cfg = config("full");
    ASSERT_EQ(run(bin("saetrain") + " " + ref_cfg + " --threads 1").code, 0);
    const std::string cmd = bin("saetrain") + " " + cfg + " --threads 1";
    const Result r = run("SAETRAIN_FAULT_DISK_FULL=final.h5:0 " + cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    const fs::path sae_dir = dir / "full" / "sae" / "topk-x4-k6";
    EXPECT_NE(r.out.find((sae_dir / "final.h5.tmp").string()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::strerror(ENOSPC)), std::string::npos) << r.out;
    EXPECT_EQ(errors_in(r.out), 1) << r.out;
    EXPECT_FALSE(fs::exists(sae_dir / "final.h5"));
    EXPECT_FALSE(fs::exists(dir / "full" / "COMPLETE"));
    for (const auto& e : fs::directory_iterator(sae_dir))
        EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    const auto steps = Checkpointer::committed_steps((dir / "full").string());
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(steps[0], 563) << "the last checkpoint is the run's end";
    for (const int64_t step : steps) {
        const SaeWeights w = sae_read_h5(checkpoint_weights_path(sae_dir.string(), step));
        EXPECT_NO_THROW(train_state_read(checkpoint_state_path(sae_dir.string(), step), w)) << step;
    }
    const Result again = run(cmd);
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_NE(again.out.find("resumed from the checkpoint at step 563"), std::string::npos)
        << again.out;
    EXPECT_TRUE(fs::exists(dir / "full" / "COMPLETE"));
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "full", "topk-x4-k6"),
                   "disk full at final.h5, then resumed");
}

// The same on a real full file system: out_dir on a 1 MiB tmpfs (as root; skipped where mounting
// is not permitted) fills up at a checkpoint: the error names a file in out_dir and ENOSPC, exit
// 1, every committed checkpoint verifies; after the tmpfs is grown the same command resumes and
// ends bitwise equal to a clean run.
TEST_F(Resume, RealFullFileSystemEndsCleanlyAndResumesOnceThereIsSpace) {
    const fs::path mnt = dir / "small";
    fs::create_directories(mnt);
    if (run("mount -t tmpfs -o size=1m tmpfs " + mnt.string()).code != 0)
        GTEST_SKIP() << "cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)";
    struct Unmount {
        std::string path;
        ~Unmount() { run("umount " + path); }
    } unmount{mnt.string()};
    const std::string ref_cfg = config("ref");
    ASSERT_EQ(run(bin("saetrain") + " " + ref_cfg + " --threads 1").code, 0);
    const fs::path out = mnt / "run";
    const fs::path p = dir / "small.yaml";
    {
        std::ifstream in(dir / "ref.yaml");
        std::string text((std::istreambuf_iterator<char>(in)), {});
        text.replace(text.find((dir / "ref").string()), (dir / "ref").string().size(),
                     out.string());
        std::ofstream(p) << text;
    }
    const std::string cmd = bin("saetrain") + " " + p.string() + " --threads 1";
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    // One line says it all: the file in out_dir and the system's reason; no HDF5 stack dump.
    const std::string line = error_line(r.out);
    EXPECT_NE(line.find(std::strerror(ENOSPC)), std::string::npos) << r.out;
    EXPECT_NE(line.find(out.string()), std::string::npos) << "the error names no file:\n" << r.out;
    EXPECT_EQ(r.out.find("HDF5-DIAG"), std::string::npos) << r.out;
    EXPECT_EQ(errors_in(r.out), 1) << r.out;
    const auto steps = Checkpointer::committed_steps(out.string());
    ASSERT_FALSE(steps.empty()) << r.out;
    const fs::path sae_dir = out / "sae" / "topk-x4-k6";
    for (const int64_t step : steps) {
        const SaeWeights w = sae_read_h5(checkpoint_weights_path(sae_dir.string(), step));
        EXPECT_NO_THROW(train_state_read(checkpoint_state_path(sae_dir.string(), step), w)) << step;
    }
    ASSERT_EQ(run("mount -o remount,size=64m " + mnt.string()).code, 0);
    const Result again = run(cmd);
    ASSERT_EQ(again.code, 0) << again.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(out, "topk-x4-k6"),
                   "real ENOSPC, then resumed");
}

// A shard that vanishes (renamed away) or is replaced by a file with a damaged header during the
// run, before the reader reached it: one line naming the shard and the row, exit 1; after the
// file is restored the same command resumes from the last committed checkpoint and ends bitwise
// equal to a clean run. The run stops itself at iteration 2 (SAETRAIN_FAULT=0:2:STOP) so the
// shard changes while it runs, by construction; rows are read in disk order, so the third shard
// (rows 8000-11999) is not yet open then.
TEST_F(Resume, ShardVanishingOrReplacedMidRunIsNamedAndTheRunResumesBitwise) {
    const std::string ref_cfg = config("ref");
    const std::string sets =
        " --set data.shuffle_buffer_rows=0 --set data.read_bytes=4096 --set "
        "data.prefetch_bytes=1048576";
    ASSERT_EQ(run(bin("saetrain") + " " + ref_cfg + " --threads 1" + sets).code, 0);
    const fs::path shard = dir / "data" / "shard_00002.h5", away = dir / "shard_00002.away";
    for (const std::string how : {"vanishes", "is replaced"}) {
        SCOPED_TRACE(how);
        const std::string name = how == "vanishes" ? "gone" : "replaced";
        const std::string cmd = bin("saetrain") + " " + config(name) + " --threads 1" + sets;
        std::string change = "mv " + shard.string() + " " + away.string();
        if (how == "is replaced")  // a copy with its superblock signature overwritten
            change = "cp " + shard.string() + " " + shard.string() + ".new && printf XXXXXXXX | " +
                     "dd of=" + shard.string() + ".new conv=notrunc status=none && " + change +
                     " && mv " + shard.string() + ".new " + shard.string();
        const Result r =
            run("SAETRAIN_FAULT=0:2:STOP " + cmd + " > " + (dir / "log").string() +
                " 2>&1 & pid=$!; for i in $(seq 200); do grep -q '^State:.*T' " +
                "/proc/$pid/status && break; sleep 0.05; done; " + change +
                " && kill -CONT $pid; wait $pid; echo exit=$?; cat " + (dir / "log").string());
        EXPECT_NE(r.out.find("exit=1"), std::string::npos) << r.out;
        EXPECT_EQ(errors_in(r.out), 1) << r.out;
        EXPECT_NE(r.out.find("shard " + shard.string() + ": "), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("row 0"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find(how == "vanishes" ? std::strerror(ENOENT) : "another file now"),
                  std::string::npos)
            << r.out;
        EXPECT_FALSE(fs::exists(dir / name / "COMPLETE"));
        const auto steps = Checkpointer::committed_steps((dir / name).string());
        ASSERT_FALSE(steps.empty()) << r.out;
        EXPECT_GE(steps[0], 100) << "the run stopped before the third shard";
        // Restore the file, run the same command again.
        fs::remove(shard);
        fs::rename(away, shard);
        const Result again = run(cmd);
        ASSERT_EQ(again.code, 0) << again.out;
        EXPECT_NE(again.out.find(fmt::format("resumed from the checkpoint at step {}", steps[0])),
                  std::string::npos)
            << again.out;
        expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / name, "topk-x4-k6"),
                       "shard " + how + ", restored, resumed");
    }
}

// SIGKILL of one rank in every parallel mode, during start-up, mid-step and during a checkpoint
// (SAETRAIN_FAULT=rank:when:KILL[:checkpoint]; a rank that writes files dies halfway through its
// weights temp file): every rank exits within parallel.timeout_s + 5 s, the output names the
// dead rank, and the same command afterwards resumes (or starts over, when no checkpoint was
// committed) and ends bitwise equal to an uninterrupted run.
TEST_F(Resume, RankKilledInEveryModeAndPhaseEndsTheJobAndResumesBitwise) {
    struct Mode {
        std::string name, extra, sets;
        int np;
        std::vector<std::string> ids;
    };
    const std::vector<Mode> modes = {
        {"sweep",
         "parallel: {mode: sweep, timeout_s: 3}\n",
         " --set 'sae.k=[4,6]'",
         2,
         {"topk-x4-k4", "topk-x4-k6"}},
        {"data_parallel", "parallel: {mode: data_parallel, timeout_s: 3}\n", "", 2, {"topk-x4-k6"}},
        {"hybrid",
         "parallel: {mode: hybrid, replicas: 2, timeout_s: 3}\n",
         " --set 'sae.k=[4,6]'",
         4,
         {"topk-x4-k4", "topk-x4-k6"}}};
    for (const Mode& m : modes) {
        std::string mpi = kMpi;
        mpi.replace(mpi.find("-np 2"), 5, "-np " + std::to_string(m.np));
        const std::string tail = " --threads 1 --set data.epochs=1" + m.sets;
        const std::string ref = config("ref-" + m.name, m.extra);
        const Result rr = run(mpi + bin("saetrain") + " " + ref + tail);
        ASSERT_EQ(rr.code, 0) << m.name << ": " << rr.out;
        const int last = m.np - 1;
        // (rank, fault): the last rank at start-up and mid-step; at a checkpoint rank 0 (a
        // writer: dies mid-file) and the last rank (in hybrid a replica that writes nothing).
        const std::vector<std::pair<int, std::string>> faults = {{last, "startup:KILL"},
                                                                 {last, "20:KILL"},
                                                                 {0, "21:KILL:checkpoint"},
                                                                 {last, "28:KILL:checkpoint"}};
        for (const auto& [rank, what] : faults) {
            SCOPED_TRACE(m.name + " SAETRAIN_FAULT=" + std::to_string(rank) + ":" + what);
            const std::string name = "kill-" + m.name;
            const std::string cmd = mpi + bin("saetrain") + " " + config(name, m.extra) + tail;
            fs::remove_all(dir / name);
            const Result r = run("SAETRAIN_FAULT=" + std::to_string(rank) + ":" + what + " " + cmd);
            const double end =
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                    .count();
            EXPECT_NE(r.code, 0) << r.out;
            EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
            // From the signal (the hook prints its wall-clock time) to the end of the job: the
            // watchdog's 3 s and the ranks' teardown, which takes about 2 s on an idle machine and
            // several times that on one shared with another job; a hang is exit 124 (above).
            const double secs = end - fault_time(r.out);
            EXPECT_LT(secs, 3 + 20) << r.out;
            EXPECT_NE(r.out.find(fmt::format("rank {}", rank)), std::string::npos)
                << "the dead rank is not named:\n"
                << r.out;
            EXPECT_FALSE(fs::exists(dir / name / "COMPLETE"));
            std::printf("%s, rank %d of %d, %s: job ended after %.1f s (exit %d)\n", m.name.c_str(),
                        rank, m.np, what.c_str(), secs, r.code);
            if (what != "startup:KILL") {
                EXPECT_FALSE(Checkpointer::committed_steps((dir / name).string()).empty());
            }
            const Result again = run(cmd);
            ASSERT_EQ(again.code, 0) << again.out;
            for (const std::string& id : m.ids)
                expect_bitwise(final_of(dir / ("ref-" + m.name), id), final_of(dir / name, id),
                               m.name + " " + id);
        }
    }
}

// Rank 0 killed after every rank agreed that a checkpoint is written but before it wrote the
// commit marker (SAETRAIN_FAULT_KILL_BEFORE_COMMIT), in sweep mode where rank 1 writes its own
// SAE's files: every checkpoint whose marker is on disk must still load (rank 1 used to delete
// the rotated-out checkpoint's files at once, while rank 0 had not yet removed its marker), and
// the same command resumes bitwise.
TEST_F(Resume, KillBeforeACommitMarkerLeavesEveryCommittedCheckpointReadable) {
    const std::string extra = "parallel: {mode: sweep, timeout_s: 3}\n";
    const std::string tail = " --threads 1 --set data.epochs=1 --set 'sae.k=[4,6]'";
    const std::string ref = config("ref", extra), cfg = config("commit", extra);
    ASSERT_EQ(run(std::string(kMpi) + bin("saetrain") + " " + ref + tail).code, 0);
    const std::string cmd = std::string(kMpi) + bin("saetrain") + " " + cfg + tail;
    const Result r = run("SAETRAIN_FAULT_KILL_BEFORE_COMMIT=21 " + cmd);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("before the commit marker of step 21"), std::string::npos) << r.out;
    const auto steps = Checkpointer::committed_steps((dir / "commit").string());
    EXPECT_EQ(steps, (std::vector<int64_t>{14, 7})) << r.out;
    for (const std::string id : {"topk-x4-k4", "topk-x4-k6"}) {
        const std::string sae_dir = (dir / "commit" / "sae" / id).string();
        for (const int64_t step : steps) {
            SCOPED_TRACE(id + " step " + std::to_string(step));
            try {
                const SaeWeights w = sae_read_h5(checkpoint_weights_path(sae_dir, step));
                train_state_read(checkpoint_state_path(sae_dir, step), w);
            } catch (const std::exception& e) {
                ADD_FAILURE() << "a committed checkpoint is unreadable: " << e.what();
            }
        }
    }
    const Result again = run(cmd);
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_NE(again.out.find("resumed from the checkpoint at step 14"), std::string::npos)
        << again.out;
    for (const std::string id : {"topk-x4-k4", "topk-x4-k6"})
        expect_bitwise(final_of(dir / "ref", id), final_of(dir / "commit", id), id);
    // Nothing uncommitted or half-written is left behind: rotated-out pairs and temp files are
    // removed at the next start and at the end.
    for (const std::string id : {"topk-x4-k4", "topk-x4-k6"})
        EXPECT_EQ(checkpoint_steps((dir / "commit" / "sae" / id).string()),
                  (std::vector<int64_t>{182, 188}))
            << id;
}

// A replica that fails mid-run in data-parallel mode (its peers wait in the fence of the update
// split over node memory) ends the job at once with its message, not after the watchdog's timeout:
// the failing rank must not block in a collective (freeing the shared window) on its way out.
TEST_F(Resume, DataParallelFailureEndsTheJobAtOnce) {
    const std::string cfg = config("fault", "parallel: {mode: data_parallel, timeout_s: 20}\n");
    const Result r = run(std::string("SAETRAIN_FAULT=1:5 ") + kMpi + bin("saetrain") + " " + cfg +
                         " --overwrite --threads 1");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
    EXPECT_NE(r.out.find("rank 1: injected fault at iteration 5"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("has waited"), std::string::npos)
        << "the job was ended by the watchdog, not by the failing rank:\n"
        << r.out;
}

TEST_F(Resume, DamagedNewestCheckpointFallsBackAndConfigChangesAreRefused) {
    const std::string cfg = config("dmg");
    const std::string cmd = bin("saetrain") + " " + cfg + " --threads 1";
    ASSERT_EQ(run(cmd + " --set data.epochs=1").code, 0);  // keeps the newest 2 committed
    fs::remove(dir / "dmg" / "COMPLETE");
    const auto steps = Checkpointer::committed_steps((dir / "dmg").string());
    ASSERT_EQ(steps.size(), 2u);
    // Flip bytes in the middle of the newest weights file: the checksum must catch it.
    const fs::path newest = dir / "dmg/sae/topk-x4-k6" / fmt::format("checkpoint-{}.h5", steps[0]);
    {
        std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(newest) / 2));
        f.write("\x13\x37\x13\x37", 4);
    }
    // A changed result-affecting key is refused, naming it; the run's config.yaml stays the
    // config it was trained with.
    const auto text_of = [](const fs::path& p) {
        std::ifstream in(p);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string trained_with = text_of(dir / "dmg/config.yaml");
    ASSERT_NE(trained_with.find("lr: 0.003"), std::string::npos) << trained_with;
    Result r = run(cmd + " --set train.lr=0.01");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("train.lr"), std::string::npos) << r.out;
    EXPECT_EQ(text_of(dir / "dmg/config.yaml"), trained_with);
    r = run(cmd + " --set data.epochs=1");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("unusable"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[1])),
              std::string::npos)
        << r.out;
}

// Latent sharding (issue 15), the "done when": 2 replicas x 2 latent shards on 4 ranks
// train, stop at a signal, resume bitwise and export. A run stopped on 2 shards resumes on one
// rank (resharding: the checkpoint holds the whole SAE) and completes.
TEST_F(Resume, LatentShardedRunResumesBitwiseReshardsAndExports) {
    const std::string mpi4 =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " SAETRAIN_MPIEXEC
        " --oversubscribe -np 4 ";
    const std::string grid =
        " --threads 1 --set data.epochs=1 --set parallel.latent_shards=2 --set "
        "parallel.mode=hybrid --set parallel.replicas=2";
    const std::string ref_cfg = config("ref"), cfg = config("stopped");
    Result r = run(mpi4 + bin("saetrain") + " " + ref_cfg + grid);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("1 SAE x 2 replicas x 2 latent shards"), std::string::npos) << r.out;
    const std::string cmd = mpi4 + bin("saetrain") + " " + cfg + grid;
    r = run("SAETRAIN_FAULT=3:40:USR1 " + cmd);  // the last shard of the last replica
    ASSERT_EQ(r.code, 75) << r.out;
    r = run(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resumed from the checkpoint at step"), std::string::npos) << r.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "stopped", "topk-x4-k6"),
                   "2 replicas x 2 latent shards");
    r = run(bin("sae-export") + " " + (dir / "stopped/sae/topk-x4-k6/final.h5").string() +
            " --format saelens --out " + (dir / "export").string());
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(dir / "export" / "cfg.json"));

    // Stopped on 2 shards (2 ranks), resumed on 1 rank.
    const std::string two = std::string(kMpi) + bin("saetrain") + " " + config("reshard") +
                            " --threads 1 --set data.epochs=1 --set parallel.latent_shards=2";
    ASSERT_EQ(run("SAETRAIN_FAULT=1:40:USR1 " + two).code, 75);
    r = run(bin("saetrain") + " " + config("reshard") + " --threads 1 --set data.epochs=1");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resumed from the checkpoint at step"), std::string::npos) << r.out;
    EXPECT_EQ(final_of(dir / "reshard", "topk-x4-k6").n_latents, 256);
}

// A latent-sharded checkpoint is one part per latent shard (checkpoint_parts.h), each verified
// by the latent shard that reads its first latent: damage in the second shard's state file (7/8
// into its adam_v, which the first shard never reads) still falls back to the previous checkpoint
// on every rank, and the run completes bitwise equal to an uninterrupted one.
TEST_F(Resume, LatentShardedDamagedNewestCheckpointFallsBack) {
    const std::string grid = " --threads 1 --set data.epochs=1 --set parallel.latent_shards=2";
    Result r = run(std::string(kMpi) + bin("saetrain") + " " + config("ref") + grid);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string cmd = std::string(kMpi) + bin("saetrain") + " " + config("dmg") + grid;
    ASSERT_EQ(run("SAETRAIN_FAULT=1:60:USR1 " + cmd).code, 75);
    const auto steps = Checkpointer::committed_steps((dir / "dmg").string());
    ASSERT_EQ(steps.size(), 2u);
    const fs::path newest =
        checkpoint_part_state_path((dir / "dmg/sae/topk-x4-k6").string(), steps[0], 1, 2);
    flip_bytes(newest, fs::file_size(newest) * 15 / 16);
    r = run(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("checkpoint part " + newest.string() + ": checksum mismatch"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[1])),
              std::string::npos)
        << r.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "dmg", "topk-x4-k6"),
                   "2 latent shards, resumed past a damaged checkpoint");
}

// --- checkpoints in parts (checkpoint_parts.h) --------------------------------------------------

// The bound for a run resumed on another latent shard count: the weights it reads are the
// written ones bit for bit (test_mpi LatentShardedPartsReadBackOnAnyLatentShardCount), but each
// later step sums in another order (the latent shards' partial reconstructions, the gradient
// norm over latent shards), ~1e-7 relative per operation, and a TopK selection that flips on such
// a difference moves a latent's weights further. Measured here over the ~150 steps after the
// resume, as the largest difference relative to the tensor's largest value: 5.4e-7 for 4 -> 2,
// 4 -> 1 and 1 -> 4 latent shards; the bound leaves room for other CPUs' BLAS kernels. A resume
// that read the wrong latents, shifted a part's rows or took stale moments moves weights by 1e-2
// or more relative.
constexpr double kReshardBound = 1e-4;

// max |a - b| / max |b| over the four tensors every SAE has.
double relative_difference(const SaeWeights& a, const SaeWeights& b) {
    double worst = 0;
    for (const char* name : {"W_enc", "W_dec", "b_enc", "b_dec"}) {
        const std::vector<float>*x = &a.at(name), *y = &b.at(name);
        EXPECT_EQ(x->size(), y->size());
        double diff = 0, scale = 0;
        for (size_t i = 0; i < std::min(x->size(), y->size()); ++i) {
            diff = std::max(diff, std::abs(double((*x)[i]) - double((*y)[i])));
            scale = std::max(scale, std::abs(double((*y)[i])));
        }
        worst = std::max(worst, diff / std::max(scale, 1e-30));
    }
    return worst;
}

std::string launch(int ranks) {
    return ranks == 1 ? ""
                      : fmt::format(
                            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                            "timeout 120 {} --oversubscribe -np {} ",
                            SAETRAIN_MPIEXEC, ranks);
}

// One replica of latent_shards ranks.
std::string on_latent_shards(int shards) {
    return fmt::format(" --threads 1 --set data.epochs=1 --set parallel.latent_shards={}", shards);
}

// A run stopped on 4 latent shards leaves, per committed checkpoint, a manifest and 4 parts (no
// pair). The same command resumes it bitwise equal to an uninterrupted run on 4; copies of it
// resume on 2 latent shards and on 1 rank, each reading its latents from the 4 parts, and end
// within kReshardBound of that run.
TEST_F(Resume, LatentShardedPartsResumeBitwiseOnFourAndReshardOntoTwoAndOne) {
    Result r = run(launch(4) + bin("saetrain") + " " + config("ref") + on_latent_shards(4));
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string stopped =
        launch(4) + bin("saetrain") + " " + config("on4") + on_latent_shards(4);
    ASSERT_EQ(run("SAETRAIN_FAULT=1:40:USR1 " + stopped).code, 75);
    const auto steps = Checkpointer::committed_steps((dir / "on4").string());
    ASSERT_EQ(steps.size(), 2u);
    const std::string sae = (dir / "on4/sae/topk-x4-k6").string();
    for (const int64_t step : steps) {
        EXPECT_TRUE(fs::exists(checkpoint_manifest_path(sae, step))) << step;
        for (int k = 0; k < 4; ++k)
            EXPECT_TRUE(fs::exists(checkpoint_part_path(sae, step, k, 4)) &&
                        fs::exists(checkpoint_part_state_path(sae, step, k, 4)))
                << step << " part " << k;
        EXPECT_FALSE(fs::exists(checkpoint_weights_path(sae, step))) << step;
    }
    for (const char* copy : {"on2", "on1"})
        fs::copy(dir / "on4", dir / copy, fs::copy_options::recursive);
    r = run(stopped);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[0])),
              std::string::npos)
        << r.out;
    const SaeWeights ref = final_of(dir / "ref", "topk-x4-k6");
    expect_bitwise(ref, final_of(dir / "on4", "topk-x4-k6"), "4 latent shards resumed on 4");
    for (const int shards : {2, 1}) {
        const std::string name = fmt::format("on{}", shards);
        r = run(launch(shards) + bin("saetrain") + " " + config(name) + on_latent_shards(shards));
        ASSERT_EQ(r.code, 0) << r.out;
        EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[0])),
                  std::string::npos)
            << r.out;
        const double diff = relative_difference(final_of(dir / name, "topk-x4-k6"), ref);
        std::printf(
            "4 latent shards resumed on %d: final weights within %.2g of the uninterrupted run\n",
            shards, diff);
        EXPECT_LT(diff, kReshardBound) << "4 -> " << shards;
    }
}

// A checkpoint written before parts (a pair: here an unsharded run's, the same files a
// latent-sharded run wrote before) resumes onto 4 latent shards, which then write parts; the
// pairs rotated out are deleted with the parts' checkpoints.
TEST_F(Resume, PairCheckpointsStillResumeOntoLatentShards) {
    Result r = run(bin("saetrain") + " " + config("ref") + on_latent_shards(1));
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(run("SAETRAIN_FAULT=0:40:USR1 " + bin("saetrain") + " " + config("pair") +
                  on_latent_shards(1))
                  .code,
              75);
    const auto steps = Checkpointer::committed_steps((dir / "pair").string());
    ASSERT_FALSE(steps.empty());
    const std::string sae = (dir / "pair/sae/topk-x4-k6").string();
    ASSERT_TRUE(fs::exists(checkpoint_weights_path(sae, steps[0])));
    r = run(launch(4) + bin("saetrain") + " " + config("pair") + on_latent_shards(4));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[0])),
              std::string::npos)
        << r.out;
    const double diff = relative_difference(final_of(dir / "pair", "topk-x4-k6"),
                                            final_of(dir / "ref", "topk-x4-k6"));
    std::printf("1 latent shard resumed on 4: final weights within %.2g of the uninterrupted run\n",
                diff);
    EXPECT_LT(diff, kReshardBound);
    for (const auto& e : fs::directory_iterator(sae)) {
        const std::string f = e.path().filename().string();
        if (checkpoint_file_step(f) >= 0) {
            EXPECT_TRUE(f.find(".part-") != std::string::npos ||
                        f.find(".manifest.json") != std::string::npos)
                << "a rotated-out pair left behind: " << f;
        }
    }
}

// A latent shard killed halfway through its part (SAETRAIN_FAULT's KILL in a checkpoint's write)
// ends the job; the other parts of that step are on disk but no manifest and no commit, so the
// same command resumes from the checkpoint before, bitwise equal to an uninterrupted run.
TEST_F(Resume, LatentShardKilledWritingItsPartResumesFromThePreviousCheckpoint) {
    Result r = run(launch(4) + bin("saetrain") + " " + config("ref") + on_latent_shards(4));
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string cmd =
        launch(4) + bin("saetrain") + " " + config("torn") + on_latent_shards(4);
    r = run("SAETRAIN_FAULT=2:21:KILL:checkpoint " + cmd);
    EXPECT_NE(r.code, 0) << r.out;
    const std::string sae = (dir / "torn/sae/topk-x4-k6").string();
    EXPECT_NE(r.out.find("SIGKILL halfway through " + checkpoint_part_path(sae, 21, 2, 4) + ".tmp"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(Checkpointer::committed_steps((dir / "torn").string()),
              (std::vector<int64_t>{14, 7}));
    EXPECT_FALSE(fs::exists(checkpoint_manifest_path(sae, 21)));
    EXPECT_TRUE(fs::exists(checkpoint_part_path(sae, 21, 1, 4)));  // written, never committed
    r = run(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resumed from the checkpoint at step 14"), std::string::npos) << r.out;
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "torn", "topk-x4-k6"),
                   "4 latent shards, one killed writing its part");
}

// A damaged part (4 bytes flipped in the newest checkpoint's part 2 of 4) is named by sae-inspect
// and in the warning of the latent shard that verifies it, on 4 latent shards (latent shard 2) and
// on 2 (latent shard 1, whose latents begin with part 2's), and the run resumes from the previous
// committed checkpoint: on 4, bitwise equal to an uninterrupted run.
TEST_F(Resume, DamagedCheckpointPartFallsBackNamingThePart) {
    Result r = run(launch(4) + bin("saetrain") + " " + config("ref") + on_latent_shards(4));
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(run("SAETRAIN_FAULT=3:40:USR1 " + launch(4) + bin("saetrain") + " " + config("dmg4") +
                  on_latent_shards(4))
                  .code,
              75);
    const auto steps = Checkpointer::committed_steps((dir / "dmg4").string());
    ASSERT_EQ(steps.size(), 2u);
    fs::copy(dir / "dmg4", dir / "dmg2", fs::copy_options::recursive);
    for (const int shards : {4, 2}) {
        const std::string name = fmt::format("dmg{}", shards);
        const fs::path part =
            checkpoint_part_path((dir / name / "sae/topk-x4-k6").string(), steps[0], 2, 4);
        flip_bytes(part, fs::file_size(part) / 2);
        if (shards == 4) {  // sae-inspect checks a checkpoint's parts as resume does
            const std::string manifest =
                checkpoint_manifest_path((dir / name / "sae/topk-x4-k6").string(), steps[0]);
            r = run(bin("sae-inspect") + " " + manifest);
            EXPECT_EQ(r.code, 1) << r.out;
            EXPECT_NE(r.out.find("part 1 of 4 (latents 64-127): checksum ok"), std::string::npos)
                << r.out;
            EXPECT_NE(r.out.find("sae-inspect: error: checkpoint part " + part.string() +
                                 ": checksum mismatch"),
                      std::string::npos)
                << r.out;
        }
        r = run(launch(shards) + bin("saetrain") + " " + config(name) + on_latent_shards(shards));
        ASSERT_EQ(r.code, 0) << r.out;
        EXPECT_NE(r.out.find(fmt::format("saetrain: warning: rank {}: checkpoint at step {} "
                                         "unusable (checkpoint part {}: checksum mismatch",
                                         shards / 2, steps[0], part.string())),
                  std::string::npos)
            << r.out;
        EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {}", steps[1])),
                  std::string::npos)
            << r.out;
    }
    expect_bitwise(final_of(dir / "ref", "topk-x4-k6"), final_of(dir / "dmg4", "topk-x4-k6"),
                   "4 latent shards, resumed past a damaged part");
}

}  // namespace
