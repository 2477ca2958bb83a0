// run.json (run_dir.h): what a run records about itself for sae-report: "running" with the pid,
// host, version and each SAE's resolved LR schedule when training starts, then how the process
// ended (complete, stopped by a signal, failed with the error). test/python/
// test_tensorboard_report.py checks the states a real run leaves (SIGTERM, SIGKILL, an error).
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "saetrain/run_dir.h"
#include "saetrain/schedule.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

nlohmann::json read_json(const fs::path& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
}

RunRecord record() {
    RunRecord r;
    r.version = "9.9.9";
    r.backend = "cpu";
    r.ranks = 4, r.hosts = 2;
    r.total_steps = 1000, r.tokens_per_step = 4096, r.resumed_from_step = 500;
    SaeConfig a, b;
    a.arch = "topk", a.lr = 4e-4, a.warmup_fraction = 0.05;
    b.arch = "relu", b.lr = 1e-3, b.warmup_steps = 7, b.lr_decay = "cosine_restarts",
    b.restart_mult = 2;
    r.saes = {{"topk-x8-k32", a}, {"relu-x8-l1_5", b}};
    return r;
}

}  // namespace

TEST(RunStateFile, RecordsTheRunThenHowItEnded) {
    saetrain::testing::TempDir tmp;
    for (const auto& [code, state] : std::vector<std::pair<int, std::string>>{
             {0, "complete"}, {75, "stopped"}, {1, "failed"}}) {
        const fs::path out = tmp.path / state;
        RunStateFile f(out.string(), record());
        nlohmann::json j = read_json(out / "run.json");
        EXPECT_EQ(j["state"], "running");
        EXPECT_TRUE(j["exit_code"].is_null());
        EXPECT_TRUE(j["ended"].is_null());
        EXPECT_EQ(j["pid"], static_cast<int64_t>(::getpid()));
        EXPECT_EQ(j["version"], "9.9.9");
        EXPECT_EQ(j["ranks"], 4);
        EXPECT_EQ(j["hosts"], 2);
        EXPECT_EQ(j["total_steps"], 1000);
        EXPECT_EQ(j["tokens_per_step"], 4096);
        EXPECT_EQ(j["resumed_from_step"], 500);
        EXPECT_EQ(j["started"].get<std::string>().size(), 20u);  // 2026-11-24T20:19:00Z
        // The schedule resolved as lr_at resolves it, so lr_at's formula alone reproduces it.
        const auto& topk = j["saes"]["topk-x8-k32"];
        EXPECT_EQ(topk["arch"], "topk");
        EXPECT_EQ(topk["lr"]["lr"], 4e-4);
        EXPECT_EQ(topk["lr"]["warmup_steps"], warmup_steps_for(record().saes[0].second, 1000));
        EXPECT_EQ(topk["lr"]["warmup_steps"], 50);
        const auto& relu = j["saes"]["relu-x8-l1_5"]["lr"];
        EXPECT_EQ(relu["warmup_steps"], 7);
        EXPECT_EQ(relu["lr_decay"], "cosine_restarts");
        EXPECT_EQ(relu["restart_steps"], 250);  // a quarter of the run
        EXPECT_EQ(relu["restart_mult"], 2.0);
        f.end(code, code == 1 ? "file x: write failed" : "");
        j = read_json(out / "run.json");
        EXPECT_EQ(j["state"], state);
        EXPECT_EQ(j["exit_code"], code);
        EXPECT_EQ(j["ended"].get<std::string>().size(), 20u);
        EXPECT_EQ(j["version"], "9.9.9");  // the record stays
        EXPECT_EQ(j.contains("message"), code == 1);
        if (code == 1) {
            EXPECT_EQ(j["message"], "file x: write failed");
        }
        EXPECT_FALSE(fs::exists(out / "run.json.tmp"));
    }
}

// The process is ending: a run.json that cannot be written is a warning, never an exception.
TEST(RunStateFile, EndNeverThrows) {
    saetrain::testing::TempDir tmp;
    RunStateFile f((tmp.path / "gone").string(), record());
    fs::remove_all(tmp.path / "gone");
    std::ofstream(tmp.path / "gone") << "a file where the directory was";
    EXPECT_NO_THROW(f.end(0));
}
