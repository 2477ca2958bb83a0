// atomic_file.h (internal) — write a file so readers see the old one or the whole new one.
#pragma once

#include <functional>
#include <string>

namespace saetrain {

// Creates the parent directory, calls write(tmp) for a temp file in the same directory, fsyncs
// it, renames it onto `path` and fsyncs the directory. The temp file is removed on any error.
void atomic_write(const std::string& path, const std::function<void(const std::string&)>& write);

// atomic_write of `text` as the file's whole content; throws Error naming `path` and the
// system's reason when it cannot be written.
void atomic_write_text(const std::string& path, const std::string& text);

}  // namespace saetrain
