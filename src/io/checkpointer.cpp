#include "saetrain/checkpointer.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "sae_file.h"  // defines: Checksum
#include "saetrain/checkpoint_parts.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/trainer_io.h"

namespace fs = std::filesystem;

namespace saetrain {
namespace {

fs::path commit_path(const std::string& out_dir, int64_t step) {
    return fs::path(out_dir) / "checkpoints" / fmt::format("step-{}.commit", step);
}

// "section.key: value" for every leaf of the block-style YAML config_to_yaml writes.
std::map<std::string, std::string> flatten(const std::string& yaml) {
    std::map<std::string, std::string> out;
    std::istringstream in(yaml);
    std::string line, section;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        const bool nested = line[0] == ' ';
        std::string key = line.substr(0, colon);
        key.erase(0, key.find_first_not_of(' '));
        std::string value = colon + 1 < line.size() ? line.substr(colon + 1) : "";
        value.erase(0, value.find_first_not_of(' '));
        if (!nested) {
            section = key;
            if (!value.empty()) out[key] = value;
        } else {
            out[section + "." + key] = value;
        }
    }
    return out;
}

// Test hook: SAETRAIN_FAULT_KILL_BEFORE_COMMIT=<step> kills rank 0 after every rank agreed that
// the checkpoint at <step> is written and before its marker is (0.3 s later, as a slow file
// system would): the moment when the other ranks' clean-up must not yet delete anything a marker
// still points at. Unset in normal runs.
void injected_kill_before_commit(int64_t step) {
    const char* v = std::getenv("SAETRAIN_FAULT_KILL_BEFORE_COMMIT");
    if (!v || std::strtoll(v, nullptr, 10) != step) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    std::fprintf(stderr,
                 "saetrain: SAETRAIN_FAULT: rank 0 raises signal 9 (before the commit marker of "
                 "step %lld) at %.3f\n",
                 static_cast<long long>(step),
                 static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec));
    std::fflush(stderr);
    std::raise(SIGKILL);
}

}  // namespace

namespace {

// The keys of a resolved config that change the result, with their values. Which keys those
// are is said where each key is declared (config_keys, config.h).
std::map<std::string, std::string> result_values(const std::string& yaml) {
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : flatten(yaml))
        if (config_key_changes_results(k)) out[k] = v;
    return out;
}

}  // namespace

std::vector<std::string> config_result_differences(const std::string& old_yaml,
                                                   const std::string& new_yaml) {
    // A key one side lacks (a run from a version without it) counts as its default value.
    static const Config default_config;
    static const auto defaults = result_values(config_to_yaml(default_config));
    const auto a = result_values(old_yaml), b = result_values(new_yaml);
    std::vector<std::string> keys;
    for (const auto& [k, v] : a) keys.push_back(k);
    for (const auto& [k, v] : b) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<std::string> diff;
    for (const std::string& k : keys) {
        auto value = [&](const auto& side) -> std::string {
            if (auto i = side.find(k); i != side.end()) return i->second;
            if (auto i = defaults.find(k); i != defaults.end()) return i->second;
            return "(absent)";
        };
        const std::string va = value(a), vb = value(b);
        if (va != vb) diff.push_back(fmt::format("{}: {} -> {}", k, va, vb));
    }
    return diff;
}

std::string config_result_digest(const std::string& yaml) {
    Checksum sum;
    for (const auto& [k, v] : result_values(yaml)) {
        const std::string line = k + ": " + v + "\n";
        sum.add(line.data(), line.size());
    }
    return sum.text();
}

Checkpointer::Checkpointer(Communicator& world, Communicator& replicas, std::string out_dir,
                           std::string sae_dir, SaeMeta meta, int64_t keep, int shard)
    : world_(world),
      replicas_(replicas),
      writes_(replicas.rank() == 0 && shard == 0),
      out_dir_(std::move(out_dir)),
      sae_dir_(std::move(sae_dir)),
      meta_(std::move(meta)),
      keep_(std::max<int64_t>(keep, 1)) {
    committed_ = committed_steps(out_dir_);
    std::reverse(committed_.begin(), committed_.end());
}

Checkpointer::~Checkpointer() {
    if (writer_.joinable()) writer_.join();
}

std::vector<int64_t> Checkpointer::committed_steps(const std::string& out_dir) {
    std::vector<int64_t> steps;
    const fs::path dir = fs::path(out_dir) / "checkpoints";
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return steps;
    static const std::regex name(R"(step-(\d+)\.commit)");
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        std::smatch m;
        const std::string f = e.path().filename().string();
        if (std::regex_match(f, m, name)) steps.push_back(std::stoll(m[1].str()));
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
}

void Checkpointer::commit(int64_t step, int64_t iteration) {
    if (world_.rank() == 0) {
        injected_kill_before_commit(step);
        const fs::path p = commit_path(out_dir_, step);
        fs::create_directories(p.parent_path());
        const fs::path tmp = p.string() + ".tmp";
        {
            errno = 0;
            std::ofstream f(tmp);
            f << fmt::format("{{\"step\": {}, \"iteration\": {}, \"world\": {}}}\n", step,
                             iteration, world_.size());
            f.flush();
            SAE_ENFORCE(f.good(),
                        "cannot write the commit marker {} ({}); the checkpoint at step {} is not "
                        "committed: free space or fix permissions in {}, then resume",
                        tmp.string(), errno ? std::strerror(errno) : "write failed", step,
                        p.parent_path().string());
        }
        std::error_code ec;
        fs::rename(tmp, p, ec);
        SAE_ENFORCE(!ec,
                    "cannot rename the commit marker {} into place ({}); the checkpoint at "
                    "step {} is not committed",
                    tmp.string(), ec.message(), step);
    }
    // A resumed run that had nothing left to do saves its restored step again.
    if (std::find(committed_.begin(), committed_.end(), step) == committed_.end())
        committed_.push_back(step);
    // Keep the newest `keep`. A marker must never point at deleted files, so a checkpoint's
    // marker goes before its files. Rank 0 removes the marker here and may then delete its own
    // files; every other writer deletes its files only at the next commit (or at the end, after
    // a barrier), when rank 0 is known to be past this point: deleting them now raced rank 0,
    // and a rank 0 killed between the two left a committed marker whose files another rank had
    // already deleted (found by tools/fault-matrix.sh in sweep mode).
    remove_files(doomed_);
    doomed_.clear();
    while (static_cast<int64_t>(committed_.size()) > keep_) {
        const int64_t old = committed_.front();
        committed_.erase(committed_.begin());
        std::error_code ec;
        if (world_.rank() == 0) {
            fs::remove(commit_path(out_dir_, old), ec);
            remove_files({old});
        } else {
            doomed_.push_back(old);
        }
    }
    if (on_commit_) on_commit_(step);
}

void Checkpointer::remove_files(const std::vector<int64_t>& steps) const {
    // The SAE's first writer (replica 0, latent shard 0) removes every file of a step: the pair,
    // or the manifest and every part, whatever latent shard count wrote them.
    if (!writes_ || steps.empty()) return;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(sae_dir_, ec)) {
        const int64_t step = checkpoint_file_step(e.path().filename().string());
        if (step >= 0 && std::find(steps.begin(), steps.end(), step) != steps.end()) {
            std::error_code ignored;
            fs::remove(e.path(), ignored);
        }
    }
}

bool Checkpointer::write_in_flight() const { return pending_step_ >= 0 && writing_.load(); }

void Checkpointer::commit_when_written(bool in_flight_anywhere) {
    if (pending_step_ >= 0 && !in_flight_anywhere) join_and_commit();
}

void Checkpointer::join_and_commit() {
    if (pending_step_ < 0) return;
    if (writer_.joinable()) writer_.join();
    std::string error;
    if (write_error_) {
        try {
            std::rethrow_exception(write_error_);
        } catch (const std::exception& e) {
            error = e.what();
        }
        write_error_ = nullptr;
    }
    int64_t failed = error.empty() ? 0 : 1;
    world_.allreduce_max(&failed, 1);
    SAE_ENFORCE(failed == 0, "checkpoint at step {} failed{}{}; the previous one stays valid",
                pending_step_, error.empty() ? " on another rank" : ": ", error);
    commit(pending_step_, pending_iteration_);
    pending_step_ = -1;
}

void Checkpointer::save(SaeTrainer& trainer, int64_t iteration, int64_t epoch, int64_t offset,
                        bool wait) {
    join_and_commit();
    trainer.rest();  // signum: the checkpoint's weights are the SAE (the average)
    // Every replica's reader position goes into the SAE's checkpoint.
    const int64_t mine[2] = {epoch, offset};
    std::vector<int64_t> cursors(static_cast<size_t>(2 * replicas_.size()));
    replicas_.allgather(mine, cursors.data(), sizeof(mine));
    pending_step_ = trainer.step_count();
    pending_iteration_ = iteration;
    if (replicas_.rank() == 0 && trainer.latent_sharded()) {
        // Every latent shard of replica 0 writes its own part, all at once, and the first then
        // the manifest (checkpoint_parts.h): no rank sends, receives or holds more than its own
        // latents. Synchronous (the manifest waits on the latent shards' agreement, on this
        // thread); a failure is reported at the commit, as below.
        TrainState header;
        header.step = trainer.step_count(), header.tokens = trainer.tokens();
        header.iteration = iteration, header.cursors = cursors;
        SaeMeta meta = meta_;
        meta.step = header.step, meta.tokens = header.tokens;
        try {
            write_checkpoint_parts(trainer, sae_dir_, meta, header);
        } catch (...) {
            write_error_ = std::current_exception();
        }
    } else if (replicas_.rank() == 0) {
        // Snapshot now (device -> host); the files are written while training goes on.
        SaeWeights w = trainer_weights(trainer);
        TrainState s = trainer_state(trainer);
        s.iteration = iteration;
        s.cursors = std::move(cursors);
        SaeMeta meta = meta_;
        meta.step = s.step;
        meta.tokens = s.tokens;
        const std::string dir = sae_dir_;
        writing_.store(true);
        writer_ = std::thread([this, w = std::move(w), s = std::move(s), meta, dir] {
            try {
                sae_write_h5(checkpoint_weights_path(dir, s.step), w, meta);
                train_state_write(checkpoint_state_path(dir, s.step), w, s);
            } catch (...) {
                write_error_ = std::current_exception();
            }
            writing_.store(false);  // after write_error_: a reader that sees false sees it too
        });
    }
    if (wait) {
        join_and_commit();
        // The end of training (or a stop): no later commit will delete what this one rotated
        // out; rank 0 has removed those markers once everyone is past the barrier.
        if (world_.size() > 1) world_.barrier();
        remove_files(doomed_);
        doomed_.clear();
    }
}

void Checkpointer::finish() { join_and_commit(); }

namespace {

// One committed checkpoint of an SAE, as resume reads it before deciding to use it: its
// manifest and parts (a latent-sharded SAE's), or else its pair, opened, their meta and header
// read (small). Checksums are checked afterwards (the pair by the SAE's writer in one
// sequential pass; each part by the latent shard that holds its first latent now), and the
// tensors read by replica 0 of each latent shard, only its latents (trainer_read_part).
struct Candidate {
    SaeMeta meta;
    TrainState state;  // the header: step, tokens, iteration, cursors
    std::unique_ptr<CheckpointParts> parts;
    std::unique_ptr<CheckpointFiles> files;  // when there are no parts
    const TensorSource* source = nullptr;
    std::string path;  // the manifest, or the pair's weights file
    int64_t d_model = 0, n_latents = 0;
};

Candidate open_candidate(const std::string& sae_dir, int64_t step) {
    Candidate c;
    const std::string manifest = checkpoint_manifest_path(sae_dir, step);
    std::error_code ec;
    if (fs::exists(manifest, ec)) {
        c.path = manifest;
        c.parts = std::make_unique<CheckpointParts>(manifest);
        c.meta = c.parts->meta();
        c.state = c.parts->header();
        c.source = c.parts.get();
    } else {
        c.path = checkpoint_weights_path(sae_dir, step);
        c.files = std::make_unique<CheckpointFiles>(c.path, checkpoint_state_path(sae_dir, step));
        c.meta = c.files->meta();
        c.state = c.files->header();
        c.source = c.files.get();
    }
    const auto dims = c.source->shape("W_dec");
    SAE_ENFORCE(dims && dims->size() == 2,
                "file {}: not an SAE checkpoint (no dataset W_dec [n_latents, d_model])", c.path);
    c.n_latents = (*dims)[0], c.d_model = (*dims)[1];
    return c;
}

// The parts this rank verifies: those whose first latent is among its own, so that each part is
// verified once, by a rank that also reads from it, whatever latent shard count wrote them.
void verify_own_parts(const CheckpointParts& parts, const SaeTrainer& t) {
    const int64_t first = t.store().latent_shard().first(), n_local = t.local_latents();
    for (int64_t k = 0; k < parts.parts(); ++k)
        if (parts.first_latent(k) >= first && parts.first_latent(k) < first + n_local)
            parts.verify(k);
}

// Broadcasts `bytes` from `root` in pieces of at most 64 MiB (a GPU communicator stages host
// buffers through device memory).
void bcast_pieces(Communicator& comm, void* data, int64_t bytes, int root) {
    constexpr int64_t kPiece = int64_t{64} << 20;
    auto* p = static_cast<char*>(data);
    for (int64_t at = 0; at < bytes; at += kPiece)
        comm.bcast(p + at, std::min(kPiece, bytes - at), root);
}

// Replica 0's part of the checkpoint to every replica (the same latent shard of each): one read
// of the files however many replicas resume.
void share_part(CheckpointPart& part, Communicator& replicas) {
    std::vector<int64_t> sizes = {static_cast<int64_t>(part.params.size()),
                                  static_cast<int64_t>(part.since_fired.size()),
                                  static_cast<int64_t>(part.buffers.size())};
    for (const auto& [name, v] : part.buffers) {
        sizes.push_back(static_cast<int64_t>(name.size()));
        sizes.push_back(static_cast<int64_t>(v.size()));
    }
    int64_t count = static_cast<int64_t>(sizes.size());
    replicas.bcast(&count, sizeof(count), 0);
    sizes.resize(static_cast<size_t>(count));
    replicas.bcast(sizes.data(), count * int64_t{sizeof(int64_t)}, 0);
    const auto n_params = static_cast<size_t>(sizes[0]);
    for (auto* v : {&part.params, &part.opt_m, &part.opt_v}) {
        v->resize(n_params);
        bcast_pieces(replicas, v->data(), sizes[0] * int64_t{sizeof(float)}, 0);
    }
    part.since_fired.resize(static_cast<size_t>(sizes[1]));
    bcast_pieces(replicas, part.since_fired.data(), sizes[1] * int64_t{sizeof(int64_t)}, 0);
    part.buffers.resize(static_cast<size_t>(sizes[2]));
    for (size_t i = 0; i < part.buffers.size(); ++i) {
        auto& [name, v] = part.buffers[i];
        name.resize(static_cast<size_t>(sizes[3 + 2 * i]));
        v.resize(static_cast<size_t>(sizes[4 + 2 * i]));
        replicas.bcast(name.data(), static_cast<int64_t>(name.size()), 0);
        replicas.bcast(v.data(), static_cast<int64_t>(v.size() * sizeof(float)), 0);
    }
    replicas.bcast(&part.input_scale, sizeof(float), 0);
}

}  // namespace

bool Checkpointer::agree_failed(const std::string& error, int64_t step) {
    int64_t failed = error.empty() ? 0 : world_.size() - world_.rank();
    world_.allreduce_max(&failed, 1);
    if (failed == 0) return false;
    if (world_.size() - world_.rank() == failed)  // the lowest rank that failed says why
        std::fprintf(stderr,
                     "saetrain: warning: rank %d: checkpoint at step %lld unusable (%s); trying an "
                     "older one\n",
                     world_.rank(), static_cast<long long>(step), error.c_str());
    return true;
}

std::optional<ResumePoint> Checkpointer::resume(SaeTrainer& trainer, const std::string& config_yaml,
                                                bool allow_config_change) {
    newest_failure_.clear();
    // Rank 0's listing decides the candidates, so every rank tries the same ones.
    std::vector<int64_t> steps = committed_steps(out_dir_);
    int64_t count = static_cast<int64_t>(steps.size());
    world_.bcast(&count, sizeof(count), 0);
    steps.resize(static_cast<size_t>(count));
    if (count > 0) world_.bcast(steps.data(), count * static_cast<int64_t>(sizeof(int64_t)), 0);
    for (int64_t step : steps) {
        std::string error;
        Candidate c;
        try {
            c = open_candidate(sae_dir_, step);
            SAE_ENFORCE(static_cast<int64_t>(c.state.cursors.size()) == 2 * replicas_.size(),
                        "checkpoint {} was written by {} replica(s) of this SAE, the job has {}; "
                        "resume with the same number of ranks",
                        c.files ? checkpoint_state_path(sae_dir_, step) : c.path,
                        c.state.cursors.size() / 2, replicas_.size());
        } catch (const std::exception& e) {
            error = e.what();
        }
        if (agree_failed(error, step)) {
            if (step == steps.front() && !error.empty())
                newest_failure_ = fmt::format("the newest, at step {}: {}", step, error);
            continue;
        }
        check_resumable(c.meta.config_yaml, config_yaml, allow_config_change, step);
        // The data's d_model is not in the config: a run whose shards were replaced by another
        // model's or hook's activations is refused here, naming what changed.
        SAE_ENFORCE(c.d_model == trainer.d_model() && c.n_latents == trainer.n_latents(),
                    "{}: the checkpoint at step {} ({}) holds an SAE of d_model {} x {} latents, "
                    "but the data at data.path now has d_model {} ({} latents): the shards "
                    "changed since the run started. Restore them, or use another run.out_dir "
                    "for the new data (--overwrite deletes this run's checkpoints)",
                    out_dir_, step, c.path, c.d_model, c.n_latents, trainer.d_model(),
                    trainer.n_latents());
        // Replica 0 of each latent shard verifies its parts (a pair: the SAE's writer verifies it
        // whole), then reads its latents; the other replicas receive theirs.
        CheckpointPart part;
        try {
            if (replicas_.rank() == 0) {
                if (c.parts)
                    verify_own_parts(*c.parts, trainer);
                else if (writes_)
                    c.files->verify();
                part = trainer_read_part(trainer, *c.source);
            }
        } catch (const std::exception& e) {
            error = e.what();
        }
        if (agree_failed(error, step)) {
            if (step == steps.front() && !error.empty())
                newest_failure_ = fmt::format("the newest, at step {}: {}", step, error);
            continue;
        }
        c.files.reset();
        c.parts.reset();
        if (replicas_.size() > 1) share_part(part, replicas_);
        trainer.restore(std::move(part), c.state.step, c.state.tokens);
        // Newer markers whose files failed to load are useless: drop them so they are not
        // tried (and reported) again.
        if (world_.rank() == 0)
            for (int64_t newer : steps) {
                if (newer <= step) break;
                std::error_code ec;
                fs::remove(commit_path(out_dir_, newer), ec);
            }
        ResumePoint p;
        p.step = step;
        p.iteration = c.state.iteration;
        p.epoch = c.state.cursors[static_cast<size_t>(2 * replicas_.rank())];
        p.offset = c.state.cursors[static_cast<size_t>(2 * replicas_.rank() + 1)];
        committed_ = steps;
        std::sort(committed_.begin(), committed_.end());
        committed_.erase(std::upper_bound(committed_.begin(), committed_.end(), step),
                         committed_.end());
        return p;
    }
    return std::nullopt;
}

void Checkpointer::check_resumable(const std::string& old_yaml, const std::string& config_yaml,
                                   bool allow_config_change, int64_t step) {
    const std::vector<std::string> diff = config_result_differences(old_yaml, config_yaml);
    int64_t differs = diff.empty() ? 0 : 1;
    world_.allreduce_max(&differs, 1);
    if (!differs || allow_config_change) return;
    std::string keys;
    for (const std::string& d : diff) keys += (keys.empty() ? "" : "; ") + d;
    throw Error(fmt::format(
        "{}: the checkpoint at step {} was trained with a different config ({}); resuming would "
        "change the result. Restore those values, or pass --allow-config-change to resume under "
        "the new ones (--overwrite deletes the run's checkpoints and starts over)",
        out_dir_, step, keys.empty() ? "on another SAE" : keys));
}

}  // namespace saetrain
