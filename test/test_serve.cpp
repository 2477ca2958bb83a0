// sae-serve's parts without a server: run ids and paths confined to the runs root, the token
// file and the token checks, the metrics tail (whole steps, since=STEP, saetrain's rewrite on
// resume), the run state table, and the run wrapper (exit status, stop signal, no descriptor
// of the server). test/serve/test_serve_e2e.py runs the server itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "saetrain/run_dir.h"  // defines: drop_metrics_after (what saetrain does on resume)
#include "saetrain/serve/auth.h"
#include "saetrain/serve/launcher.h"
#include "saetrain/serve/metrics_tail.h"
#include "saetrain/serve/run_status.h"
#include "saetrain/serve/runs_root.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;
using namespace saetrain::serve;
using saetrain::testing::TempDir;

namespace {

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
}

void append(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::app);
    out << text;
}

// Waits (up to a minute) for `cond`; a test fails on the condition, never on the time taken.
template <class F>
bool eventually(F cond) {
    for (int i = 0; i < 6000; ++i) {
        if (cond()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
}

std::string metrics_line(const std::string& sae, int64_t step, double fvu = 0.5) {
    return fmt::format(R"({{"sae":"{}","step":{},"tokens":{},"fvu":{}}})", sae, step, step * 10,
                       fvu);
}

}  // namespace

// ---- run ids and the root ------------------------------------------------------------------

TEST(ServeRoot, RunIdsAreOneNameInTheRoot) {
    for (const char* ok : {"quickstart", "sweep4", "a.b-c_1", "X"})
        EXPECT_EQ(run_id_check(ok), "") << ok;
    for (const std::string& bad :
         std::vector<std::string>{"", ".", "..", ".sae-serve", "a/b", "../x", "a b", "x\n", "/etc",
                                  std::string(129, 'a')}) {
        const std::string why = run_id_check(bad);
        EXPECT_NE(why, "") << bad;
        EXPECT_EQ(why.rfind("run id '", 0), 0u) << why;
    }
    EXPECT_NE(file_name_check("../token"), "");
    EXPECT_EQ(file_name_check("fvu.svg"), "");
}

TEST(ServeRoot, PercentEscapesDecodeBeforeTheChecks) {
    EXPECT_EQ(percent_decode("%2e%2e"), "..");
    EXPECT_EQ(percent_decode("a%2Fb"), "a/b");
    EXPECT_EQ(percent_decode("plain+text"), "plain+text");
    EXPECT_FALSE(percent_decode("%zz").has_value());
    EXPECT_FALSE(percent_decode("%4").has_value());
    EXPECT_FALSE(percent_decode("a%00b").has_value());
    // So an escaped "../" is a bad run id, not a path.
    EXPECT_NE(run_id_check(*percent_decode("..%2Fetc")), "");
}

TEST(ServeRoot, SymlinksAndOtherFilesAreNotRuns) {
    TempDir tmp("serve_root");
    const fs::path root = tmp.path / "runs", outside = tmp.path / "outside";
    fs::create_directories(root / "real" / "report");
    fs::create_directories(outside);
    std::ofstream(outside / "secret") << "x";
    fs::create_directory_symlink(outside, root / "escape");       // a link out of the root
    fs::create_directory_symlink(root / "real", root / "alias");  // even one inside it
    std::ofstream(root / "file") << "x";
    fs::create_directories(root / ".hidden");
    fs::create_directory_symlink(outside, root / "real" / "report" / "up");
    fs::create_symlink(outside / "secret", root / "real" / "report" / "index.html");

    RunsRoot r(root.string());
    EXPECT_EQ(r.list_runs(), std::vector<std::string>{"real"});
    std::string why;
    EXPECT_TRUE(r.open_run("real", &why).valid()) << why;
    for (const char* id : {"escape", "alias"}) {
        EXPECT_FALSE(r.open_run(id, &why).valid());
        EXPECT_NE(why.find("is a symlink (not followed)"), std::string::npos) << why;
        EXPECT_NE(why.find(id), std::string::npos) << why;
    }
    EXPECT_FALSE(r.open_run("file", &why).valid());
    EXPECT_NE(why.find("not a directory"), std::string::npos) << why;
    EXPECT_FALSE(r.open_run("missing", &why).valid());
    EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
    EXPECT_FALSE(r.open_run("..", &why).valid());
    EXPECT_NE(why.find("run id '..'"), std::string::npos) << why;

    // Inside a run: links are refused at every component, whatever they point at.
    Fd run = r.open_run("real", &why);
    Fd report = open_beneath(run.get(), "report", true, &why);
    ASSERT_TRUE(report.valid()) << why;
    EXPECT_FALSE(open_beneath(report.get(), "up", true, &why).valid());
    EXPECT_NE(why.find("symlink"), std::string::npos) << why;
    EXPECT_FALSE(open_beneath(report.get(), "index.html", false, &why).valid());
    EXPECT_NE(why.find("symlink"), std::string::npos) << why;
}

TEST(ServeRoot, ASubmittedOutDirMustBeARunDirectoryOfTheRoot) {
    TempDir tmp("serve_outdir");
    const fs::path root = tmp.path / "runs";
    fs::create_directories(root);
    fs::create_directory_symlink(root, tmp.path / "link");
    RunsRoot r(root.string());
    const std::string cwd = tmp.path.string();  // the server's, beside the root
    std::string why;
    EXPECT_EQ(r.run_id_of_out_dir("sweep", cwd, &why), "sweep");
    EXPECT_EQ(r.run_id_of_out_dir("runs/sweep", cwd, &why), "sweep") << why;
    EXPECT_EQ(r.run_id_of_out_dir("./runs/sweep/", cwd, &why), "sweep") << why;
    EXPECT_EQ(r.run_id_of_out_dir(root.string() + "/sweep", cwd, &why), "sweep");
    EXPECT_EQ(r.run_id_of_out_dir(root.string() + "/sweep/", cwd, &why), "sweep");
    EXPECT_EQ(r.run_id_of_out_dir((tmp.path / "link" / "sweep").string(), cwd, &why), "sweep");
    const std::pair<std::string, std::string> bad[] = {
        {"other/quickstart", "outside the runs root"},
        {"../x", "outside the runs root"},
        {"runs/../x", "outside the runs root"},
        {"..", "run id '..'"},
        {"/etc/x", "outside the runs root"},
        {(root / ".." / "x").string(), "outside the runs root"},
        {root.string(), "outside the runs root"},
        {"/", "outside the runs root"},
        {root.string() + "/a/b", "outside the runs root"},
        {"runs/.hidden", "run id '.hidden'"},
    };
    for (const auto& [out_dir, expect] : bad) {
        why.clear();
        EXPECT_FALSE(r.run_id_of_out_dir(out_dir, cwd, &why).has_value()) << out_dir;
        EXPECT_NE(why.find(expect), std::string::npos) << out_dir << ": " << why;
        EXPECT_EQ(why.rfind("run.out_dir '", 0), 0u) << why;
    }
}

TEST(ServeRoot, AStageDirIsResolvedIntoTheRootOrTheTemporaryDirectoryAndCreatedWithoutLinks) {
    TempDir tmp("serve_stage");
    const fs::path root = tmp.path / "runs", node_tmp = tmp.path / "nodetmp";
    const fs::path outside = tmp.path / "outside";
    fs::create_directories(root);
    fs::create_directories(node_tmp);
    fs::create_directories(outside);
    fs::create_directory_symlink(outside, node_tmp / "link");  // planted in the temp dir
    fs::create_directories(node_tmp / "shared");
    fs::permissions(node_tmp / "shared", fs::perms::all);  // others may write: links could come
    fs::create_directory_symlink(node_tmp, tmp.path / "tmplink");
    RunsRoot r(root.string());
    const std::string cwd = tmp.path.string(), t = node_tmp.string();
    std::string why;
    // Fine: created (0700, no link followed) and returned as a real path.
    EXPECT_EQ(r.stage_dir_for_launch("$TMPDIR/stage/a", cwd, t, &why), t + "/stage/a") << why;
    EXPECT_TRUE(fs::is_directory(node_tmp / "stage" / "a"));
    EXPECT_EQ(fs::status(node_tmp / "stage").permissions() & fs::perms::all, fs::perms::owner_all);
    EXPECT_EQ(r.stage_dir_for_launch(t + "/stage/b/", cwd, t, &why), t + "/stage/b") << why;
    EXPECT_EQ(r.stage_dir_for_launch("runs/x/stage", cwd, t, &why), root.string() + "/x/stage")
        << why;
    // The temporary directory named through a link is its real path.
    EXPECT_EQ(r.stage_dir_for_launch("$TMPDIR/c", cwd, (tmp.path / "tmplink").string(), &why),
              t + "/c")
        << why;
    const std::pair<std::string, std::string> bad[] = {
        {"$TMPDIR/../outside/x", "holds '..'"},  // a prefix test on the text took these
        {"$TMPDIR/../../etc", "holds '..'"},
        {"$TMPDIRx/y", "outside both"},
        {"/etc/saetrain-stage", "outside both"},
        {"stage", "outside both"},  // relative: from the server's working directory
        {"$TMPDIR/link/x", "link is a symlink"},
        {"$TMPDIR/shared/x", "others may write"},
    };
    for (const auto& [stage, expect] : bad) {
        why.clear();
        EXPECT_FALSE(r.stage_dir_for_launch(stage, cwd, t, &why).has_value()) << stage;
        EXPECT_NE(why.find(expect), std::string::npos) << stage << ": " << why;
        EXPECT_EQ(why.rfind("data.stage_dir '", 0), 0u) << why;
        EXPECT_NE(why.find(root.string()), std::string::npos) << why;
    }
    EXPECT_TRUE(fs::is_empty(outside)) << "nothing created through the planted link";
    EXPECT_FALSE(fs::exists(tmp.path / "stage"));
}

TEST(ServeRoot, LinksPlantedWhereSaeReportReadsOrWritesAreNamed) {
    TempDir tmp("serve_planted");
    const fs::path run = tmp.path / "run";
    fs::create_directories(run / "sae" / "topk");
    fs::create_directories(run / "report");
    std::ofstream(run / "config.yaml") << "x";
    std::ofstream(run / "metrics.jsonl") << "x";
    std::ofstream(tmp.path / "secret") << "x";
    const int fd = ::open(run.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(fd, 0);
    Fd dir(fd);
    EXPECT_EQ(planted_link(dir.get()), "");
    const std::pair<fs::path, std::string> cases[] = {
        {"config.yaml", "config.yaml is a symlink"},
        {"report/fvu.svg", "report/fvu.svg is a symlink"},
        {"sae/topk/feature_density.csv", "sae/topk/feature_density.csv is a symlink"},
        {"sae/other", "sae/other is a symlink"},
        {"report", "report is a symlink"},
    };
    for (const auto& [name, expect] : cases) {
        const fs::path p = run / name;
        if (fs::is_directory(fs::symlink_status(p)))
            fs::remove_all(p);
        else
            fs::remove(p);
        fs::create_symlink(tmp.path / "secret", p);
        EXPECT_EQ(planted_link(dir.get()), expect) << name;
        fs::remove(p);
        if (name == "report") fs::create_directories(p);
        if (name == "config.yaml") std::ofstream(p) << "x";
        EXPECT_EQ(planted_link(dir.get()), "") << name;
    }
}

// A pid proves it is a run's only by holding the run's lock: /proc/locks, not a file's word.
TEST(ServeLauncher, APidIsTheRunsOnlyWhenItHoldsTheRunsLock) {
    TempDir tmp("serve_flock");
    std::ofstream(tmp.path / ".saetrain.lock") << "";
    std::ofstream(tmp.path / "other") << "";
    fs::create_symlink(tmp.path / ".saetrain.lock", tmp.path / "link");
    const int dir = ::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(dir, 0);
    Fd dir_fd(dir);
    EXPECT_FALSE(process_holds_flock(::getpid(), dir, ".saetrain.lock")) << "not locked yet";
    const int lock = ::open((tmp.path / ".saetrain.lock").c_str(), O_RDWR);
    ASSERT_GE(lock, 0);
    ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
    EXPECT_TRUE(process_holds_flock(::getpid(), dir, ".saetrain.lock"));
    EXPECT_FALSE(process_holds_flock(::getppid(), dir, ".saetrain.lock"));
    EXPECT_FALSE(process_holds_flock(::getpid(), dir, "other"));
    EXPECT_FALSE(process_holds_flock(::getpid(), dir, "link")) << "a link is not followed";
    ::close(lock);
    EXPECT_FALSE(process_holds_flock(::getpid(), dir, ".saetrain.lock"));
    // The parser: the holder, device (hex major:minor) and inode must all agree; a waiter's
    // line ("->") and POSIX locks do not count.
    const std::string locks =
        "1: POSIX  ADVISORY  WRITE 77 fd:01:42 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 88 fd:01:42 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 99 fd:01:42 0 EOF\n";
    const dev_t dev = makedev(0xfd, 0x01);
    EXPECT_TRUE(locks_text_has_flock(locks, 88, dev, 42));
    EXPECT_FALSE(locks_text_has_flock(locks, 77, dev, 42));
    EXPECT_FALSE(locks_text_has_flock(locks, 99, dev, 42));
    EXPECT_FALSE(locks_text_has_flock(locks, 88, dev, 43));
    EXPECT_FALSE(locks_text_has_flock(locks, 88, makedev(0xfd, 0x02), 42));
}

// ---- the token -----------------------------------------------------------------------------

TEST(ServeToken, MadeOnceWithMode0600InA0700Directory) {
    TempDir tmp("serve_token");
    const std::string path = (tmp.path / ".sae-serve" / "token").string();
    const std::string token = token_load_or_create(path);
    EXPECT_EQ(token.size(), 64u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    ASSERT_EQ(::stat((tmp.path / ".sae-serve").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_EQ(token_load_or_create(path), token);  // kept across restarts
    EXPECT_NE(token_generate(), token);
}

TEST(ServeToken, AFileOthersCouldReadOrAPlantedLinkIsRefused) {
    TempDir tmp("serve_token_bad");
    const std::string path = (tmp.path / "token").string();
    std::ofstream(path) << std::string(64, 'a') << "\n";
    ::chmod(path.c_str(), 0644);
    try {
        token_load_or_create(path);
        FAIL() << "a token file others can read was used";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("chmod 600 " + path), std::string::npos) << e.what();
    }
    ::chmod(path.c_str(), 0600);
    EXPECT_EQ(token_load_or_create(path), std::string(64, 'a'));
    const std::string link = (tmp.path / "link").string();
    fs::create_symlink(path, link);
    try {
        token_load_or_create(link);
        FAIL() << "a token file was read through a symlink";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("symlink"), std::string::npos) << e.what();
    }
    const std::string shorter = (tmp.path / "short").string();
    std::ofstream(shorter) << "secret\n";
    ::chmod(shorter.c_str(), 0600);
    EXPECT_THROW(token_load_or_create(shorter), Error);
}

TEST(ServeToken, RequestsCarryItAsBearerCookieOrQuery) {
    const std::string t(64, 'f');
    EXPECT_TRUE(token_equal(t, t));
    EXPECT_FALSE(token_equal(t.substr(0, 63), t));  // a prefix
    EXPECT_FALSE(token_equal(t + "f", t));
    EXPECT_FALSE(token_equal(std::string(63, 'f') + "e", t));
    EXPECT_FALSE(token_equal("", t));
    EXPECT_FALSE(token_equal("", ""));
    EXPECT_EQ(bearer_token("Bearer abc"), "abc");
    EXPECT_EQ(bearer_token("bearer   abc "), "abc");
    EXPECT_EQ(bearer_token("Basic abc"), "");
    EXPECT_EQ(bearer_token("Bearer"), "");
    EXPECT_EQ(cookie_value("a=1; sae_serve_token_8765=xyz; b=2", "sae_serve_token_8765"), "xyz");
    EXPECT_EQ(cookie_value("sae_serve_token_8766=xyz", "sae_serve_token_8765"), "");
    EXPECT_EQ(cookie_name(8765), "sae_serve_token_8765");
}

// ---- the metrics tail ----------------------------------------------------------------------

class ServeTail : public ::testing::Test {
protected:
    ServeTail() : dir(::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY)) {}
    TempDir tmp{"serve_tail"};
    Fd dir;
    std::string path() const { return tmp / "metrics.jsonl"; }
    static std::vector<int64_t> steps_of(const MetricsTail& t) {
        std::vector<int64_t> s;
        for (const MetricsStep& m : t.steps()) s.push_back(m.step);
        return s;
    }
};

TEST_F(ServeTail, StepsAreHandedOnWholeAndOnlyOnce) {
    MetricsTail tail(dir.get());
    EXPECT_EQ(tail.poll(2, false).first_new, 0u);  // no file yet
    append(path(), metrics_line("a", 5) + "\n");
    tail.poll(2, false);
    EXPECT_TRUE(tail.steps().empty()) << "step 5 has one SAE of two";
    append(path(), metrics_line("b", 5));  // no newline yet: still being written
    tail.poll(2, false);
    EXPECT_TRUE(tail.steps().empty());
    append(path(), "\n" + metrics_line("a", 10) + "\n");
    MetricsTail::Update up = tail.poll(2, false);
    ASSERT_EQ(steps_of(tail), std::vector<int64_t>{5});
    EXPECT_EQ(up.first_new, 0u);
    EXPECT_EQ(tail.steps()[0].lines,
              (std::vector<std::string>{metrics_line("a", 5), metrics_line("b", 5)}));
    EXPECT_EQ(tail.steps()[0].saes, (std::vector<std::string>{"a", "b"}));
    up = tail.poll(2, false);
    EXPECT_EQ(up.first_new, 1u) << "nothing new, nothing handed on twice";
    EXPECT_FALSE(up.rewound.has_value());
    append(path(), metrics_line("b", 10) + "\n");
    up = tail.poll(2, false);
    EXPECT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10}));
    EXPECT_EQ(up.first_new, 1u);
}

TEST_F(ServeTail, WithoutTheSaeCountAStepEndsWhenTheNextBeginsOrTheRunEnds) {
    MetricsTail tail(dir.get());
    append(path(), metrics_line("a", 5) + "\n" + metrics_line("b", 5) + "\n");
    tail.poll(0, false);
    EXPECT_TRUE(tail.steps().empty());
    append(path(), metrics_line("a", 10) + "\n");
    tail.poll(0, false);
    EXPECT_EQ(steps_of(tail), std::vector<int64_t>{5});
    tail.poll(0, /*ended=*/true);
    EXPECT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10}));
}

TEST_F(ServeTail, SinceAStepGivesTheStepsAfterIt) {
    MetricsTail tail(dir.get());
    for (int64_t s : {5, 10, 15}) append(path(), metrics_line("a", s) + "\n");
    tail.poll(1, false);
    EXPECT_EQ(tail.first_after(-1), 0u);
    EXPECT_EQ(tail.first_after(0), 0u);
    EXPECT_EQ(tail.first_after(5), 1u);
    EXPECT_EQ(tail.first_after(7), 1u);
    EXPECT_EQ(tail.first_after(15), 3u);
    EXPECT_EQ(tail.first_after(1000), 3u);
    EXPECT_EQ(tail.last_step(), 15);
}

TEST_F(ServeTail, AResumeThatKeepsEveryLineRepeatsNothing) {
    // A stop commits a checkpoint at the last step, so saetrain's rewrite on resume keeps every
    // line; the resumed run appends after them.
    MetricsTail tail(dir.get());
    for (int64_t s : {5, 10})
        append(path(), metrics_line("a", s) + "\n" + metrics_line("b", s) + "\n");
    tail.poll(2, false);
    drop_metrics_after(path(), 10);
    MetricsTail::Update up = tail.poll(2, false);
    EXPECT_FALSE(up.rewound.has_value());
    append(path(), metrics_line("a", 15) + "\n" + metrics_line("b", 15) + "\n");
    up = tail.poll(2, false);
    EXPECT_FALSE(up.rewound.has_value());
    EXPECT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10, 15}));
    EXPECT_EQ(up.first_new, 2u);
}

TEST_F(ServeTail, AResumeFromAnEarlierCheckpointRewindsToIt) {
    // A run killed after step 15 resumes from its checkpoint at 10: saetrain drops the lines
    // after 10 and logs 15 again, with other values.
    MetricsTail tail(dir.get());
    for (int64_t s : {5, 10, 15})
        append(path(), metrics_line("a", s) + "\n" + metrics_line("b", s) + "\n");
    tail.poll(2, false);
    ASSERT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10, 15}));
    drop_metrics_after(path(), 10);
    MetricsTail::Update up = tail.poll(2, false);
    EXPECT_FALSE(up.rewound.has_value()) << "a shorter file alone may still be being rewritten";
    append(path(), metrics_line("a", 15, 0.25) + "\n" + metrics_line("b", 15, 0.25) + "\n");
    up = tail.poll(2, false);
    ASSERT_TRUE(up.rewound.has_value());
    EXPECT_EQ(*up.rewound, 10);
    EXPECT_EQ(up.first_new, 2u);
    EXPECT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10, 15}));
    EXPECT_EQ(tail.steps()[2].lines[0], metrics_line("a", 15, 0.25));
}

TEST_F(ServeTail, ARewriteThatGrewPastTheOldEndBetweenPollsIsCaught) {
    MetricsTail tail(dir.get());
    for (int64_t s : {5, 10, 15}) append(path(), metrics_line("a", s) + "\n");
    tail.poll(1, false);
    drop_metrics_after(path(), 5);
    // The resumed run logs more than was dropped before the next poll.
    for (int64_t s : {10, 15, 20}) append(path(), metrics_line("a", s, 0.125) + "\n");
    const MetricsTail::Update up = tail.poll(1, false);
    ASSERT_TRUE(up.rewound.has_value());
    EXPECT_EQ(*up.rewound, 5);
    EXPECT_EQ(steps_of(tail), (std::vector<int64_t>{5, 10, 15, 20}));
    EXPECT_EQ(tail.steps()[1].lines[0], metrics_line("a", 10, 0.125));
    EXPECT_EQ(tail.skipped_lines(), 0);
}

TEST_F(ServeTail, AReplacedFileIsReadAgainAndALostTailIsRewound) {
    MetricsTail tail(dir.get());
    for (int64_t s : {5, 10}) append(path(), metrics_line("a", s) + "\n");
    tail.poll(1, false);
    // The same lines in a new file (another inode): nothing new.
    const std::string fresh = path() + ".new";
    append(fresh, metrics_line("a", 5) + "\n");
    fs::rename(fresh, path());
    EXPECT_FALSE(tail.poll(1, false).rewound.has_value());
    // The run ends with step 10 gone from the file: the clients drop it.
    const MetricsTail::Update up = tail.poll(1, /*ended=*/true);
    ASSERT_TRUE(up.rewound.has_value());
    EXPECT_EQ(*up.rewound, 5);
    EXPECT_EQ(steps_of(tail), std::vector<int64_t>{5});
}

TEST_F(ServeTail, LinesThatAreNotMetricsAreSkippedAndCounted) {
    MetricsTail tail(dir.get());
    append(path(), "not json\n{\"step\": 5}\n{\"sae\": \"a\", \"step\": \"5\"}\n[1,2]\n" +
                       metrics_line("a", 5) + "\n");
    tail.poll(1, false);
    EXPECT_EQ(steps_of(tail), std::vector<int64_t>{5});
    EXPECT_EQ(tail.skipped_lines(), 4);
}

// ---- the run's state -----------------------------------------------------------------------

TEST(ServeState, TheStateComesFromTheFilesAndTheProcesses) {
    StateInputs launched;
    launched.launched = launched.launch_newer = true;
    launched.wrapper_pid = 123;
    launched.wrapper_alive = true;
    EXPECT_EQ(state_derive(launched).state, "queued");
    StateInputs stopping = launched;
    stopping.stop_requested = true;
    EXPECT_EQ(state_derive(stopping).state, "stopping");

    StateInputs start_failed = launched;
    start_failed.wrapper_alive = false;
    start_failed.wrapper_exit = 1;
    start_failed.console_line = "saetrain: error: data.path /x: no such file";
    RunState s = state_derive(start_failed);
    EXPECT_EQ(s.state, "failed");
    EXPECT_EQ(s.exit_code, 1);
    EXPECT_EQ(s.exit_line, "saetrain: error: data.path /x: no such file");

    StateInputs vanished = launched;
    vanished.wrapper_alive = false;
    s = state_derive(vanished);
    EXPECT_EQ(s.state, "failed");
    EXPECT_NE(s.exit_line.find("pid 123"), std::string::npos) << s.exit_line;

    StateInputs running = launched;
    running.launch_newer = false;
    running.run_json_state = "running";
    EXPECT_EQ(state_derive(running).state, "running");
    // Ended while no server was up: the wrapper's exit file says how.
    StateInputs killed = running;
    killed.wrapper_alive = false;
    killed.wrapper_exit = 128 + SIGKILL;
    s = state_derive(killed);
    EXPECT_EQ(s.state, "failed");
    EXPECT_EQ(s.exit_code, 137);
    EXPECT_NE(s.exit_line.find("SIGKILL"), std::string::npos) << s.exit_line;

    StateInputs exiting = running;
    exiting.run_json_state = "stopped";  // written by saetrain just before it exits
    exiting.stop_requested = true;
    EXPECT_EQ(state_derive(exiting).state, "stopping") << "stopped only once the process is gone";
    StateInputs stopped = running;
    stopped.wrapper_alive = false;
    stopped.run_json_state = "stopped";
    stopped.run_json_exit = 75;
    stopped.console_line = "saetrain: stopped by a signal after 40 steps; ...";
    s = state_derive(stopped);
    EXPECT_EQ(s.state, "stopped");
    EXPECT_EQ(s.exit_code, 75);
    EXPECT_EQ(s.exit_line, stopped.console_line);

    // A run started by hand: run.json and its pid on this host.
    StateInputs hand;
    hand.run_json_state = "running";
    hand.run_pid = 77;
    hand.run_pid_alive = true;
    EXPECT_EQ(state_derive(hand).state, "running");
    hand.run_pid_alive = false;
    s = state_derive(hand);
    EXPECT_EQ(s.state, "failed");
    EXPECT_NE(s.exit_line.find("process 77 is gone"), std::string::npos) << s.exit_line;
    hand.run_pid_alive.reset();  // another host: taken at its word
    EXPECT_EQ(state_derive(hand).state, "running");
    hand.run_json_state = "complete";
    EXPECT_EQ(state_derive(hand).state, "complete");
    hand.run_pid_alive = true;  // still exiting, holding out_dir's lock
    EXPECT_EQ(state_derive(hand).state, "running");
    StateInputs failed;
    failed.run_json_state = "failed";
    failed.run_json_exit = 1;
    failed.run_json_message = "shard x.h5: truncated";
    s = state_derive(failed);
    EXPECT_EQ(s.exit_line, "saetrain: error: shard x.h5: truncated");
    StateInputs complete;
    complete.complete_marker = true;
    EXPECT_EQ(state_derive(complete).state, "complete");
    EXPECT_EQ(state_derive(StateInputs{}).state, "unknown");
}

TEST(ServeState, TheExitLineIsThisLaunchsError) {
    const std::string log =
        "sae-serve: 2026-01-01T00:00:00Z: starting: saetrain a.yaml\n"
        "saetrain: error: old launch\n"
        "sae-serve: 2026-01-01T00:00:09Z: the run's command exited with code 1\n"
        "sae-serve: 2026-01-01T00:01:00Z: starting: mpirun -np 2 saetrain a.yaml\n"
        "saetrain: rank 0 of 2 ...\n"
        "saetrain: error: rank 1: this launch; stopping all 2 ranks\n"
        "mpirun noticed that process rank 1 exited\n"
        "sae-serve: 2026-01-01T00:01:05Z: the run's command exited with code 1\n";
    EXPECT_EQ(console_exit_line(log), "saetrain: error: rank 1: this launch; stopping all 2 ranks");
    EXPECT_EQ(console_exit_line("sae-serve: x: starting: s\nsaetrain: stopped by a signal after 4 "
                                "steps\nsome tail\n"),
              "saetrain: stopped by a signal after 4 steps");
    EXPECT_EQ(console_exit_line("sae-serve: x: starting: s\nwrote a/summary.csv\n"
                                "sae-serve: x: the run's command exited with code 0\n"),
              "wrote a/summary.csv");
}

// ---- the launcher and the wrapper ----------------------------------------------------------

TEST(ServeLauncher, TheTemplateBecomesTheCommand) {
    using V = std::vector<std::string>;
    EXPECT_EQ(launch_command("", "/b/saetrain", "c.yaml", 1, {}), (V{"/b/saetrain", "c.yaml"}));
    EXPECT_EQ(launch_command("", "/b/saetrain", "c.yaml", 4, {"--overwrite"}),
              (V{"mpirun", "--oversubscribe", "-np", "4", "/b/saetrain", "c.yaml", "--overwrite"}));
    EXPECT_EQ(launch_command("srun -n {ranks} --mpi=pmix", "s", "c", 2, {}),
              (V{"srun", "-n", "2", "--mpi=pmix", "s", "c"}));
    EXPECT_EQ(launch_command("sbatch --wait --ntasks={ranks} slurm/sweep-1node.sbatch {config}",
                             "s", "c", 8, {}),
              (V{"sbatch", "--wait", "--ntasks=8", "slurm/sweep-1node.sbatch", "c"}));
    EXPECT_EQ(launch_command("env X=1 {saetrain}", "s", "c", 1, {}), (V{"env", "X=1", "s", "c"}));
    EXPECT_THROW(launch_command("mpirun -np {rank}", "s", "c", 2, {}), Error);
}

class ServeWrapper : public ::testing::Test {
protected:
    TempDir tmp{"serve_wrapper"};
    const std::string self = std::string(SAETRAIN_BIN_DIR) + "/sae-serve";
    int wait_exit(pid_t pid) {
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::optional<int> recorded() {
        Fd d(::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY));
        return wrapper_exit_code(d.get());
    }
};

TEST_F(ServeWrapper, RecordsTheExitCodeAndTheOutputInASessionOfItsOwn) {
    const pid_t pid =
        launch_spawn(self, tmp.path.string(), {"/bin/sh", "-c", "echo hello from the run; exit 3"},
                     tmp.path.string(), {"SAETRAIN=/x/saetrain"});
    EXPECT_EQ(wait_exit(pid), 3);
    EXPECT_EQ(recorded(), 3);
    const std::string log = slurp(tmp / "console.log");
    EXPECT_NE(log.find("hello from the run"), std::string::npos) << log;
    EXPECT_NE(log.find("exited with code 3"), std::string::npos) << log;
    EXPECT_EQ(console_exit_line(log), "hello from the run");
    EXPECT_FALSE(process_alive(pid, 0)) << "reaped";

    // Its own session and the environment it was given; none of the caller's descriptors.
    // A descriptor number the shell would not use for its own pipes.
    const int leaked = ::dup2(::open("/dev/null", O_RDONLY), 100);  // not close-on-exec
    ASSERT_EQ(leaked, 100);
    const pid_t p2 = launch_spawn(self, tmp.path.string(),
                                  {"/bin/sh", "-c",
                                   "echo sid=$(cut -d' ' -f6 /proc/$$/stat) wrapper=$PPID; echo "
                                   "env=$SAETRAIN; echo fds: $(ls /proc/$$/fd)"},
                                  tmp.path.string(), {"SAETRAIN=/x/saetrain"});
    EXPECT_EQ(wait_exit(p2), 0);
    ::close(leaked);
    const std::string out = slurp(tmp / "console.log");
    EXPECT_NE(out.find(fmt::format("sid={} wrapper={}", p2, p2)), std::string::npos) << out;
    EXPECT_NE(out.find("env=/x/saetrain"), std::string::npos) << out;
    const size_t fds = out.rfind("fds: 0 1 2");
    ASSERT_NE(fds, std::string::npos) << out;
    EXPECT_EQ(out.find(" 100", fds), std::string::npos) << out;
}

TEST_F(ServeWrapper, PassesAStopSignalOnAndRecords75) {
    const std::string ready = tmp / "ready";
    const pid_t pid = launch_spawn(
        self, tmp.path.string(),
        {"/bin/sh", "-c", "trap 'exit 75' USR1; touch " + ready + "; while :; do sleep 0.05; done"},
        tmp.path.string(), {});
    const uint64_t start = process_start_time(pid);
    EXPECT_GT(start, 0u);
    EXPECT_TRUE(process_alive(pid, start));
    EXPECT_FALSE(process_alive(pid, start + 1)) << "another start time: another process";
    ASSERT_TRUE(eventually([&] { return fs::exists(ready); })) << "the command never started";
    ASSERT_EQ(::kill(pid, SIGUSR1), 0);
    EXPECT_EQ(wait_exit(pid), 75);
    EXPECT_EQ(recorded(), 75);
}

TEST_F(ServeWrapper, ACommandThatCannotStartIs127) {
    const pid_t pid =
        launch_spawn(self, tmp.path.string(), {"/no/such/launcher", "x"}, tmp.path.string(), {});
    EXPECT_EQ(wait_exit(pid), 127);
    EXPECT_EQ(recorded(), 127);
    EXPECT_NE(console_exit_line(slurp(tmp / "console.log")).find("cannot start /no/such/launcher"),
              std::string::npos);
}
