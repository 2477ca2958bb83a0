// server_parts.h — what sae-serve's server (server.h) shares among its sources: the sessions
// (sessions.cpp), the server's set-up and poll loop (server.cpp) and its routes (routes.cpp).
// Private to src/serve.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "saetrain/config.h"  // defines: Config
#include "saetrain/serve/auth.h"
#include "saetrain/serve/run_status.h"
#include "saetrain/serve/runs_root.h"
#include "saetrain/serve/server.h"

namespace saetrain::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// A client whose unsent messages pass this is dropped (it reconnects with since=STEP).
constexpr size_t kMaxQueuedBytes = 64 << 20;
// Every WebSocket client's queue together: clients that never read cannot hold 64 MiB each.
constexpr size_t kMaxQueuedTotal = 256 << 20;
constexpr size_t kMaxReportFile = 64 << 20;
constexpr size_t kHeaderLimit = 16 << 10;
constexpr auto kReadTimeout = std::chrono::seconds(60);
// A connection's first request header, before the client has shown the token.
constexpr auto kFirstHeaderTimeout = std::chrono::seconds(10);

// Nanoseconds since the epoch (the real-time clock).
int64_t now_ns();
// A request's target split into its decoded path segments and query parameters.
struct Target {
    std::vector<std::string> segments;
    std::map<std::string, std::string> query;
    bool ok = true;
    bool trailing_slash = false;
};

Target parse_target(const std::string& target);
// A JSON body with `status`.
Response json_response(const Request& req, http::status status, const nlohmann::ordered_json& j);
// {"error": message} with `status`.
Response error_response(const Request& req, http::status status, const std::string& message);
// A whole non-negative number, or nothing.
std::optional<int64_t> parse_count(const std::string& s);
// The query parameter `key` as a whole number >= minimum into *value (left as it is when the
// parameter is absent); a malformed one gives the line to answer with, e.g. "since=x: not a step
// (a whole number >= 0)".
std::optional<std::string> query_count(const Target& t, const std::string& key, int64_t minimum,
                                       const char* what, int64_t* value);
inline constexpr const char* kStep = "a step (a whole number >= 0)";
inline constexpr const char* kRanks = "a rank count (a whole number >= 1)";
// The Content-Type of a report file, from its extension.
std::string content_type_of(const std::string& name);

class Server;

// ---- WebSocket session -------------------------------------------------------------------------

class WsSession : public std::enable_shared_from_this<WsSession> {
public:
    WsSession(tcp::socket&& socket, Server& server, std::string run, int64_t since)
        : ws_(std::move(socket)), server_(server), run_(std::move(run)), since_(since) {}
    ~WsSession();
    void start(Request req);
    void send(std::shared_ptr<const std::string> msg);
    // A step's metrics message: sent only when the step is after the last one this client has
    // (its `since`, then each step sent), so a client never gets a step twice, whenever it
    // connected; a rewind moves that point back.
    void send_step(int64_t step, std::shared_ptr<const std::string> msg);
    void rewind(int64_t step, std::shared_ptr<const std::string> msg);
    const std::string& run() const { return run_; }
    int64_t since() const { return since_; }

private:
    void write_next();
    void do_read();
    void close();

    websocket::stream<beast::tcp_stream> ws_;
    Server& server_;
    std::string run_;
    int64_t since_;
    std::deque<std::shared_ptr<const std::string>> out_;
    size_t out_bytes_ = 0;
    bool writing_ = false, closed_ = false;
    beast::flat_buffer in_;
};

// ---- HTTP session ------------------------------------------------------------------------------

class HttpSession : public std::enable_shared_from_this<HttpSession> {
public:
    HttpSession(tcp::socket&& socket, Server& server)
        : stream_(std::move(socket)), server_(server) {}
    ~HttpSession();
    void start() { read_header(); }
    // Whether a request on it carried the token.
    bool trusted() const { return trusted_; }
    // Closes it (a client that never showed the token, when the slots are full).
    void evict();

private:
    void read_header();
    void on_header(beast::error_code ec);
    void read_body();
    // The 413 for a body over --max-body.
    Response body_over_limit(const Request& req) const;
    void on_body(beast::error_code ec);
    void dispatch();
    void send(Response res, bool then_close = false);
    void drain_and_close();

    beast::tcp_stream stream_;
    Server& server_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::array<char, 65536> drain_{};
    size_t drained_ = 0;
    bool trusted_ = false;
};

// ---- the server --------------------------------------------------------------------------------

class Server {
public:
    explicit Server(const ServeOptions& opt);
    int run();

    // A complete request of an authorized client. `respond` may be called later (a report
    // being made), or never when the request is a WebSocket's: its session takes `stream`'s
    // socket.
    void handle(Request&& req, beast::tcp_stream* stream, std::function<void(Response)> respond);
    // A request whose headers arrived: nothing when it may go on, else the response that ends it.
    std::optional<Response> check_header(const Request& req);
    size_t max_body() const { return opt_.max_body; }

    void subscribe(const std::shared_ptr<WsSession>& s);
    void unsubscribe(const WsSession* s);
    void connection_opened() { ++connections_; }
    void connection_closed() { --connections_; }
    bool too_many_connections() const { return connections_ >= opt_.max_clients; }
    // The WebSocket clients' queued bytes, all together (kMaxQueuedTotal).
    size_t& ws_queued() { return ws_queued_; }

private:
    void accept();
    void tick();
    void discover();
    RunWatch* watch(const std::string& id);
    // The 404 for a run that watch() does not find, with open_run's reason.
    Response unknown_run(const Request& req, const std::string& id);
    enum class Kind { state, step, rewind };
    void broadcast(const std::string& run, const std::string& text, Kind kind, int64_t step = 0);

    Response page(const Request& req, const Target& t);
    Response list_runs(const Request& req);
    Response get_run(const Request& req, const std::string& id);
    Response get_metrics(const Request& req, const std::string& id, const Target& t);
    Response submit(const Request& req, const Target& t);
    Response stop(const Request& req, const std::string& id);
    Response resume(const Request& req, const std::string& id, const Target& t);
    void report(const Request& req, const std::string& id, const std::string& file, bool refresh,
                std::function<void(Response)> respond);
    // report/<file>, or a file below report/ in `dirs` (report/features/<sae>/: the feature
    // pages), each directory opened beneath the last without following links.
    Response report_file(const Request& req, const std::string& id, const std::string& file,
                         const std::vector<std::string>& dirs = {});
    // Launches `cfg` as run `id` with `ranks` ranks; the response to the POST.
    Response launch(const Request& req, const std::string& id, Config cfg, int ranks,
                    bool overwrite, http::status ok_status);
    // The job size to launch `cfg` with: `asked` (0: the config's own) checked against the
    // config's grid and --max-ranks; an error line in `why` otherwise.
    std::optional<int> ranks_for(const Config& cfg, int64_t asked, std::string* why) const;
    // Token from the header, cookie or query: "" when absent; `how` says which.
    std::string token_of(const Request& req, const Target& t, std::string* how) const;

    ServeOptions opt_;
    RunsRoot root_;
    std::string token_file_, token_;
    Fd lock_;              // ROOT/.sae-serve/lock: one server per root
    net::io_context ioc_;  // run by one thread; the report threads post to it
    tcp::acceptor acceptor_{ioc_};
    net::steady_timer timer_{ioc_}, accept_retry_{ioc_};
    net::signal_set signals_{ioc_, SIGINT, SIGTERM};
    std::map<std::string, std::unique_ptr<RunWatch>> runs_;
    std::map<std::string, std::vector<std::weak_ptr<WsSession>>> subscribers_;
    // Reports being made: the requests waiting for each ("" or why sae-report failed).
    std::map<std::string, std::vector<std::function<void(const std::string&)>>> reports_;
    std::set<pid_t> children_;  // wrappers to reap
    int connections_ = 0;
    int ticks_ = 0;
    size_t ws_queued_ = 0;
    // Connections in the order accepted, until their first request shows the token: when every
    // slot is taken, the oldest of them is closed for a new one (idle connections that never
    // authenticate cannot keep clients out).
    std::deque<std::weak_ptr<HttpSession>> untrusted_;
};

}  // namespace saetrain::serve
