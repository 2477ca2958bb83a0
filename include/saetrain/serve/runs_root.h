// runs_root.h — sae-serve's runs root: the one directory whose run directories it watches and
// launches into, and the checks that keep every path it touches inside it.
//
// A run id is the name of a run directory directly under the root (run_id_check): letters,
// digits, '.', '_' and '-', not starting with '.' (the root's own .sae-serve/ and hidden files
// are no runs), at most 128 bytes, so no id is "..", holds a '/' or names a path elsewhere.
// Every open goes through the root's directory descriptor with O_NOFOLLOW (openat), one
// component at a time: a symlink at a run's name or inside it (report/, a file) is refused, never
// followed, so a link planted in the root cannot make the server read or list a path outside it,
// whatever the link points at and whenever it is planted (no check-then-open race).
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>
#include <vector>

namespace saetrain::serve {

// "" when `id` is a valid run id, else why not ("run id '..': ..."), naming the id.
std::string run_id_check(const std::string& id);

// "" when `name` is one plain file name servable from a run's report/ directory (the same
// characters as a run id), else why not.
std::string file_name_check(const std::string& name);

// Decodes %XX escapes of a URL path segment or query value ('+' stays '+'). Nothing when an
// escape is malformed or decodes to a NUL byte.
std::optional<std::string> percent_decode(const std::string& text);

// A file descriptor closed when it goes out of scope (-1: none).
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd();
    Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Fd& operator=(Fd&& o) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

class RunsRoot {
public:
    // Opens `path` (created when missing, mode 0755) as the root; throws Error naming it when it
    // is not a directory or cannot be opened. path() is its canonical absolute form.
    explicit RunsRoot(const std::string& path);

    const std::string& path() const { return path_; }
    int fd() const { return fd_.get(); }
    // ROOT/id, as text (for run.out_dir and messages).
    std::string run_path(const std::string& id) const { return path_ + "/" + id; }

    // The run directory `id`, opened (O_DIRECTORY | O_NOFOLLOW), or an invalid Fd with `why`
    // set: an invalid id, no such directory, a symlink (refused, not followed), not a directory.
    Fd open_run(const std::string& id, std::string* why) const;
    // Whether ROOT/id exists in any form (a symlink counts: the name is taken).
    bool exists(const std::string& id) const;

    // The run ids under the root: the names of real directories (no symlinks) that pass
    // run_id_check, sorted.
    std::vector<std::string> list_runs() const;

    // The run id a submitted config's run.out_dir names: a bare run id (a directory of the
    // root), or a path whose parent is the root itself after its symlinks are resolved,
    // relative paths taken from `cwd` as saetrain run there would (runs/x names ROOT/x for a
    // server started beside ROOT = runs). Anything else ("..", "/elsewhere/x", ROOT/a/b) is an
    // error naming run.out_dir and the root, in `why`.
    std::optional<std::string> run_id_of_out_dir(const std::string& out_dir, const std::string& cwd,
                                                 std::string* why) const;

    // The directory a launched run stages its shards in, for a submitted config's
    // data.stage_dir: `$TMPDIR` at its start becomes `tmpdir` (the node's temporary directory,
    // as the run would expand it), a relative path is taken from `cwd`. After `$TMPDIR` is
    // expanded the path must lie, component by component, in `tmpdir` (or its real path) or the
    // root; a '..' component is refused. The components below that base are opened from its
    // descriptor without following a symlink, each existing one owned by this user and not
    // writable by others (so nobody else can plant a link in it later), the missing ones created
    // (mode 0700). Returns the real path to launch with, or nothing with `why` naming
    // data.stage_dir and the two places a launched run may write.
    std::optional<std::string> stage_dir_for_launch(const std::string& stage_dir,
                                                    const std::string& cwd,
                                                    const std::string& tmpdir,
                                                    std::string* why) const;

private:
    std::string path_;
    Fd fd_;
};

// Opens `name` inside the directory `dir_fd` without following a symlink (O_NOFOLLOW), as a
// directory when `directory` (O_DIRECTORY), else as a regular file (anything else is refused).
// Invalid Fd with `why` set ("report is a symlink", "does not exist", ...).
Fd open_beneath(int dir_fd, const std::string& name, bool directory, std::string* why);

// The first symlink among what sae-report reads or writes in the run directory `run_fd` (its
// config.yaml, run.json, metrics.jsonl, summary.csv, COMPLETE, lock, checkpoints/, sae/ and each
// sae/ID/ with its feature_density.csv, report/ and every file in it), as "NAME is a symlink";
// "" when there is none. A run never writes a link: sae-serve runs sae-report only on a run
// directory without them (sae-report refuses one on its own too).
std::string planted_link(int run_fd);

// The names of the real directories (no symlinks) in `dir_fd` that pass run_id_check, sorted.
std::vector<std::string> list_plain_dirs(int dir_fd);

// Reads a regular file opened by open_beneath (at most max_bytes: more is an error in `why`).
std::optional<std::string> read_fd(int fd, size_t max_bytes, std::string* why);

// The stat of `name` in `dir_fd`, not following a symlink; nothing when it does not exist.
std::optional<struct stat> stat_beneath(int dir_fd, const std::string& name);

}  // namespace saetrain::serve
