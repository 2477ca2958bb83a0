// error.h — one family of checks for every library saetrain calls.
//
// Every failure becomes a saetrain::Error carrying a one-line, user-facing message: what was
// wrong, where (file, key, rank), and what to do. `main` catches it once, prints it once and
// aborts the job, so no rank is left waiting on a peer that already gave up.
// SAE_ENFORCE is for preconditions and bad input; SAE_<LIB>_CHECK wraps a library call and
// reports the failing statement with file:line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace saetrain {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A wait abandoned because a stop signal arrived (s3_set_stop_check, s3.h): not a failure of
// the data. main exits 75 for it, as for a run stopped by a signal, with nothing to save.
class StopRequested : public Error {
public:
    explicit StopRequested(const std::string& what) : Error(what) {}
};

// Formats "<what> (at file:line)" for checks whose failure is a bug or a library fault.
[[noreturn]] void throw_check_failure(const char* lib, const char* stmt, const std::string& detail,
                                      const char* file, int line);

// `path` (a file the user named: a config, a shard, a checkpoint) is, after its symlinks, a
// regular file: opening a FIFO would block where no signal reaches, and a device or a directory
// is never what was meant. Throws Error "<what> <path> is <a FIFO | a directory | a dangling
// symlink | ...>, not a regular file" (or "does not exist"), before anything opens it.
void require_regular_file(const std::string& path, const std::string& what);

// `text` safe to print on one terminal line: control characters (newlines, ESC of an ANSI
// sequence planted in a path or a file's attribute) and DEL become \xNN; other bytes, UTF-8
// included, are kept. Every program prints its error line and user-named strings through it.
std::string printable(const std::string& text);

}  // namespace saetrain

// SAE_ENFORCE(cond, "fmt {}", args...): a user-facing precondition; the message is the error.
#define SAE_ENFORCE(cond, ...)                                          \
    do {                                                                \
        if (!(cond)) throw ::saetrain::Error(fmt::format(__VA_ARGS__)); \
    } while (0)

// HDF5 calls return a negative value on failure.
#define SAE_H5_CHECK(stmt)                                                                  \
    ([&]() {                                                                                \
        auto _r = (stmt);                                                                   \
        if (_r < 0) ::saetrain::throw_check_failure("HDF5", #stmt, "", __FILE__, __LINE__); \
        return _r;                                                                          \
    }())

#define SAE_MPI_CHECK(stmt)                                                                      \
    do {                                                                                         \
        int _rc = (stmt);                                                                        \
        if (_rc != 0)                                                                            \
            ::saetrain::throw_check_failure("MPI", #stmt, fmt::format("code {}", _rc), __FILE__, \
                                            __LINE__);                                           \
    } while (0)
