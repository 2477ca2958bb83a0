// sae-serve's routes (server_parts.h): the token check, the page, the runs and their metrics,
// submitting, stopping and resuming a run, and its report.
#include "saetrain/error.h"
#include "saetrain/rank_grid.h"  // defines: RankGrid (the job sizes a config fits)
#include "saetrain/serve/launcher.h"
#include "saetrain/serve/page.h"  // defines: page_html
#include "server_parts.h"

extern char** environ;

namespace saetrain::serve {

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
        if (s[0] == "runs" && s.size() >= 3 && s.size() <= 6 && s[2] == "report") {
            if (!get) return method_not_allowed("GET");
            if (s.size() == 3 && !t.trailing_slash) {
                // Relative links in the report resolve against the directory.
                Response r{http::status::see_other, req.version()};
                r.set(http::field::location, "/runs/" + s[1] + "/report/");
                r.keep_alive(req.keep_alive());
                r.prepare_payload();
                return respond(std::move(r));
            }
            // report/FILE, and the feature pages: report/features/FILE and
            // report/features/SAE/FILE (a path ending in '/': its index.html).
            std::vector<std::string> dirs(s.begin() + 3, s.end());
            std::string file = "index.html";
            if (!dirs.empty() && !t.trailing_slash) file = dirs.back(), dirs.pop_back();
            if (const std::string bad = run_id_check(s[1]); !bad.empty())
                return respond(error_response(req, http::status::bad_request, bad));
            for (const std::string& name : dirs)
                if (const std::string bad = file_name_check(name); !bad.empty())
                    return respond(error_response(req, http::status::bad_request, bad));
            if (const std::string bad = file_name_check(file); !bad.empty())
                return respond(error_response(req, http::status::bad_request, bad));
            if (!dirs.empty() && (dirs.front() != "features" || dirs.size() > 2))
                return respond(error_response(
                    req, http::status::not_found,
                    fmt::format("run '{}': report/{}/: the report has no such directory "
                                "(only features/ and features/<sae>/)",
                                s[1], fmt::join(dirs, "/"))));
            if (!dirs.empty()) return respond(report_file(req, s[1], file, dirs));
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

Response Server::report_file(const Request& req, const std::string& id, const std::string& file,
                             const std::vector<std::string>& dirs) {
    std::string why;
    Fd run = root_.open_run(id, &why);
    if (!run.valid()) return error_response(req, http::status::not_found, why);
    Fd dir = open_beneath(run.get(), "report", true, &why);
    if (!dir.valid())
        return error_response(req, http::status::not_found, fmt::format("run '{}': {}", id, why));
    std::string at = "report/";
    for (const std::string& d : dirs) {
        Fd sub = open_beneath(dir.get(), d, true, &why);
        if (!sub.valid())
            return error_response(req, http::status::not_found,
                                  fmt::format("run '{}': {}{}", id, at, why));
        dir = std::move(sub);
        at += d + "/";
    }
    Fd fd = open_beneath(dir.get(), file, false, &why);
    if (!fd.valid())
        return error_response(req, http::status::not_found,
                              fmt::format("run '{}': {}{}", id, at, why));
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

}  // namespace saetrain::serve
