// sae-serve's HTTP and WebSocket server (server.h): its set-up, the poll loop that tails every
// run and pushes what is new to the run's WebSocket clients, and the helpers its sessions
// (sessions.cpp) and routes (routes.cpp) share.
#include "saetrain/serve/server.h"

#include "saetrain/error.h"
#include "saetrain/serve/launcher.h"
#include "server_parts.h"

namespace saetrain::serve {

int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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

std::optional<int64_t> parse_count(const std::string& s) {
    if (s.empty() || s.size() > 15) return std::nullopt;
    for (char c : s)
        if (c < '0' || c > '9') return std::nullopt;
    return std::stoll(s);
}

std::optional<std::string> query_count(const Target& t, const std::string& key, int64_t minimum,
                                       const char* what, int64_t* value) {
    const auto q = t.query.find(key);
    if (q == t.query.end()) return std::nullopt;
    const auto v = parse_count(q->second);
    if (!v || *v < minimum) return fmt::format("{}={}: not {}", key, q->second, what);
    *value = *v;
    return std::nullopt;
}

std::string content_type_of(const std::string& name) {
    const size_t dot = name.rfind('.');
    const std::string ext = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (ext == "html") return "text/html; charset=utf-8";
    if (ext == "svg") return "image/svg+xml";
    if (ext == "png") return "image/png";
    if (ext == "csv") return "text/csv; charset=utf-8";
    if (ext == "json") return "application/json";
    if (ext == "css") return "text/css";
    if (ext == "js") return "text/javascript; charset=utf-8";  // the feature pages' data
    return "text/plain; charset=utf-8";
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

// ---- entry -------------------------------------------------------------------------------------

int serve_run(const ServeOptions& opt) {
    std::signal(SIGPIPE, SIG_IGN);
    Server server(opt);
    return server.run();
}

}  // namespace saetrain::serve
