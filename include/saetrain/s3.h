// s3.h — activation shards in S3-compatible object storage (s3://bucket/prefix/).
//
// data.path may name objects instead of files: `s3://bucket/prefix/` (the .h5 objects directly
// under the prefix, as a directory), `s3://bucket/prefix/shard_*.h5` (a glob), or one object.
// The listing is ListObjectsV2, paginated and ordered by key; each object's size and ETag are
// recorded when the dataset is opened, and every later read asks for that ETag (If-Match), so an
// object replaced during a run is an error, not other bytes. Bytes come by HTTP range GETs
// through libcurl, signed by libcurl's AWS SigV4, many at a time on a bounded pool of
// keep-alive connections per process, retried with backoff on timeouts, 5xx and 503 SlowDown.
// Every answer is checked against its request, not trusted: a range must come back as 206 with
// a Content-Range of exactly those bytes and the listed size (or 200 with the whole object when
// the range is the whole object), that many bytes, and the listed ETag; a listing must make
// progress from page to page. Anything else is an error line naming the object and the
// endpoint (only a 206 cut short is retried). Keys are sent byte for byte ("a/../b" included).
// HDF5 reads a shard's metadata through a read-only virtual file driver over the same ranged
// GETs (s3_vfd.h), so an object is validated exactly as a file is; rows are then fetched raw at
// the byte offsets HDF5 reports, as pread does for files (raw_shards.h).
//
// Configuration is the AWS tools': credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
// (/ AWS_SESSION_TOKEN), else the profile AWS_PROFILE (or "default") of
// AWS_SHARED_CREDENTIALS_FILE (or ~/.aws/credentials); the region from AWS_REGION,
// AWS_DEFAULT_REGION or the profile's region in AWS_CONFIG_FILE (or ~/.aws/config), else
// us-east-1; the endpoint from data.s3_endpoint, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the
// profile's endpoint_url, else AWS's. data.s3_* keys override; S3Settings holds them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace saetrain {

struct DataConfig;

// The data.s3_* keys (config.h): "" and 0 mean "the AWS way" (environment, profile, default).
struct S3Settings {
    std::string endpoint;             // http(s)://host[:port]; "" : environment, else AWS
    std::string region;               // "" : environment or profile, else us-east-1
    std::string addressing = "auto";  // auto (path-style on a custom endpoint) | path | virtual
    bool anonymous = false;           // unsigned requests (public buckets)
    int64_t connections = 16;         // concurrent requests (connections) per process
    int64_t request_bytes = 8 << 20;  // bytes of one range GET
    int64_t retries = 10;             // attempts of one request before the run stops
    double timeout_s = 30;            // a request without progress for this long is retried
};

S3Settings s3_settings_from(const DataConfig& data);

// True for "s3://...".
bool is_s3_url(const std::string& path);

struct S3Url {
    std::string bucket, key;  // key: an object's key, a prefix or a glob; may be empty
};
// Splits s3://bucket/key; throws Error naming the URL when it has no bucket.
S3Url s3_url_parse(const std::string& url);

// One object as listed: its size and ETag at that moment.
struct S3Object {
    std::string bucket, key;
    int64_t size = 0;
    std::string etag;  // as the store sent it, quotes included
    std::string url() const { return "s3://" + bucket + "/" + key; }
};

// Credentials as the AWS tools find them (see the top of this file); `source` says where they
// came from for messages ("environment variables AWS_ACCESS_KEY_ID/...", "profile 'x' in
// FILE", "anonymous (data.s3_anonymous)"). Throws Error naming `what` when none are found and
// the settings do not ask for anonymous reads.
struct S3Credentials {
    std::string access_key, secret_key, session_token;
    bool anonymous = false;
    std::string source;
};
S3Credentials s3_credentials_find(const S3Settings& settings, const std::string& what);

// The named section of an AWS INI file (~/.aws/credentials: [name]; ~/.aws/config: [name] for
// "default", else [profile name] or [name]) as key/value pairs, keys lower-cased, values
// trimmed; empty when the section is absent. `#` and `;` start comments.
std::vector<std::pair<std::string, std::string>> aws_ini_section(const std::string& text,
                                                                 const std::string& section,
                                                                 bool config_file);

// A connection to one store with one set of settings and credentials. Thread-safe; requests of
// every client of a process share one pool of connections (S3Settings::connections).
class S3Client {
public:
    // Resolves endpoint, region and credentials; `what` (a data.path) names the source in
    // errors.
    S3Client(const S3Settings& settings, const std::string& what);
    ~S3Client();
    S3Client(const S3Client&) = delete;
    S3Client& operator=(const S3Client&) = delete;

    // The objects `url` names, ordered by key: with a trailing '/' (or when no object has
    // exactly that key) the objects directly under the prefix; with glob characters (* ? [) the
    // keys matching it ('*' does not cross '/'); else the one object. Paginated ListObjectsV2.
    std::vector<S3Object> list(const std::string& url) const;
    // `bytes` of `obj` from `offset` into out: range GETs of request_bytes, concurrently,
    // If-Match its ETag. Throws Error naming the object on failure after the retries.
    void read(const S3Object& obj, int64_t offset, int64_t bytes, void* out) const;
    struct Range {
        const S3Object* obj;
        int64_t offset, bytes;
        void* out;
    };
    // Several ranges at once, each split as read() splits one (sae-iobench's plain rate).
    void read_many(const std::vector<Range>& ranges) const;

    const S3Settings& settings() const;
    const std::string& endpoint() const;
    const std::string& region() const;
    const S3Credentials& credentials() const;

    struct Impl;
    const Impl& impl() const { return *impl_; }

private:
    std::unique_ptr<Impl> impl_;
};

// Every byte of `objects`, by range GETs of request_bytes on every connection at once (the
// objects interleaved: each one's first request, then each one's second, ...), into buffers
// that are then dropped: the store's plain parallel rate, beside which sae-iobench puts
// the reader's. Stops after max_s seconds when max_s > 0; returns the bytes read.
int64_t s3_read_all(const S3Client& client, const std::vector<S3Object>& objects, double max_s);

// The process's client for these settings (made on first use, then shared).
std::shared_ptr<const S3Client> s3_client(const S3Settings& settings, const std::string& what);

// A process-wide check that every S3 wait polls (every 100 ms, and before it starts): a listing
// page, a range GET, a retry's backoff. When it returns true the wait is abandoned by throwing
// StopRequested (error.h) naming the object and the endpoint; the transfers abandoned never
// write into the caller's memory afterwards. nullptr (the default): waits are not interrupted.
// saetrain passes its stop signals' flag for the time before training starts (after that the
// training loop honours them at the next step).
void s3_set_stop_check(bool (*check)());

}  // namespace saetrain
