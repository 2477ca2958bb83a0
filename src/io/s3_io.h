// s3_io.h — asynchronous range GETs of S3 objects (s3_transfer.cpp), and the ranges a reader
// fetches ahead (s3_ranges.cpp); what the client resolved (s3_client.cpp). Internal to
// saetrain_io.
//
// Every request of the process goes through one transfer thread driving a libcurl multi handle:
// at most S3Settings::connections transfers at once, on keep-alive connections; a request that
// times out, loses its connection or gets a 5xx / 503 SlowDown is retried with exponential
// backoff (S3Settings::retries attempts), then fails with one line naming the object, the
// endpoint and what to do. Requests marked urgent (a reader waiting for them) go ahead of
// queued prefetches. A response whose framing is not what was asked for (status, Content-Range,
// length, ETag: s3_range_framing_error) is an error, never retried and never used.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "saetrain/s3.h"

namespace saetrain {

namespace io {
// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters kept, and '/' in paths.
std::string s3_uri_encode(const std::string& s, bool keep_slash);
}  // namespace io

// What a client resolved from its settings and the environment (s3.h).
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
        if (!key.empty() || !path_style) u += "/" + io::s3_uri_encode(key, true);
        if (!query.empty()) u += "?" + query;
        return u;
    }
};

}  // namespace saetrain

namespace saetrain::io {

// "Code: Message" of an S3 error body (XML), or "".
std::string s3_error_text(const std::string& body);

// --- what a response must be (issue 58: a store's framing is checked, not trusted) ---------

// A Content-Range header's value, "bytes FIRST-LAST/TOTAL" (TOTAL "*": -1).
struct S3ContentRange {
    int64_t first = -1, last = -1, total = -1;
};
// Parses it; nullopt when the value is not of that form (or FIRST > LAST).
std::optional<S3ContentRange> s3_content_range_parse(const std::string& value);

// What is wrong with a 200 or 206 answer to the range GET of bytes [offset, offset + bytes) of
// an object listed with `size` bytes: "" when it is those bytes; "retry" when it is a 206 cut
// short (a lost connection, retried); else a phrase for the error line. `content_range`: the
// header's value, nullptr when absent; `received`: body bytes kept; `overflow`: the body went
// past `bytes`; `cut`: the transfer ended with a libcurl error. A range must get 206 with a
// Content-Range of exactly that range and the listed size, except that a 200 of the whole
// object answers a range that is the whole object.
std::string s3_range_framing_error(int64_t offset, int64_t bytes, int64_t size, long status,
                                   const std::string* content_range, int64_t received,
                                   bool overflow, bool cut);

// Whether `value` may go into a request header: no control characters (a CR/LF from a listing
// would end the header and start another).
bool s3_header_value_ok(const std::string& value);

// `endpoint` with its userinfo (user:password@) replaced by "***@": the form in messages.
std::string s3_endpoint_redacted(const std::string& endpoint);

// The body of a GET of `url` (a listing page), urgently; throws the request's error line.
std::string s3_get_body(const S3Client& client, const std::string& url, const std::string& what);

// Calls f(offset, bytes) for the requests that fetch [offset, offset + bytes): as few as hold
// request_bytes each, of equal size (to a byte), cut from the range's own start. The same range
// is cut the same way wherever it lies, so a hint and the read that follows it ask for the same
// requests; and a range a little over a multiple of request_bytes, or not aligned to one (a
// loader's chunk of rows after an object's header), is not split into a stub beside it. Each
// request costs a round trip and, on some stores, a pass over the object: the shuffle plan's
// 8 MiB chunks cut at 8 MiB multiples of the object took two requests each, and the reader
// made about 1.7x the plain pass's requests (55-58% of its rate against moto).
template <class F>
void s3_for_each_request(int64_t request_bytes, int64_t offset, int64_t bytes, F f) {
    if (bytes <= 0) return;
    const int64_t n = (bytes + request_bytes - 1) / request_bytes;
    const int64_t base = bytes / n, longer = bytes % n;  // the first `longer` take one byte more
    for (int64_t k = 0; k < n; ++k) {
        const int64_t len = base + (k < longer ? 1 : 0);
        f(offset, len);
        offset += len;
    }
}

struct S3Transfer;

// A request under way; wait() blocks until it has ended. Destroyed before it has ended, the
// request is abandoned: from then on it never writes into its destination.
class S3Pending {
public:
    explicit S3Pending(std::shared_ptr<S3Transfer> t) : t_(std::move(t)) {}
    ~S3Pending();
    S3Pending(const S3Pending&) = delete;
    S3Pending& operator=(const S3Pending&) = delete;
    // Blocks until the transfer has ended (its destination is no longer written); throws Error
    // when it failed. Both waits throw StopRequested, abandoning the request, when the stop
    // check (s3_set_stop_check) says so.
    void wait();
    // The same without throwing Error: "" or the error line.
    std::string wait_error();

private:
    std::shared_ptr<S3Transfer> t_;
};

// Starts GET of bytes [offset, offset + bytes) of `obj` into out, If-Match obj.etag; the answer
// is checked against the request and obj.size (s3_range_framing_error) and must carry obj.etag.
// `keep` holds out's memory until the transfer has ended (even when the caller stops waiting).
std::unique_ptr<S3Pending> s3_fetch(const S3Client& client, const S3Object& obj, int64_t offset,
                                    int64_t bytes, char* out, std::shared_ptr<void> keep,
                                    bool urgent);

// A reader's ranges of a set of objects, fetched ahead on hints (RawRowReader::will_need) into
// buffers of its own and copied out when read, or fetched straight into the destination when
// not hinted. Hints and reads come in the same order (the loader hints the pieces it reads
// next); a hinted range passed over by the reads (after a restore) is dropped.
class S3RangeReader {
public:
    S3RangeReader(std::shared_ptr<const S3Client> client, std::vector<S3Object> objects);
    ~S3RangeReader();
    S3RangeReader(const S3RangeReader&) = delete;
    S3RangeReader& operator=(const S3RangeReader&) = delete;

    // Bytes [offset, offset + bytes) of object i into out.
    void read(size_t i, int64_t offset, int64_t bytes, char* out);
    // Starts fetching them, when the buffers ahead have room (ahead_bytes()).
    void hint(size_t i, int64_t offset, int64_t bytes);
    // Drops every hinted range (the reader restarts elsewhere: ShardBatchSource::restore).
    void forget();
    // Bytes a reader should hint ahead to keep every connection busy.
    int64_t ahead_bytes() const;
    const S3Object& object(size_t i) const { return objects_[i]; }

private:
    struct Ahead;
    void drop_front();
    std::shared_ptr<const S3Client> client_;
    std::vector<S3Object> objects_;
    std::deque<std::unique_ptr<Ahead>> ahead_;               // in hint order
    int64_t ahead_held_ = 0;                                 // their bytes
    std::vector<std::shared_ptr<std::vector<char>>> spare_;  // buffers to reuse
};

}  // namespace saetrain::io
