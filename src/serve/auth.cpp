#include "saetrain/serve/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "saetrain/error.h"
#include "saetrain/serve/runs_root.h"  // defines: Fd, read_fd

namespace fs = std::filesystem;

namespace saetrain::serve {

namespace {

constexpr size_t kMinTokenChars = 32;
constexpr size_t kMaxTokenFileBytes = 4096;

std::string trim(const std::string& s) {
    size_t a = 0, b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
    return s.substr(a, b - a);
}

// The token file's directory: created 0700 when missing; an existing one must be a directory.
void make_token_dir(const fs::path& dir) {
    if (dir.empty()) return;
    if (::mkdir(dir.c_str(), 0700) == 0) return;
    SAE_ENFORCE(errno == EEXIST, "token directory {}: cannot be created: {}",
                printable(dir.string()), std::strerror(errno));
    struct stat st {};
    SAE_ENFORCE(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
                "token directory {} is not a directory (a symlink is not followed)",
                printable(dir.string()));
}

std::string read_token(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    SAE_ENFORCE(fd >= 0, "token file {}: {}", printable(path),
                errno == ELOOP ? "is a symlink (not followed)" : std::strerror(errno));
    Fd owned(fd);
    struct stat st {};
    SAE_ENFORCE(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), "token file {} is not a regular file",
                printable(path));
    SAE_ENFORCE((st.st_mode & 077) == 0,
                "token file {} can be read or written by others (mode {:04o}): run chmod 600 {}",
                printable(path), st.st_mode & 07777, printable(path));
    std::string why;
    const std::optional<std::string> text = read_fd(fd, kMaxTokenFileBytes, &why);
    SAE_ENFORCE(text.has_value(), "token file {} {}", printable(path), why);
    const std::string token = trim(*text);
    SAE_ENFORCE(
        token.size() >= kMinTokenChars && token.find_first_of(" \t\r\n") == std::string::npos,
        "token file {} holds no token of at least {} characters on one line: remove it "
        "and sae-serve makes a new one",
        printable(path), kMinTokenChars);
    return token;
}

}  // namespace

std::string token_generate() {
    unsigned char bytes[32];
    size_t got = 0;
    while (got < sizeof(bytes)) {
        const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
        if (n < 0 && errno == EINTR) continue;
        SAE_ENFORCE(n > 0, "getrandom failed: {}", std::strerror(errno));
        got += static_cast<size_t>(n);
    }
    std::string hex;
    for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
    return hex;
}

std::string token_load_or_create(const std::string& path) {
    make_token_dir(fs::path(path).parent_path());
    const std::string token = token_generate();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        SAE_ENFORCE(errno == EEXIST, "token file {}: cannot be created: {}", printable(path),
                    std::strerror(errno));
        return read_token(path);
    }
    Fd owned(fd);
    const std::string line = token + "\n";
    SAE_ENFORCE(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                    ::fsync(fd) == 0,
                "token file {}: cannot be written: {}", printable(path), std::strerror(errno));
    return token;
}

bool token_equal(const std::string& given, const std::string& token) {
    if (given.empty() || token.empty()) return false;
    // Every byte of the token is compared whatever the given string holds.
    unsigned diff = given.size() == token.size() ? 0u : 1u;
    for (size_t i = 0; i < token.size(); ++i) {
        const char g = i < given.size() ? given[i] : '\0';
        diff |= static_cast<unsigned>(static_cast<unsigned char>(g) ^
                                      static_cast<unsigned char>(token[i]));
    }
    return diff == 0;
}

std::string bearer_token(const std::string& authorization) {
    const std::string v = trim(authorization);
    if (v.size() < 7) return "";
    std::string scheme = v.substr(0, 7);
    for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (scheme != "bearer ") return "";
    return trim(v.substr(7));
}

std::string cookie_value(const std::string& cookie_header, const std::string& name) {
    size_t pos = 0;
    while (pos < cookie_header.size()) {
        size_t end = cookie_header.find(';', pos);
        if (end == std::string::npos) end = cookie_header.size();
        const std::string pair = trim(cookie_header.substr(pos, end - pos));
        const size_t eq = pair.find('=');
        if (eq != std::string::npos && pair.substr(0, eq) == name) return pair.substr(eq + 1);
        pos = end + 1;
    }
    return "";
}

std::string cookie_name(int port) { return fmt::format("sae_serve_token_{}", port); }

}  // namespace saetrain::serve
