// s3_client.cpp — S3 settings, credentials, the client and its listing and reads (see s3.h);
// the transfers themselves are s3_transfer.cpp's, the ranges a reader fetches ahead
// s3_ranges.cpp's. XML is libxml2's.
#include <fnmatch.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

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

}  // namespace

std::string io::s3_uri_encode(const std::string& s, bool keep_slash) {
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
    std::string from = "data.s3_endpoint";  // where it came from, for messages
    for (const char* env : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
        if (!m.endpoint.empty()) break;
        m.endpoint = getenv_str(env);
        from = env;
    }
    if (m.endpoint.empty()) {
        m.endpoint = ini_value(profile, "endpoint_url");
        from = fmt::format("endpoint_url of profile '{}' in {}", profile_name(), config_file);
    }
    const bool custom = !m.endpoint.empty();
    if (!custom) m.endpoint = "https://s3." + m.region + ".amazonaws.com";
    while (!m.endpoint.empty() && m.endpoint.back() == '/') m.endpoint.pop_back();
    // Credentials in the URL (http://user:secret@host) are refused, and never printed: every
    // message names the endpoint, and libcurl would send them as well as the signature.
    const std::string shown = io::s3_endpoint_redacted(m.endpoint);
    SAE_ENFORCE(shown == m.endpoint,
                "{}: the endpoint {} ({}) has credentials in it (user:password@, not shown); "
                "remove them from the URL and give them as AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY or a profile in ~/.aws/credentials",
                what, shown, from);
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

// --- S3's XML: errors and listings -----------------------------------------------------------

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

}  // namespace

std::string s3_error_text(const std::string& body) {
    XmlDoc d(body);
    xmlNodePtr r = d.root();
    if (!named(r, "Error")) return "";
    const std::string code = child_text(r, "Code"), msg = child_text(r, "Message");
    return code.empty() ? msg : msg.empty() ? code : code + ": " + msg;
}

namespace {

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Every object under `prefix` (with `delimiter` "/": only those directly under it).
std::vector<S3Object> list_prefix(const S3Client& client, const std::string& bucket,
                                  const std::string& prefix, bool delimiter,
                                  const std::string& what) {
    int64_t max_keys = 1000;
    if (const char* v = std::getenv("SAETRAIN_S3_LIST_MAX_KEYS"))  // tests: many pages
        max_keys = std::clamp<int64_t>(std::atoll(v), 1, 1000);
    std::vector<S3Object> out;
    std::string token;
    // A listing must make progress: a continuation token seen before, or a page whose keys do
    // not all come after the previous page's, would list the same keys again, for ever.
    std::set<std::string> tokens;
    std::string before;  // the greatest key (or common prefix) of the pages so far
    for (int page = 0;; ++page) {
        // Query parameters in SigV4's canonical order (sorted by name).
        std::string q;
        if (!token.empty()) q += "continuation-token=" + s3_uri_encode(token, false) + "&";
        if (delimiter) q += "delimiter=%2F&";
        q += fmt::format("list-type=2&max-keys={}&prefix={}", max_keys,
                         s3_uri_encode(prefix, false));
        const std::string body = s3_get_body(client, client.impl().url(bucket, "", q), what);
        XmlDoc d(body);
        xmlNodePtr r = d.root();
        SAE_ENFORCE(named(r, "ListBucketResult"),
                    "{}: the store's listing (page {}) is not a ListObjectsV2 result; is the "
                    "endpoint {} an S3-compatible store?",
                    what, page + 1, client.endpoint());
        std::string greatest = before;
        for (xmlNodePtr c = r->children; c; c = c->next) {
            if (!named(c, "Contents") && !named(c, "CommonPrefixes")) continue;
            const std::string key = child_text(c, named(c, "Contents") ? "Key" : "Prefix");
            SAE_ENFORCE(page == 0 || key > before,
                        "{}: the store's listing went backwards: page {} has the key '{}', not "
                        "after '{}' of the page before; is the endpoint {} an S3-compatible "
                        "store (ListObjectsV2)?",
                        what, page + 1, key, before, client.endpoint());
            greatest = std::max(greatest, key);
            if (!named(c, "Contents")) continue;
            S3Object o;
            o.bucket = bucket;
            o.key = key;
            o.size = std::atoll(child_text(c, "Size").c_str());
            o.etag = child_text(c, "ETag");
            // Every read asks for this ETag (If-Match): without one a replaced object could not
            // be told apart; with a control character it would end the request's header.
            SAE_ENFORCE(!o.etag.empty(),
                        "{}: the store's listing gives no ETag for it, so it does not support "
                        "If-Match/ETags and an object replaced during the run could not be "
                        "told from the one listed; use an S3-compatible store that does "
                        "(endpoint {})",
                        o.url(), client.endpoint());
            SAE_ENFORCE(s3_header_value_ok(o.etag),
                        "{}: the store's listing gives it the ETag '{}', which has a control "
                        "character (CR, LF, ...) and cannot be sent in If-Match; is the "
                        "endpoint {} an S3-compatible store?",
                        o.url(), o.etag, client.endpoint());
            if (o.etag.front() != '"') o.etag = "\"" + o.etag + "\"";
            out.push_back(std::move(o));
        }
        before = greatest;
        const bool more = child_text(r, "IsTruncated") == "true";
        token = child_text(r, "NextContinuationToken");
        if (!more) break;
        SAE_ENFORCE(!token.empty(),
                    "{}: the store's listing is truncated but gives no continuation token; is "
                    "the endpoint {} an S3-compatible store (ListObjectsV2)?",
                    what, client.endpoint());
        SAE_ENFORCE(tokens.insert(token).second,
                    "{}: the store's listing repeats the continuation token '{}' (page {}), so "
                    "it would list the same keys for ever; is the endpoint {} an "
                    "S3-compatible store (ListObjectsV2)?",
                    what, token, page + 1, client.endpoint());
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

void S3Client::read_many(const std::vector<Range>& ranges) const {
    std::vector<std::unique_ptr<io::S3Pending>> pending;
    for (const Range& r : ranges)
        io::s3_for_each_request(
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
    // The objects' requests interleaved (the first of each object, then the second, ...): the
    // store serves several objects at once, as the reader's strata do (a store that serializes
    // the requests of one object, as moto does, is not made the slower side by the order).
    std::vector<std::pair<const S3Object*, int64_t>> order;
    for (int64_t off = 0, more = 1; more; off += rb) {
        more = 0;
        for (const S3Object& o : objects)
            if (off < o.size) order.emplace_back(&o, off), more = 1;
    }
    for (const auto& [o, off] : order) {
        if (!error.empty()) break;
        if (max_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > max_s) break;
        if (free_slots.empty()) retire();
        const size_t slot = free_slots.back();
        free_slots.pop_back();
        const int64_t n = std::min(rb, o->size - off);
        flying.emplace_back(slot,
                            io::s3_fetch(client, *o, off, n, bufs[slot].data(), nullptr, false));
        done += n;
    }
    while (!flying.empty()) retire();
    SAE_ENFORCE(error.empty(), "{}", error);
    return done;
}

}  // namespace saetrain
