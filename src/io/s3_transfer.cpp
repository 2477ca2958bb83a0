// s3_transfer.cpp — every S3 request of a process: one thread driving a libcurl multi handle,
// keep-alive connections, SigV4 signing by libcurl, retries with backoff (see s3_io.h).
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "s3_io.h"
#include "saetrain/error.h"

namespace saetrain::io {

using Clock = std::chrono::steady_clock;

struct S3Transfer {
    // The request.
    const S3Client::Impl* client = nullptr;
    std::string url, what, if_match;
    int64_t offset = -1, bytes = 0;  // offset >= 0: a range
    int64_t size = -1;               // of the object as listed (a range's)
    char* out = nullptr;             // null: the body is kept in `body`
    std::shared_ptr<void> keep;
    bool urgent = false;
    // Its state.
    int attempt = 0;
    Clock::time_point first = Clock::now(), not_before = Clock::now();
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    char curl_error[CURL_ERROR_SIZE] = {};
    int64_t received = 0;
    bool overflow = false;
    std::string body, etag, content_range;
    bool has_etag = false, has_content_range = false;
    bool headers_done = false;  // the response's headers ended (its blank line came)
    long status = 0;
    // Its end.
    std::mutex m;  // also held while the body is written into `out`
    std::condition_variable cv;
    bool done = false;
    std::string error;  // "" when it worked
    // The waiter gave up (S3Pending destroyed, a stop signal): set under `m`, after which
    // nothing is written into `out`; the transfer thread then ends it at its next look.
    std::atomic<bool> abandoned{false};
};

namespace {

constexpr size_t kMaxBody = 64u << 20;  // listing pages and error bodies
const char* const kAbandoned = "abandoned: no one waits for it";

std::atomic<bool (*)()> stop_check{nullptr};

size_t on_header(char* p, size_t size, size_t n, void* arg) {
    auto* t = static_cast<S3Transfer*>(arg);
    const std::string line(p, size * n);
    auto value = [&](size_t from) {
        const size_t a = line.find_first_not_of(" \t", from);
        const size_t b = line.find_last_not_of(" \t\r\n");
        return a == std::string::npos || b < a ? std::string() : line.substr(a, b - a + 1);
    };
    if (line.rfind("HTTP/", 0) == 0) {
        // A new response (after a 100 Continue, say): only its own headers count.
        t->etag.clear(), t->content_range.clear();
        t->has_etag = t->has_content_range = t->headers_done = false;
    } else if (line == "\r\n" || line == "\n") {
        t->headers_done = true;
    } else if (line.size() > 5 && ::strncasecmp(line.c_str(), "etag:", 5) == 0) {
        t->etag = value(5);
        t->has_etag = true;
    } else if (line.size() > 14 && ::strncasecmp(line.c_str(), "content-range:", 14) == 0) {
        t->content_range = value(14);
        t->has_content_range = true;
    }
    return size * n;
}

size_t on_body(char* p, size_t size, size_t n, void* arg) {
    auto* t = static_cast<S3Transfer*>(arg);
    const size_t len = size * n;
    long code = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    if (t->out == nullptr || code >= 300) {
        if (t->body.size() + len > kMaxBody) return 0;
        t->body.append(p, len);
        return len;
    }
    if (t->received + static_cast<int64_t>(len) > t->bytes) {
        t->overflow = true;  // more than the range asked for: never written past `out`
        return 0;
    }
    // Under the transfer's lock: once a waiter has abandoned it (and perhaps freed `out`),
    // nothing more is written.
    std::lock_guard<std::mutex> g(t->m);
    if (t->abandoned.load()) return 0;
    std::memcpy(t->out + t->received, p, len);
    t->received += static_cast<int64_t>(len);
    return len;
}

// Called by libcurl about once a second and whenever data moves: an abandoned transfer is
// aborted at once rather than left to run to its end.
int on_progress(void* arg, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<S3Transfer*>(arg)->abandoned.load() ? 1 : 0;
}

// Backoff before attempt `a` (1-based retries): 0.1 s doubling to 5 s, with jitter.
double backoff_s(int a) {
    thread_local std::mt19937 rng(std::random_device{}());
    const double base = std::min(5.0, 0.1 * std::pow(2.0, a - 1));
    return base * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
}

class Engine {
public:
    static Engine& get() {
        static Engine e;
        return e;
    }

    void submit(const std::shared_ptr<S3Transfer>& t) {
        {
            std::lock_guard<std::mutex> g(m_);
            max_active_ = std::max<int64_t>(max_active_, t->client->settings.connections);
            if (t->urgent)
                queue_.push_front(t);
            else
                queue_.push_back(t);
        }
        curl_multi_wakeup(multi_);
    }

    ~Engine() {
        {
            std::lock_guard<std::mutex> g(m_);
            stop_ = true;
        }
        curl_multi_wakeup(multi_);
        if (thread_.joinable()) thread_.join();
        for (auto& [easy, t] : active_) {
            curl_multi_remove_handle(multi_, easy);
            curl_easy_cleanup(easy);
            curl_slist_free_all(t->headers);
            finish(t, "the process is ending");
        }
        for (CURL* e : idle_) curl_easy_cleanup(e);
        curl_multi_cleanup(multi_);
        curl_global_cleanup();
    }

private:
    Engine() {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        multi_ = curl_multi_init();
        thread_ = std::thread([this] {
            // A write to a connection the store has closed must be an error of that transfer,
            // not SIGPIPE ending the process (libcurl avoids it where it can; this is sure).
            sigset_t pipe;
            sigemptyset(&pipe);
            sigaddset(&pipe, SIGPIPE);
            pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
            loop();
        });
    }

    void start(const std::shared_ptr<S3Transfer>& t) {
        // A header value with a control character (a CR/LF from a listing, an environment
        // variable) would end its header and start another: never sent.
        const char* bad = !s3_header_value_ok(t->if_match) ? "If-Match (the listed ETag)"
                          : !s3_header_value_ok(t->client->creds.session_token)
                              ? "x-amz-security-token (AWS_SESSION_TOKEN)"
                              : nullptr;
        if (bad)
            return finish(t, fmt::format("{} (endpoint {}): the value of the {} header has a "
                                         "control character (CR, LF, ...), so it is not sent; "
                                         "check where it came from",
                                         t->what, t->client->endpoint, bad));
        CURL* e = nullptr;
        if (!idle_.empty()) {
            e = idle_.back();
            idle_.pop_back();
            curl_easy_reset(e);
        } else {
            e = curl_easy_init();
        }
        t->easy = e;
        t->received = 0, t->overflow = false, t->status = 0;
        t->body.clear(), t->etag.clear(), t->content_range.clear();
        t->has_etag = t->has_content_range = t->headers_done = false;
        t->curl_error[0] = 0;
        const S3Client::Impl& c = *t->client;
        curl_easy_setopt(e, CURLOPT_URL, t->url.c_str());
        curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->curl_error);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, t.get());
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        // Keys are sent byte for byte: libcurl would otherwise squash "a/../b" to "b", another
        // object (the key was percent-encoded already, '.' and '/' kept as S3 wants them).
        curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024);
        // A request that makes no progress for timeout_s is abandoned (and retried): a stalled
        // store never hangs a rank.
        const long timeout = std::max(1L, static_cast<long>(c.settings.timeout_s));
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, std::min(timeout, 10L));
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, timeout);
        curl_slist* h = nullptr;
        if (!c.creds.anonymous) {
            curl_easy_setopt(e, CURLOPT_AWS_SIGV4, c.sigv4.c_str());
            curl_easy_setopt(e, CURLOPT_USERNAME, c.creds.access_key.c_str());
            curl_easy_setopt(e, CURLOPT_PASSWORD, c.creds.secret_key.c_str());
            // The payload's hash (of the empty body of a GET), which S3 requires and signs.
            h = curl_slist_append(
                h,
                "x-amz-content-sha256: "
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
            if (!c.creds.session_token.empty())
                h = curl_slist_append(h,
                                      ("x-amz-security-token: " + c.creds.session_token).c_str());
        }
        if (!t->if_match.empty()) h = curl_slist_append(h, ("If-Match: " + t->if_match).c_str());
        t->headers = h;
        if (h) curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        std::string range;
        if (t->offset >= 0) {
            range = fmt::format("{}-{}", t->offset, t->offset + t->bytes - 1);
            curl_easy_setopt(e, CURLOPT_RANGE, range.c_str());  // copied by libcurl
        }
        curl_multi_add_handle(multi_, e);
        active_[e] = t;
    }

    // The outcome of a finished attempt: "" done, "retry", or the error line.
    std::string judge(S3Transfer& t, CURLcode rc) {
        curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &t.status);
        const S3Client::Impl& c = *t.client;
        const std::string where = fmt::format("{} (endpoint {})", t.what, c.endpoint);
        const long s = t.status;
        // Cut before the headers ended: nothing to judge them by.
        if (rc != CURLE_OK && !t.headers_done && !t.overflow) return "retry";
        if (t.offset >= 0 && (s == 200 || s == 206)) {
            // A range's answer is checked against the request: an ETag that differs says the
            // object changed (a store that ignored If-Match); none at all, that the store
            // cannot say; then the framing, whose only retried fault is a 206 cut short.
            if (!t.if_match.empty() && t.has_etag && bare(t.etag) != bare(t.if_match))
                return changed(t, t.etag);
            if (!t.if_match.empty() && !t.has_etag)
                return fmt::format(
                    "{}: the store answered the range GET of bytes {}-{} without an ETag, so it "
                    "does not support If-Match/ETags and an object replaced during the run "
                    "could not be told from the one listed; use an S3-compatible store that "
                    "sends ETags and honours If-Match (data.s3_endpoint, AWS_ENDPOINT_URL)",
                    where, t.offset, t.offset + t.bytes - 1);
            const std::string framing = s3_range_framing_error(
                t.offset, t.bytes, t.size, s, t.has_content_range ? &t.content_range : nullptr,
                t.received, t.overflow, rc != CURLE_OK);
            if (framing.empty() || framing == "retry") return framing;
            return fmt::format(
                "{}: {}; nothing was used from this answer: check that the endpoint is an "
                "S3-compatible store that serves ranges correctly (data.s3_endpoint, "
                "AWS_ENDPOINT_URL), then run the same command to resume from the last "
                "checkpoint",
                where, framing);
        }
        if (t.overflow)
            return fmt::format(
                "{}: the store sent more than the {} bytes asked for at offset {}; "
                "is data.s3_endpoint an S3-compatible store?",
                where, t.bytes, t.offset);
        if (rc != CURLE_OK) return "retry";
        if (s == 200 || s == 206) return "";
        if (s >= 500 || s == 429 || s == 408) return "retry";
        const std::string why = s3_error_text(t.body);
        const std::string said =
            why.empty() ? fmt::format("HTTP {}", s) : fmt::format("HTTP {} {}", s, why);
        if (s == 412 || s == 416) return changed(t, "");
        if (s == 403 && c.creds.anonymous)
            return fmt::format(
                "{}: access denied ({}) with credentials from {}: it is not public; set "
                "credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and "
                "data.s3_anonymous: false",
                where, said, c.creds.source);
        if (s == 403)
            return fmt::format(
                "{}: access denied ({}) with credentials from {}; check that they may read the "
                "bucket (s3:GetObject, s3:ListBucket), the region ({}) and the clock, or use "
                "data.s3_anonymous: true for a public bucket",
                where, said, c.creds.source, c.region);
        if (s == 404 && why.rfind("NoSuchBucket", 0) == 0)
            return fmt::format(
                "{}: no such bucket ({}); check the bucket name in data.path and the endpoint "
                "(data.s3_endpoint or AWS_ENDPOINT_URL)",
                where, said);
        if (s == 404)
            return fmt::format(
                "{}: no such key ({}); the object was listed when the run started: restore it "
                "and run the same command to resume from the last checkpoint",
                where, said);
        if (s == 301 || s == 307 || s == 400)
            return fmt::format(
                "{}: {} (region {}); set data.s3_region or AWS_REGION to the "
                "bucket's region, or data.s3_addressing: path",
                where, said, c.region);
        if (s == 401)
            return fmt::format("{}: {} with credentials from {}; check them", where, said,
                               c.creds.source);
        return fmt::format("{}: {}", where, said);
    }

    // An ETag without its quotes (stores differ in sending them).
    static std::string bare(std::string e) {
        if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
        return e;
    }

    static std::string changed(const S3Transfer& t, const std::string& now) {
        return fmt::format(
            "{}: the object changed since the run started (ETag {} then{}); do not modify "
            "shards during a run: restore it and run the same command to resume from the last "
            "checkpoint",
            t.what, t.if_match, now.empty() ? "" : fmt::format(", {} now", now));
    }

    void finish(const std::shared_ptr<S3Transfer>& t, const std::string& error) {
        {
            std::lock_guard<std::mutex> g(t->m);
            t->done = true;
            t->error = error;
            t->keep.reset();
        }
        t->cv.notify_all();
    }

    void on_done(CURL* e, CURLcode rc) {
        auto it = active_.find(e);
        if (it == active_.end()) return;
        std::shared_ptr<S3Transfer> t = it->second;
        active_.erase(it);
        std::string verdict = t->abandoned.load() ? kAbandoned : judge(*t, rc);
        curl_multi_remove_handle(multi_, e);
        curl_slist_free_all(t->headers);
        t->headers = nullptr;
        idle_.push_back(e);
        t->easy = nullptr;
        if (verdict != "retry") return finish(t, verdict);
        const S3Settings& s = t->client->settings;
        ++t->attempt;
        const std::string body_error = s3_error_text(t->body);
        const std::string last =
            rc != CURLE_OK
                ? std::string(t->curl_error[0] ? t->curl_error : curl_easy_strerror(rc))
                : fmt::format("HTTP {}{}", t->status, body_error.empty() ? "" : " " + body_error);
        if (t->attempt < s.retries && Clock::now() - last_warning_ > std::chrono::seconds(5)) {
            // Once per 5 s at most: a store that is down fails every connection's request.
            last_warning_ = Clock::now();
            std::fprintf(stderr,
                         "saetrain: warning: %s: %s from %s; retrying (attempt %d of %lld, "
                         "data.s3_retries)\n",
                         printable(t->what).c_str(), printable(last).c_str(),
                         t->client->endpoint.c_str(), t->attempt + 1,
                         static_cast<long long>(s.retries));
        }
        if (t->attempt >= s.retries) {
            const double secs = std::chrono::duration<double>(Clock::now() - t->first).count();
            return finish(
                t, fmt::format("{}: endpoint {} failed {} attempts over {:.0f} s (last: {}); "
                               "check that the store is up and reachable (data.s3_endpoint, "
                               "AWS_ENDPOINT_URL), then run the same command to resume from "
                               "the last checkpoint (data.s3_retries sets the attempts)",
                               t->what, t->client->endpoint, t->attempt, secs, last));
        }
        t->not_before = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(backoff_s(t->attempt)));
        std::lock_guard<std::mutex> g(m_);
        // A retry keeps its place ahead of prefetches when a reader waits for it.
        if (t->urgent)
            queue_.push_front(t);
        else
            queue_.push_back(t);
    }

    void loop() {
        for (;;) {
            int wait_ms = 100;
            {
                std::lock_guard<std::mutex> g(m_);
                if (stop_) return;
                const auto now = Clock::now();
                for (auto it = queue_.begin();
                     it != queue_.end() && static_cast<int64_t>(active_.size()) < max_active_;) {
                    if ((*it)->abandoned.load()) {
                        finish(*it, kAbandoned);  // no one waits for it: never started
                        it = queue_.erase(it);
                    } else if ((*it)->not_before <= now) {
                        std::shared_ptr<S3Transfer> t = *it;
                        it = queue_.erase(it);
                        start(t);
                    } else {
                        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                            (*it)->not_before - now)
                                            .count();
                        wait_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 1, wait_ms));
                        ++it;
                    }
                }
            }
            int running = 0;
            curl_multi_perform(multi_, &running);
            int left = 0;
            while (CURLMsg* msg = curl_multi_info_read(multi_, &left))
                if (msg->msg == CURLMSG_DONE) on_done(msg->easy_handle, msg->data.result);
            curl_multi_poll(multi_, nullptr, 0, wait_ms, nullptr);
        }
    }

    std::mutex m_;
    std::deque<std::shared_ptr<S3Transfer>> queue_;
    std::map<CURL*, std::shared_ptr<S3Transfer>> active_;  // the transfer thread's alone
    std::vector<CURL*> idle_;
    int64_t max_active_ = 1;
    Clock::time_point last_warning_{};
    bool stop_ = false;
    CURLM* multi_ = nullptr;
    std::thread thread_;
};

std::shared_ptr<S3Transfer> transfer_start(const S3Client& client, const std::string& url,
                                           const std::string& what) {
    auto t = std::make_shared<S3Transfer>();
    t->client = &client.impl();
    t->url = url;
    t->what = what;
    return t;
}

}  // namespace

S3Pending::~S3Pending() {
    if (!t_) return;
    std::lock_guard<std::mutex> g(t_->m);
    if (!t_->done) t_->abandoned.store(true);  // on_body holds `m` while it writes
}

void S3Pending::wait() {
    const std::string e = wait_error();
    if (!e.empty()) throw Error(e);
}

std::string S3Pending::wait_error() {
    bool (*check)() = stop_check.load();
    std::unique_lock<std::mutex> g(t_->m);
    for (;;) {
        // The check comes first: a loop of quick requests (a listing's pages) stops at its
        // next wait, not only when one of them is slow.
        if (check && check()) {
            if (!t_->done) t_->abandoned.store(true);
            g.unlock();
            throw StopRequested(
                fmt::format("stopped by a signal while waiting for {} (endpoint {})", t_->what,
                            t_->client->endpoint));
        }
        if (t_->done) return t_->error;
        if (check)
            t_->cv.wait_for(g, std::chrono::milliseconds(100));
        else
            t_->cv.wait(g, [&] { return t_->done; });
    }
}

std::unique_ptr<S3Pending> s3_fetch(const S3Client& client, const S3Object& obj, int64_t offset,
                                    int64_t bytes, char* out, std::shared_ptr<void> keep,
                                    bool urgent) {
    auto t = transfer_start(client, client.impl().url(obj.bucket, obj.key), obj.url());
    t->offset = offset, t->bytes = bytes, t->out = out;
    t->size = obj.size;
    t->if_match = obj.etag;
    t->keep = std::move(keep);
    t->urgent = urgent;
    Engine::get().submit(t);
    return std::make_unique<S3Pending>(t);
}

std::string s3_get_body(const S3Client& client, const std::string& url, const std::string& what) {
    auto t = transfer_start(client, url, what);
    t->urgent = true;
    Engine::get().submit(t);
    S3Pending p(t);
    p.wait();
    return t->body;
}

// --- what a response must be -----------------------------------------------------------------

std::optional<S3ContentRange> s3_content_range_parse(const std::string& value) {
    // "bytes FIRST-LAST/TOTAL": digits only (no sign, no space inside), TOTAL may be "*".
    const std::string unit = "bytes ";
    if (value.compare(0, unit.size(), unit) != 0) return std::nullopt;
    size_t at = unit.size();
    auto number = [&](int64_t& out) {
        const size_t from = at;
        int64_t v = 0;
        while (at < value.size() && value[at] >= '0' && value[at] <= '9') {
            if (v > (INT64_MAX - 9) / 10) return false;  // beyond any object
            v = v * 10 + (value[at++] - '0');
        }
        out = v;
        return at > from;
    };
    S3ContentRange r;
    if (!number(r.first) || at >= value.size() || value[at++] != '-') return std::nullopt;
    if (!number(r.last) || at >= value.size() || value[at++] != '/') return std::nullopt;
    if (value.compare(at, std::string::npos, "*") == 0) {
        r.total = -1;
    } else if (!number(r.total) || at != value.size()) {
        return std::nullopt;
    }
    if (r.first > r.last || (r.total >= 0 && r.last >= r.total)) return std::nullopt;
    return r;
}

std::string s3_range_framing_error(int64_t offset, int64_t bytes, int64_t size, long status,
                                   const std::string* content_range, int64_t received,
                                   bool overflow, bool cut) {
    const int64_t last = offset + bytes - 1;
    const std::string asked = fmt::format("the range GET of bytes {}-{}", offset, last);
    if (status == 200) {
        // A store may answer a range that is the whole object with the whole object.
        if (offset != 0 || bytes != size)
            return fmt::format(
                "the store answered {} with 200 OK (the object from its first byte), not 206 "
                "Partial Content: it ignores Range",
                asked);
        if (overflow || (!cut && received != bytes))
            return fmt::format(
                "the store answered {} (the whole object) with 200 OK and {} bytes, not the {} "
                "listed",
                asked, overflow ? fmt::format("more than {}", bytes) : std::to_string(received),
                size);
        return cut ? "retry" : "";
    }
    if (content_range == nullptr)
        return fmt::format("the store answered {} with 206 Partial Content but no Content-Range",
                           asked);
    const auto r = s3_content_range_parse(*content_range);
    if (!r)
        return fmt::format("the store answered {} with an unreadable Content-Range '{}'", asked,
                           *content_range);
    if (r->first != offset || r->last != last)
        return fmt::format(
            "the store answered {} with Content-Range '{}': other bytes than were asked for", asked,
            *content_range);
    if (r->total != size)
        return fmt::format(
            "the store answered {} with Content-Range '{}': an object of {} bytes, but it was "
            "listed with {}",
            asked, *content_range, r->total < 0 ? "unknown" : std::to_string(r->total), size);
    if (overflow) return fmt::format("the store sent more than the {} bytes of {}", bytes, asked);
    // A 206 cut short (the connection lost mid-body): retried.
    if (cut || received < bytes) return "retry";
    return "";
}

bool s3_header_value_ok(const std::string& value) {
    return std::none_of(value.begin(), value.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u < 0x20 || u == 0x7f;
    });
}

std::string s3_endpoint_redacted(const std::string& endpoint) {
    const size_t scheme = endpoint.find("://");
    const size_t from = scheme == std::string::npos ? 0 : scheme + 3;
    const size_t end = endpoint.find_first_of("/?#", from);
    const size_t at = endpoint.rfind('@', end == std::string::npos ? std::string::npos : end - 1);
    if (at == std::string::npos || at < from) return endpoint;
    return endpoint.substr(0, from) + "***" + endpoint.substr(at);
}

}  // namespace saetrain::io

namespace saetrain {

void s3_set_stop_check(bool (*check)()) { io::stop_check.store(check); }

}  // namespace saetrain
