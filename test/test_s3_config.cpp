// The parts of s3:// support that need no server (test/s3/test_s3.py has the rest, against a real
// one): s3:// URLs, the AWS INI files' sections, where credentials, region and endpoint come from
// and in which order, and the one-line errors when they cannot be found.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "../src/io/s3_io.h"
#include "saetrain/config.h"
#include "saetrain/error.h"
#include "saetrain/s3.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

// Sets (or, with nullptr, unsets) environment variables for one test and restores them after.
class Env {
public:
    void set(const char* name, const char* value) {
        if (!saved_.count(name)) {
            const char* old = std::getenv(name);
            saved_[name] = old ? std::make_pair(true, std::string(old)) : std::make_pair(false, "");
        }
        if (value)
            ::setenv(name, value, 1);
        else
            ::unsetenv(name);
    }
    ~Env() {
        for (const auto& [name, v] : saved_) {
            if (v.first)
                ::setenv(name.c_str(), v.second.c_str(), 1);
            else
                ::unsetenv(name.c_str());
        }
    }

private:
    std::map<std::string, std::pair<bool, std::string>> saved_;
};

class S3Config : public ::testing::Test {
protected:
    fs::path dir;
    Env env;
    void SetUp() override {
        dir = fs::temp_directory_path() / ("saetrain_s3cfg_" + std::to_string(::getpid()));
        fs::create_directories(dir / ".aws");
        // Nothing from the machine running the test.
        for (const char* v :
             {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
              "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"})
            env.set(v, nullptr);
        env.set("HOME", dir.c_str());
    }
    void TearDown() override { fs::remove_all(dir); }
    void write(const std::string& name, const std::string& text) {
        std::ofstream(dir / ".aws" / name) << text;
    }
};

std::string value(const std::vector<std::pair<std::string, std::string>>& kv,
                  const std::string& key) {
    for (const auto& [k, v] : kv)
        if (k == key) return v;
    return "<absent>";
}

}  // namespace

TEST(S3Url, SplitsBucketAndKey) {
    EXPECT_TRUE(is_s3_url("s3://b/k"));
    EXPECT_FALSE(is_s3_url("data/s3://b"));
    S3Url u = s3_url_parse("s3://acts/gpt2/l6/shard_*.h5");
    EXPECT_EQ(u.bucket, "acts");
    EXPECT_EQ(u.key, "gpt2/l6/shard_*.h5");
    u = s3_url_parse("s3://acts");
    EXPECT_EQ(u.bucket, "acts");
    EXPECT_EQ(u.key, "");
    EXPECT_THROW(s3_url_parse("s3:///key"), Error);
    EXPECT_THROW(s3_url_parse("s3://ac*ts/key"), Error);
}

TEST(AwsIni, SectionsOfCredentialsAndConfigFiles) {
    const std::string creds =
        "# comment\n[default]\naws_access_key_id = A1\naws_secret_access_key=S1 ; inline\n\n"
        "[lab]\n  AWS_ACCESS_KEY_ID =A2\naws_secret_access_key = S2#kept\n";
    EXPECT_EQ(value(aws_ini_section(creds, "default", false), "aws_access_key_id"), "A1");
    EXPECT_EQ(value(aws_ini_section(creds, "default", false), "aws_secret_access_key"), "S1");
    EXPECT_EQ(value(aws_ini_section(creds, "lab", false), "aws_access_key_id"), "A2");
    // '#' without whitespace before it is part of the value (secret keys may hold one).
    EXPECT_EQ(value(aws_ini_section(creds, "lab", false), "aws_secret_access_key"), "S2#kept");
    EXPECT_TRUE(aws_ini_section(creds, "missing", false).empty());
    const std::string config =
        "[default]\nregion = eu-west-1\n[profile lab]\nregion=us-west-2\n"
        "endpoint_url = http://127.0.0.1:9000\n[lab]\nregion = wrong-unless-no-profile\n";
    EXPECT_EQ(value(aws_ini_section(config, "default", true), "region"), "eu-west-1");
    const auto lab = aws_ini_section(config, "lab", true);
    EXPECT_EQ(value(lab, "region"), "us-west-2");  // the first match: [profile lab]
    EXPECT_EQ(value(lab, "endpoint_url"), "http://127.0.0.1:9000");
    // In a credentials file "[profile lab]" is not the profile lab.
    EXPECT_TRUE(aws_ini_section("[profile lab]\naws_access_key_id = X\n", "lab", false).empty());
}

TEST_F(S3Config, CredentialsFromTheEnvironmentFirst) {
    write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FS\n");
    env.set("AWS_ACCESS_KEY_ID", "ENVKEY");
    env.set("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
    env.set("AWS_SESSION_TOKEN", "TOKEN");
    const S3Credentials c = s3_credentials_find(S3Settings{}, "s3://b/p/");
    EXPECT_EQ(c.access_key, "ENVKEY");
    EXPECT_EQ(c.secret_key, "ENVSECRET");
    EXPECT_EQ(c.session_token, "TOKEN");
    EXPECT_NE(c.source.find("environment variables"), std::string::npos) << c.source;
    // Half a pair is an error naming the missing half.
    env.set("AWS_SECRET_ACCESS_KEY", nullptr);
    try {
        s3_credentials_find(S3Settings{}, "s3://b/p/");
        FAIL() << "half a key pair was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("AWS_SECRET_ACCESS_KEY is not"), std::string::npos)
            << e.what();
    }
}

TEST_F(S3Config, CredentialsFromTheProfile) {
    write("credentials",
          "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
          "[lab]\naws_access_key_id = L\naws_secret_access_key = LS\naws_session_token = LT\n");
    S3Credentials c = s3_credentials_find(S3Settings{}, "s3://b/p/");
    EXPECT_EQ(c.access_key, "D");
    EXPECT_EQ(c.source, "profile 'default' in " + (dir / ".aws/credentials").string());
    env.set("AWS_PROFILE", "lab");
    c = s3_credentials_find(S3Settings{}, "s3://b/p/");
    EXPECT_EQ(c.access_key, "L");
    EXPECT_EQ(c.session_token, "LT");
    // AWS_SHARED_CREDENTIALS_FILE moves the file.
    std::ofstream(dir / "elsewhere")
        << "[lab]\naws_access_key_id = E\naws_secret_access_key = ES\n";
    env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "elsewhere").c_str());
    EXPECT_EQ(s3_credentials_find(S3Settings{}, "s3://b/p/").access_key, "E");
}

TEST_F(S3Config, NoCredentialsIsOneLineNamingThePathAndWhatToDo) {
    try {
        s3_credentials_find(S3Settings{}, "s3://acts/gpt2/");
        FAIL() << "found credentials where there are none";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.find('\n'), std::string::npos);
        EXPECT_EQ(m.rfind("s3://acts/gpt2/: no AWS credentials", 0), 0u) << m;
        EXPECT_NE(m.find("data.s3_anonymous: true"), std::string::npos) << m;
    }
    S3Settings anon;
    anon.anonymous = true;
    const S3Credentials c = s3_credentials_find(anon, "s3://acts/gpt2/");
    EXPECT_TRUE(c.anonymous);
    EXPECT_EQ(c.source, "anonymous (data.s3_anonymous)");
}

TEST_F(S3Config, RegionEndpointAndAddressingInTheAwsOrder) {
    S3Settings anon;
    anon.anonymous = true;
    {
        const S3Client c(anon, "s3://b/");
        EXPECT_EQ(c.region(), "us-east-1");
        EXPECT_EQ(c.endpoint(), "https://s3.us-east-1.amazonaws.com");
    }
    write("config", "[default]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9000/\n");
    {
        const S3Client c(anon, "s3://b/");
        EXPECT_EQ(c.region(), "eu-west-1");
        EXPECT_EQ(c.endpoint(), "http://127.0.0.1:9000");
    }
    env.set("AWS_REGION", "ap-south-1");
    env.set("AWS_ENDPOINT_URL", "http://localhost:9100");
    {
        const S3Client c(anon, "s3://b/");
        EXPECT_EQ(c.region(), "ap-south-1");
        EXPECT_EQ(c.endpoint(), "http://localhost:9100");
    }
    S3Settings keys = anon;
    keys.region = "us-west-2";
    keys.endpoint = "http://10.0.0.1:80";
    {
        const S3Client c(keys, "s3://b/");
        EXPECT_EQ(c.region(), "us-west-2");
        EXPECT_EQ(c.endpoint(), "http://10.0.0.1:80");
    }
    keys.endpoint = "127.0.0.1:9000";  // no scheme
    EXPECT_THROW(S3Client(keys, "s3://b/"), Error);
    keys.endpoint = "";
    keys.addressing = "sideways";
    EXPECT_THROW(S3Client(keys, "s3://b/"), Error);
}

TEST(S3Settings, FromTheDataKeys) {
    DataConfig d;
    d.s3_endpoint = "http://127.0.0.1:9000";
    d.s3_anonymous = true;
    d.s3_connections = 4;
    d.s3_request_bytes = 1 << 20;
    d.s3_retries = 3;
    d.s3_timeout_s = 2.5;
    const S3Settings s = s3_settings_from(d);
    EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
    EXPECT_TRUE(s.anonymous);
    EXPECT_EQ(s.connections, 4);
    EXPECT_EQ(s.request_bytes, 1 << 20);
    EXPECT_EQ(s.retries, 3);
    EXPECT_EQ(s.timeout_s, 2.5);
    EXPECT_EQ(s.addressing, "auto");
}

// How a range is cut into requests: as few as hold request_bytes each, equal to a byte, from
// the range's own start, so that a loader's chunk just under request_bytes at any offset is one
// request (cutting at multiples of request_bytes in the object made it two), and a hint and the
// read of the same range ask for the same requests.
TEST(S3Requests, FewestEqualPiecesFromTheRangesStart) {
    auto cut = [](int64_t rb, int64_t offset, int64_t bytes) {
        std::vector<std::pair<int64_t, int64_t>> out;
        io::s3_for_each_request(rb, offset, bytes,
                                [&](int64_t o, int64_t n) { out.emplace_back(o, n); });
        return out;
    };
    using P = std::vector<std::pair<int64_t, int64_t>>;
    const int64_t mib = 1 << 20;
    // 5461 rows of 1536 bytes (the shuffle plan's 8 MiB chunk) after a 2 KiB header: one request.
    EXPECT_EQ(cut(8 * mib, 2048, 5461 * 1536), (P{{2048, 5461 * 1536}}));
    EXPECT_EQ(cut(8 * mib, 8 * mib - 1, 8 * mib), (P{{8 * mib - 1, 8 * mib}}));
    // Four chunks: four requests, not five.
    EXPECT_EQ(cut(8 * mib, 2048, 4 * 5461 * 1536).size(), 4u);
    // One byte over a request: two halves, not a request and a one-byte stub.
    EXPECT_EQ(cut(100, 7, 101), (P{{7, 51}, {58, 50}}));
    EXPECT_EQ(cut(100, 0, 300), (P{{0, 100}, {100, 100}, {200, 100}}));
    EXPECT_EQ(cut(100, 5, 1), (P{{5, 1}}));
    EXPECT_TRUE(cut(100, 5, 0).empty());
    // Every cut covers the range exactly, in order, within request_bytes, the same wherever the
    // range lies.
    for (int64_t rb : {1, 3, 64, 1000})
        for (int64_t bytes : {1, 2, 63, 64, 65, 999, 1000, 1001, 4097})
            for (int64_t offset : {0, 1, 777}) {
                const P p = cut(rb, offset, bytes);
                EXPECT_EQ(static_cast<int64_t>(p.size()), (bytes + rb - 1) / rb);
                int64_t at = offset;
                for (const auto& [o, n] : p) {
                    EXPECT_EQ(o, at);
                    EXPECT_GE(n, 1);
                    EXPECT_LE(n, rb);
                    EXPECT_LE(n - p.back().second, 1);
                    at += n;
                }
                EXPECT_EQ(at, offset + bytes);
                const P q = cut(rb, offset + 12345, bytes);
                for (size_t k = 0; k < p.size(); ++k) EXPECT_EQ(q[k].second, p[k].second);
            }
}

// --- what a response must be (issue 58) -----------------------------------------------------

TEST(S3Framing, ContentRangeParsing) {
    const auto r = io::s3_content_range_parse("bytes 100-199/1000");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->first, 100);
    EXPECT_EQ(r->last, 199);
    EXPECT_EQ(r->total, 1000);
    const auto star = io::s3_content_range_parse("bytes 0-0/*");
    ASSERT_TRUE(star);
    EXPECT_EQ(star->total, -1);
    for (const char* bad : {"", "bytes", "bytes 1-2", "bytes 5-4/10", "bytes 0-10/10",
                            "bytes -1-2/10", "bytes 1-2/10 ", "items 1-2/10", "bytes 1 -2/10",
                            "bytes 1-2/99999999999999999999999", "bytes */10"})
        EXPECT_FALSE(io::s3_content_range_parse(bad)) << bad;
}

// Each way a 200 or 206 can fail to be the range asked for: bytes [100, 200) of a 1000-byte
// object, or all of a 100-byte one.
TEST(S3Framing, EachAnswerAgainstItsRequest) {
    auto judge = [](int64_t offset, int64_t bytes, int64_t size, long status, const char* cr,
                    int64_t received, bool overflow = false, bool cut = false) {
        const std::string header = cr ? cr : "";
        return io::s3_range_framing_error(offset, bytes, size, status, cr ? &header : nullptr,
                                          received, overflow, cut);
    };
    auto has = [](const std::string& s, const char* part) {
        return s.find(part) != std::string::npos;
    };
    EXPECT_EQ(judge(100, 100, 1000, 206, "bytes 100-199/1000", 100), "");
    EXPECT_EQ(judge(0, 100, 100, 200, nullptr, 100), "");  // the whole object, as 200
    EXPECT_EQ(judge(0, 100, 100, 206, "bytes 0-99/100", 100), "");
    // A 206 cut short (a lost connection) is retried; any other fault is an error.
    EXPECT_EQ(judge(100, 100, 1000, 206, "bytes 100-199/1000", 40), "retry");
    EXPECT_EQ(judge(100, 100, 1000, 206, "bytes 100-199/1000", 40, false, true), "retry");
    EXPECT_EQ(judge(0, 100, 100, 200, nullptr, 40, false, true), "retry");
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes 300-399/1000", 100),
                    "with Content-Range 'bytes 300-399/1000': other bytes"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes 100-299/1000", 100), "other bytes"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes 100-199/1200", 100),
                    "an object of 1200 bytes, but it was listed with 1000"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes 100-199/*", 100), "an object of unknown"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, nullptr, 100), "but no Content-Range"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes=100-199", 100), "unreadable"));
    EXPECT_TRUE(has(judge(100, 100, 1000, 206, "bytes 100-199/1000", 100, true), "more than"));
    // A 200 answers only a range that is the whole object, with all of it.
    EXPECT_TRUE(has(judge(100, 100, 1000, 200, nullptr, 100), "with 200 OK"));
    EXPECT_TRUE(has(judge(0, 100, 1000, 200, nullptr, 100), "with 200 OK"));
    EXPECT_TRUE(has(judge(0, 100, 100, 200, nullptr, 90), "200 OK and 90 bytes, not the 100"));
    EXPECT_TRUE(has(judge(0, 100, 100, 200, nullptr, 100, true), "more than 100 bytes"));
    // A wrong Content-Range is an error even when the connection was also cut.
    EXPECT_NE(judge(100, 100, 1000, 206, "bytes 0-99/1000", 40, false, true), "retry");
}

TEST(S3Framing, HeaderValuesAndEndpointsInMessages) {
    EXPECT_TRUE(io::s3_header_value_ok("\"9b2cf535f27731c974343645a3985328\""));
    EXPECT_TRUE(io::s3_header_value_ok(""));
    EXPECT_FALSE(io::s3_header_value_ok("\"abc\"\r\nX-Injected: 1"));
    EXPECT_FALSE(io::s3_header_value_ok(std::string("a\0b", 3)));
    EXPECT_FALSE(io::s3_header_value_ok("a\tb"));
    EXPECT_FALSE(io::s3_header_value_ok("a\x7f"));
    EXPECT_EQ(io::s3_endpoint_redacted("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    EXPECT_EQ(io::s3_endpoint_redacted("http://u:p@host:9000"), "http://***@host:9000");
    EXPECT_EQ(io::s3_endpoint_redacted("https://u:p@ss@host/x@y"), "https://***@host/x@y");
    EXPECT_EQ(io::s3_endpoint_redacted("http://host/path@x"), "http://host/path@x");
}

TEST_F(S3Config, CredentialsInTheEndpointAreRefusedUnprinted) {
    S3Settings s;
    s.anonymous = true;
    s.endpoint = "http://AKIDUSER:Sup3rSecret@127.0.0.1:9000";
    try {
        S3Client c(s, "s3://b/");
        FAIL() << "accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.find("Sup3rSecret"), std::string::npos) << m;
        EXPECT_EQ(m.find("AKIDUSER"), std::string::npos) << m;
        EXPECT_NE(m.find("http://***@127.0.0.1:9000 (data.s3_endpoint) has credentials"),
                  std::string::npos)
            << m;
    }
}
