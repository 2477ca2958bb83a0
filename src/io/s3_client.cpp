// s3_client.cpp — S3 settings, credentials, listing and range GETs over libcurl (see s3.h and
// s3_io.h). HTTP, TLS and SigV4 signing are libcurl's (CURLOPT_AWS_SIGV4); XML is libxml2's.
#include <curl/curl.h>
#include <fnmatch.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "s3_io.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/s3.h"

namespace saetrain {

using Clock = std::chrono::steady_clock;

// --- settings and names --------------------------------------------------------------------

S3Settings s3_settings_from(const DataConfig& data) {
    S3Settings s;
    s.endpoint = data.s3_endpoint;
    s.region = data.s3_region;
    s.addressing = data.s3_addressing;
    s.anonymous = data.s3_anonymous;
    s.connections = data.s3_connections;
    s.request_bytes = data.s3_request_bytes;
    s.retries = data.s3_retries;
    s.timeout_s = data.s3_timeout_s;
    return s;
}

bool is_s3_url(const std::string& path) { return path.rfind("s3://", 0) == 0; }

S3Url s3_url_parse(const std::string& url) {
    SAE_ENFORCE(is_s3_url(url), "{}: not an s3:// URL", url);
    const std::string rest = url.substr(5);
    const size_t slash = rest.find('/');
    S3Url u;
    u.bucket = rest.substr(0, slash);
    u.key = slash == std::string::npos ? "" : rest.substr(slash + 1);
    SAE_ENFORCE(!u.bucket.empty() && u.bucket.find_first_of("*?[") == std::string::npos,
                "{}: no bucket name; write s3://BUCKET/prefix/ (a glob may follow the bucket)",
                url);
    return u;
}

namespace {

std::string getenv_str(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string home_file(const char* env, const char* rel) {
    std::string f = getenv_str(env);
    if (!f.empty()) return f;
    const std::string home = getenv_str("HOME");
    return home.empty() ? std::string() : home + "/" + rel;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string trim(const std::string& s) {
    size_t a = 0, b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
    return s.substr(a, b - a);
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string ini_value(const std::vector<std::pair<std::string, std::string>>& kv,
                      const std::string& key) {
    for (const auto& [k, v] : kv)
        if (k == key) return v;
    return "";
}

std::string profile_name() {
    std::string p = getenv_str("AWS_PROFILE");
    return p.empty() ? "default" : p;
}

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters kept, '/' kept in paths.
std::string uri_encode(const std::string& s, bool keep_slash) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
            (keep_slash && c == '/')) {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> aws_ini_section(const std::string& text,
                                                                 const std::string& section,
                                                                 bool config_file) {
    std::vector<std::pair<std::string, std::string>> out;
    // ~/.aws/config names profiles "[profile NAME]" (and "[default]"); credentials "[NAME]".
    // A name may have several sections: their keys in file order (the first of a key counts).
    auto matches = [&](const std::string& name) {
        return name == section || (config_file && name == "profile " + section);
    };
    bool in = false;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        std::string t = trim(line);
        if (t.empty() || t[0] == '#' || t[0] == ';') continue;
        if (t.front() == '[') {
            const size_t close = t.find(']');
            if (close == std::string::npos) {
                in = false;
                continue;
            }
            std::string name = trim(t.substr(1, close - 1));
            // Collapse "profile   x" to "profile x".
            if (name.rfind("profile", 0) == 0 && name.size() > 7 &&
                std::isspace(static_cast<unsigned char>(name[7])))
                name = "profile " + trim(name.substr(7));
            in = matches(name);
            continue;
        }
        if (!in) continue;
        const size_t eq = t.find('=');
        if (eq == std::string::npos) continue;
        std::string v = trim(t.substr(eq + 1));
        // An inline comment needs whitespace before it (values such as keys may hold '#').
        for (const char* c : {" #", "\t#", " ;", "\t;"})
            if (const size_t p = v.find(c); p != std::string::npos) v = trim(v.substr(0, p));
        out.emplace_back(lower(trim(t.substr(0, eq))), v);
    }
    return out;
}

S3Credentials s3_credentials_find(const S3Settings& settings, const std::string& what) {
    S3Credentials c;
    if (settings.anonymous) {
        c.anonymous = true;
        c.source = "anonymous (data.s3_anonymous)";
        return c;
    }
    const std::string id = getenv_str("AWS_ACCESS_KEY_ID");
    const std::string secret = getenv_str("AWS_SECRET_ACCESS_KEY");
    if (!id.empty() || !secret.empty()) {
        SAE_ENFORCE(!id.empty() && !secret.empty(),
                    "{}: {} is set but {} is not; set both (or neither, to use a profile in "
                    "~/.aws/credentials)",
                    what, id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                    id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY");
        c.access_key = id, c.secret_key = secret;
        c.session_token = getenv_str("AWS_SESSION_TOKEN");
        c.source = "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";
        return c;
    }
    const std::string file = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    const std::string profile = profile_name();
    if (!file.empty()) {
        const auto kv = aws_ini_section(read_text(file), profile, false);
        const std::string fid = ini_value(kv, "aws_access_key_id");
        const std::string fsecret = ini_value(kv, "aws_secret_access_key");
        if (!fid.empty() && !fsecret.empty()) {
            c.access_key = fid, c.secret_key = fsecret;
            c.session_token = ini_value(kv, "aws_session_token");
            c.source = fmt::format("profile '{}' in {}", profile, file);
            return c;
        }
    }
    throw Error(fmt::format(
        "{}: no AWS credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and {} has "
        "no profile '{}' with aws_access_key_id and aws_secret_access_key; set them (or "
        "AWS_PROFILE), or set data.s3_anonymous: true for a public bucket",
        what, file.empty() ? "~/.aws/credentials" : file, profile));
}

// --- the client -----------------------------------------------------------------------------

struct S3Client::Impl {
    S3Settings settings;
    std::string endpoint;  // scheme://host[:port], no trailing '/'
    std::string region;
    S3Credentials creds;
    bool path_style = true;
    std::string sigv4;  // "aws:amz:REGION:s3"

    std::string scheme() const { return endpoint.substr(0, endpoint.find("://")); }
    std::string host() const { return endpoint.substr(endpoint.find("://") + 3); }
    // The URL of `key` in `bucket` (key "" : the bucket), with a query already in canonical
    // order.
    std::string url(const std::string& bucket, const std::string& key,
                    const std::string& query = "") const {
        std::string u =
            path_style ? endpoint + "/" + bucket : scheme() + "://" + bucket + "." + host();
        if (!key.empty() || !path_style) u += "/" + uri_encode(key, true);
        if (!query.empty()) u += "?" + query;
        return u;
    }
};

S3Client::S3Client(const S3Settings& settings, const std::string& what) : impl_(new Impl) {
    Impl& m = *impl_;
    m.settings = settings;
    SAE_ENFORCE(settings.connections >= 1 && settings.request_bytes >= 4096 &&
                    settings.retries >= 1 && settings.timeout_s > 0,
                "{}: data.s3_connections, s3_request_bytes, s3_retries and s3_timeout_s must be "
                "positive (s3_request_bytes at least 4096)",
                what);
    const std::string config_file = home_file("AWS_CONFIG_FILE", ".aws/config");
    const auto profile = config_file.empty()
                             ? decltype(aws_ini_section("", "", true)){}
                             : aws_ini_section(read_text(config_file), profile_name(), true);
    m.region = settings.region;
    for (const char* env : {"AWS_REGION", "AWS_DEFAULT_REGION"})
        if (m.region.empty()) m.region = getenv_str(env);
    if (m.region.empty()) m.region = ini_value(profile, "region");
    if (m.region.empty()) m.region = "us-east-1";
    m.endpoint = settings.endpoint;
    for (const char* env : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
        if (m.endpoint.empty()) m.endpoint = getenv_str(env);
    if (m.endpoint.empty()) m.endpoint = ini_value(profile, "endpoint_url");
    const bool custom = !m.endpoint.empty();
    if (!custom) m.endpoint = "https://s3." + m.region + ".amazonaws.com";
    while (!m.endpoint.empty() && m.endpoint.back() == '/') m.endpoint.pop_back();
    SAE_ENFORCE(m.endpoint.rfind("http://", 0) == 0 || m.endpoint.rfind("https://", 0) == 0,
                "{}: endpoint '{}' is not an http:// or https:// URL; set data.s3_endpoint or "
                "AWS_ENDPOINT_URL to e.g. http://127.0.0.1:9000",
                what, m.endpoint);
    SAE_ENFORCE(settings.addressing == "auto" || settings.addressing == "path" ||
                    settings.addressing == "virtual",
                "{}: data.s3_addressing '{}' is not auto, path or virtual", what,
                settings.addressing);
    m.path_style = settings.addressing == "path" || (settings.addressing == "auto" && custom);
    m.creds = s3_credentials_find(settings, what);
    m.sigv4 = "aws:amz:" + m.region + ":s3";
}

S3Client::~S3Client() = default;
const S3Settings& S3Client::settings() const { return impl_->settings; }
const std::string& S3Client::endpoint() const { return impl_->endpoint; }
const std::string& S3Client::region() const { return impl_->region; }
const S3Credentials& S3Client::credentials() const { return impl_->creds; }

std::shared_ptr<const S3Client> s3_client(const S3Settings& s, const std::string& what) {
    static std::mutex m;
    static std::map<std::string, std::shared_ptr<const S3Client>> clients;
    // Credentials come from the environment at first use: one client per settings.
    const std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", s.endpoint, s.region, s.addressing, s.anonymous,
                    s.connections, s.request_bytes, s.retries, s.timeout_s);
    std::lock_guard<std::mutex> g(m);
    auto it = clients.find(key);
    if (it != clients.end()) return it->second;
    auto c = std::make_shared<const S3Client>(s, what);
    clients[key] = c;
    return c;
}

}  // namespace saetrain

// --- the transfer thread -------------------------------------------------------------------

namespace saetrain::io {

namespace {

struct XmlDoc {
    xmlDocPtr doc = nullptr;
    explicit XmlDoc(const std::string& text) {
        if (!text.empty())
            doc = xmlReadMemory(text.data(), static_cast<int>(text.size()), "s3.xml", nullptr,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    }
    ~XmlDoc() {
        if (doc) xmlFreeDoc(doc);
    }
    XmlDoc(const XmlDoc&) = delete;
    XmlDoc& operator=(const XmlDoc&) = delete;
    xmlNodePtr root() const { return doc ? xmlDocGetRootElement(doc) : nullptr; }
};

bool named(xmlNodePtr n, const char* name) {
    return n && n->type == XML_ELEMENT_NODE &&
           std::strcmp(reinterpret_cast<const char*>(n->name), name) == 0;
}

std::string text_of(xmlNodePtr n) {
    xmlChar* t = xmlNodeGetContent(n);
    std::string s = t ? reinterpret_cast<const char*>(t) : "";
    if (t) xmlFree(t);
    return s;
}

std::string child_text(xmlNodePtr parent, const char* name) {
    for (xmlNodePtr c = parent ? parent->children : nullptr; c; c = c->next)
        if (named(c, name)) return text_of(c);
    return "";
}

// "Code: Message" of an S3 error body, or "".
std::string s3_error_text(const std::string& body) {
    XmlDoc d(body);
    xmlNodePtr r = d.root();
    if (!named(r, "Error")) return "";
    const std::string code = child_text(r, "Code"), msg = child_text(r, "Message");
    return code.empty() ? msg : msg.empty() ? code : code + ": " + msg;
}

}  // namespace

struct S3Transfer {
    // The request.
    const S3Client::Impl* client = nullptr;
    std::shared_ptr<const void> client_keep;  // the client outlives its transfers
    std::string url, what, if_match;
    int64_t offset = -1, bytes = 0;  // offset >= 0: a range
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
    std::string body, etag;
    long status = 0;
    // Its end.
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::string error;  // "" when it worked
};

namespace {

constexpr size_t kMaxBody = 64u << 20;  // listing pages and error bodies

size_t on_header(char* p, size_t size, size_t n, void* arg) {
    auto* t = static_cast<S3Transfer*>(arg);
    const std::string line(p, size * n);
    if (line.rfind("HTTP/", 0) == 0) {
        t->etag.clear();  // a new response (after a 100 Continue, say)
    } else if (line.size() > 5 && lower(line.substr(0, 5)) == "etag:") {
        t->etag = trim(line.substr(5));
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
    std::memcpy(t->out + t->received, p, len);
    t->received += static_cast<int64_t>(len);
    return len;
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
        thread_ = std::thread([this] { loop(); });
    }

    void start(const std::shared_ptr<S3Transfer>& t) {
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
        t->body.clear(), t->etag.clear();
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
        if (t.overflow)
            return fmt::format(
                "{}: the store sent more than the {} bytes asked for at offset {}; "
                "is data.s3_endpoint an S3-compatible store?",
                where, t.bytes, t.offset);
        if (rc != CURLE_OK) return "retry";
        const long s = t.status;
        if (s == 200 || s == 206) {
            if (t.offset >= 0 && t.received != t.bytes) {
                // 206 cut short: retried; 200 of the whole object: a store ignoring Range.
                if (s == 206) return "retry";
                return fmt::format(
                    "{}: the store answered a range request with the whole "
                    "object; is data.s3_endpoint an S3-compatible store?",
                    where);
            }
            if (!t.if_match.empty() && !t.etag.empty() && bare(t.etag) != bare(t.if_match))
                return changed(t, t.etag);
            return "";
        }
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
        std::string verdict = judge(*t, rc);
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
                    if ((*it)->not_before <= now) {
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

void S3Pending::wait() {
    const std::string e = wait_error();
    if (!e.empty()) throw Error(e);
}

std::string S3Pending::wait_error() {
    std::unique_lock<std::mutex> g(t_->m);
    t_->cv.wait(g, [&] { return t_->done; });
    return t_->error;
}

std::unique_ptr<S3Pending> s3_fetch(const S3Client& client, const S3Object& obj, int64_t offset,
                                    int64_t bytes, char* out, std::shared_ptr<void> keep,
                                    bool urgent) {
    auto t = transfer_start(client, client.impl().url(obj.bucket, obj.key), obj.url());
    t->offset = offset, t->bytes = bytes, t->out = out;
    t->if_match = obj.etag;
    t->keep = std::move(keep);
    t->urgent = urgent;
    Engine::get().submit(t);
    return std::make_unique<S3Pending>(t);
}

namespace {

// A body (a listing page) of `url`, or throws the request's error line.
std::string get_body(const S3Client& client, const std::string& url, const std::string& what) {
    auto t = transfer_start(client, url, what);
    t->urgent = true;
    Engine::get().submit(t);
    S3Pending p(t);
    p.wait();
    return t->body;
}

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

struct Page {
    std::vector<S3Object> objects;
    std::string next;  // continuation token; "" when this was the last page
};

// Every object under `prefix` (with `delimiter` "/": only those directly under it).
std::vector<S3Object> list_prefix(const S3Client& client, const std::string& bucket,
                                  const std::string& prefix, bool delimiter,
                                  const std::string& what) {
    int64_t max_keys = 1000;
    if (const char* v = std::getenv("SAETRAIN_S3_LIST_MAX_KEYS"))  // tests: many pages
        max_keys = std::clamp<int64_t>(std::atoll(v), 1, 1000);
    std::vector<S3Object> out;
    std::string token;
    for (int page = 0;; ++page) {
        // Query parameters in SigV4's canonical order (sorted by name).
        std::string q;
        if (!token.empty()) q += "continuation-token=" + uri_encode(token, false) + "&";
        if (delimiter) q += "delimiter=%2F&";
        q += fmt::format("list-type=2&max-keys={}&prefix={}", max_keys, uri_encode(prefix, false));
        const std::string body = get_body(client, client.impl().url(bucket, "", q), what);
        XmlDoc d(body);
        xmlNodePtr r = d.root();
        SAE_ENFORCE(named(r, "ListBucketResult"),
                    "{}: the store's listing (page {}) is not a ListObjectsV2 result; is the "
                    "endpoint {} an S3-compatible store?",
                    what, page + 1, client.endpoint());
        for (xmlNodePtr c = r->children; c; c = c->next) {
            if (!named(c, "Contents")) continue;
            S3Object o;
            o.bucket = bucket;
            o.key = child_text(c, "Key");
            o.size = std::atoll(child_text(c, "Size").c_str());
            o.etag = child_text(c, "ETag");
            if (!o.etag.empty() && o.etag.front() != '"') o.etag = "\"" + o.etag + "\"";
            out.push_back(std::move(o));
        }
        const bool more = child_text(r, "IsTruncated") == "true";
        token = child_text(r, "NextContinuationToken");
        if (!more) break;
        SAE_ENFORCE(!token.empty(),
                    "{}: the store's listing is truncated but gives no continuation token; is "
                    "the endpoint {} an S3-compatible store (ListObjectsV2)?",
                    what, client.endpoint());
    }
    // Ordered by key (S3 lists in UTF-8 binary order already; other stores may not).
    std::sort(out.begin(), out.end(),
              [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
    return out;
}

}  // namespace

}  // namespace saetrain::io

namespace saetrain {

std::vector<S3Object> S3Client::list(const std::string& url) const {
    const S3Url u = s3_url_parse(url);
    if (io::has_glob(u.key)) {
        const std::string prefix = u.key.substr(0, u.key.find_first_of("*?["));
        std::vector<S3Object> out;
        for (S3Object& o : io::list_prefix(*this, u.bucket, prefix, false, url))
            if (::fnmatch(u.key.c_str(), o.key.c_str(), FNM_PATHNAME) == 0)
                out.push_back(std::move(o));
        return out;
    }
    if (u.key.empty() || u.key.back() == '/')
        return io::list_prefix(*this, u.bucket, u.key, true, url);
    // One object, or a prefix written without its trailing '/'.
    for (S3Object& o : io::list_prefix(*this, u.bucket, u.key, true, url))
        if (o.key == u.key) return {o};
    return io::list_prefix(*this, u.bucket, u.key + "/", true, url);
}

namespace {

// Calls f(offset, bytes) for the request_bytes pieces of [offset, offset + bytes), aligned to
// multiples of request_bytes in the object (so that reads and hints cut a range alike).
template <class F>
void for_each_request(int64_t request_bytes, int64_t offset, int64_t bytes, F f) {
    const int64_t end = offset + bytes;
    while (offset < end) {
        const int64_t next = std::min(end, (offset / request_bytes + 1) * request_bytes);
        f(offset, next - offset);
        offset = next;
    }
}

}  // namespace

void S3Client::read_many(const std::vector<Range>& ranges) const {
    std::vector<std::unique_ptr<io::S3Pending>> pending;
    for (const Range& r : ranges)
        for_each_request(
            impl_->settings.request_bytes, r.offset, r.bytes, [&](int64_t off, int64_t n) {
                pending.push_back(io::s3_fetch(*this, *r.obj, off, n,
                                               static_cast<char*>(r.out) + (off - r.offset),
                                               nullptr, true));
            });
    // Every transfer has ended before the first error is thrown: none writes into `out` later.
    std::string first;
    for (auto& p : pending) {
        const std::string e = p->wait_error();
        if (first.empty()) first = e;
    }
    SAE_ENFORCE(first.empty(), "{}", first);
}

void S3Client::read(const S3Object& obj, int64_t offset, int64_t bytes, void* out) const {
    read_many({Range{&obj, offset, bytes, out}});
}

int64_t s3_read_all(const S3Client& client, const std::vector<S3Object>& objects, double max_s) {
    const int64_t rb = client.settings().request_bytes;
    // Twice as many requests under way as connections: one queued behind each transfer.
    const size_t slots = static_cast<size_t>(2 * client.settings().connections);
    std::vector<std::vector<char>> bufs(slots, std::vector<char>(static_cast<size_t>(rb)));
    std::deque<std::pair<size_t, std::unique_ptr<io::S3Pending>>> flying;
    std::vector<size_t> free_slots;
    for (size_t i = 0; i < slots; ++i) free_slots.push_back(i);
    int64_t done = 0;
    std::string error;
    const auto t0 = Clock::now();
    auto retire = [&] {
        auto& [slot, p] = flying.front();
        const std::string e = p->wait_error();
        if (error.empty()) error = e;
        free_slots.push_back(slot);
        flying.pop_front();
    };
    for (const S3Object& o : objects) {
        for (int64_t off = 0; off < o.size && error.empty(); off += rb) {
            if (max_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > max_s)
                break;
            if (free_slots.empty()) retire();
            const size_t slot = free_slots.back();
            free_slots.pop_back();
            const int64_t n = std::min(rb, o.size - off);
            flying.emplace_back(slot,
                                io::s3_fetch(client, o, off, n, bufs[slot].data(), nullptr, false));
            done += n;
        }
    }
    while (!flying.empty()) retire();
    SAE_ENFORCE(error.empty(), "{}", error);
    return done;
}

}  // namespace saetrain

// --- ranges fetched ahead --------------------------------------------------------------------

namespace saetrain::io {

struct S3RangeReader::Ahead {
    size_t object = 0;
    int64_t offset = 0, bytes = 0;
    std::shared_ptr<std::vector<char>> buf;
    std::unique_ptr<S3Pending> pending;
    bool waited = false;
    std::string error;
};

S3RangeReader::S3RangeReader(std::shared_ptr<const S3Client> client, std::vector<S3Object> objects)
    : client_(std::move(client)), objects_(std::move(objects)) {}

S3RangeReader::~S3RangeReader() {
    // Transfers still running keep their buffers alive (S3Transfer::keep); nothing to wait for.
}

int64_t S3RangeReader::ahead_bytes() const {
    const S3Settings& s = client_->settings();
    return s.connections * s.request_bytes;
}

void S3RangeReader::drop_front() {
    ahead_held_ -= ahead_.front()->bytes;
    if (ahead_.front()->waited && ahead_.front()->buf.use_count() == 1)
        spare_.push_back(std::move(ahead_.front()->buf));
    ahead_.pop_front();
}

void S3RangeReader::forget() {
    while (!ahead_.empty()) drop_front();
}

void S3RangeReader::hint(size_t i, int64_t offset, int64_t bytes) {
    const int64_t rb = client_->settings().request_bytes;
    for_each_request(rb, offset, bytes, [&](int64_t off, int64_t n) {
        // The loader hints ahead_bytes() beyond the piece it reads, which is held too.
        if (ahead_held_ + n > 2 * ahead_bytes()) return;
        for (const auto& a : ahead_)  // already hinted
            if (a->object == i && a->offset == off && a->bytes == n) return;
        auto a = std::make_unique<Ahead>();
        a->object = i, a->offset = off, a->bytes = n;
        if (!spare_.empty()) {
            a->buf = std::move(spare_.back());
            spare_.pop_back();
        } else {
            a->buf = std::make_shared<std::vector<char>>();
        }
        if (static_cast<int64_t>(a->buf->size()) < n) a->buf->resize(static_cast<size_t>(rb));
        a->pending = s3_fetch(*client_, objects_[i], off, n, a->buf->data(), a->buf, false);
        ahead_held_ += n;
        ahead_.push_back(std::move(a));
    });
}

void S3RangeReader::read(size_t i, int64_t offset, int64_t bytes, char* out) {
    const int64_t end = offset + bytes;
    auto overlaps = [&](const Ahead& a) {
        return a.object == i && a.offset < end && offset < a.offset + a.bytes;
    };
    // Hints passed over (before the first one this read uses) will not be read: dropped.
    auto first = std::find_if(ahead_.begin(), ahead_.end(),
                              [&](const std::unique_ptr<Ahead>& a) { return overlaps(*a); });
    if (first != ahead_.end())
        while (ahead_.front().get() != first->get()) drop_front();
    // What was fetched ahead is copied out; the gaps are fetched straight into `out`, urgently.
    std::vector<std::unique_ptr<S3Pending>> direct;
    std::string error;
    int64_t at = offset;
    auto fetch_gap = [&](int64_t to) {
        if (to > at)
            for_each_request(client_->settings().request_bytes, at, to - at,
                             [&](int64_t off, int64_t n) {
                                 direct.push_back(s3_fetch(*client_, objects_[i], off, n,
                                                           out + (off - offset), nullptr, true));
                             });
    };
    std::vector<Ahead*> used;
    for (const auto& a : ahead_)
        if (overlaps(*a)) used.push_back(a.get());
    std::sort(used.begin(), used.end(),
              [](const Ahead* x, const Ahead* y) { return x->offset < y->offset; });
    for (Ahead* a : used) {
        fetch_gap(std::max(at, a->offset));
        if (!a->waited) a->error = a->pending->wait_error(), a->waited = true;
        if (error.empty()) error = a->error;
        const int64_t from = std::max(offset, a->offset);
        const int64_t to = std::min(end, a->offset + a->bytes);
        if (a->error.empty() && to > from)
            std::memcpy(out + (from - offset), a->buf->data() + (from - a->offset),
                        static_cast<size_t>(to - from));
        at = std::max(at, to);
    }
    fetch_gap(end);
    for (auto& p : direct) {
        const std::string e = p->wait_error();
        if (error.empty()) error = e;
    }
    // Ranges read to their end are done with.
    while (!ahead_.empty() && ahead_.front()->waited && ahead_.front()->object == i &&
           ahead_.front()->offset >= offset &&
           ahead_.front()->offset + ahead_.front()->bytes <= end)
        drop_front();
    SAE_ENFORCE(error.empty(), "{}", error);
}

}  // namespace saetrain::io
