#include "saetrain/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "saetrain/error.h"

namespace fs = std::filesystem;

namespace saetrain {
namespace {

// --- CRC-32C ----------------------------------------------------------------------------------
// One byte at a time from a 256-entry table: the writer checksums a few hundred bytes per log
// interval, so slicing-by-8 or SSE4.2's crc32 instruction would buy nothing measurable.
std::array<uint32_t, 256> make_crc32c_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int b = 0; b < 8; ++b) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        t[i] = c;
    }
    return t;
}

// --- protobuf wire format (only what Event, Summary and Value use) ----------------------------
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, WireType type) {
    put_varint(out, field << 3 | type);
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 and ARM store it
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
}
void put_bytes(std::string& out, uint32_t field, const std::string& s) {
    put_tag(out, field, kBytes);
    put_varint(out, s.size());
    out += s;
}

struct Reader {
    const std::string& s;
    size_t pos = 0;
    bool done() const { return pos >= s.size(); }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            SAE_ENFORCE(pos < s.size(), "TensorBoard event: truncated varint");
            const auto b = static_cast<uint8_t>(s[pos++]);
            v |= uint64_t{b & 0x7Fu} << shift;
            if (!(b & 0x80)) return v;
        }
        throw Error("TensorBoard event: varint longer than 10 bytes");
    }
    std::string bytes(size_t n) {
        SAE_ENFORCE(n <= s.size() - pos, "TensorBoard event: field runs past the end");
        std::string out = s.substr(pos, n);
        pos += n;
        return out;
    }
    template <typename T>
    T fixed() {
        const std::string b = bytes(sizeof(T));
        T v;
        std::memcpy(&v, b.data(), sizeof(T));
        return v;
    }
    void skip(uint32_t type) {
        switch (type) {
            case kVarint:
                varint();
                break;
            case kFixed64:
                bytes(8);
                break;
            case kBytes:
                bytes(varint());
                break;
            case kFixed32:
                bytes(4);
                break;
            default:
                throw Error(fmt::format("TensorBoard event: wire type {}", type));
        }
    }
};

constexpr const char* kFileVersion = "brain.Event:2";

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

bool is_event_file(const fs::path& p) {
    return p.filename().string().find("tfevents") != std::string::npos;
}

// "events.out.tfevents.<seconds>.<host>.<pid>": TensorBoard orders a directory's files by name,
// and the seconds keep a resumed run's file after the first one's.
std::string event_file_name() {
    char host[256] = "localhost";
    if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
    host[sizeof(host) - 1] = '\0';
    return fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now_seconds()), host,
                       ::getpid());
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
    static const std::array<uint32_t, 256> table = make_crc32c_table();
    const auto* p = static_cast<const uint8_t*>(data);
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string tfrecord_frame(const std::string& payload) {
    std::string out;
    out.reserve(payload.size() + 16);
    put_fixed<uint64_t>(out, payload.size());
    put_fixed<uint32_t>(out, crc32c_masked(crc32c(out.data(), 8)));
    out += payload;
    put_fixed<uint32_t>(out, crc32c_masked(crc32c(payload.data(), payload.size())));
    return out;
}

TfRecords tfrecord_read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    SAE_ENFORCE(in.good(), "cannot read {}: {}", path, std::strerror(errno));
    const std::string s((std::istreambuf_iterator<char>(in)), {});
    TfRecords r;
    size_t pos = 0;
    auto u32 = [&](size_t at) {
        uint32_t v;
        std::memcpy(&v, s.data() + at, 4);
        return v;
    };
    while (pos < s.size()) {
        if (s.size() - pos < 12) break;
        uint64_t len;
        std::memcpy(&len, s.data() + pos, 8);
        if (u32(pos + 8) != crc32c_masked(crc32c(s.data() + pos, 8))) break;
        if (len > s.size() - pos - 12 || s.size() - pos - 12 - len < 4) break;
        const std::string payload = s.substr(pos + 12, len);
        if (u32(pos + 12 + len) != crc32c_masked(crc32c(payload.data(), payload.size()))) break;
        r.payloads.push_back(payload);
        pos += 16 + len;
    }
    r.valid_bytes = static_cast<int64_t>(pos);
    r.complete = pos == s.size();
    return r;
}

namespace {

// An Event {wall_time: 1, step: 2, summary: 5} holding `summary` (a serialized Summary).
std::string event_of(double wall_time, int64_t step, const std::string& summary) {
    std::string e;
    put_tag(e, 1, kFixed64);
    put_fixed<double>(e, wall_time);
    put_tag(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));
    put_bytes(e, 5, summary);
    return e;
}

}  // namespace

std::string tb_event_file_version(double wall_time) {
    std::string e;
    put_tag(e, 1, kFixed64);
    put_fixed<double>(e, wall_time);
    put_bytes(e, 3, kFileVersion);
    return e;
}

std::string tb_event_scalars(double wall_time, int64_t step, const std::vector<TbScalar>& values) {
    std::string summary;
    for (const auto& [tag, value] : values) {
        std::string v;
        put_bytes(v, 1, tag);
        put_tag(v, 2, kFixed32);
        put_fixed<float>(v, value);
        put_bytes(summary, 1, v);
    }
    return event_of(wall_time, step, summary);
}

std::string tb_event_text(double wall_time, int64_t step, const std::string& tag,
                          const std::string& markdown) {
    // SummaryMetadata {plugin_data {plugin_name: "text"}; data_class: DATA_CLASS_TENSOR (2)}
    std::string plugin, metadata, tensor, v, summary;
    put_bytes(plugin, 1, "text");
    put_bytes(metadata, 1, plugin);
    put_tag(metadata, 4, kVarint);
    put_varint(metadata, 2);
    // TensorProto {dtype: DT_STRING (7); tensor_shape {} (a scalar); string_val: markdown}
    put_tag(tensor, 1, kVarint);
    put_varint(tensor, 7);
    put_bytes(tensor, 2, "");
    put_bytes(tensor, 8, markdown);
    put_bytes(v, 1, tag);
    put_bytes(v, 9, metadata);
    put_bytes(v, 8, tensor);
    put_bytes(summary, 1, v);
    return event_of(wall_time, step, summary);
}

namespace {

// A TensorProto's first string_val (the text of a text summary).
std::string tensor_string(const std::string& tensor) {
    Reader r{tensor};
    while (!r.done()) {
        const uint64_t key = r.varint();
        if (key == (8u << 3 | kBytes)) return r.bytes(r.varint());
        r.skip(static_cast<uint32_t>(key & 7));
    }
    return {};
}

}  // namespace

TbEvent tb_event_parse(const std::string& payload) {
    TbEvent ev;
    Reader r{payload};
    while (!r.done()) {
        const uint64_t key = r.varint();
        const auto field = static_cast<uint32_t>(key >> 3), type = static_cast<uint32_t>(key & 7);
        if (field == 1 && type == kFixed64) {
            ev.wall_time = r.fixed<double>();
        } else if (field == 2 && type == kVarint) {
            ev.step = static_cast<int64_t>(r.varint());
        } else if (field == 3 && type == kBytes) {
            ev.file_version = r.bytes(r.varint());
        } else if (field == 5 && type == kBytes) {
            const std::string summary = r.bytes(r.varint());
            Reader sr{summary};
            while (!sr.done()) {
                const uint64_t sk = sr.varint();
                if (sk != (1u << 3 | kBytes)) {
                    sr.skip(static_cast<uint32_t>(sk & 7));
                    continue;
                }
                const std::string value = sr.bytes(sr.varint());
                Reader vr{value};
                TbScalar sc;
                std::string text;
                bool is_text = false;
                while (!vr.done()) {
                    const uint64_t vk = vr.varint();
                    if (vk == (1u << 3 | kBytes)) {
                        sc.first = vr.bytes(vr.varint());
                    } else if (vk == (2u << 3 | kFixed32)) {
                        sc.second = vr.fixed<float>();
                    } else if (vk == (8u << 3 | kBytes)) {
                        text = tensor_string(vr.bytes(vr.varint()));
                        is_text = true;
                    } else {
                        vr.skip(static_cast<uint32_t>(vk & 7));
                    }
                }
                if (is_text)
                    ev.texts.emplace_back(std::move(sc.first), std::move(text));
                else
                    ev.scalars.push_back(sc);
            }
        } else {
            r.skip(type);
        }
    }
    return ev;
}

std::string tensorboard_tag(const std::string& key) {
    std::string k = key;
    const size_t fraction = k.rfind("_fraction");
    if (fraction != std::string::npos && fraction + 9 == k.size())
        k.resize(fraction + 5);  // the names these runs have always had: "_frac"
    if (k.rfind("eval_", 0) == 0) return "held_out/" + k.substr(5);
    // Throughput and memory: how fast and how big, apart from what the SAE learns.
    static const char* const kPerf[] = {
        "tokens_per_s", "read_MBps",       "wait_frac",        "elapsed_s",   "tflops",
        "mfu",          "gpu_mem_peak_GB", "host_mem_peak_GB", "cpu_threads",
    };
    for (const char* p : kPerf)
        if (k == p) return "perf/" + k;
    return "train/" + k;
}

std::vector<TbScalar> tensorboard_scalars(const MetricsRow& r) {
    std::vector<TbScalar> v;
    for (const MetricsField& f : metrics_fields()) {
        // The same fields and conditions as metrics_json: absent there, absent here. An
        // undefined figure (NaN: fvu on rows of no variance; null there) is left out.
        if (!f.logged || !f.scalar || !f.shown_in(r) || std::isnan(f.get(r))) continue;
        v.emplace_back(tensorboard_tag(f.name), static_cast<float>(f.get(r)));
    }
    return v;
}

bool tensorboard_split_legacy(const std::string& tb_dir, const std::vector<std::string>& ids) {
    std::vector<fs::path> old;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(tb_dir, ec))
        if (e.is_regular_file() && is_event_file(e.path())) old.push_back(e.path());
    if (old.empty()) return false;
    std::sort(old.begin(), old.end());  // TensorBoard's reading order
    // "<id>/<key>": ids hold no '/', keys none either, so the id is all before the last '/'.
    std::map<std::string, std::vector<std::string>> events;  // by id: payloads
    for (const fs::path& p : old) {
        for (const std::string& payload : tfrecord_read(p.string()).payloads) {
            TbEvent ev;
            try {
                ev = tb_event_parse(payload);
            } catch (const Error&) {
                continue;
            }
            std::map<std::string, std::vector<TbScalar>> by_id;
            for (const auto& [tag, value] : ev.scalars) {
                const size_t slash = tag.rfind('/');
                if (slash == std::string::npos) continue;
                const std::string id = tag.substr(0, slash);
                if (std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
                by_id[id].emplace_back(tensorboard_tag(tag.substr(slash + 1)), value);
            }
            for (const auto& [id, values] : by_id)
                events[id].push_back(tb_event_scalars(ev.wall_time, ev.step, values));
        }
    }
    for (const auto& [id, payloads] : events) {
        const fs::path dir = fs::path(tb_dir) / id;
        fs::create_directories(dir);
        const std::string pending = (dir / ".pending-events").string();
        {
            std::ofstream out(pending, std::ios::binary | std::ios::trunc);
            out << tfrecord_frame(tb_event_file_version(now_seconds()));
            for (const std::string& payload : payloads) out << tfrecord_frame(payload);
            out.flush();
            SAE_ENFORCE(out.good(), "cannot write {}: {}", pending, std::strerror(errno));
        }
        const fs::path target = dir / event_file_name();
        SAE_ENFORCE(std::rename(pending.c_str(), target.c_str()) == 0, "cannot rename {} to {}: {}",
                    pending, target.string(), std::strerror(errno));
    }
    for (const fs::path& p : old) fs::remove(p);
    return true;
}

// --- the writer -------------------------------------------------------------------------------

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resumed_step) {
    fs::create_directories(dir);
    std::vector<fs::path> old;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && is_event_file(e.path())) old.push_back(e.path());
    std::sort(old.begin(), old.end());  // TensorBoard's reading order
    // The records to carry over: steps up to the resumed one, in file order, each step once.
    std::vector<std::string> kept;
    int64_t last_step = -1;
    if (resumed_step >= 0) {
        for (const fs::path& p : old) {
            for (const std::string& payload : tfrecord_read(p.string()).payloads) {
                TbEvent ev;
                try {
                    ev = tb_event_parse(payload);
                } catch (const Error&) {
                    continue;  // not an event this writer made: dropped
                }
                if (!ev.file_version.empty() || (ev.scalars.empty() && ev.texts.empty())) continue;
                // A text at the resumed step came from an earlier resume from the same
                // checkpoint: the run resuming now writes its own there.
                if (ev.scalars.empty() && ev.step >= resumed_step) continue;
                // A step at or before the last kept one was written by a run that died and
                // was resumed before this rewrite existed; keep the first copy only.
                if (ev.step > resumed_step || ev.step < last_step) continue;
                last_step = ev.step;
                kept.push_back(payload);
                for (const auto& [tag, v] : ev.scalars) last_step_[tag] = ev.step;
            }
        }
    }
    // Written under a name TensorBoard ignores, then renamed, then the old files removed: a kill
    // at any point leaves either the old files or the new one holding each step once (at worst
    // both, if killed between the rename and the removal; the next resume rewrites them).
    path_ = (fs::path(dir) / event_file_name()).string();
    const std::string pending = (fs::path(dir) / ".pending-events").string();
    f_ = std::fopen(pending.c_str(), "wb");
    SAE_ENFORCE(f_ != nullptr, "cannot open {} for writing: {}", pending, std::strerror(errno));
    append(tb_event_file_version(now_seconds()), false);
    for (const std::string& payload : kept) append(payload, false);
    append(std::string(), true);
    SAE_ENFORCE(std::rename(pending.c_str(), path_.c_str()) == 0, "cannot rename {} to {}: {}",
                pending, path_, std::strerror(errno));
    for (const fs::path& p : old)
        if (p != fs::path(path_)) fs::remove(p);
}

TensorBoardWriter::~TensorBoardWriter() {
    if (f_) std::fclose(f_);
}

void TensorBoardWriter::append(const std::string& payload, bool flush) {
    if (!payload.empty()) {
        const std::string rec = tfrecord_frame(payload);
        SAE_ENFORCE(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size(), "cannot write {}: {}",
                    path_, std::strerror(errno));
    }
    if (flush)
        SAE_ENFORCE(std::fflush(f_) == 0, "cannot write {}: {}", path_, std::strerror(errno));
}

void TensorBoardWriter::write(int64_t step, const std::vector<TbScalar>& values) {
    std::vector<TbScalar> fresh;
    for (const TbScalar& v : values) {
        const auto it = last_step_.find(v.first);
        if (it != last_step_.end() && it->second >= step) continue;
        last_step_[v.first] = step;
        fresh.push_back(v);
    }
    if (!fresh.empty()) append(tb_event_scalars(now_seconds(), step, fresh), true);
}

void TensorBoardWriter::write_text(int64_t step, const std::string& tag,
                                   const std::string& markdown) {
    append(tb_event_text(now_seconds(), step, tag, markdown), true);
}

}  // namespace saetrain
