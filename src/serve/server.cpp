// sae-serve's HTTP and WebSocket server (server.h): the sessions, the routes, the poll loop that
// tails every run and pushes what is new to the run's WebSocket clients.
#include "saetrain/serve/server.h"

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
#include <set>
#include <thread>

#include "saetrain/config.h"  // defines: config_parse, config_to_yaml
#include "saetrain/error.h"
#include "saetrain/rank_grid.h"  // defines: RankGrid (the job sizes a config fits)
#include "saetrain/serve/auth.h"
#include "saetrain/serve/launcher.h"
#include "saetrain/serve/page.h"  // defines: page_html
#include "saetrain/serve/run_status.h"
#include "saetrain/serve/runs_root.h"

extern char** environ;

namespace saetrain::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

namespace {

// A client whose unsent messages pass this is dropped (it reconnects with since=STEP).
constexpr size_t kMaxQueuedBytes = 64 << 20;
// Every WebSocket client's queue together: clients that never read cannot hold 64 MiB each.
constexpr size_t kMaxQueuedTotal = 256 << 20;
constexpr size_t kMaxReportFile = 64 << 20;
constexpr size_t kHeaderLimit = 16 << 10;
constexpr auto kReadTimeout = std::chrono::seconds(60);
// A connection's first request header, before the client has shown the token.
constexpr auto kFirstHeaderTimeout = std::chrono::seconds(10);

int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A request's target split into its decoded path segments and query parameters.
struct Target {
    std::vector<std::string> segments;
    std::map<std::string, std::string> query;
    bool ok = true;
    bool trailing_slash = false;
};

Target parse_target(const std::string& target) {
    Target t;
    const size_t q = target.find('?');
    const std::string path = target.substr(0, q);
    if (q != std::string::npos) {
        const std::string qs = target.substr(q + 1);
        size_t pos = 0;
        while (pos <= qs.size()) {
            size_t amp = qs.find('&', pos);
            if (amp == std::string::npos) amp = qs.size();
            const std::string kv = qs.substr(pos, amp - pos);
            if (!kv.empty()) {
                const size_t eq = kv.find('=');
                const auto k = percent_decode(kv.substr(0, eq));
                const auto v = percent_decode(eq == std::string::npos ? "" : kv.substr(eq + 1));
                if (!k || !v)
                    t.ok = false;
                else
                    t.query[*k] = *v;
            }
            pos = amp + 1;
        }
    }
    if (path.empty() || path[0] != '/') {
        t.ok = false;
        return t;
    }
    t.trailing_slash = path.size() > 1 && path.back() == '/';
    size_t pos = 1;
    while (pos < path.size()) {
        size_t slash = path.find('/', pos);
        if (slash == std::string::npos) slash = path.size();
        const auto seg = percent_decode(path.substr(pos, slash - pos));
        if (!seg)
            t.ok = false;
        else if (!seg->empty())
            t.segments.push_back(*seg);
        pos = slash + 1;
    }
    return t;
}

Response json_response(const Request& req, http::status status, const nlohmann::ordered_json& j) {
    Response res{status, req.version()};
    res.set(http::field::content_type, "application/json");
    res.set(http::field::cache_control, "no-store");
    res.keep_alive(req.keep_alive());
    // Config text, error lines and file contents may hold bytes that are not UTF-8: they become
    // U+FFFD rather than an exception.
    res.body() = j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    res.prepare_payload();
    return res;
}

Response error_response(const Request& req, http::status status, const std::string& message) {
    nlohmann::ordered_json j;
    j["error"] = printable(message);
    return json_response(req, status, j);
}

// A whole non-negative number, or nothing.
std::optional<int64_t> parse_count(const std::string& s) {
    if (s.empty() || s.size() > 15) return std::nullopt;
    for (char c : s)
        if (c < '0' || c > '9') return std::nullopt;
    return std::stoll(s);
}

// The query parameter `key` as a whole number >= minimum into *value (left as it is when the
// parameter is absent); a malformed one gives the line to answer with, e.g. "since=x: not a step
// (a whole number >= 0)".
std::optional<std::string> query_count(const Target& t, const std::string& key, int64_t minimum,
                                       const char* what, int64_t* value) {
    const auto q = t.query.find(key);
    if (q == t.query.end()) return std::nullopt;
    const auto v = parse_count(q->second);
    if (!v || *v < minimum) return fmt::format("{}={}: not {}", key, q->second, what);
    *value = *v;
    return std::nullopt;
}
constexpr const char* kStep = "a step (a whole number >= 0)";
constexpr const char* kRanks = "a rank count (a whole number >= 1)";

std::string content_type_of(const std::string& name) {
    const size_t dot = name.rfind('.');
    const std::string ext = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (ext == "html") return "text/html; charset=utf-8";
    if (ext == "svg") return "image/svg+xml";
    if (ext == "png") return "image/png";
    if (ext == "csv") return "text/csv; charset=utf-8";
    if (ext == "json") return "application/json";
    if (ext == "css") return "text/css";
    return "text/plain; charset=utf-8";
}

}  // namespace

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
    Response report_file(const Request& req, const std::string& id, const std::string& file);
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

// ---- WsSession ---------------------------------------------------------------------------------

WsSession::~WsSession() {
    server_.ws_queued() -= std::min(server_.ws_queued(), out_bytes_);
    server_.connection_closed();
    server_.unsubscribe(this);
}

void WsSession::start(Request req) {
    // A client gone without a close (a laptop's tunnel dropped) is noticed by a ping unanswered
    // within two minutes, not at the next write.
    websocket::stream_base::timeout timeouts =
        websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeouts.idle_timeout = std::chrono::seconds(120);
    timeouts.keep_alive_pings = true;
    ws_.set_option(timeouts);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "sae-serve"); }));
    ws_.read_message_max(64 << 10);
    // A client's close frame: stop writing at once, so that Beast can answer it (its close reply
    // waits for our write in progress) instead of the client waiting out its close timeout.
    ws_.control_callback([this](websocket::frame_type kind, beast::string_view) {
        if (kind == websocket::frame_type::close) {
            closed_ = true;
            // What stays queued is the write in progress, if any.
            size_t keep = writing_ && !out_.empty() ? out_.front()->size() : 0;
            if (out_.size() > 1) out_.erase(out_.begin() + 1, out_.end());
            if (!writing_) out_.clear();
            keep = std::min(keep, out_bytes_);
            server_.ws_queued() -= std::min(server_.ws_queued(), out_bytes_ - keep);
            out_bytes_ = keep;
        }
    });
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
        if (ec) return;
        self->server_.subscribe(self);
        self->do_read();
    });
}

void WsSession::send(std::shared_ptr<const std::string> msg) {
    if (closed_) return;
    if (out_bytes_ + msg->size() > kMaxQueuedBytes ||
        server_.ws_queued() + msg->size() > kMaxQueuedTotal) {
        // Too slow to keep up: dropped; it reconnects with since=STEP and loses nothing.
        close();
        return;
    }
    out_bytes_ += msg->size();
    server_.ws_queued() += msg->size();
    out_.push_back(std::move(msg));
    if (!writing_) write_next();
}

void WsSession::send_step(int64_t step, std::shared_ptr<const std::string> msg) {
    if (step <= since_) return;
    since_ = step;
    send(std::move(msg));
}

void WsSession::rewind(int64_t step, std::shared_ptr<const std::string> msg) {
    since_ = std::min(since_, step);
    send(std::move(msg));
}

void WsSession::write_next() {
    writing_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(*out_.front()),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                        const size_t n = std::min(self->out_bytes_, self->out_.front()->size());
                        self->out_bytes_ -= n;
                        self->server_.ws_queued() -= std::min(self->server_.ws_queued(), n);
                        self->out_.pop_front();
                        if (ec) {
                            self->closed_ = true;
                            self->server_.unsubscribe(self.get());
                            return;
                        }
                        if (!self->out_.empty() && !self->closed_)
                            self->write_next();
                        else
                            self->writing_ = false;
                    });
}

void WsSession::do_read() {
    // Clients send nothing the server needs; reading notices their close.
    ws_.async_read(in_, [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) {
            self->closed_ = true;
            self->server_.unsubscribe(self.get());
            return;
        }
        self->in_.consume(self->in_.size());
        self->do_read();
    });
}

void WsSession::close() {
    if (closed_) return;
    closed_ = true;
    server_.unsubscribe(this);
    ws_.async_close(websocket::close_reason(websocket::close_code::policy_error,
                                            "too slow: reconnect with since=STEP"),
                    [self = shared_from_this()](beast::error_code) {});
}

// ---- HttpSession -------------------------------------------------------------------------------

HttpSession::~HttpSession() { server_.connection_closed(); }

void HttpSession::evict() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
        beast::error_code ec;
        self->stream_.socket().close(ec);
    });
}

void HttpSession::read_header() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    // No limit while the header is read: the token is checked before the body's size, so that a
    // client without it learns nothing but 401.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(trusted_ ? kReadTimeout : kFirstHeaderTimeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void HttpSession::on_header(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::eof)
        return;
    Request bad;
    bad.version(11);
    bad.keep_alive(false);
    if (ec == http::error::header_limit)
        return send(
            error_response(bad, http::status::request_header_fields_too_large,
                           fmt::format("the request's header is over {} bytes", kHeaderLimit)),
            true);
    if (ec == http::error::body_limit) return send(body_over_limit(bad), true);
    if (ec) return send(error_response(bad, http::status::bad_request, ec.message()), true);
    if (auto refused = server_.check_header(parser_->get())) return send(std::move(*refused), true);
    trusted_ = true;
    if (const auto length = parser_->content_length(); length && *length > server_.max_body())
        return send(error_response(parser_->get(), http::status::payload_too_large,
                                   fmt::format("the request body ({} bytes) is over sae-serve's "
                                               "limit of {} bytes (--max-body)",
                                               *length, server_.max_body())),
                    true);
    parser_->body_limit(server_.max_body());  // a chunked body is counted as it comes
    if (parser_->is_done()) return dispatch();
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
        // curl waits a second for this before it sends a body over 1 KiB.
        auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                       parser_->get().version());
        return http::async_write(stream_, *cont,
                                 [self = shared_from_this(), cont](beast::error_code e, size_t) {
                                     if (!e) self->read_body();
                                 });
    }
    read_body();
}

Response HttpSession::body_over_limit(const Request& req) const {
    return error_response(req, http::status::payload_too_large,
                          fmt::format("the request body is over sae-serve's limit of {} bytes "
                                      "(--max-body)",
                                      server_.max_body()));
}

void HttpSession::read_body() {
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code e, size_t) { self->on_body(e); });
}

void HttpSession::on_body(beast::error_code ec) {
    Request bad;
    bad.version(11);
    bad.keep_alive(false);
    if (ec == http::error::body_limit) return send(body_over_limit(bad), true);
    if (ec) return;
    dispatch();
}

void HttpSession::dispatch() {
    Request req = parser_->release();
    // The answer may come later (a report being made): the callback keeps the session.
    server_.handle(std::move(req), &stream_,
                   [self = shared_from_this()](Response res) { self->send(std::move(res)); });
}

void HttpSession::send(Response res, bool then_close) {
    auto sp = std::make_shared<Response>(std::move(res));
    const bool close = then_close || sp->need_eof();
    if (close) sp->keep_alive(false);
    stream_.expires_after(kReadTimeout);
    http::async_write(stream_, *sp,
                      [self = shared_from_this(), sp, close](beast::error_code ec, size_t) {
                          if (ec) return;
                          if (close) return self->drain_and_close();
                          self->read_header();
                      });
}

// After an answer that ends the connection before its body was read (401, 413): stop sending,
// then read and drop what the client still sends (up to 64 MiB or 10 s), so that it reads the
// answer instead of a connection reset.
void HttpSession::drain_and_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (drained_ > (64 << 20)) return;
    stream_.expires_after(std::chrono::seconds(10));
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code e, size_t n) {
                                if (e) return;
                                self->drained_ += n;
                                self->drain_and_close();
                            });
}

// ---- Server: set-up and the poll loop ----------------------------------------------------------

Server::Server(const ServeOptions& opt) : opt_(opt), root_(opt.root) {
    const std::string dir = root_.path() + "/.sae-serve";
    SAE_ENFORCE(::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST, "cannot create {}: {}", dir,
                std::strerror(errno));
    // One server per root: two would launch into the same run directories.
    const std::string lock = dir + "/lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    SAE_ENFORCE(fd >= 0, "cannot open {}: {}", lock, std::strerror(errno));
    lock_ = Fd(fd);
    SAE_ENFORCE(::flock(fd, LOCK_EX | LOCK_NB) == 0,
                "another sae-serve serves the runs root {} (it holds {}); stop it or use another "
                "--root",
                root_.path(), lock);
    token_file_ = opt.token_file.empty() ? dir + "/token" : opt.token_file;
    token_ = token_load_or_create(token_file_);

    beast::error_code ec;
    const auto address = net::ip::make_address(opt.host, ec);
    SAE_ENFORCE(!ec, "--host {}: not an IP address ({})", printable(opt.host), ec.message());
    const tcp::endpoint ep(address, static_cast<unsigned short>(opt.port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    SAE_ENFORCE(!ec, "cannot listen on {}:{}: {}", printable(opt.host), opt.port, ec.message());
    discover();
}

int Server::run() {
    const auto ep = acceptor_.local_endpoint();
    std::printf("sae-serve: listening on http://%s:%d/ (runs root %s, token in %s)\n",
                ep.address().to_string().c_str(), ep.port(), root_.path().c_str(),
                token_file_.c_str());
    std::fflush(stdout);
    signals_.async_wait([this](beast::error_code, int) { ioc_.stop(); });
    accept();
    tick();
    ioc_.run();
    std::printf("sae-serve: stopped; the runs it launched go on\n");
    return 0;
}

void Server::accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket s) {
        if (ec) {
            // Out of descriptors, say: try again shortly rather than spin.
            accept_retry_.expires_after(std::chrono::milliseconds(100));
            accept_retry_.async_wait([this](beast::error_code) { accept(); });
            return;
        }
        bool room = !too_many_connections();
        while (!room && !untrusted_.empty()) {
            const std::shared_ptr<HttpSession> old = untrusted_.front().lock();
            untrusted_.pop_front();
            if (old && !old->trusted()) {
                old->evict();  // its slot is freed when it ends, a moment later
                room = true;
            }
        }
        if (!room) {
            beast::error_code ignored;
            s.close(ignored);
        } else {
            connection_opened();
            auto session = std::make_shared<HttpSession>(std::move(s), *this);
            // Forget the ones that ended or showed the token (kept bounded by the slots).
            while (!untrusted_.empty() &&
                   (untrusted_.front().expired() || untrusted_.front().lock()->trusted()))
                untrusted_.pop_front();
            if (untrusted_.size() > 4 * static_cast<size_t>(opt_.max_clients))
                untrusted_.erase(std::remove_if(untrusted_.begin(), untrusted_.end(),
                                                [](const std::weak_ptr<HttpSession>& w) {
                                                    auto p = w.lock();
                                                    return !p || p->trusted();
                                                }),
                                 untrusted_.end());
            untrusted_.push_back(session);
            session->start();
        }
        accept();
    });
}

void Server::discover() {
    std::set<std::string> ids;
    for (const std::string& id : root_.list_runs()) ids.insert(id);
    // Launched runs whose directory saetrain has not made yet.
    std::string why;
    Fd serve = open_beneath(root_.fd(), ".sae-serve", true, &why);
    Fd runs = serve.valid() ? open_beneath(serve.get(), "runs", true, &why) : Fd();
    if (runs.valid()) {
        for (const std::string& id : list_plain_dirs(runs.get())) ids.insert(id);
    }
    for (const std::string& id : ids)
        if (!runs_.count(id)) runs_[id] = std::make_unique<RunWatch>(root_, id);
}

RunWatch* Server::watch(const std::string& id) {
    auto it = runs_.find(id);
    if (it != runs_.end()) return it->second.get();
    if (!run_id_check(id).empty() || !root_.exists(id)) return nullptr;
    std::string why;
    if (!root_.open_run(id, &why).valid()) return nullptr;
    auto& w = runs_[id] = std::make_unique<RunWatch>(root_, id);
    w->poll();
    return w.get();
}

void Server::tick() {
    for (auto it = children_.begin(); it != children_.end();) {
        int status = 0;
        it = ::waitpid(*it, &status, WNOHANG) != 0 ? children_.erase(it) : std::next(it);
    }
    const bool full = ticks_++ % 8 == 0;
    if (full) discover();
    for (auto& [id, w] : runs_) {
        // A run that is over and that nobody watches is looked at every 8th poll (2 s): a root
        // of many finished runs costs little, and one started again by hand is still seen.
        if (!full && !w->state().active() && !subscribers_.count(id)) continue;
        RunWatch::Changes ch;
        try {
            ch = w->poll();
        } catch (const std::exception& e) {
            // A run the server cannot read is reported, never the end of the server.
            std::fprintf(stderr, "sae-serve: warning: run '%s': %s\n", id.c_str(),
                         printable(e.what()).c_str());
            continue;
        }
        if (ch.metrics.rewound)
            broadcast(id, fmt::format(R"({{"type":"rewind","step":{}}})", *ch.metrics.rewound),
                      Kind::rewind, *ch.metrics.rewound);
        const auto& steps = w->metrics() ? w->metrics()->steps() : std::vector<MetricsStep>{};
        for (size_t i = ch.metrics.first_new; i < steps.size(); ++i)
            broadcast(id,
                      fmt::format(R"({{"type":"metrics","step":{},"lines":[{}]}})", steps[i].step,
                                  fmt::join(steps[i].lines, ",")),
                      Kind::step, steps[i].step);
        if (ch.state_changed) broadcast(id, w->state_message(), Kind::state);
    }
    timer_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(opt_.poll_s * 1000)));
    timer_.async_wait([this](beast::error_code ec) {
        if (!ec) tick();
    });
}

void Server::broadcast(const std::string& run, const std::string& text, Kind kind, int64_t step) {
    auto it = subscribers_.find(run);
    if (it == subscribers_.end()) return;
    auto msg = std::make_shared<const std::string>(text);
    std::vector<std::shared_ptr<WsSession>> live;
    for (auto& w : it->second)
        if (auto s = w.lock()) live.push_back(std::move(s));
    for (auto& s : live) {
        if (kind == Kind::step)
            s->send_step(step, msg);
        else if (kind == Kind::rewind)
            s->rewind(step, msg);
        else
            s->send(msg);
    }
}

void Server::subscribe(const std::shared_ptr<WsSession>& s) {
    RunWatch* w = watch(s->run());
    if (w == nullptr) return;
    // Every complete step after `since`, then the state (as a poll sends a step before the state
    // change that follows it), then live ones: all on this thread between two polls, so no step
    // is sent twice or skipped.
    if (const MetricsTail* m = w->metrics()) {
        const auto& steps = m->steps();
        for (size_t i = m->first_after(s->since()); i < steps.size(); ++i)
            s->send_step(steps[i].step, std::make_shared<const std::string>(fmt::format(
                                            R"({{"type":"metrics","step":{},"lines":[{}]}})",
                                            steps[i].step, fmt::join(steps[i].lines, ","))));
    }
    s->send(std::make_shared<const std::string>(w->state_message()));
    subscribers_[s->run()].push_back(s);
}

void Server::unsubscribe(const WsSession* s) {
    for (auto it = subscribers_.begin(); it != subscribers_.end();) {
        auto& list = it->second;
        list.erase(std::remove_if(list.begin(), list.end(),
                                  [s](const std::weak_ptr<WsSession>& w) {
                                      auto p = w.lock();
                                      return !p || p.get() == s;
                                  }),
                   list.end());
        it = list.empty() ? subscribers_.erase(it) : std::next(it);
    }
}

// ---- Server: requests --------------------------------------------------------------------------

std::string Server::token_of(const Request& req, const Target& t, std::string* how) const {
    const std::string auth(req[http::field::authorization]);
    if (!auth.empty()) {
        *how = "header";
        return bearer_token(auth);
    }
    const std::string cookie = cookie_value(std::string(req[http::field::cookie]),
                                            cookie_name(acceptor_.local_endpoint().port()));
    if (!cookie.empty()) {
        *how = "cookie";
        return cookie;
    }
    auto q = t.query.find("token");
    if (q != t.query.end()) {
        *how = "query";
        return q->second;
    }
    *how = "";
    return "";
}

std::optional<Response> Server::check_header(const Request& req) {
    const Target t = parse_target(std::string(req.target()));
    std::string how;
    const std::string given = token_of(req, t, &how);
    if (!token_equal(given, token_)) {
        return error_response(
            req, http::status::unauthorized,
            how.empty() ? fmt::format("no token: send 'Authorization: Bearer TOKEN' (the token is "
                                      "in {} on the server) or open /?token=TOKEN",
                                      token_file_)
                        : fmt::format("wrong token (from the {}): the token is in {} on the server",
                                      how, token_file_));
    }
    if (req.method() == http::verb::post && how != "header")
        return error_response(req, http::status::unauthorized,
                              "a POST needs the token in its 'Authorization: Bearer TOKEN' "
                              "header (a cookie or ?token= is not enough to change a run)");
    // A browser's request from another site's page: refused, whatever it carries.
    const std::string origin(req[http::field::origin]);
    const std::string host(req[http::field::host]);
    if (!origin.empty() && how != "header" && origin != "http://" + host)
        return error_response(
            req, http::status::forbidden,
            fmt::format("origin {} is not this server's (http://{})", origin, host));
    return std::nullopt;
}

void Server::handle(Request&& req, beast::tcp_stream* stream,
                    std::function<void(Response)> respond) {
    const Target t = parse_target(std::string(req.target()));
    if (!t.ok) {
        respond(error_response(req, http::status::bad_request,
                               fmt::format("malformed request target '{}' (a bad %-escape?)",
                                           std::string(req.target()))));
        return;
    }
    const auto& s = t.segments;
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    auto method_not_allowed = [&](const char* allowed) {
        Response r = error_response(req, http::status::method_not_allowed,
                                    fmt::format("{} {}: use {}", std::string(req.method_string()),
                                                std::string(req.target()), allowed));
        r.set(http::field::allow, allowed);
        respond(std::move(r));
    };
    try {
        // A WebSocket: /api/runs/ID/stream[?since=S].
        if (websocket::is_upgrade(req)) {
            if (s.size() != 4 || s[0] != "api" || s[1] != "runs" || s[3] != "stream") {
                respond(error_response(req, http::status::not_found,
                                       "WebSockets are served at /api/runs/ID/stream only"));
                return;
            }
            std::string why;
            if (!root_.open_run(s[2], &why).valid() && !runs_.count(s[2])) {
                respond(error_response(req,
                                       run_id_check(s[2]).empty() ? http::status::not_found
                                                                  : http::status::bad_request,
                                       why));
                return;
            }
            if (runs_.count(s[2]) == 0 && watch(s[2]) == nullptr) {
                respond(error_response(req, http::status::not_found, why));
                return;
            }
            int64_t since = -1;
            if (const auto bad = query_count(t, "since", 0, kStep, &since)) {
                respond(error_response(req, http::status::bad_request, *bad));
                return;
            }
            connection_opened();
            std::make_shared<WsSession>(stream->release_socket(), *this, s[2], since)
                ->start(std::move(req));
            return;
        }
        if (s.empty()) {
            if (!get) return method_not_allowed("GET");
            respond(page(req, t));
            return;
        }
        if (s[0] == "api" && s.size() >= 2 && s[1] == "runs") {
            if (s.size() == 2) {
                if (post) return respond(submit(req, t));
                if (get) return respond(list_runs(req));
                return method_not_allowed("GET, POST");
            }
            const std::string& id = s[2];
            if (std::string bad = run_id_check(id); !bad.empty())
                return respond(error_response(req, http::status::bad_request, bad));
            if (s.size() == 3) {
                if (!get) return method_not_allowed("GET");
                return respond(get_run(req, id));
            }
            if (s.size() == 4 && s[3] == "metrics") {
                if (!get) return method_not_allowed("GET");
                return respond(get_metrics(req, id, t));
            }
            if (s.size() == 4 && s[3] == "stop") {
                if (!post) return method_not_allowed("POST");
                return respond(stop(req, id));
            }
            if (s.size() == 4 && s[3] == "resume") {
                if (!post) return method_not_allowed("POST");
                return respond(resume(req, id, t));
            }
            if (s.size() == 4 && s[3] == "stream")
                return respond(error_response(req, http::status::bad_request,
                                              "/api/runs/ID/stream is a WebSocket: connect with "
                                              "a WebSocket client"));
        }
        if (s[0] == "runs" && s.size() >= 3 && s.size() <= 4 && s[2] == "report") {
            if (!get) return method_not_allowed("GET");
            if (s.size() == 3 && !t.trailing_slash) {
                // Relative links in the report resolve against the directory.
                Response r{http::status::see_other, req.version()};
                r.set(http::field::location, "/runs/" + s[1] + "/report/");
                r.keep_alive(req.keep_alive());
                r.prepare_payload();
                return respond(std::move(r));
            }
            const std::string file = s.size() == 4 ? s[3] : "index.html";
            for (const std::string* name : {&s[1], &file}) {
                const std::string bad =
                    name == &s[1] ? run_id_check(*name) : file_name_check(*name);
                if (!bad.empty())
                    return respond(error_response(req, http::status::bad_request, bad));
            }
            report(req, s[1], file, t.query.count("refresh") > 0, std::move(respond));
            return;
        }
        respond(error_response(req, http::status::not_found,
                               fmt::format("no such page: {} (the API is under /api/runs)",
                                           std::string(req.target()))));
    } catch (const std::exception& e) {
        // Nothing a request does may end the server: its error is the answer.
        respond(error_response(req, http::status::internal_server_error, e.what()));
    }
}

Response Server::page(const Request& req, const Target& t) {
    if (t.query.count("token")) {
        // The first visit: the token becomes an HttpOnly cookie and leaves the address bar.
        Response r{http::status::see_other, req.version()};
        r.set(http::field::location, "/");
        r.set(http::field::set_cookie,
              fmt::format("{}={}; HttpOnly; SameSite=Strict; Path=/",
                          cookie_name(acceptor_.local_endpoint().port()), token_));
        r.set(http::field::cache_control, "no-store");
        r.keep_alive(req.keep_alive());
        r.prepare_payload();
        return r;
    }
    Response r{http::status::ok, req.version()};
    r.set(http::field::content_type, "text/html; charset=utf-8");
    r.set(http::field::cache_control, "no-store");
    r.set("Content-Security-Policy",
          "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
          "connect-src 'self' ws: wss:; img-src 'self' data:; base-uri 'none'; "
          "form-action 'none'; frame-ancestors 'none'");
    r.keep_alive(req.keep_alive());
    r.body() = page_html();
    r.prepare_payload();
    return r;
}

Response Server::list_runs(const Request& req) {
    nlohmann::ordered_json runs = nlohmann::ordered_json::array();
    for (auto& [id, w] : runs_) runs.push_back(w->summary());
    nlohmann::ordered_json j;
    j["root"] = root_.path();
    j["runs"] = runs;
    return json_response(req, http::status::ok, j);
}

Response Server::unknown_run(const Request& req, const std::string& id) {
    std::string why;
    root_.open_run(id, &why);
    return error_response(req, http::status::not_found, why);
}

Response Server::get_run(const Request& req, const std::string& id) {
    RunWatch* w = watch(id);
    if (w == nullptr) return unknown_run(req, id);
    return json_response(req, http::status::ok, w->detail());
}

Response Server::get_metrics(const Request& req, const std::string& id, const Target& t) {
    RunWatch* w = watch(id);
    if (w == nullptr) return unknown_run(req, id);
    int64_t since = -1;
    if (const auto bad = query_count(t, "since", 0, kStep, &since))
        return error_response(req, http::status::bad_request, *bad);
    Response r{http::status::ok, req.version()};
    r.set(http::field::content_type, "application/x-ndjson");
    r.set(http::field::cache_control, "no-store");
    int64_t last = since;
    if (const MetricsTail* m = w->metrics()) {
        const auto& steps = m->steps();
        for (size_t i = m->first_after(since); i < steps.size(); ++i) {
            for (const std::string& l : steps[i].lines) r.body() += l + "\n";
            last = steps[i].step;
        }
    }
    // Where to continue from: the last complete step sent (or `since` when none was).
    r.set("X-Last-Step", std::to_string(last));
    r.set("X-Run-State", w->state().state);
    r.keep_alive(req.keep_alive());
    r.prepare_payload();
    return r;
}

std::optional<int> Server::ranks_for(const Config& cfg, int64_t asked, std::string* why) const {
    const int64_t g = cfg.sweep.empty() ? 1 : static_cast<int64_t>(cfg.sweep.size());
    const int64_t per = cfg.parallel.latent_shards;
    const int64_t own = cfg.parallel.mode == "sweep" ? g * per : g * cfg.parallel.replicas * per;
    const int64_t ranks = asked > 0 ? asked : own;
    if (ranks > opt_.max_ranks) {
        *why = fmt::format(
            "the run needs {} rank(s){}, more than this server launches "
            "(--max-ranks {})",
            ranks, asked > 0 ? " (?ranks)" : " (one per SAE of the sweep)", opt_.max_ranks);
        return std::nullopt;
    }
    try {
        RankGrid::from_config(cfg, static_cast<int>(ranks));
    } catch (const std::exception& e) {
        *why = fmt::format("saetrain: error: {}", printable(e.what()));
        return std::nullopt;
    }
    return static_cast<int>(ranks);
}

Response Server::submit(const Request& req, const Target& t) {
    int64_t asked = 0;
    if (const auto bad = query_count(t, "ranks", 1, kRanks, &asked))
        return error_response(req, http::status::bad_request, *bad);
    for (const auto& [k, v] : t.query)
        if (k != "ranks" && k != "id" && k != "overwrite" && k != "token")
            return error_response(req, http::status::bad_request,
                                  fmt::format("unknown parameter '{}' (POST /api/runs takes ranks, "
                                              "id and overwrite)",
                                              printable(k)));
    // saetrain's own loader: the error is the line `saetrain CONFIG --dry-run` prints.
    Config cfg;
    try {
        cfg = config_parse(req.body(), {}, "request body");
    } catch (const std::exception& e) {
        return error_response(req, http::status::bad_request,
                              fmt::format("saetrain: error: {}", printable(e.what())));
    }
    std::string why;
    std::string id;
    if (auto q = t.query.find("id"); q != t.query.end()) {
        id = q->second;
        if (std::string bad = run_id_check(id); !bad.empty())
            return error_response(req, http::status::bad_request, "id: " + bad);
    } else {
        const auto named = root_.run_id_of_out_dir(cfg.run.out_dir, opt_.cwd, &why);
        if (!named) return error_response(req, http::status::bad_request, why);
        id = *named;
    }
    const std::optional<int> ranks = ranks_for(cfg, asked, &why);
    if (!ranks) return error_response(req, http::status::bad_request, why);
    const bool overwrite = t.query.count("overwrite") && t.query.at("overwrite") != "0";
    if (auto known = runs_.find(id); known != runs_.end() && known->second->state().active())
        return error_response(
            req, http::status::conflict,
            fmt::format("run '{}' is {}: stop it first", id, known->second->state().state));
    if (root_.exists(id)) {
        Fd dir = root_.open_run(id, &why);
        if (!dir.valid()) return error_response(req, http::status::bad_request, why);
        RunWatch* w = watch(id);
        if (w != nullptr && w->state().active())
            return error_response(
                req, http::status::conflict,
                fmt::format("run '{}' is {}: stop it first", id, w->state().state));
        if (!overwrite)
            return error_response(
                req, http::status::conflict,
                fmt::format("run '{}' exists{}: POST /api/runs/{}/resume continues it, "
                            "?overwrite=1 replaces it",
                            id, w != nullptr ? " (" + w->state().state + ")" : "", id));
    }
    // Last of the checks: it creates the directory.
    if (!cfg.data.stage_dir.empty()) {
        const char* tmpdir = std::getenv("TMPDIR");  // the launched run's, as it inherits ours
        const auto stage = root_.stage_dir_for_launch(cfg.data.stage_dir, opt_.cwd,
                                                      tmpdir != nullptr ? tmpdir : "", &why);
        if (!stage) return error_response(req, http::status::bad_request, why);
        cfg.data.stage_dir = *stage;
    }
    return launch(req, id, std::move(cfg), *ranks, overwrite, http::status::created);
}

Response Server::launch(const Request& req, const std::string& id, Config cfg, int ranks,
                        bool overwrite, http::status ok_status) {
    auto& w = runs_[id];
    if (!w) w = std::make_unique<RunWatch>(root_, id);
    const int sdir = w->state_dir_fd();
    cfg.run.out_dir = root_.run_path(id);
    const std::string yaml = config_to_yaml(cfg);
    {
        const int fd = ::openat(sdir, ".config.yaml.tmp",
                                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        SAE_ENFORCE(fd >= 0, "cannot write {}/config.yaml: {}", w->state_dir_path(),
                    std::strerror(errno));
        Fd owned(fd);
        SAE_ENFORCE(::write(fd, yaml.data(), yaml.size()) == static_cast<ssize_t>(yaml.size()),
                    "cannot write {}/config.yaml", w->state_dir_path());
        SAE_ENFORCE(::renameat(sdir, ".config.yaml.tmp", sdir, "config.yaml") == 0,
                    "cannot write {}/config.yaml: {}", w->state_dir_path(), std::strerror(errno));
    }
    const std::string config_path = w->state_dir_path() + "/config.yaml";
    std::vector<std::string> extra;
    if (overwrite) extra.push_back("--overwrite");
    const std::vector<std::string> argv =
        launch_command(opt_.launcher, opt_.saetrain, config_path, ranks, extra);
    LaunchRecord rec;
    rec.launched_ns = now_ns();
    rec.ranks = ranks;
    rec.command = argv;
    rec.wrapper_pid =
        launch_spawn(opt_.self, w->state_dir_path(), argv, opt_.cwd, {"SAETRAIN=" + opt_.saetrain});
    children_.insert(rec.wrapper_pid);
    rec.wrapper_start = process_start_time(rec.wrapper_pid);
    w->set_launch(rec);
    std::printf("sae-serve: launched run '%s' (%d rank(s), wrapper pid %d): %s\n", id.c_str(),
                ranks, rec.wrapper_pid, printable(fmt::format("{}", fmt::join(argv, " "))).c_str());
    std::fflush(stdout);
    nlohmann::ordered_json j;
    j["id"] = id;
    j["state"] = w->state().state;
    j["ranks"] = ranks;
    j["command"] = argv;
    j["url"] = "/api/runs/" + id;
    j["stream"] = "/api/runs/" + id + "/stream";
    return json_response(req, ok_status, j);
}

Response Server::stop(const Request& req, const std::string& id) {
    RunWatch* w = watch(id);
    if (w == nullptr) return unknown_run(req, id);
    w->refresh_state();
    const std::string& state = w->state().state;
    if (state == "queued")
        return error_response(req, http::status::conflict,
                              fmt::format("run '{}' is starting (queued): stop it once it is "
                                          "running (a stop signal before saetrain's start-up is "
                                          "done would end it without a checkpoint)",
                                          id));
    if (state != "running" && state != "stopping")
        return error_response(req, http::status::conflict,
                              fmt::format("run '{}' is {}: nothing to stop", id, state));
    nlohmann::ordered_json j;
    if (w->launch() && process_alive(w->launch()->wrapper_pid, w->launch()->wrapper_start)) {
        LaunchRecord rec = *w->launch();
        SAE_ENFORCE(::kill(rec.wrapper_pid, opt_.stop_signal) == 0, "cannot signal run '{}': {}",
                    id, std::strerror(errno));
        rec.stop_requested_ns = now_ns();
        w->set_launch(rec);
        j["pid"] = rec.wrapper_pid;
    } else {
        const pid_t pid = w->local_saetrain_pid();
        if (pid == 0)
            return error_response(req, http::status::conflict,
                                  fmt::format("run '{}' runs on another host, or no process here "
                                              "holds its lock ({}/.saetrain.lock): stop it where "
                                              "it runs",
                                              id, id));
        SAE_ENFORCE(::kill(pid, opt_.stop_signal) == 0, "cannot signal run '{}' (pid {}): {}", id,
                    pid, std::strerror(errno));
        w->note_stop_requested();
        w->refresh_state();
        j["pid"] = pid;
    }
    std::printf("sae-serve: sent %s to run '%s' (pid %d)\n", signal_name(opt_.stop_signal).c_str(),
                id.c_str(), j["pid"].get<int>());
    std::fflush(stdout);
    j["id"] = id;
    j["state"] = w->state().state;
    j["signal"] = signal_name(opt_.stop_signal);
    return json_response(req, http::status::accepted, j);
}

Response Server::resume(const Request& req, const std::string& id, const Target& t) {
    std::string why;
    if (!root_.open_run(id, &why).valid()) {
        const bool launched = runs_.count(id) && runs_[id]->launch();
        if (!launched) return error_response(req, http::status::not_found, why);
    }
    RunWatch* w = watch(id);
    if (w == nullptr) return error_response(req, http::status::not_found, why);
    w->refresh_state();
    const std::string state = w->state().state;
    if (w->state().active() || state == "complete")
        return error_response(req, http::status::conflict,
                              fmt::format("run '{}' is {}: nothing to resume", id, state));
    int64_t asked = w->ranks();
    if (const auto bad = query_count(t, "ranks", 1, kRanks, &asked))
        return error_response(req, http::status::bad_request, *bad);
    const std::string text = w->config_text();
    if (text.empty())
        return error_response(req, http::status::conflict,
                              fmt::format("run '{}' has no config.yaml to resume from", id));
    Config cfg;
    try {
        cfg = config_parse(text, {}, id + "/config.yaml");
    } catch (const std::exception& e) {
        return error_response(req, http::status::conflict,
                              fmt::format("saetrain: error: {}", printable(e.what())));
    }
    const std::optional<int> ranks = ranks_for(cfg, asked, &why);
    if (!ranks) return error_response(req, http::status::bad_request, why);
    return launch(req, id, std::move(cfg), *ranks, false, http::status::accepted);
}

// ---- Server: the report ------------------------------------------------------------------------

Response Server::report_file(const Request& req, const std::string& id, const std::string& file) {
    std::string why;
    Fd run = root_.open_run(id, &why);
    if (!run.valid()) return error_response(req, http::status::not_found, why);
    Fd dir = open_beneath(run.get(), "report", true, &why);
    if (!dir.valid())
        return error_response(req, http::status::not_found, fmt::format("run '{}': {}", id, why));
    Fd fd = open_beneath(dir.get(), file, false, &why);
    if (!fd.valid())
        return error_response(req, http::status::not_found,
                              fmt::format("run '{}': report/{}", id, why));
    const std::optional<std::string> body = read_fd(fd.get(), kMaxReportFile, &why);
    if (!body)
        return error_response(req, http::status::internal_server_error,
                              fmt::format("run '{}': report/{} {}", id, file, why));
    Response r{http::status::ok, req.version()};
    r.set(http::field::content_type, content_type_of(file));
    r.set(http::field::cache_control, "no-store");
    r.keep_alive(req.keep_alive());
    r.body() = *body;
    r.prepare_payload();
    return r;
}

void Server::report(const Request& req, const std::string& id, const std::string& file,
                    bool refresh, std::function<void(Response)> respond) {
    std::string why;
    Fd run = root_.open_run(id, &why);
    if (!run.valid()) return respond(error_response(req, http::status::not_found, why));
    Fd dir = open_beneath(run.get(), "report", true, &why);
    const bool have = dir.valid() && stat_beneath(dir.get(), "index.html").has_value();
    if (file != "index.html" || (have && !refresh)) return respond(report_file(req, id, file));
    if (const std::string link = planted_link(run.get()); !link.empty())
        return respond(error_response(
            req, http::status::forbidden,
            fmt::format("run '{}': {} (not followed); a run never writes one, so sae-report is "
                        "not run on this directory: remove the link",
                        id, link)));
    // Made now by sae-report, in a thread of its own (it takes seconds); every request for it
    // meanwhile waits for the same one.
    Request head;
    head.version(req.version());
    head.keep_alive(req.keep_alive());
    auto& waiting = reports_[id];
    waiting.push_back([this, head, id, file, respond](const std::string& failed) {
        respond(failed.empty() ? report_file(head, id, file)
                               : error_response(head, http::status::internal_server_error, failed));
    });
    if (waiting.size() > 1) return;
    const std::string run_dir = root_.run_path(id);
    const std::string log = root_.path() + "/.sae-serve/report-" + id + ".log";
    const std::string tool = opt_.sae_report;
    std::thread([this, id, run_dir, log, tool]() {
        std::vector<std::string> args = {tool, run_dir};
        std::vector<char*> cargs;
        for (std::string& a : args) cargs.push_back(a.data());
        cargs.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        posix_spawn_file_actions_addclosefrom_np(&fa, 3);
        pid_t pid = 0;
        const int rc = ::posix_spawn(&pid, tool.c_str(), &fa, nullptr, cargs.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        int status = 0;
        if (rc == 0)
            while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
        std::string failed;
        if (rc != 0) {
            failed = fmt::format("cannot run {} (--sae-report): {}", tool, std::strerror(rc));
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::ifstream in(log);
            std::string line, last;
            while (std::getline(in, line))
                if (!line.empty()) last = line;
            failed = fmt::format("sae-report {} failed: {}", run_dir, last);
        }
        net::post(ioc_, [this, id, failed]() {
            auto list = std::move(reports_[id]);
            reports_.erase(id);
            for (auto& f : list) f(failed);
        });
    }).detach();
}

// ---- entry -------------------------------------------------------------------------------------

int serve_run(const ServeOptions& opt) {
    std::signal(SIGPIPE, SIG_IGN);
    Server server(opt);
    return server.run();
}

}  // namespace saetrain::serve
