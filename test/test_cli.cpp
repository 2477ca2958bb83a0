// The command-line programs as a user runs them: outputs of a run, and one clear line and a
// non-zero exit for each kind of bad input.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "saetrain/arch.h"
#include "saetrain/build_commit.h"  // defines: SAETRAIN_GIT_COMMIT
#include "saetrain/build_config.h"  // defines: SAETRAIN_VERSION, SAETRAIN_CUDA, SAETRAIN_NCCL, ...
#include "saetrain/checkpoint.h"
#include "saetrain/cores.h"
#include "saetrain/safetensors.h"
#include "saetrain/shards.h"
#include "shard_oracle.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using Result = saetrain::testing::CommandResult;
Result run(const std::string& cmd) { return saetrain::testing::run_command(cmd); }

std::string bin(const std::string& name) { return std::string(SAETRAIN_BIN_DIR) + "/" + name; }

std::vector<std::string> lines_of(const fs::path& p) {
    std::ifstream in(p);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// The whole line of `out` that starts with `prefix` (the first such), or "" when none does:
// messages are compared as whole strings, so an argument too many or too few shows.
std::string line_with(const std::string& out, const std::string& prefix) {
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
        if (l.rfind(prefix, 0) == 0) return l;
    return "";
}

class Cli : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        // The pid keeps concurrent runs of the suite (several build trees) apart.
        dir = fs::temp_directory_path() /
              (std::string("saetrain_cli_") + std::to_string(getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir);
        fs::create_directories(dir);
        const Result r = run(bin("sae-synth") + " --out " + (dir / "data").string() +
                             " --d-model 16 --features 32 --rows 3000 --shards 2 --seed 3");
        ASSERT_EQ(r.code, 0) << r.out;
        std::ofstream(dir / "cfg.yaml") << "run: {out_dir: " << (dir / "run").string() << "}\n"
                                        << "data: {path: " << (dir / "data").string()
                                        << ", batch_size: 256, shuffle_buffer_rows: 1024}\n"
                                        << "sae: {arch: topk, expansion: 2, k: 4}\n"
                                        << "train: {lr: 0.005, warmup_steps: 2}\n"
                                        << "log: {every_steps: 4}\n"
                                        << "checkpoint: {every_steps: 5, keep: 1}\n";
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    Result train(const std::string& extra = "") {
        return run(bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --threads 1 " + extra);
    }
};

TEST_F(Cli, TrainWritesEveryOutput) {
    const Result r = train();
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("recovery"), std::string::npos) << r.out;
    const fs::path run_dir = dir / "run";
    // config.yaml: the resolved config, defaults written out.
    std::ifstream cfg(run_dir / "config.yaml");
    std::stringstream cs;
    cs << cfg.rdbuf();
    EXPECT_NE(cs.str().find("dead_tokens"), std::string::npos);
    // metrics.jsonl: 3000 rows / 256 = 12 steps, logged every 4 -> 3 lines with the brief's keys.
    std::ifstream metrics(run_dir / "metrics.jsonl");
    std::string line;
    int lines = 0;
    int64_t last_step = 0;
    while (std::getline(metrics, line)) {
        const auto j = nlohmann::json::parse(line);
        for (const char* key : {"sae", "step", "tokens", "lr", "mse", "fvu", "l0", "dead_fraction",
                                "tokens_per_s", "read_MBps", "loss"})
            EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
        EXPECT_GT(j["step"].get<int64_t>(), last_step);
        last_step = j["step"].get<int64_t>();
        ++lines;
    }
    EXPECT_EQ(lines, 3);
    EXPECT_EQ(last_step, 12);
    // summary.csv: header and one row for the one SAE.
    std::ifstream summary(run_dir / "summary.csv");
    std::string header, row, extra;
    std::getline(summary, header);
    std::getline(summary, row);
    EXPECT_FALSE(std::getline(summary, extra));
    // The configuration columns: every architecture's summary keys (the registry's), blank in
    // the columns a TopK SAE does not read.
    std::string columns = "sae,arch,n_latents,", cells = "topk-x2-k4,topk,32,";
    for (const std::string& key : saetrain::arch_summary_keys()) {
        columns += key.substr(key.find('.') + 1) + ",";
        cells += key == "sae.k" ? "4," : ",";
    }
    EXPECT_EQ(header.rfind(columns + "lr,", 0), 0u) << header;
    EXPECT_EQ(row.rfind(cells + "0.005,12,3000,", 0), 0u) << row;
    // The quality gates close every row, and each SAE has its feature-density histogram.
    EXPECT_NE(header.find(",rel_recon_err,zeros_frac,decorr_rms,gates_dead_fraction,"
                          "gates_dense_fraction,gates_on,gates"),
              std::string::npos)
        << header;
    EXPECT_TRUE(row.size() > 5 &&
                (row.substr(row.size() - 5) == ",PASS" || row.substr(row.size() - 5) == ",FAIL"))
        << row;
    EXPECT_TRUE(fs::is_regular_file(run_dir / "sae" / "topk-x2-k4" / "feature_density.csv"));
    EXPECT_NE(header.find("feature_recovery"), std::string::npos) << header;
    // final.h5: shapes of the brief and the step count.
    saetrain::SaeMeta meta;
    const auto w = saetrain::sae_read_h5((run_dir / "sae/topk-x2-k4/final.h5").string(), &meta);
    EXPECT_EQ(w.d_model, 16);
    EXPECT_EQ(w.n_latents, 32);
    EXPECT_EQ(meta.step, 12);
    EXPECT_EQ(meta.tokens, 3000);
    EXPECT_EQ(meta.arch, "topk");
    // checkpoints at steps 5, 10 and the end (12), keeping only the newest, committed.
    EXPECT_EQ(saetrain::checkpoint_steps((run_dir / "sae/topk-x2-k4").string()),
              std::vector<int64_t>{12});
    EXPECT_TRUE(fs::exists(run_dir / "checkpoints/step-12.commit"));
    EXPECT_FALSE(fs::exists(run_dir / "checkpoints/step-10.commit"));
    EXPECT_TRUE(fs::exists(run_dir / "sae/topk-x2-k4/checkpoint-12.state.h5"));
    saetrain::sae_read_h5((run_dir / "sae/topk-x2-k4/checkpoint-12.h5").string(), &meta);
    EXPECT_EQ(meta.step, 12);
    EXPECT_TRUE(fs::exists(run_dir / "COMPLETE"));
}

// summary.csv as column -> value, one map per row.
std::vector<std::map<std::string, std::string>> csv_rows(const fs::path& p) {
    auto split = [](const std::string& line) {
        std::vector<std::string> cells;
        std::stringstream ss(line);
        for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
        if (!line.empty() && line.back() == ',') cells.emplace_back();
        return cells;
    };
    const auto lines = lines_of(p);
    std::vector<std::map<std::string, std::string>> rows;
    if (lines.empty()) return rows;
    const auto header = split(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
        const auto cells = split(lines[i]);
        std::map<std::string, std::string> r;
        for (size_t c = 0; c < header.size() && c < cells.size(); ++c) r[header[c]] = cells[c];
        rows.push_back(r);
    }
    return rows;
}

// Model FLOPs per token of the fixture's SAE (TopK, d = 16, n = 32, k = 4, sparse kernels):
// 2*d*n + 8*k*d, computed here by hand rather than through perfmodel.h.
constexpr double kFixtureFlopsPerToken = 2.0 * 16 * 32 + 8.0 * 4 * 16;

// Throughput and memory as a benchmark reports them: TFLOP/s from the model FLOPs and the
// measured tokens/s, the process's peak RSS as host memory, and MFU only against a known peak.
TEST_F(Cli, MetricsReportTflopsMemoryAndMfuOnlyWithAPeak) {
    Result r = train("--set backend=cpu");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("no MFU"), std::string::npos) << r.out;
    const auto metrics = lines_of(dir / "run/metrics.jsonl");
    ASSERT_EQ(metrics.size(), 3u);
    for (const std::string& line : metrics) {
        const auto j = nlohmann::json::parse(line);
        const double tflops = j["tflops"].get<double>();
        EXPECT_GT(tflops, 0) << line;
        EXPECT_NEAR(tflops, kFixtureFlopsPerToken * j["tokens_per_s"].get<double>() / 1e12,
                    1e-9 * tflops)
            << line;
        // A process that mapped the shards, OpenBLAS and the SAE holds more than 1 MB and
        // less than this machine's memory.
        ASSERT_TRUE(j.contains("host_mem_peak_GB")) << line;
        EXPECT_GT(j["host_mem_peak_GB"].get<double>(), 1e-3) << line;
        EXPECT_LT(j["host_mem_peak_GB"].get<double>(), 1024.0) << line;
        EXPECT_FALSE(j.contains("mfu")) << "no peak is known for the CPU: " << line;
        EXPECT_FALSE(j.contains("gpu_mem_peak_GB")) << line;
    }
    auto summary = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 1u);
    EXPECT_NEAR(std::stod(summary[0]["tflops"]),
                kFixtureFlopsPerToken * std::stod(summary[0]["tokens_per_s"]) / 1e12,
                1e-5 * std::stod(summary[0]["tflops"]));
    EXPECT_GT(std::stod(summary[0]["host_mem_peak_GB"]), 1e-3);
    EXPECT_EQ(summary[0].count("mfu"), 0u);
    EXPECT_EQ(summary[0].count("gpu_mem_peak_GB"), 0u);
    EXPECT_NE(r.out.find("TFLOP/s"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("host mem GB"), std::string::npos) << r.out;

    // With a configured peak: mfu = tflops / peak, in the log, the summary and the console.
    r = train("--overwrite --set backend=cpu --set log.peak_tflops=0.001");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("MFU against 0.001 TFLOP/s per device (log.peak_tflops)"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("MFU %"), std::string::npos) << r.out;
    for (const std::string& line : lines_of(dir / "run/metrics.jsonl")) {
        const auto j = nlohmann::json::parse(line);
        ASSERT_TRUE(j.contains("mfu")) << line;
        EXPECT_NEAR(j["mfu"].get<double>(), j["tflops"].get<double>() / 0.001,
                    1e-9 * j["mfu"].get<double>())
            << line;
    }
    summary = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 1u);
    ASSERT_EQ(summary[0].count("mfu"), 1u);
    EXPECT_NEAR(std::stod(summary[0]["mfu"]), std::stod(summary[0]["tflops"]) / 0.001,
                1e-5 * std::stod(summary[0]["mfu"]));
}

// A run stopped between its final checkpoint and COMPLETE resumes with nothing left to train:
// its summary must still describe the SAE (from the log), not an empty interval of zeros.
TEST_F(Cli, ResumedAtTheEndKeepsTheSummary) {
    ASSERT_EQ(train().code, 0);
    const auto before = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(before.size(), 1u);
    fs::remove(dir / "run/COMPLETE");
    const Result r = train();
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resumed from the checkpoint"), std::string::npos) << r.out;
    const auto after = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(after.size(), 1u);
    for (const char* key : {"steps", "tokens", "mse", "fvu", "l0", "dead_fraction"})
        EXPECT_EQ(after[0].at(key), before[0].at(key)) << key;
    EXPECT_GT(std::stod(after[0].at("fvu")), 0.0);
    EXPECT_GT(std::stod(after[0].at("tokens_per_s")), 0.0);
}

TEST_F(Cli, FinishedRunsAreKeptAndForeignRunsRefused) {
    ASSERT_EQ(train().code, 0);
    // A finished run: nothing to do, nothing overwritten.
    const auto before = fs::last_write_time(dir / "run/sae/topk-x2-k4/final.h5");
    Result again = train();
    EXPECT_EQ(again.code, 0) << again.out;
    EXPECT_NE(again.out.find("nothing to do"), std::string::npos) << again.out;
    EXPECT_EQ(fs::last_write_time(dir / "run/sae/topk-x2-k4/final.h5"), before);
    // A run that died before its first checkpoint: another config's run is refused, not
    // clobbered; the same run starts again.
    fs::remove_all(dir / "run/checkpoints");
    fs::remove(dir / "run/COMPLETE");
    again = train("--set train.lr=0.01");
    EXPECT_NE(again.code, 0);
    EXPECT_NE(again.out.find("--overwrite"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("train.lr"), std::string::npos) << again.out;
    again = train();
    EXPECT_EQ(again.code, 0) << again.out;
    EXPECT_TRUE(fs::exists(dir / "run/COMPLETE"));
    EXPECT_EQ(lines_of(dir / "run/metrics.jsonl").size(), 3u) << "the dead run's log is replaced";
    EXPECT_EQ(train("--overwrite --set train.lr=0.01").code, 0);
}

// Hostile inputs (issue 35): nothing outside the run is touched, and no user-named path that is
// not a regular file is opened (a FIFO would block open() where no signal reaches).
TEST_F(Cli, ForeignOutDirsAndNonRegularFilesAreRefusedBeforeAnythingIsWritten) {
    // A directory with someone's files and no run in it: refused, with or without --overwrite,
    // and left as it was (no lock file, no config.yaml).
    fs::create_directories(dir / "run/sae");
    std::ofstream(dir / "run/sae/notes.txt") << "mine\n";
    for (const char* extra : {"", "--overwrite"}) {
        const Result r = train(extra);
        EXPECT_EQ(r.code, 1) << extra << ": " << r.out;
        EXPECT_NE(line_with(r.out, "saetrain: error: run.out_dir " + (dir / "run").string() +
                                       " holds files that no saetrain run wrote (e.g. 'sae')"),
                  "")
            << r.out;
        EXPECT_TRUE(fs::exists(dir / "run/sae/notes.txt")) << extra;
        EXPECT_FALSE(fs::exists(dir / "run/.saetrain.lock")) << extra;
        EXPECT_FALSE(fs::exists(dir / "run/config.yaml")) << extra;
    }
    fs::remove_all(dir / "run");
    // The root directory, whatever the spelling.
    for (const std::string& root : {std::string("/"), (dir / "../../..").string() + "/"}) {
        if (fs::weakly_canonical(root) != "/") continue;
        const Result r = train("--overwrite --set run.out_dir=" + root);
        EXPECT_EQ(r.code, 1) << r.out;
        EXPECT_NE(r.out.find("is the root directory"), std::string::npos) << r.out;
    }
    fs::create_directories(dir / "home");
    const Result home = run("HOME=" + (dir / "home").string() + " " + bin("saetrain") + " " +
                            (dir / "cfg.yaml").string() +
                            " --overwrite --set run.out_dir=" + (dir / "home/.").string());
    EXPECT_EQ(home.code, 1) << home.out;
    EXPECT_NE(home.out.find("is the home directory"), std::string::npos) << home.out;
    // A run's own directory is still ours: a planted config.yaml or lock-file symlink is refused
    // (SymlinksPlantedInARunDirectoryAreRefused has the other files), never written through.
    ASSERT_EQ(train().code, 0);
    std::ofstream(dir / "victim.txt") << "keep\n";
    fs::remove(dir / "run/config.yaml");
    fs::create_symlink(dir / "victim.txt", dir / "run/config.yaml");
    const Result cfg_link = train("--overwrite");
    EXPECT_EQ(cfg_link.code, 1) << cfg_link.out;
    EXPECT_NE(cfg_link.out.find("config.yaml is a symlink"), std::string::npos) << cfg_link.out;
    EXPECT_TRUE(fs::is_symlink(dir / "run/config.yaml"));
    EXPECT_EQ(lines_of(dir / "victim.txt"), std::vector<std::string>{"keep"});
    fs::remove(dir / "run/config.yaml");
    fs::remove(dir / "run/.saetrain.lock");
    fs::create_symlink(dir / "victim.txt", dir / "run/.saetrain.lock");
    const Result lock = train("--overwrite");
    EXPECT_EQ(lock.code, 1) << lock.out;
    EXPECT_NE(lock.out.find("is a symlink"), std::string::npos) << lock.out;
    EXPECT_EQ(lines_of(dir / "victim.txt"), std::vector<std::string>{"keep"});
    // A FIFO as the config, as a shard among the data files, and as data.path; a directory as
    // the config; a dangling symlink among the shards (it was skipped: fewer rows, exit 0).
    ASSERT_EQ(::mkfifo((dir / "fifo.yaml").c_str(), 0600), 0);
    const Result fifo_cfg =
        run("timeout 20 " + bin("saetrain") + " " + (dir / "fifo.yaml").string());
    EXPECT_EQ(line_with(fifo_cfg.out, "saetrain: error:"),
              "saetrain: error: config file " + (dir / "fifo.yaml").string() +
                  " is a FIFO, not a regular file; saetrain reads only regular files");
    const Result dir_cfg = run(bin("saetrain") + " " + dir.string());
    EXPECT_NE(dir_cfg.out.find("is a directory, not a regular file"), std::string::npos)
        << dir_cfg.out;
    ASSERT_EQ(::mkfifo((dir / "data/zz.h5").c_str(), 0600), 0);
    const Result fifo_shard =
        run("timeout 20 " + bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --overwrite");
    EXPECT_EQ(fifo_shard.code, 1) << fifo_shard.out;
    EXPECT_NE(fifo_shard.out.find("shard " + (dir / "data/zz.h5").string() + " is a FIFO"),
              std::string::npos)
        << fifo_shard.out;
    const Result fifo_path =
        run("timeout 20 " + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --overwrite --set data.path=" + (dir / "data/zz.h5").string());
    EXPECT_EQ(fifo_path.code, 1) << fifo_path.out;
    EXPECT_NE(fifo_path.out.find("is a FIFO"), std::string::npos) << fifo_path.out;
    fs::remove(dir / "data/zz.h5");
    fs::create_symlink(dir / "gone.h5", dir / "data/zz.h5");
    const Result dangling = train("--overwrite");
    EXPECT_EQ(dangling.code, 1) << dangling.out;
    EXPECT_NE(dangling.out.find("zz.h5 is a dangling symlink"), std::string::npos) << dangling.out;
}

// Each bad input: non-zero exit and one "saetrain: error:" line naming the culprit.
TEST_F(Cli, BadInputsFailWithOneClearLine) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--set sae.expnasion=4", "sae.expansion"},  // typo: the nearest key is suggested
        {"--set sae.k=64", "sae.k"},                 // k > n_latents (32)
        {"--set train.lr=-1", "train.lr"},           // bad value
        {"--set data.path=" + (dir / "nowhere").string(), "nowhere"},  // missing data
    };
    for (const auto& [args, needle] : cases) {
        const Result r = train(args);
        EXPECT_NE(r.code, 0) << args;
        EXPECT_NE(r.out.find("saetrain: error:"), std::string::npos) << args << ": " << r.out;
        EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
        EXPECT_FALSE(fs::exists(dir / "run" / "metrics.jsonl")) << args;
    }
    // A sweep larger than the world: the whole line (issue 34's had nine arguments for eight
    // fields and read "one SAE per rank2: mpirun -np  / srun -n 2").
    const Result sweep = train("--set 'sae.k=[16,32]'");
    EXPECT_EQ(sweep.code, 1) << sweep.out;
    EXPECT_EQ(line_with(sweep.out, "saetrain: error:"),
              "saetrain: error: " + (dir / "cfg.yaml").string() +
                  ": the sweep has 2 SAE config(s) but the job has 1 rank(s); run with 2 rank(s) "
                  "(one SAE per rank: mpirun -np 2 / srun -n 2)");
    const Result missing = run(bin("saetrain") + " " + (dir / "absent.yaml").string());
    EXPECT_NE(missing.code, 0);
    EXPECT_NE(missing.out.find("absent.yaml"), std::string::npos) << missing.out;
}

std::string mpirun(int np) {
    // `timeout` turns a hung job into exit code 124 instead of a stuck test.
    return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " SAETRAIN_MPIEXEC
           " --oversubscribe -np " +
           std::to_string(np) + " ";
}

size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
    return n;
}

TEST_F(Cli, MpiSweepTrainsOneSaePerRank) {
    const Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
                         " --set 'sae.k=[2,4]'");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto summary = lines_of(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 3u) << r.out;  // header + one row per SAE, sorted by l0
    EXPECT_EQ(summary[1].rfind("topk-x2-k2,", 0), 0u) << summary[1];
    EXPECT_EQ(summary[2].rfind("topk-x2-k4,", 0), 0u) << summary[2];
    // Both SAEs see the whole dataset once (shared stream): 3000 tokens each.
    EXPECT_NE(summary[1].find(",12,3000,"), std::string::npos) << summary[1];
    EXPECT_NE(summary[2].find(",12,3000,"), std::string::npos) << summary[2];
    const auto metrics = lines_of(dir / "run/metrics.jsonl");
    EXPECT_EQ(metrics.size(), 6u);  // 3 log intervals x 2 SAEs
    EXPECT_TRUE(fs::exists(dir / "run/sae/topk-x2-k2/final.h5"));
    EXPECT_TRUE(fs::exists(dir / "run/sae/topk-x2-k4/final.h5"));
    EXPECT_EQ(count(r.out, "sae (sorted by l0)"), 1u) << "only rank 0 prints";
}

// Waits that do not spin through the time slices of threads sharing the cores: OpenMP's idle
// threads spin briefly, then sleep (saetrain executes itself once with GOMP_SPINCOUNT=1000 unless
// the user chose a policy), and MPI's waits yield the core when the node's ranks outnumber its
// cores; the start-up line says which.
TEST_F(Cli, WaitsYieldTheCoresUnlessTheUserChoseOtherwise) {
    const std::string cmd = bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --overwrite";
    // OpenBLAS's kernels likewise: saetrain's choice for this CPU unless the user named them.
    const char* core = saetrain::blas_core_for_this_cpu();
    const std::string kernels =
        core ? fmt::format(
                   "; OpenBLAS kernels {} (OPENBLAS_CORETYPE, saetrain's choice for this "
                   "CPU)\n",
                   core)
             : "\n";
    Result r = run("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE " + cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("; idle threads spin 1000 times, then sleep "
                         "(GOMP_SPINCOUNT, saetrain's default)" +
                         kernels),
              std::string::npos)
        << r.out;
    r = run("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=5 OPENBLAS_CORETYPE=PRESCOTT " + cmd);
    EXPECT_NE(r.out.find("; idle threads spin 5 times, then sleep (GOMP_SPINCOUNT); OpenBLAS "
                         "kernels PRESCOTT (OPENBLAS_CORETYPE)\n"),
              std::string::npos)
        << r.out;
    r = run("env -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=active " + cmd);
    EXPECT_NE(r.out.find("; OMP_WAIT_POLICY=active" + kernels), std::string::npos) << r.out;
    // An empty OPENBLAS_CORETYPE names no kernels: saetrain names them as if it were unset.
    r = run("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OPENBLAS_CORETYPE= " + cmd);
    EXPECT_NE(r.out.find("(GOMP_SPINCOUNT, saetrain's default)" + kernels), std::string::npos)
        << r.out;
    // 2 ranks of 1 + cores threads each outnumber the cores: MPI's waits yield.
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    r = run("env -u OMPI_MCA_mpi_yield_when_idle -u OPENBLAS_CORETYPE " + mpirun(2) +
            bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --overwrite --set 'sae.k=[2,4]' --threads " + std::to_string(cores));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("; MPI waits yield the core (mpi_yield_when_idle, set as ranks outnumber "
                         "cores)" +
                         kernels),
              std::string::npos)
        << r.out;
    // 2 ranks of 1 thread confined to one CPU (taskset, and mpirun binding nothing: the cpuset a
    // container or Slurm's cgroup gives a job) outnumber its cores too, however many the machine
    // has.
    r = run("env -u OMPI_MCA_mpi_yield_when_idle -u OPENBLAS_CORETYPE taskset -c 0 env " +
            mpirun(2) + "--bind-to none " + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --overwrite --set 'sae.k=[2,4]' --threads 1");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("; MPI waits yield the core (mpi_yield_when_idle, set as ranks outnumber "
                         "cores)"),
              std::string::npos)
        << r.out;
}

// saetrain executes itself again to set its OpenMP spin count (cores.h): the process keeps its
// name, so ps, pgrep, pkill and the fault matrix still find "saetrain" (it was "exe").
TEST_F(Cli, SettingItsSpinsKeepsTheProcessName) {
    const Result r =
        run("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY SAETRAIN_FAULT=0:2:STOP " + bin("saetrain") +
            " " + (dir / "cfg.yaml").string() + " --threads 1 > " + (dir / "log").string() +
            " 2>&1 & p=$!; for i in $(seq 200); do grep -q '^State:.*T' "
            "/proc/$p/status && break; sleep 0.05; done; echo \"name $(cat "
            "/proc/$p/comm)\"; kill -CONT $p; wait $p; echo \"exit $?\"");
    EXPECT_NE(r.out.find("name saetrain\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("exit 0"), std::string::npos) << r.out;
    std::string log;
    for (const std::string& line : lines_of(dir / "log")) log += line + "\n";
    EXPECT_NE(log.find("(GOMP_SPINCOUNT, saetrain's default)"), std::string::npos)
        << "the run set its spins itself: " << log;
}

// No result depends on the thread count (cpu_backend.cpp: reductions in fixed blocks, GEMMs in
// fixed tiles), so a run is the same on any machine and its threads may follow the cores other
// processes leave: every architecture of one rank trains the same bits at 1, 2 and 3 threads.
// The GEMMs are wide enough to be split in several tiles (512 x 512 and 64 x 512).
TEST_F(Cli, ResultsDoNotDependOnTheThreadCount) {
    const Result d = run(bin("sae-synth") + " --out " + (dir / "wide").string() +
                         " --d-model 64 --features 256 --rows 6144 --seed 5");
    ASSERT_EQ(d.code, 0) << d.out;
    for (const char* arch : {"topk", "batchtopk", "relu", "jumprelu", "gated", "switch"}) {
        std::vector<fs::path> finals;
        for (const int threads : {1, 2, 3}) {
            const fs::path out = dir / fmt::format("{}-{}", arch, threads);
            const Result r = run(
                bin("saetrain") + " " + (dir / "cfg.yaml").string() +
                " --fixed-threads --threads " + std::to_string(threads) +
                " --set data.path=" + (dir / "wide").string() +
                " --set data.batch_size=512 --set sae.expansion=8 --set sae.k=8 --set sae.arch=" +
                arch + " --set sae.n_experts=2 --set data.eval_rows=512 --set run.out_dir=" +
                out.string());
            ASSERT_EQ(r.code, 0) << r.out;
            EXPECT_NE(r.out.find(fmt::format(" {} CPU thread(s) each; ", threads)),
                      std::string::npos)
                << r.out;
            fs::path final_h5;
            for (const auto& e : fs::directory_iterator(out / "sae"))
                final_h5 = e.path() / "final.h5";
            finals.push_back(final_h5);
        }
        for (size_t i = 1; i < finals.size(); ++i) {
            const Result c = run(bin("sae-inspect") + " " + finals[0].string() + " --compare " +
                                 finals[i].string());
            EXPECT_EQ(c.code, 0) << arch << ": " << finals[0] << " against " << finals[i] << "\n"
                                 << c.out;
        }
    }
}

// Beside a job that keeps every core busy, a rank's threads shrink to what the job leaves (one:
// each busy loop takes half of its core while the rank's threads share them) and the run says
// so; with --fixed-threads they stay as asked; the SAE is the same bits either way (test_e2e
// LoopThreads checks every architecture). Needs 2 cores or more.
TEST_F(Cli, ThreadsFollowTheCoresOtherProcessesLeave) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 2) GTEST_SKIP() << "one core: a rank has no thread to give back";
    const Result d = run(bin("sae-synth") + " --out " + (dir / "long").string() +
                         " --d-model 64 --features 256 --rows 30000 --seed 6");
    ASSERT_EQ(d.code, 0) << d.out;
    const std::string cmd =
        bin("saetrain") + " " + (dir / "cfg.yaml").string() +
        " --set data.path=" + (dir / "long").string() +
        " --set data.batch_size=1024 --set data.epochs=20 --set sae.expansion=8 "
        "--set log.every_steps=20 --set checkpoint.every_steps=100000 "
        "--threads 2";
    // One busy loop per core, for the run's time and no longer (killed by pid).
    const auto beside_busy_loops = [&](const std::string& extra, const fs::path& out) {
        return run("pids=; for i in $(seq " + std::to_string(cores) +
                   "); do (while :; do :; done) & pids=\"$pids $!\"; done; " + cmd + " " + extra +
                   " --set run.out_dir=" + out.string() + "; code=$?; kill $pids; exit $code");
    };
    const auto mean_threads = [&](const fs::path& out) {
        std::vector<double> v;
        for (const std::string& line : lines_of(out / "metrics.jsonl"))
            v.push_back(nlohmann::json::parse(line).value("cpu_threads", 0.0));
        return v;
    };
    Result r = beside_busy_loops("", dir / "adapts");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(" 2 CPU thread(s) each (fewer while other processes take their cores); "),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(" CPU threads on average, 1 at fewest, of the 2 asked: other processes "
                         "took the rest of its cores\n"),
              std::string::npos)
        << r.out;
    const std::vector<double> adapted = mean_threads(dir / "adapts");
    ASSERT_FALSE(adapted.empty());
    EXPECT_LT(*std::min_element(adapted.begin(), adapted.end()), 2.0) << r.out;
    for (const double t : adapted) EXPECT_GE(t, 1.0);

    r = beside_busy_loops("--fixed-threads", dir / "fixed");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(" 2 CPU thread(s) each; "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(" at fewest, of the "), std::string::npos) << r.out;
    for (const double t : mean_threads(dir / "fixed")) EXPECT_EQ(t, 2.0);
    // The same SAE either way.
    const Result c =
        run(bin("sae-inspect") + " " + (dir / "adapts/sae/topk-x8-k4/final.h5").string() +
            " --compare " + (dir / "fixed/sae/topk-x8-k4/final.h5").string());
    EXPECT_EQ(c.code, 0) << c.out;
}

// sae-inspect --compare: two SAEs that differ exit 1 with the first differing value and the
// largest difference relative to its tensor's largest value (the multinode test reads it).
TEST_F(Cli, InspectCompareNamesTheFirstAndLargestDifference) {
    Result r = train("--set run.out_dir=" + (dir / "a").string());
    ASSERT_EQ(r.code, 0) << r.out;
    r = train("--set run.out_dir=" + (dir / "b").string() + " --set train.lr=0.00501");
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string a = (dir / "a/sae/topk-x2-k4/final.h5").string(),
                      b = (dir / "b/sae/topk-x2-k4/final.h5").string();
    const Result same = run(bin("sae-inspect") + " " + a + " --compare " + a);
    EXPECT_EQ(same.code, 0) << same.out;
    EXPECT_NE(same.out.find("weights bitwise identical"), std::string::npos) << same.out;
    const Result c = run(bin("sae-inspect") + " " + a + " --compare " + b);
    EXPECT_EQ(c.code, 1) << c.out;
    const size_t at = c.out.find("; max relative difference ");
    ASSERT_NE(at, std::string::npos) << c.out;
    EXPECT_NE(c.out.find(" differ: W_enc["), std::string::npos) << c.out;
    // A 0.2% change of the learning rate over 12 steps moves the weights by far less than their
    // size, but not by nothing.
    const double rel = std::stod(c.out.substr(at + 26));
    EXPECT_GT(rel, 1e-6) << c.out;
    EXPECT_LT(rel, 0.5) << c.out;
}

// data.shuffle_buffer_bytes sizes the shuffle window in bytes: as many stored rows as fit, the
// same shuffle as that many rows given as data.shuffle_buffer_rows; with both set it is refused.
TEST_F(Cli, ShuffleBufferInBytesIsTheRowsThatFit) {
    Result rows = train("--set data.shuffle_buffer_rows=312");
    ASSERT_EQ(rows.code, 0) << rows.out;
    EXPECT_NE(rows.out.find("shuffle: windows of 312 rows (0.0 MB as stored, "
                            "data.shuffle_buffer_rows; the reader holds two)"),
              std::string::npos)
        << rows.out;
    // 16 float32 values a row: 20,000 bytes hold 312 rows.
    Result bytes = train(
        "--set data.shuffle_buffer_rows=262144 --set data.shuffle_buffer_bytes=20000 "
        "--set run.out_dir=" +
        (dir / "run2").string());
    ASSERT_EQ(bytes.code, 0) << bytes.out;
    EXPECT_NE(bytes.out.find("shuffle: windows of 312 rows (0.0 MB as stored, "
                             "data.shuffle_buffer_bytes; the reader holds two)"),
              std::string::npos)
        << bytes.out;
    const fs::path sae = fs::path("sae") / "topk-x2-k4" / "final.h5";
    EXPECT_TRUE(saetrain::sae_read_h5((dir / "run" / sae).string()) ==
                saetrain::sae_read_h5((dir / "run2" / sae).string()))
        << "the same 312-row windows trained the same SAE";
    Result both =
        train("--set data.shuffle_buffer_bytes=20000 --set run.out_dir=" + (dir / "run3").string());
    EXPECT_NE(both.code, 0);
    EXPECT_NE(both.out.find("data.shuffle_buffer_bytes"), std::string::npos) << both.out;
    EXPECT_FALSE(fs::exists(dir / "run3" / "config.yaml"));
}

// Held-out rows: the last data.eval_rows rows are never trained on, or data.eval_path gives
// shards of their own; the held-out FVU, L0, dead and dense fractions reach the console,
// metrics.jsonl and summary.csv, labelled as held-out. Two data-parallel replicas split the
// held-out rows and report the whole set.
TEST_F(Cli, HeldOutRowsAreNeverTrainedAndReported) {
    auto summary_row = [&] {
        const auto lines = lines_of(dir / "run/summary.csv");
        std::map<std::string, std::string> row;
        if (lines.size() != 2) return row;
        std::stringstream h(lines[0]), v(lines[1]);
        for (std::string k, x; std::getline(h, k, ',') && std::getline(v, x, ',');) row[k] = x;
        return row;
    };
    Result r = train("--set data.eval_rows=1000 --set log.eval_every_steps=4");
    ASSERT_EQ(r.code, 0) << r.out;
    auto row = summary_row();
    EXPECT_EQ(row["tokens"], "2000");  // 3000 rows less the 1000 held out
    EXPECT_EQ(row["eval_rows"], "1000");
    const double fvu = std::stod(row["eval_fvu"]);
    EXPECT_GT(fvu, 0.0);
    EXPECT_LT(fvu, 1.0);
    EXPECT_NE(r.out.find("held-out: 1000 rows from the last rows of"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("held-out (1000 rows): fvu"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("held-out fvu"), std::string::npos) << r.out;
    // 8 steps, logged every 4 with an evaluation each: the last line carries the end's.
    const auto metrics = lines_of(dir / "run/metrics.jsonl");
    ASSERT_EQ(metrics.size(), 2u);
    for (const std::string& m : metrics) {
        const auto j = nlohmann::json::parse(m);
        EXPECT_EQ(j.value("eval_rows", 0), 1000) << m;
    }
    EXPECT_NEAR(nlohmann::json::parse(metrics.back())["eval_fvu"].get<double>(), fvu, 1e-6);

    // Shards of their own: all of them, every training row trained; then with two replicas.
    const Result synth = run(bin("sae-synth") + " --out " + (dir / "held").string() +
                             " --d-model 16 --features 32 --rows 700 --shards 1 --seed 9");
    ASSERT_EQ(synth.code, 0) << synth.out;
    const std::string eval_path = " --set data.eval_path=" + (dir / "held").string();
    r = train("--overwrite" + eval_path);
    ASSERT_EQ(r.code, 0) << r.out;
    row = summary_row();
    EXPECT_EQ(row["tokens"], "3000");
    EXPECT_EQ(row["eval_rows"], "700");
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --overwrite" +
            eval_path + " --set data.eval_rows=500 --set parallel.mode=data_parallel");
    ASSERT_EQ(r.code, 0) << r.out;
    row = summary_row();
    EXPECT_EQ(row["tokens"], "3000");
    EXPECT_EQ(row["eval_rows"], "500");

    // Held-out rows that cannot be: one line naming the key or the path.
    const Result wide = run(bin("sae-synth") + " --out " + (dir / "wide").string() +
                            " --d-model 8 --features 16 --rows 100 --shards 1");
    ASSERT_EQ(wide.code, 0) << wide.out;
    for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
             {"--set data.eval_rows=3000", "data.eval_rows = 3000"},
             {"--set data.eval_path=" + (dir / "wide").string(), "differs from the training"},
             {"--set data.eval_path=" + (dir / "absent").string(), "absent"},
             {"--set log.eval_every_steps=6", "log.eval_every_steps"}}) {
        r = train("--overwrite " + args);
        EXPECT_EQ(r.code, 1) << args;
        EXPECT_NE(r.out.find("saetrain: error:"), std::string::npos) << args << ": " << r.out;
        EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
    }
}

// A transcoder over two latent shards trains and evaluates as one process does (the shards
// receive the whole [x | y] rows: each once got half of each row and the run crashed).
TEST_F(Cli, MpiLatentShardedTranscoderTrainsAsOneProcess) {
    const Result synth =
        run(bin("sae-synth") + " --out " + (dir / "in").string() + " --target " +
            (dir / "out").string() + " --d-model 16 --features 32 --rows 3000 --shards 2 --seed 5");
    ASSERT_EQ(synth.code, 0) << synth.out;
    const std::string sets = " --set data.path=" + (dir / "in").string() +
                             " --set data.target_path=" + (dir / "out").string() +
                             " --set sae.arch=transcoder --set data.eval_rows=500"
                             " --set parallel.mode=data_parallel";
    auto eval_fvu = [&] {
        const auto j = nlohmann::json::parse(lines_of(dir / "run/metrics.jsonl").back());
        return j["eval_fvu"].get<double>();
    };
    Result r = train(sets);
    ASSERT_EQ(r.code, 0) << r.out;
    const double one = eval_fvu();
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --overwrite" +
            sets + " --set parallel.latent_shards=2");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NEAR(eval_fvu(), one, 1e-4 * one) << r.out;
}

// A CLT's data.eval_path: one multi-layer paired set. Trained on shard 0 of two layers' sets
// and held out on shard 1 as a set of its own (per-layer lists, or a multi-layer paired set),
// it is the CLT trained on both shards with shard 1 held out by data.eval_rows: the same
// weights bit for bit and the same held-out figures, per layer too. A held-out set of other
// layers, and data.eval_target_path, are refused in one line each.
TEST_F(Cli, CltHoldsOutAMultiLayerPairedSetOfItsOwn) {
    std::vector<saetrain::DatasetInfo> ins, outs;
    for (int l = 0; l < 2; ++l) {
        const fs::path in = dir / fmt::format("in{}", l), out = dir / fmt::format("out{}", l);
        const Result synth = run(fmt::format(
            "{} --out {} --target {} --d-model 8 --features 16 --rows 3000 --shards 2 --seed {}",
            bin("sae-synth"), in.string(), out.string(), 20 + l));
        ASSERT_EQ(synth.code, 0) << synth.out;
        ins.push_back(saetrain::dataset_open(in.string()));
        outs.push_back(saetrain::dataset_open(out.string()));
    }
    ASSERT_EQ(ins[0].shards.size(), 2u);
    ASSERT_EQ(ins[0].shards[1].rows, 1500);
    auto shard = [](std::vector<saetrain::DatasetInfo> sets, size_t i) {
        for (auto& s : sets) s.shards = {s.shards[i]};
        return sets;
    };
    for (const char* name : {"pairs_all", "pairs_head", "pairs_tail"})
        fs::create_directories(dir / name);
    saetrain::testing::write_layer_pairs((dir / "pairs_all").string(), ins, outs);
    saetrain::testing::write_layer_pairs((dir / "pairs_head").string(), shard(ins, 0),
                                         shard(outs, 0));
    saetrain::testing::write_layer_pairs((dir / "pairs_tail").string(), shard(ins, 1),
                                         shard(outs, 1));
    const std::string common =
        " --set sae.arch=clt --set sae.k=2 --set sae.k_scope=layer --set data.epochs=2 "
        "--set data.shuffle_buffer_rows=0 --set run.out_dir=";
    auto train = [&](const std::string& sets, const std::string& out) {
        return run(bin("saetrain") + " " + (dir / "cfg.yaml").string() + sets + common +
                   (dir / out).string());
    };
    Result r =
        train(" --set data.path=" + (dir / "pairs_all").string() + " --set data.eval_rows=1500",
              "held_by_rows");
    ASSERT_EQ(r.code, 0) << r.out;
    r = train(" --set data.path=" + (dir / "pairs_head").string() +
                  " --set data.eval_path=" + (dir / "pairs_tail").string(),
              "held_by_path");
    ASSERT_EQ(r.code, 0) << r.out;
    // Per-layer lists of shard 0 (each layer's set as its one shard file) beside the same
    // held-out set.
    const std::string lists = fmt::format(
        " --set 'data.path=[{},{}]' --set 'data.target_path=[{},{}]'", ins[0].shards[0].path,
        ins[1].shards[0].path, outs[0].shards[0].path, outs[1].shards[0].path);
    r = train(lists + " --set data.eval_path=" + (dir / "pairs_tail").string(), "lists_by_path");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto want = csv_rows(dir / "held_by_rows/summary.csv");
    ASSERT_EQ(want.size(), 1u);
    EXPECT_EQ(want[0].at("eval_rows"), "1500");
    const saetrain::SaeWeights a =
        saetrain::sae_read_h5((dir / "held_by_rows/sae/clt-x2-k2-layer/final.h5").string());
    for (const char* run_dir : {"held_by_path", "lists_by_path"}) {
        SCOPED_TRACE(run_dir);
        const auto got = csv_rows(dir / run_dir / "summary.csv");
        ASSERT_EQ(got.size(), 1u);
        for (const char* col : {"eval_rows", "eval_fvu", "eval_l0", "eval_dead_fraction",
                                "eval_fvu_layer0", "eval_fvu_layer1", "eval_l0_layer0",
                                "eval_l0_layer1", "eval_dead_layer0", "eval_dead_layer1"})
            EXPECT_EQ(got[0].at(col), want[0].at(col)) << col;
        const saetrain::SaeWeights b =
            saetrain::sae_read_h5((dir / run_dir / "sae/clt-x2-k2-layer/final.h5").string());
        for (const char* t : {"W_enc", "W_dec", "b_enc", "b_dec"}) EXPECT_EQ(a.at(t), b.at(t)) << t;
    }
    // Held-out rows of one layer are not the CLT's two.
    r = train(lists + " --set data.eval_path=" + (dir / "pairs_tail").string() +
                  " --set data.eval_target_path=" + ins[0].source,
              "refused");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("data.eval_target_path is set, but sae.arch clt"), std::string::npos)
        << r.out;
    fs::create_directories(dir / "one_layer");
    saetrain::testing::write_layer_pairs((dir / "one_layer").string(), shard({ins[0]}, 1),
                                         shard({outs[0]}, 1));
    r = train(lists + " --set data.eval_path=" + (dir / "one_layer").string(), "refused");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("'inputs' is [rows, 1, 8], but the CLT trains on 2 layers of d_model 8"),
              std::string::npos)
        << r.out;
}

// A CLT on a multi-layer paired set (one data.path whose shards hold `inputs` and `targets`
// [rows, L, d]) trains the same SAE as on its layers' sets listed one by one: in disk order the
// rows, the held-out split and every step are the same, so the weights are equal bit for bit
// (two replicas: every rank reads the layers from rank 0's dataset description). The run
// records the layers it found (config.yaml's data.layers), and sae-export reads the CLT back.
TEST_F(Cli, CltOnAMultiLayerPairedSetEqualsTheCltOnItsLayersSets) {
    std::vector<saetrain::DatasetInfo> ins, outs;
    for (int l = 0; l < 2; ++l) {
        const fs::path in = dir / fmt::format("in{}", l), out = dir / fmt::format("out{}", l);
        const Result synth = run(fmt::format(
            "{} --out {} --target {} --d-model 8 --features 16 --rows 3000 --shards 2 --seed {} "
            "--dtype f16",
            bin("sae-synth"), in.string(), out.string(), 10 + l));
        ASSERT_EQ(synth.code, 0) << synth.out;
        ins.push_back(saetrain::dataset_open(in.string()));
        outs.push_back(saetrain::dataset_open(out.string()));
    }
    fs::create_directories(dir / "pairs");
    saetrain::testing::write_layer_pairs((dir / "pairs").string(), ins, outs);
    const std::string common =
        " --set sae.arch=clt --set sae.k=2 --set data.eval_rows=500 --set data.epochs=3 "
        "--set data.shuffle_buffer_rows=0 --set parallel.mode=data_parallel --set run.out_dir=";
    const std::string lists =
        fmt::format(" --set 'data.path=[{},{}]' --set 'data.target_path=[{},{}]'", ins[0].source,
                    ins[1].source, outs[0].source, outs[1].source);
    Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + lists +
                   common + (dir / "lists").string());
    ASSERT_EQ(r.code, 0) << r.out;
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --set data.path=" + (dir / "pairs").string() + common + (dir / "pairs_run").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(", 2 layers x d_model 8, float16 |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("its shards' 'targets', row for row beside 'inputs'"), std::string::npos)
        << r.out;
    const saetrain::SaeWeights a =
        saetrain::sae_read_h5((dir / "lists/sae/clt-x2-k2/final.h5").string());
    const saetrain::SaeWeights b =
        saetrain::sae_read_h5((dir / "pairs_run/sae/clt-x2-k2/final.h5").string());
    ASSERT_EQ(b.d_model, 16);
    ASSERT_EQ(b.n_latents, 32);
    for (const char* t : {"W_enc", "W_dec", "b_enc", "b_dec"}) EXPECT_EQ(a.at(t), b.at(t)) << t;
    std::ifstream yaml(dir / "pairs_run/config.yaml");
    std::stringstream ys;
    ys << yaml.rdbuf();
    EXPECT_NE(ys.str().find("  layers: 2\n"), std::string::npos) << ys.str();
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --set data.path=" + (dir / "pairs").string() + common + (dir / "pairs_run").string() +
            " --overwrite --set sae.transcoder_activation=batchtopk");
    ASSERT_EQ(r.code, 0) << r.out;
    r = run(bin("sae-export") + " " + (dir / "pairs_run/sae/clt-x2-batchtopk-k2").string() +
            " --format circuit_tracer --out " + (dir / "ct").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(dir / "ct/W_dec_1.safetensors")) << r.out;
    EXPECT_FALSE(fs::exists(dir / "ct/W_dec_2.safetensors")) << r.out;

    // What reads no multi-layer set, and a layer count the data does not have.
    const std::string pairs = " --set data.path=" + (dir / "pairs").string();
    for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
             {pairs + " --set data.dataset=inputs",
              "data.path " + (dir / "pairs").string() +
                  ": dataset 'inputs' is [rows, 2, 8], a multi-layer paired set's; only sae.arch "
                  "clt reads it"},
             {pairs + " --set sae.arch=clt --set data.layers=3",
              "data.layers is 3, but data.path " + (dir / "pairs").string() + " holds 2 layers"},
             {" --set data.path=" + ins[0].source + " --set sae.arch=clt", "no dataset 'inputs'"},
             {pairs + " --set data.layers=2",
              "data.layers is 2, but sae.arch topk reads no layers"}}) {
        r = train("--overwrite" + args);
        EXPECT_EQ(r.code, 1) << args << ": " << r.out;
        EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
    }
}

// A cross-layer transcoder on two layers' pairs (data.path and data.target_path as lists):
// it trains with two replicas, its final.h5 holds the compact encoder [n, d_l] and keeps the
// decoder to the earlier layer at exactly zero, and layers that disagree are refused in one line
// naming the layer's key.
TEST_F(Cli, CltTrainsOnEveryLayersPairsAndRefusesMisalignedLayers) {
    for (int l = 0; l < 2; ++l) {
        const Result synth = run(fmt::format(
            "{} --out {} --target {} --d-model 8 --features 16 --rows 3000 --shards 2 --seed {}",
            bin("sae-synth"), (dir / fmt::format("in{}", l)).string(),
            (dir / fmt::format("out{}", l)).string(), 10 + l));
        ASSERT_EQ(synth.code, 0) << synth.out;
    }
    const std::string in = fmt::format("[{},{}]", (dir / "in0").string(), (dir / "in1").string());
    const std::string out =
        fmt::format("[{},{}]", (dir / "out0").string(), (dir / "out1").string());
    const std::string sets =
        " --set 'data.path=" + in + "' --set 'data.target_path=" + out +
        "' --set sae.arch=clt --set sae.k=2 --set data.eval_rows=500 --set data.epochs=6";
    Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + sets +
                   " --set parallel.mode=data_parallel");
    ASSERT_EQ(r.code, 0) << r.out;
    const saetrain::SaeWeights w =
        saetrain::sae_read_h5((dir / "run/sae/clt-x2-k2/final.h5").string());
    ASSERT_EQ(w.d_model, 16);
    ASSERT_EQ(w.n_latents, 32);
    // The compact encoder: [n, d_l], each latent's weights on its own layer's 8 values.
    const saetrain::WeightTensor* enc = w.find("W_enc");
    ASSERT_NE(enc, nullptr);
    EXPECT_EQ(enc->shape, (std::vector<int64_t>{32, 8}));
    double off = 0, live = 0, enc_live = 0;
    for (float e : enc->data) enc_live += std::abs(e);
    for (int64_t i = 0; i < 32; ++i)
        for (int64_t c = 0; c < 16; ++c) {
            const int64_t layer = i / 16, block = c / 8;
            const float dec = w.at("W_dec")[static_cast<size_t>(i * 16 + c)];
            (block < layer ? off : live) += std::abs(dec);
        }
    EXPECT_EQ(off, 0.0);
    EXPECT_GT(live, 1.0);
    EXPECT_GT(enc_live, 1.0);
    // It learns: the training FVU falls from the first logged interval to the last.
    const auto metrics = lines_of(dir / "run/metrics.jsonl");
    ASSERT_GE(metrics.size(), 3u);
    const auto first = nlohmann::json::parse(metrics.front());
    const auto last = nlohmann::json::parse(metrics.back());
    EXPECT_LT(last["fvu"].get<double>(), 0.8 * first["fvu"].get<double>());
    // k per token and layer: up to 4 latents a token over the 2 layers (a ReLU'd one may be 0).
    EXPECT_LE(last["eval_l0"].get<double>(), 4.0);
    EXPECT_GT(last["eval_l0"].get<double>(), 2.0);

    // sae.k_scope: layer: each layer's own k. TopK keeps at most 2 a token in each layer;
    // BatchTopK keeps a threshold a layer, and both show in their ids.
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + sets +
            " --overwrite --set sae.k_scope=layer --set 'sae.transcoder_activation=[topk,"
            "batchtopk]' --set parallel.mode=sweep");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto rows = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& row : rows) {
        SCOPED_TRACE(row.at("sae"));
        EXPECT_EQ(row.at("k_scope"), "layer");
        for (const char* col : {"eval_l0_layer0", "eval_l0_layer1"}) {
            const double l0 = std::stod(row.at(col));
            if (row.at("sae") == "clt-x2-k2-layer") {
                EXPECT_LE(l0, 2.0) << col;
            }
            EXPECT_GT(l0, 1.0) << col;
        }
    }
    const saetrain::SaeWeights bt =
        saetrain::sae_read_h5((dir / "run/sae/clt-x2-batchtopk-k2-layer/final.h5").string());
    ASSERT_TRUE(bt.has("threshold"));
    const std::vector<float>& th = bt.at("threshold");
    ASSERT_EQ(th.size(), 2u);
    EXPECT_GT(th[0], 0.0f);
    EXPECT_GT(th[1], 0.0f);
    EXPECT_NE(th[0], th[1]);

    // sae.skip: a skip path a layer, W_skip [2, 8, 8] trained from zero; circuit-tracer's CLT
    // format has none, so the export refuses it in one line and writes nothing.
    r = train("--overwrite" + sets + " --set sae.k_scope=layer --set sae.skip=true");
    ASSERT_EQ(r.code, 0) << r.out;
    const saetrain::SaeWeights sk =
        saetrain::sae_read_h5((dir / "run/sae/clt-x2-k2-layer-skip/final.h5").string());
    ASSERT_TRUE(sk.has("W_skip"));
    EXPECT_EQ(sk.find("W_skip")->shape, (std::vector<int64_t>{2, 8, 8}));
    double skip_sum = 0;
    for (float v : sk.at("W_skip")) skip_sum += std::abs(v);
    EXPECT_GT(skip_sum, 0.1);
    r = run(bin("sae-export") + " " + (dir / "run/sae/clt-x2-k2-layer-skip").string() +
            " --format circuit_tracer --out " + (dir / "ct_skip").string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("have no skip path"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "ct_skip/config.yaml")) << r.out;

    // A second layer of other rows; two inputs for a transcoder; one target too few.
    const Result small = run(bin("sae-synth") + " --out " + (dir / "small").string() +
                             " --d-model 8 --features 16 --rows 2000 --shards 2");
    ASSERT_EQ(small.code, 0) << small.out;
    const std::string misaligned =
        fmt::format("[{},{}]", (dir / "in0").string(), (dir / "small").string());
    for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
             {" --set 'data.path=" + misaligned + "' --set 'data.target_path=" + out +
                  "' --set sae.arch=clt",
              "data.path[1] " + (dir / "small").string() + " holds 2000 rows, but data.path[0]"},
             {" --set 'data.path=" + in + "' --set 'data.target_path=" + out +
                  "' --set sae.arch=transcoder",
              "data.path lists 2 datasets, but sae.arch transcoder reads one"},
             {" --set 'data.path=" + in + "' --set data.target_path=" + (dir / "out0").string() +
                  " --set sae.arch=clt",
              "data.target_path lists 1 dataset(s), but data.path lists 2"}}) {
        r = train("--overwrite" + args);
        EXPECT_EQ(r.code, 1) << args << ": " << r.out;
        EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
    }
}

// A JumpReLU CLT with sae.target_l0: on two layers of unlike density (0.5 and 8 planted features
// active a row), the token scope holds the L0 over both layers at twice the target and lets the
// layers drift apart; sae.k_scope: layer holds each layer's at the target with a threshold shift
// a layer (checkpointed, folded into the exported thresholds). Without sae.target_l0 the layer
// scope is refused in one line.
TEST_F(Cli, JumpReluCltHoldsEachLayersL0AtTheTarget) {
    const char* active[] = {"0.5", "8 --max-scale 6"};
    for (int l = 0; l < 2; ++l) {
        const Result synth = run(fmt::format(
            "{} --out {} --target {} --d-model 8 --features 16 --active {} --rows 6000 --shards 2 "
            "--seed {}",
            bin("sae-synth"), (dir / fmt::format("in{}", l)).string(),
            (dir / fmt::format("out{}", l)).string(), active[l], 10 + l));
        ASSERT_EQ(synth.code, 0) << synth.out;
    }
    const std::string sets =
        fmt::format(" --set 'data.path=[{},{}]' --set 'data.target_path=[{},{}]'",
                    (dir / "in0").string(), (dir / "in1").string(), (dir / "out0").string(),
                    (dir / "out1").string()) +
        " --set sae.arch=clt --set sae.transcoder_activation=jumprelu --set data.batch_size=128"
        " --set data.epochs=6 --set data.eval_rows=2000 --set train.lr=0.004"
        " --set checkpoint.every_steps=100 --set log.every_steps=50";
    Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + sets +
                   " --threads 1 --set sae.target_l0=3 --set 'sae.k_scope=[token, layer]'");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto rows = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& row : rows) {
        SCOPED_TRACE(row.at("sae"));
        const double l0_0 = std::stod(row.at("eval_l0_layer0"));
        const double l0_1 = std::stod(row.at("eval_l0_layer1"));
        // Both hold the L0 over the layers (6) within 10%.
        EXPECT_NEAR(l0_0 + l0_1, 6.0, 0.6);
        const double worst = std::max(std::abs(l0_0 / 3 - 1), std::abs(l0_1 / 3 - 1));
        if (row.at("k_scope") == "layer") {
            EXPECT_EQ(row.at("sae"), "clt-x2-jumprelu-target_l0_3-layer");
            EXPECT_LT(worst, 0.1) << l0_0 << " " << l0_1;  // 3.08 and 3.13 when written
            EXPECT_NE(row.at("log_threshold_shift_layer0_final"),
                      row.at("log_threshold_shift_layer1_final"));
        } else {
            // The data tells the scopes apart: 2.34 and 3.59 when written.
            EXPECT_GT(worst, 0.15) << l0_0 << " " << l0_1;
        }
    }
    // The shifts travel with the SAE: final.h5 holds one a layer, and the export's thresholds
    // are exp(log_threshold + its layer's shift).
    const saetrain::SaeWeights w = saetrain::sae_read_h5(
        (dir / "run/sae/clt-x2-jumprelu-target_l0_3-layer/final.h5").string());
    ASSERT_TRUE(w.has("log_threshold_shift"));
    const std::vector<float>& shift = w.at("log_threshold_shift");
    ASSERT_EQ(shift.size(), 2u);
    r = run(bin("sae-export") + " " +
            (dir / "run/sae/clt-x2-jumprelu-target_l0_3-layer/final.h5").string() +
            " --format circuit_tracer --out " + (dir / "ct").string());
    ASSERT_EQ(r.code, 0) << r.out;
    const auto th1 = saetrain::safetensors_read((dir / "ct/W_enc_1.safetensors").string());
    const std::vector<float>& t1 = th1.at("threshold_1").data;
    ASSERT_EQ(t1.size(), 16u);  // 16 features a layer
    for (size_t f = 0; f < 16; ++f)
        EXPECT_FLOAT_EQ(t1[f], std::exp(w.at("log_threshold")[16 + f] + shift[1])) << f;

    r = train("--overwrite" + sets + " --set sae.k_scope=layer");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("sae.k_scope: layer with a JumpReLU CLT holds each layer's L0 at "
                         "sae.target_l0, which is not set"),
              std::string::npos)
        << r.out;
}

TEST_F(Cli, MpiDataParallelTrainsOneSaeOnAllSlices) {
    const Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
                         " --set parallel.mode=data_parallel");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto summary = lines_of(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 2u);
    // Two replicas x 256 rows a step over 3000 rows: 6 steps, every row once.
    EXPECT_NE(summary[1].find(",6,3000,"), std::string::npos) << summary[1];
}

// Two replicas of one SAE: its TFLOP/s count every replica's tokens, and its MFU divides by
// both devices' peaks.
TEST_F(Cli, MpiDataParallelMfuCountsEveryReplicasPeak) {
    const Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
                         " --set parallel.mode=data_parallel --set backend=cpu"
                         " --set log.peak_tflops=0.001");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto metrics = lines_of(dir / "run/metrics.jsonl");
    ASSERT_FALSE(metrics.empty());
    for (const std::string& line : metrics) {
        const auto j = nlohmann::json::parse(line);
        EXPECT_NEAR(j["tflops"].get<double>(),
                    kFixtureFlopsPerToken * j["tokens_per_s"].get<double>() / 1e12,
                    1e-9 * j["tflops"].get<double>())
            << line;
        ASSERT_TRUE(j.contains("mfu")) << line;
        EXPECT_NEAR(j["mfu"].get<double>(), j["tflops"].get<double>() / (2 * 0.001),
                    1e-9 * j["mfu"].get<double>())
            << line;
        EXPECT_GT(j["host_mem_peak_GB"].get<double>(), 1e-3) << line;
    }
    EXPECT_NE(r.out.find("all 1 SAE(s) on 2 rank(s)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("host mem max"), std::string::npos) << r.out;
}

// A failure during start-up on any rank ends every rank, with the message printed once.
TEST_F(Cli, MpiStartupFailuresEndAllRanksWithOneMessage) {
    // World size that does not fit the sweep.
    Result r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string());
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: error:"),
              "saetrain: error: rank 0: " + (dir / "cfg.yaml").string() +
                  ": the sweep has 1 SAE config(s) but the job has 2 rank(s); run with 1 rank(s) "
                  "(one SAE per rank: mpirun -np 1 / srun -n 1)")
        << r.out;
    // A truncated shard, seen by every rank: still one message, naming the file.
    const fs::path shard = dir / "data" / "shard_00001.h5";
    fs::resize_file(shard, fs::file_size(shard) / 2);
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --set 'sae.k=[2,4]'");
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_NE(r.out.find("shard_00001.h5"), std::string::npos) << r.out;
}

// A rank failing mid-run (injected through SAETRAIN_FAULT) ends the whole job instead of leaving
// its peer waiting in a collective.
TEST_F(Cli, MpiFailureMidRunEndsEveryRank) {
    const Result r = run("SAETRAIN_FAULT=1:5 " + mpirun(2) + bin("saetrain") + " " +
                         (dir / "cfg.yaml").string() + " --set 'sae.k=[2,4]'");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.code, 124) << "the job hung: " << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_NE(r.out.find("rank 1: injected fault at iteration 5"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "run/summary.csv"));
}

// NaN in the data: skipped and reported by default, a clear stop with data.nonfinite: stop.
TEST_F(Cli, NonFiniteDataIsSkippedOrStops) {
    // The last float of a contiguous float32 shard is the last bytes of its file.
    const fs::path shard = dir / "data" / "shard_00001.h5";
    {
        std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(shard) - 4));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        f.write(reinterpret_cast<const char*>(&nan), 4);
    }
    Result r = train();
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("skipped 1 batch(es) holding NaN/Inf"), std::string::npos) << r.out;
    r = train("--overwrite --set data.nonfinite=stop");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("NaN or Inf"), std::string::npos) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    // A NaN in the very first batch (rows in file order): the SAE starts from the next one
    // instead of failing to initialize from no rows.
    const fs::path first = dir / "data" / "shard_00000.h5";
    {
        std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
        // 1500 rows x 16 floats end the file: the first value is 1500 * 16 * 4 bytes before it.
        f.seekp(static_cast<std::streamoff>(fs::file_size(first) - 1500 * 16 * 4));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        f.write(reinterpret_cast<const char*>(&nan), 4);
    }
    r = train("--overwrite --set data.shuffle_buffer_rows=0");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("skipped 2 batch(es) holding NaN/Inf"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(dir / "run" / "sae" / "topk-x2-k4" / "final.h5"));
    // A NaN in every row: no step is ever applied. An error, not a COMPLETE run with an
    // untrained final.h5 (issue 35).
    for (const char* name : {"shard_00000.h5", "shard_00001.h5"}) {
        const fs::path p = dir / "data" / name;
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        const auto start = static_cast<std::streamoff>(fs::file_size(p) - 1500 * 16 * 4);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (std::streamoff row = 0; row < 1500; ++row) {
            f.seekp(start + row * 16 * 4);
            f.write(reinterpret_cast<const char*>(&nan), 4);
        }
    }
    r = train("--overwrite");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: error:"),
              "saetrain: error: topk-x2-k4 applied no optimizer step: 12 batch(es) held NaN/Inf "
              "and 0 step(s) had a non-finite loss or gradient; check the data (sae-inspect) "
              "before training again")
        << r.out;
    EXPECT_FALSE(fs::exists(dir / "run" / "COMPLETE"));
    EXPECT_FALSE(fs::exists(dir / "run" / "sae" / "topk-x2-k4" / "final.h5"));
}

// Hostile inputs (issue 35): COMPLETE says which run finished. A finished run started again with
// another result-changing config names the keys and touches nothing; a marker that is not the
// run's own (garbage, an older version's bare step count, another run's, a FIFO) is ignored with
// one warning, and the stopped run it was planted in resumes from its checkpoint.
TEST_F(Cli, CompleteMarkersCarryTheRunsIdentity) {
    ASSERT_EQ(train().code, 0);
    const fs::path out = dir / "run", marker = out / "COMPLETE";
    const fs::path final_h5 = out / "sae/topk-x2-k4/final.h5";
    const std::vector<std::string> written = lines_of(marker);
    ASSERT_EQ(written.size(), 1u);
    const auto j = nlohmann::json::parse(written[0]);
    EXPECT_EQ(j.at("format"), "saetrain-complete-1");
    EXPECT_EQ(j.at("steps"), 12);
    EXPECT_EQ(j.at("total_steps"), 12);
    EXPECT_EQ(j.at("config_digest").get<std::string>().rfind("xxh3:", 0), 0u) << written[0];

    const auto h5_time = fs::last_write_time(final_h5);
    const std::vector<std::string> config = lines_of(out / "config.yaml");
    const std::vector<std::string> metrics = lines_of(out / "metrics.jsonl");
    Result r = train("--set train.lr=0.01");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: error:"),
              "saetrain: error: run.out_dir " + out.string() +
                  " holds a finished run trained with a different config (train.lr: 0.005 -> "
                  "0.01); restore those values to keep it, or choose another run.out_dir "
                  "(--overwrite would delete its 1 committed checkpoint(s) (the newest at step "
                  "12), its final weights and its metrics to start over)")
        << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_EQ(fs::last_write_time(final_h5), h5_time);
    EXPECT_EQ(lines_of(out / "config.yaml"), config);
    EXPECT_EQ(lines_of(out / "metrics.jsonl"), metrics);
    EXPECT_EQ(lines_of(marker), written);
    // A key that cannot change the result: the same finished run, nothing to do.
    r = train("--set log.every_steps=2");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("nothing to do"), std::string::npos) << r.out;
    EXPECT_EQ(fs::last_write_time(final_h5), h5_time);

    // Each foreign marker in a run stopped at a committed checkpoint (it said "nothing to do").
    const std::string another_run =
        R"({"format":"saetrain-complete-1","steps":12,"total_steps":12,)"
        R"("config_digest":"xxh3:0123456789abcdef"})";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"done", "it is not a marker saetrain wrote"},
        {"12",
         "it holds only a step count (an older saetrain's marker), which does not say which run "
         "finished"},
        {written[0],
         "it says 12 steps, but the newest committed checkpoint is at step {} "
         "(another run's marker)"},
        {another_run, "its config_digest xxh3:0123456789abcdef is not that of " +
                          (out / "config.yaml").string() + " (another run's marker)"},
        {"", "it is not a regular file"},  // a FIFO: never opened, so nothing blocks
    };
    for (const auto& [text, why] : cases) {
        const Result stop = run("SAETRAIN_FAULT=0:7:TERM " + bin("saetrain") + " " +
                                (dir / "cfg.yaml").string() + " --threads 1 --overwrite");
        ASSERT_EQ(stop.code, 75) << stop.out;
        const std::vector<int64_t> steps =
            saetrain::checkpoint_steps((out / "sae/topk-x2-k4").string());
        ASSERT_EQ(steps.size(), 1u);
        ASSERT_LT(steps[0], 12);
        ASSERT_FALSE(fs::exists(marker));
        if (text.empty())
            ASSERT_EQ(::mkfifo(marker.c_str(), 0600), 0);
        else
            std::ofstream(marker) << text << "\n";
        r = run("timeout 60 " + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
                " --threads 1");
        EXPECT_EQ(r.code, 0) << text << ": " << r.out;
        EXPECT_EQ(line_with(r.out, "saetrain: warning: ignoring"),
                  "saetrain: warning: ignoring " + marker.string() + ": " +
                      fmt::format(fmt::runtime(why), steps[0]) + "; the run goes on as unfinished")
            << r.out;
        EXPECT_NE(r.out.find(fmt::format("resumed from the checkpoint at step {} ", steps[0])),
                  std::string::npos)
            << text << ": " << r.out;
        EXPECT_EQ(lines_of(marker), written) << text;  // the finished run's own marker now
    }
}

// Hostile inputs (issue 35): FVU on rows of no variance (identical, all-zero, denormal) is
// undefined, not 0.0000: null in metrics.jsonl, an empty summary.csv cell, "n/a" on the console,
// one warning per SAE and set of rows, and quality gates that fail.
TEST_F(Cli, FvuOfDataWithoutVarianceIsUndefined) {
    // Every row of both shards (contiguous float32: the last 1500 x 16 floats of each file).
    auto plant = [&](const std::function<float(int64_t row, int64_t col)>& value) {
        for (const char* name : {"shard_00000.h5", "shard_00001.h5"}) {
            const fs::path p = dir / "data" / name;
            std::vector<float> rows(1500 * 16);
            for (int64_t i = 0; i < 1500 * 16; ++i) rows[i] = value(i / 16, i % 16);
            std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(static_cast<std::streamoff>(fs::file_size(p) - rows.size() * 4));
            f.write(reinterpret_cast<const char*>(rows.data()),
                    static_cast<std::streamsize>(rows.size() * 4));
        }
    };
    const std::string warning = "saetrain: warning: topk-x2-k4: the ";
    const std::string because =
        " have (near) zero variance, so FVU is undefined (null in metrics.jsonl, n/a here) and "
        "the quality gates fail; check the data (sae-inspect)";
    // Identical rows, 512 of them held out.
    plant([](int64_t, int64_t col) { return static_cast<float>(col + 1); });
    Result r = train("--set data.eval_rows=512");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(line_with(r.out, warning), warning + "training batches" + because) << r.out;
    EXPECT_EQ(line_with(r.out, warning + "held-out"), warning + "held-out rows" + because);
    EXPECT_EQ(count(r.out, because), 2u) << "once per SAE and set of rows: " << r.out;
    EXPECT_NE(r.out.find("| fvu n/a |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("held-out (512 rows): fvu n/a |"), std::string::npos) << r.out;
    const std::vector<std::string> log = lines_of(dir / "run/metrics.jsonl");
    ASSERT_FALSE(log.empty());
    for (const std::string& line : log) EXPECT_TRUE(nlohmann::json::parse(line)["fvu"].is_null());
    EXPECT_TRUE(nlohmann::json::parse(log.back())["eval_fvu"].is_null()) << log.back();
    auto summary = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 1u);
    EXPECT_EQ(summary[0].at("fvu"), "");
    EXPECT_EQ(summary[0].at("eval_fvu"), "");  // the column is there, its cell empty
    EXPECT_EQ(summary[0].at("eval_rows"), "512");
    EXPECT_EQ(summary[0].at("gates"), "FAIL");
    EXPECT_EQ(summary[0].at("gates_failed").rfind("no variance in the rows (FVU undefined)", 0), 0u)
        << summary[0].at("gates_failed");
    // Resumed with nothing left to train: the summary still comes from the logged row (its null
    // fvu read back as undefined, not a row to skip, which left an interval of zeros).
    fs::remove(dir / "run/COMPLETE");
    r = train("--set data.eval_rows=512");
    ASSERT_EQ(r.code, 0) << r.out;
    summary = csv_rows(dir / "run/summary.csv");
    ASSERT_EQ(summary.size(), 1u);
    EXPECT_GT(std::stod(summary[0].at("tokens_per_s")), 0.0);
    EXPECT_EQ(summary[0].at("fvu"), "");
    // All-zero and denormal rows (squares below float32's normal range), gates on the training
    // steps.
    for (const float tiny : {0.0f, 1e-41f}) {
        plant([tiny](int64_t row, int64_t col) { return (row + col) % 2 ? tiny : -2 * tiny; });
        r = train("--overwrite");
        ASSERT_EQ(r.code, 0) << r.out;
        EXPECT_EQ(line_with(r.out, warning), warning + "training batches" + because) << r.out;
        summary = csv_rows(dir / "run/summary.csv");
        ASSERT_EQ(summary.size(), 1u);
        EXPECT_EQ(summary[0].at("fvu"), "") << tiny;
        EXPECT_EQ(summary[0].at("gates_on"), "training");
        EXPECT_EQ(summary[0].at("gates"), "FAIL") << tiny;
        EXPECT_EQ(summary[0].at("gates_failed").rfind("no variance in the rows", 0), 0u) << tiny;
    }
}

// Two runs on one out_dir: the second refuses with one line while the first holds the lock;
// a lock file left by a killed run (no process holds the lock) blocks nothing.
TEST_F(Cli, OutDirIsLockedWhileARunUsesIt) {
    const fs::path out = dir / "run";
    fs::create_directories(out);
    const int fd = ::open((out / ".saetrain.lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // as a running saetrain holds it
    const std::string note = "pid 4242 on somehost\n";
    ASSERT_EQ(::pwrite(fd, note.data(), note.size(), 0), static_cast<ssize_t>(note.size()));
    Result r = train();
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(
        r.out.find(out.string() + " is in use by another saetrain run (pid 4242 on somehost)"),
        std::string::npos)
        << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "the refused run wrote into the out_dir";
    r = train("--overwrite");  // --overwrite does not take another run's out_dir either
    EXPECT_EQ(r.code, 1) << r.out;
    ::close(fd);  // the holder is gone; its file stays, as after a SIGKILL
    ASSERT_TRUE(fs::exists(out / ".saetrain.lock"));
    r = train();
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(out / "COMPLETE"));
}

// The data's d_model is not in the config: shards replaced by another model's activations
// between runs of one out_dir are refused with one line naming the checkpoint and both widths.
TEST_F(Cli, ChangedDataWidthIsRefusedOnResume) {
    ASSERT_EQ(train().code, 0);
    fs::remove(dir / "run" / "COMPLETE");  // as if stopped after its last checkpoint
    fs::remove_all(dir / "data");
    const Result synth = run(bin("sae-synth") + " --out " + (dir / "data").string() +
                             " --d-model 8 --features 32 --rows 3000 --shards 2 --seed 3");
    ASSERT_EQ(synth.code, 0) << synth.out;
    const Result r = train();
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("holds an SAE of d_model 16"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("now has d_model 8"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("checkpoint-"), std::string::npos) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
}

// A resume refused names what to restore: each result-changing key with both values (sae.k names
// the SAE, so its checkpoints would simply not be found), or the rank count the checkpoints were
// written with; --overwrite is offered only with what it deletes, and nothing is deleted.
TEST_F(Cli, ARefusedResumeNamesWhatToRestoreAndWhatOverwriteDeletes) {
    ASSERT_EQ(train().code, 0);
    fs::remove(dir / "run" / "COMPLETE");  // as if stopped after its last checkpoint
    const auto commits = [&] {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(dir / "run" / "checkpoints"))
            names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    };
    const std::vector<std::string> before = commits();
    ASSERT_EQ(before, std::vector<std::string>{"step-12.commit"});
    Result r = train("--set sae.k=2 --set train.lr=0.01");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: error:"),
              "saetrain: error: " + (dir / "run").string() +
                  " holds a run trained with a different config (sae.k: 4 -> 2; train.lr: 0.005 "
                  "-> 0.01); restore those values and run again to resume it, pass "
                  "--allow-config-change to resume it under the new values, or choose another "
                  "run.out_dir (--overwrite would delete its 1 committed checkpoint(s) (the newest "
                  "at step 12) and its metrics to start over)")
        << r.out;
    EXPECT_EQ(commits(), before);
    EXPECT_EQ(train().code, 0) << "the same command as before resumes";
    // Another rank count: the checkpoint's replicas are named, on the line itself.
    const std::string dp =
        " --set parallel.mode=data_parallel --set run.out_dir=" + (dir / "dp").string();
    ASSERT_EQ(run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() + dp).code, 0);
    fs::remove(dir / "dp" / "COMPLETE");
    r = train(dp);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    const std::string line = line_with(r.out, "saetrain: error:");
    EXPECT_NE(line.find("no committed checkpoint could be loaded (the newest, at step 6: "
                        "checkpoint "),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("was written by 2 replica(s) of this SAE, the job has 1; resume with the "
                        "same number of ranks); restore what it names and run again to resume"),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("(--overwrite would delete its 1 committed checkpoint(s)"),
              std::string::npos)
        << line;
    EXPECT_TRUE(fs::exists(dir / "dp" / "checkpoints" / "step-6.commit"));
}

// An out_dir the job cannot write: under a regular file (ENOTDIR, always), on a read-only file
// system (a read-only tmpfs; skipped where mounting is not permitted) and in a directory the
// user may not write (run as nobody through setpriv, since root ignores modes; skipped without
// it): one line naming the out_dir and the reason, exit 1, and under mpirun no rank left
// waiting.
TEST_F(Cli, OutDirThatCannotBeWrittenIsOneClearLine) {
    std::ofstream(dir / "afile") << "not a directory\n";
    const std::string under_file = (dir / "afile" / "run").string();
    Result r = train("--set run.out_dir=" + under_file);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("run.out_dir " + under_file + ": cannot create it"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(std::strerror(ENOTDIR)), std::string::npos) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    r = run(mpirun(2) + bin("saetrain") + " " + (dir / "cfg.yaml").string() +
            " --threads 1 --set parallel.mode=data_parallel --set run.out_dir=" + under_file);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.code, 124) << "a rank hung:\n" << r.out;
    EXPECT_NE(r.out.find(under_file), std::string::npos) << r.out;
    EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    // A path the system cannot take (a component over 255 bytes) is said so, not called "the
    // root directory".
    const std::string too_long = (dir / std::string(300, 'a') / "run").string();
    r = train("--set run.out_dir=" + too_long);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(line_with(r.out, "saetrain: error:"),
              "saetrain: error: run.out_dir " + too_long + " cannot be resolved (" +
                  std::strerror(ENAMETOOLONG) + "); choose another")
        << r.out;

    const fs::path ro = dir / "rofs";
    fs::create_directories(ro);
    if (run("mount -t tmpfs -o ro,size=1m tmpfs " + ro.string()).code == 0) {
        r = train("--set run.out_dir=" + (ro / "run").string());
        run("umount " + ro.string());
        EXPECT_EQ(r.code, 1) << r.out;
        EXPECT_NE(r.out.find("run.out_dir " + (ro / "run").string()), std::string::npos) << r.out;
        EXPECT_NE(r.out.find(std::strerror(EROFS)), std::string::npos) << r.out;
        EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    } else {
        std::printf("read-only file system: not tested (cannot mount a tmpfs here)\n");
    }

    const fs::path locked = dir / "locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    if (getuid() == 0 && run("command -v setpriv").code == 0) {
        r = run("HOME=/tmp setpriv --reuid=65534 --regid=65534 --clear-groups " + bin("saetrain") +
                " " + (dir / "cfg.yaml").string() +
                " --threads 1 --set run.out_dir=" + (locked / "run").string());
        EXPECT_EQ(r.code, 1) << r.out;
        EXPECT_NE(r.out.find("run.out_dir " + (locked / "run").string()), std::string::npos)
            << r.out;
        EXPECT_NE(r.out.find(std::strerror(EACCES)), std::string::npos) << r.out;
        EXPECT_EQ(count(r.out, "saetrain: error:"), 1u) << r.out;
    } else {
        std::printf("permission denied: not tested (needs root and setpriv to drop to nobody)\n");
    }
}

// Resource limits too low for MPI, OpenMP and OpenBLAS to start are named before they start (they
// segfaulted or spun in MPI_Init, or libgomp failed to make threads, with no line of ours); a run
// under limits above those floors trains.
TEST_F(Cli, ResourceLimitsTooLowAreNamedBeforeMpiStarts) {
    const std::string cmd = bin("saetrain") + " " + (dir / "cfg.yaml").string() + " --threads 1";
    Result r = run("ulimit -n 40 && " + cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(r.out,
              "saetrain: error: the open-file limit (ulimit -n) is 40; MPI's start-up alone opens "
              "about 30 files and each rank reads shards beside them: raise it to at least 64 "
              "(ulimit -n 1024)\n");
    EXPECT_FALSE(fs::exists(dir / "run"));
#if defined(__SANITIZE_ADDRESS__)
    std::printf("ulimit -v: not tested (AddressSanitizer reserves terabytes of address space)\n");
#else
    r = run("ulimit -v 900000 && " + cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("saetrain: error: the address-space limit (ulimit -v) is 878 MiB;"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(count(r.out, "\n"), 1u) << r.out;
    EXPECT_FALSE(fs::exists(dir / "run"));
    r = run("ulimit -n 64 && ulimit -v 2097152 && " + cmd);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(dir / "run/COMPLETE")) << r.out;
#endif
}

// A symlink to a file planted inside a run's directory (where saetrain appends to metrics.jsonl and
// replaces or removes its files) is refused before anything is written through it, with or
// without --overwrite; a linked directory (checkpoints/ on another disk) is not refused.
TEST_F(Cli, SymlinksPlantedInARunDirectoryAreRefused) {
    ASSERT_EQ(train().code, 0);
    const fs::path victim = dir / "victim.txt";
    std::ofstream(victim) << "someone's file\n";
    fs::remove(dir / "run/metrics.jsonl");
    fs::create_symlink(victim, dir / "run/metrics.jsonl");
    for (const char* extra : {"", "--overwrite"}) {
        const Result r = train(extra);
        EXPECT_EQ(r.code, 1) << r.out;
        EXPECT_EQ(r.out, "saetrain: error: run.out_dir " + (dir / "run").string() +
                             ": metrics.jsonl is a symlink; saetrain writes only its own files in "
                             "a run's directory and would write or remove through it: remove the "
                             "link\n");
        EXPECT_EQ(lines_of(victim), std::vector<std::string>{"someone's file"});
        EXPECT_TRUE(fs::is_symlink(dir / "run/metrics.jsonl"));
    }
    fs::remove(dir / "run/metrics.jsonl");
    fs::create_directories(dir / "elsewhere");
    fs::remove_all(dir / "run/checkpoints");
    fs::create_directory_symlink(dir / "elsewhere", dir / "run/checkpoints");
    EXPECT_EQ(train("--overwrite").code, 0);
}

// Usage errors on every program: no arguments (where one is required), an unknown option and a
// bad option value each print "PROGRAM: error: WHAT" and the usage line, and exit 2 (issue 34:
// saetrain with no arguments exited 106, sae-export with two inputs 109, CLI11's own codes).
// Shards the disk cannot hold are one line before anything is written (2^40 rows of 65,536
// values: far past any disk), not an HDF5 failure partway through.
TEST_F(Cli, SynthSizesTheDiskCannotHoldAreRefusedBeforeWriting) {
    const fs::path out = dir / "huge";
    const Result r =
        run(bin("sae-synth") + " --out " + out.string() + " --rows 1099511627776 --d-model 65536");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(count(r.out, "sae-synth: error:"), 1u) << r.out;
    EXPECT_NE(r.out.find("sae-synth: error: --rows 1099511627776 x --d-model 65536 of f32 need "
                         "288230376.2 GB, but " +
                         dir.string() + " has "),
              std::string::npos)
        << r.out;
    EXPECT_FALSE(fs::exists(out));
}

TEST_F(Cli, UsageErrorsExitTwoWithTheUsageLine) {
    const std::map<std::string, std::string> usage = {
        {"saetrain",
         "saetrain CONFIG.yaml [--set key=value ...] [--overwrite] [--allow-config-change] "
         "[--threads N] [--fixed-threads] [--dry-run [--ranks N]] | --list-keys"},
        {"sae-synth",
         "sae-synth --out DIR [--d-model N] [--features M] [--rows N] [--shards N] "
         "[--dtype f32|f16|bf16] [--chunked] [--seed S] ..."},
        {"sae-inspect", "sae-inspect PATH [--dataset NAME] [--compare OTHER_SAE.h5]"},
        {"sae-export",
         "sae-export SAE [SAE ...] --format saelens|sparsify|circuit_tracer --out DIR "
         "[--model-name NAME] [--hook-name HOOK] [--layer N]"},
        {"sae-perfmodel",
         "sae-perfmodel [--gpu NAME] [--d-model D] [--n-latents N] [--k K] [--arch ARCH] "
         "[--mode MODE] [--ranks N] ... | --list-gpus"},
        {"sae-iobench",
         "sae-iobench DATA [--batch N] [--shuffle-rows N] [--read-mib N] [--passes N] "
         "[--seconds S] [--no-cold] [--json] ..."}};
    const std::string cfg = (dir / "cfg.yaml").string(), data = (dir / "data").string();
    struct Case {
        std::string program, args, error;
    };
    const std::vector<Case> cases = {
        {"saetrain", "", "CONFIG is required"},
        {"saetrain", cfg + " --bogus", "The following argument was not expected: --bogus"},
        {"saetrain", cfg + " --threads many", "Could not convert: --threads = many"},
        {"saetrain", cfg + " --threads 100000", "--threads: Value 100000 not in range 0 to 1024"},
        {"saetrain", cfg + " " + cfg, "The following argument was not expected: " + cfg},
        {"sae-synth", "", "--out is required"},
        {"sae-synth", "--out x --bogus", "The following argument was not expected: --bogus"},
        {"sae-synth", "--out x --dtype f64", "--dtype: f64 not in {f32,f16,bf16}"},
        {"sae-synth", "--out x --d-model 10000000000",
         "--d-model: Value 10000000000 not in range 1 to 65536"},
        {"sae-synth", "--out x --shards 0", "--shards: Value 0 not in range 1 to 100000"},
        {"sae-inspect", "", "PATH is required"},
        {"sae-inspect", data + " --bogus", "The following argument was not expected: --bogus"},
        {"sae-export", "", "SAE is required"},
        {"sae-export", data + " --format saelens", "--out is required"},
        {"sae-export", data + " --format saelens --out o --bogus",
         "The following argument was not expected: --bogus"},
        {"sae-perfmodel", "--bogus", "The following argument was not expected: --bogus"},
        {"sae-perfmodel", "--d-model wide", "Could not convert: --d-model = wide"},
        {"sae-iobench", "", "DATA is required"},
        {"sae-iobench", data + " --batch lots", "Could not convert: --batch = lots"},
    };
    for (const Case& c : cases) {
        const Result r = run(bin(c.program) + " " + c.args);
        EXPECT_EQ(r.code, 2) << c.program << " " << c.args << ":\n" << r.out;
        EXPECT_EQ(r.out, c.program + ": error: " + c.error + "\nusage: " + usage.at(c.program) +
                             " (--help for every option)\n")
            << c.program << " " << c.args;
    }
    // --help is no error.
    for (const auto& [program, line] : usage) {
        const Result r = run(bin(program) + " --help");
        EXPECT_EQ(r.code, 0) << program << ":\n" << r.out;
        EXPECT_NE(r.out.find("--version"), std::string::npos) << program << ":\n" << r.out;
    }
    // Nor is saetrain --list-keys, which needs no CONFIG (its callback ends the parse).
    const Result keys = run(bin("saetrain") + " --list-keys");
    EXPECT_EQ(keys.code, 0) << keys.out;
    EXPECT_NE(keys.out.find("sae.jumprelu_bandwidth"), std::string::npos) << keys.out;
    EXPECT_EQ(keys.out.find("error"), std::string::npos) << keys.out;
}

// --dry-run checks the config, the overrides and the job size without data, MPI or out_dir: what
// the README's examples are checked with (tools/check-readme.py).
TEST_F(Cli, DryRunChecksTheConfigAndTheJobSizeAndTouchesNothing) {
    const std::string cfg = (dir / "cfg.yaml").string();
    fs::remove_all(dir / "data");  // no data needed
    Result r = run(bin("saetrain") + " " + cfg + " --dry-run --set 'sae.k=[2,4]'");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, "saetrain: " + cfg + ": config OK: 2 SAEs: topk-x2-k2, topk-x2-k4\n" +
                         "saetrain: sweep mode on 2 rank(s): 2 SAEs x 1 replica, shared data; "
                         "out_dir " +
                         (dir / "run").string() + "; data " + (dir / "data").string() + "\n");
    EXPECT_FALSE(fs::exists(dir / "run"));
    // The job size a launcher would give, checked as a run checks it.
    r = run(bin("saetrain") + " " + cfg + " --dry-run --set 'sae.k=[2,4]' --ranks 4");
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out, "saetrain: error: " + cfg +
                         ": the sweep has 2 SAE config(s) but the job has 4 rank(s); run with 2 "
                         "rank(s) (one SAE per rank: mpirun -np 2 / srun -n 2)\n");
    r = run(bin("saetrain") + " " + cfg +
            " --dry-run --set parallel.mode=hybrid --set parallel.replicas=2 "
            "--set parallel.latent_shards=2");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("hybrid mode on 4 rank(s): 1 SAE x 2 replicas x 2 latent shards;"),
              std::string::npos)
        << r.out;
    // A sweep of 65,536 points (256 k x 256 lr: groups of one base id told apart by lr) is
    // expanded and named in linear time (it took minutes when quadratic), and said in one line:
    // its first 16 ids and its last.
    {
        std::ofstream big(dir / "big.yaml");
        big << "data: {path: x}\nsae: {arch: topk, expansion: 2, k: [1";
        for (int k = 2; k <= 256; ++k) big << "," << k;
        big << "]}\ntrain: {lr: [0.001";
        for (int i = 1; i < 256; ++i) big << "," << 0.001 + i * 1e-5;
        big << "]}\n";
    }
    r = run(bin("saetrain") + " " + (dir / "big.yaml").string() + " --dry-run");
    EXPECT_EQ(r.code, 0) << r.out.substr(0, 2000);
    const std::string first = line_with(r.out, "saetrain: " + (dir / "big.yaml").string());
    EXPECT_EQ(first.rfind("saetrain: " + (dir / "big.yaml").string() +
                              ": config OK: 65536 SAEs: topk-x2-k1-lr0.001, topk-x2-k1-lr0.00101, ",
                          0),
              0u)
        << first.substr(0, 400);
    EXPECT_NE(first.find(", ... (65519 more), topk-x2-k256-lr0.00355"), std::string::npos)
        << first.substr(0, 2000);
    EXPECT_LT(first.size(), 1000u);
    // A bad key is the run's own one-line error.
    r = run(bin("saetrain") + " " + cfg + " --dry-run --set sae.kk=3");
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out, "saetrain: error: " + cfg +
                         ": --set sae.kk=3: unknown key 'sae.kk' (did you mean sae.k?)\n");
}

// --version on every program: the project version, the commit the build was configured at and
// the build's options, from the generated headers; nothing else, exit 0, no MPI started.
TEST_F(Cli, VersionNamesTheCommitAndTheBuildOptions) {
    const std::string commit = SAETRAIN_GIT_COMMIT;
    EXPECT_TRUE(
        commit == "unknown" ||
        (commit.size() == 12 && commit.find_first_not_of("0123456789abcdef") == std::string::npos))
        << commit;
    const std::string build = fmt::format(
        "build: {}, CUDA {}, NCCL {}, native {}", SAETRAIN_BUILD_TYPE, SAETRAIN_CUDA ? "on" : "off",
        SAETRAIN_NCCL ? "on" : "off", SAETRAIN_NATIVE ? "on" : "off");
    for (const std::string program :
         {"saetrain", "sae-synth", "sae-inspect", "sae-export", "sae-perfmodel", "sae-iobench"}) {
        const Result r = run(bin(program) + " --version");
        EXPECT_EQ(r.code, 0) << program << ":\n" << r.out;
        EXPECT_EQ(r.out,
                  program + " " + SAETRAIN_VERSION + " (git " + commit + ")\n" + build + "\n");
    }
    // The version is the project's (CMakeLists.txt), three numbers.
    EXPECT_TRUE(std::regex_match(std::string(SAETRAIN_VERSION), std::regex(R"(\d+\.\d+\.\d+)")))
        << SAETRAIN_VERSION;
}

TEST_F(Cli, InspectDescribesDataAndSae) {
    Result r = run(bin("sae-inspect") + " " + (dir / "data").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("3000"), std::string::npos) << r.out;
    ASSERT_EQ(train().code, 0);
    r = run(bin("sae-inspect") + " " + (dir / "run/sae/topk-x2-k4/final.h5").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("topk"), std::string::npos) << r.out;
    r = run(bin("sae-inspect") + " " + (dir / "cfg.yaml").string());
    EXPECT_NE(r.code, 0) << r.out;
}

}  // namespace
