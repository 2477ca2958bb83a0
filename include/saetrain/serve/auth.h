// auth.h — sae-serve's bearer token: made once, kept in a file only its user can read, and
// required on every request (page, API, WebSocket).
//
// The token is 32 random bytes (getrandom) as 64 hex digits, generated at the first start into
// RUNS/.sae-serve/token (or --token-file): the directory is created with mode 0700 and the file
// with 0600 (O_EXCL: never through a planted file or symlink). An existing token file is used as
// it is, provided it is a regular file (not a symlink) that neither group nor others can read or
// write, as ssh treats its keys; otherwise the server refuses to start, naming the file and the
// chmod that fixes it.
//
// A request carries the token as `Authorization: Bearer TOKEN` (curl, scripts; required for
// every POST, so that no page of another site can make a browser launch or stop a run), as the
// `token` query parameter (the first visit of the page, a WebSocket from a browser or websocat),
// or as the HttpOnly, SameSite=Strict cookie the page's first visit sets (cookie_name), which
// the page's own fetches and WebSockets then send. Tokens are compared in constant time.
#pragma once

#include <string>

namespace saetrain::serve {

// The token in `path`, created (and its directory, mode 0700) when missing. Throws Error naming
// the file when it cannot be made or read, is not a regular file, is readable or writable by
// group or others, or holds fewer than 32 characters.
std::string token_load_or_create(const std::string& path);

// Whether `given` equals `token`, in time independent of where they differ (both non-empty).
bool token_equal(const std::string& given, const std::string& token);

// The token of an Authorization header value "Bearer TOKEN" (scheme case-insensitive), or "".
std::string bearer_token(const std::string& authorization);

// The value of the cookie `name` in a Cookie header ("a=1; name=value"), or "".
std::string cookie_value(const std::string& cookie_header, const std::string& name);

// The cookie carrying the token for the server on `port`: one name per port, since browsers send
// a host's cookies to every port of it.
std::string cookie_name(int port);

// A new random token (64 hex digits).
std::string token_generate();

}  // namespace saetrain::serve
