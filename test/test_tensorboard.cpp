// The TensorBoard writer (tensorboard.h): CRC-32C against published vectors, TFRecord framing,
// the Event protobuf byte for byte (scalars and text summaries), the shared tag names, a torn
// file read up to its last complete record, the resume rewrite (no step duplicated or
// rewound), and an earlier version's one-directory layout split into one run per SAE.
// test/python/test_tensorboard_report.py reads a real run's files with TensorBoard's own loader.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "saetrain/tensorboard.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace saetrain;

namespace {

std::vector<fs::path> event_files(const fs::path& dir) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find("tfevents") != std::string::npos)
            out.push_back(e.path());
    return out;
}

std::vector<int64_t> scalar_steps(const fs::path& file) {
    std::vector<int64_t> steps;
    for (const std::string& p : tfrecord_read(file.string()).payloads) {
        const TbEvent ev = tb_event_parse(p);
        if (!ev.scalars.empty()) steps.push_back(ev.step);
    }
    return steps;
}

}  // namespace

// RFC 3720 (iSCSI) appendix B.4 and the common check value of CRC-32C.
TEST(Crc32c, KnownVectors) {
    const char* check = "123456789";
    EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
    EXPECT_EQ(crc32c("", 0), 0u);
    std::vector<uint8_t> b(32, 0x00);
    EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);
    std::fill(b.begin(), b.end(), 0xFF);
    EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);
    for (int i = 0; i < 32; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
    EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);
    for (int i = 0; i < 32; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(31 - i);
    EXPECT_EQ(crc32c(b.data(), b.size()), 0x113FDB5Cu);
    // Continuing from a previous CRC equals one pass over the whole.
    EXPECT_EQ(crc32c(check + 4, 5, crc32c(check, 4)), 0xE3069283u);
}

TEST(Crc32c, TfRecordMask) {
    EXPECT_EQ(crc32c_masked(0), 0xa282ead8u);
    const uint32_t c = 0xE3069283u;
    EXPECT_EQ(crc32c_masked(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TfRecord, FrameLayout) {
    const std::string payload = "hello";
    const std::string rec = tfrecord_frame(payload);
    ASSERT_EQ(rec.size(), payload.size() + 16);
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, rec.data(), 8);
    std::memcpy(&len_crc, rec.data() + 8, 4);
    std::memcpy(&data_crc, rec.data() + 12 + payload.size(), 4);
    EXPECT_EQ(len, payload.size());
    EXPECT_EQ(len_crc, crc32c_masked(crc32c(rec.data(), 8)));
    EXPECT_EQ(rec.substr(12, payload.size()), payload);
    EXPECT_EQ(data_crc, crc32c_masked(crc32c(payload.data(), payload.size())));
}

// Event{wall_time: 1.5, step: 300, summary{value{tag: "a/fvu", simple_value: 0.25}}}, encoded
// by hand from event.proto and summary.proto.
TEST(TbEvent, ScalarEventBytes) {
    const std::string e = tb_event_scalars(1.5, 300, {{"a/fvu", 0.25f}});
    // clang-format off
    const unsigned char want[] = {
        0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,       // field 1, fixed64: 1.5
        0x10, 0xAC, 0x02,                         // field 2, varint: 300
        0x2A, 0x0E,                               // field 5 (summary), 14 bytes
        0x0A, 0x0C,                               //   value, 12 bytes
        0x0A, 0x05, 'a', '/', 'f', 'v', 'u',      //     tag
        0x15, 0x00, 0x00, 0x80, 0x3E};            //     simple_value, fixed32: 0.25
    // clang-format on
    ASSERT_EQ(e.size(), sizeof(want));
    EXPECT_EQ(std::memcmp(e.data(), want, sizeof(want)), 0);
    const TbEvent ev = tb_event_parse(e);
    EXPECT_EQ(ev.wall_time, 1.5);
    EXPECT_EQ(ev.step, 300);
    ASSERT_EQ(ev.scalars.size(), 1u);
    EXPECT_EQ(ev.scalars[0].first, "a/fvu");
    EXPECT_EQ(ev.scalars[0].second, 0.25f);
    EXPECT_EQ(tb_event_parse(tb_event_file_version(2.0)).file_version, "brain.Event:2");
}

// Summary.Value{tag: "config", metadata{plugin_data{plugin_name: "text"}, data_class: 2},
// tensor{dtype: DT_STRING, tensor_shape{}, string_val: "# hi"}}, encoded by hand from
// summary.proto and tensor.proto.
TEST(TbEvent, TextEventBytes) {
    const std::string e = tb_event_text(1.5, 7, "config", "# hi");
    // clang-format off
    const unsigned char want[] = {
        0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,       // field 1, fixed64: 1.5
        0x10, 0x07,                               // field 2, varint: 7
        0x2A, 0x22,                               // field 5 (summary), 34 bytes
        0x0A, 0x20,                               //   value, 32 bytes
        0x0A, 0x06, 'c', 'o', 'n', 'f', 'i', 'g', //     tag
        0x4A, 0x0A,                               //     metadata (9), 10 bytes
        0x0A, 0x06, 0x0A, 0x04, 't', 'e', 'x', 't', //     plugin_data{plugin_name}
        0x20, 0x02,                               //       data_class: DATA_CLASS_TENSOR
        0x42, 0x0A,                               //     tensor (8), 10 bytes
        0x08, 0x07,                               //       dtype: DT_STRING
        0x12, 0x00,                               //       tensor_shape: a scalar
        0x42, 0x04, '#', ' ', 'h', 'i'};          //       string_val
    // clang-format on
    ASSERT_EQ(e.size(), sizeof(want));
    EXPECT_EQ(std::memcmp(e.data(), want, sizeof(want)), 0);
    const TbEvent ev = tb_event_parse(e);
    EXPECT_EQ(ev.step, 7);
    EXPECT_TRUE(ev.scalars.empty());  // a text value is not read as a scalar 0
    ASSERT_EQ(ev.texts.size(), 1u);
    EXPECT_EQ(ev.texts[0].first, "config");
    EXPECT_EQ(ev.texts[0].second, "# hi");
}

// Every SAE's run has the same tags, so TensorBoard overlays a sweep on one chart per tag.
TEST(TbScalars, SharedTagsWithTheNumbersOfMetricsJson) {
    EXPECT_EQ(tensorboard_tag("fvu"), "train/fvu");
    EXPECT_EQ(tensorboard_tag("dead_fraction"), "train/dead_frac");
    EXPECT_EQ(tensorboard_tag("dead_frac"), "train/dead_frac");  // an earlier version's name
    EXPECT_EQ(tensorboard_tag("eval_fvu"), "held_out/fvu");
    EXPECT_EQ(tensorboard_tag("eval_dense_fraction"), "held_out/dense_frac");
    EXPECT_EQ(tensorboard_tag("tokens_per_s"), "perf/tokens_per_s");
    EXPECT_EQ(tensorboard_tag("wait_fraction"), "perf/wait_frac");
    MetricsRow r;
    r.sae = "topk-x4-k8";
    r.step = 50, r.tokens = 1000, r.lr = 1e-3, r.fvu = 0.2, r.l0 = 8, r.dead_fraction = 0.01;
    std::vector<TbScalar> v = tensorboard_scalars(r);
    auto value = [&](const std::string& tag) -> std::optional<float> {
        for (const auto& s : v)
            if (s.first == tag) return s.second;
        return std::nullopt;
    };
    for (const char* t : {"train/fvu", "train/l0", "train/dead_frac", "train/lr", "train/loss",
                          "train/mse", "train/tokens", "perf/tokens_per_s"})
        EXPECT_TRUE(value(t)) << t;
    EXPECT_EQ(value("train/fvu"), 0.2f);
    EXPECT_EQ(value("train/tokens"), 1000.0f);
    for (const auto& [tag, _] : v) EXPECT_EQ(tag.find("topk"), std::string::npos) << tag;
    EXPECT_FALSE(value("perf/mfu"));  // no peak known: absent, as in metrics.jsonl
    EXPECT_FALSE(value("held_out/fvu"));
    r.eval_rows = 100, r.eval_fvu = 0.3, r.eval_dead_fraction = 0.25, r.mfu = 0.5;
    v = tensorboard_scalars(r);
    EXPECT_EQ(value("held_out/fvu"), 0.3f);
    EXPECT_EQ(value("held_out/dead_frac"), 0.25f);
    EXPECT_EQ(value("held_out/rows"), 100.0f);
    EXPECT_EQ(value("perf/mfu"), 0.5f);
}

// A run killed mid-write leaves a torn last record: every complete one still reads.
TEST(TensorBoardWriter, TornFileKeepsItsCompleteRecords) {
    saetrain::testing::TempDir tmp;
    std::string path;
    {
        TensorBoardWriter w((tmp.path / "tb").string());
        for (int64_t s = 10; s <= 30; s += 10) w.write(s, {{"a/fvu", 0.1f * float(s)}});
        path = w.path();
    }
    EXPECT_EQ(scalar_steps(path), (std::vector<int64_t>{10, 20, 30}));
    EXPECT_TRUE(tfrecord_read(path).complete);
    const auto size = fs::file_size(path);
    fs::resize_file(path, size - 3);
    const TfRecords r = tfrecord_read(path);
    EXPECT_FALSE(r.complete);
    EXPECT_EQ(r.payloads.size(), 3u);  // the file version and steps 10, 20
    EXPECT_EQ(scalar_steps(path), (std::vector<int64_t>{10, 20}));
    // A flipped byte inside a record: reading stops before it.
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    bytes[static_cast<size_t>(r.valid_bytes) - 6] ^= 0x40;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_EQ(scalar_steps(path), (std::vector<int64_t>{10}));
}

// Resume: one file, the old steps up to the resumed one, then the new ones; a fresh run
// starts empty.
TEST(TensorBoardWriter, ResumeKeepsStepsUpToTheCheckpoint) {
    saetrain::testing::TempDir tmp;
    const fs::path dir = tmp.path / "tb";
    {
        TensorBoardWriter w(dir.string());
        for (int64_t s = 50; s <= 250; s += 50) w.write(s, {{"a/l0", float(s)}, {"b/l0", 1.0f}});
    }
    {
        TensorBoardWriter w(dir.string(), /*resumed_step=*/100);
        for (int64_t s = 150; s <= 300; s += 50) w.write(s, {{"a/l0", float(s)}});
    }
    {
        TensorBoardWriter w(dir.string(), /*resumed_step=*/300);
        // The end of a run logs its last step again with the held-out figures: only those
        // are new. A step before a tag's last one is never written.
        w.write(300, {{"a/l0", 300.0f}, {"a/eval_fvu", 0.5f}});
        w.write(200, {{"a/l0", 1.0f}});
        w.write_text(300, "config", "resumed");
    }
    auto texts = [&](const fs::path& file) {
        std::vector<std::pair<int64_t, std::string>> out;
        for (const std::string& p : tfrecord_read(file.string()).payloads) {
            const TbEvent ev = tb_event_parse(p);
            for (const auto& [tag, text] : ev.texts) out.emplace_back(ev.step, text);
        }
        return out;
    };
    {
        // Resumed from the same checkpoint again: that step's text is the new run's to write.
        TensorBoardWriter w(dir.string(), /*resumed_step=*/300);
        EXPECT_TRUE(texts(w.path()).empty());
        w.write_text(300, "config", "again");
    }
    {
        TensorBoardWriter w(dir.string(), /*resumed_step=*/301);  // a later resume keeps it
    }
    std::vector<fs::path> files = event_files(dir);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(scalar_steps(files[0]), (std::vector<int64_t>{50, 100, 150, 200, 250, 300, 300}));
    EXPECT_EQ(texts(files[0]), (std::vector<std::pair<int64_t, std::string>>{{300, "again"}}));
    const auto payloads = tfrecord_read(files[0].string()).payloads;
    const TbEvent last = tb_event_parse(payloads[payloads.size() - 2]);
    ASSERT_EQ(last.scalars.size(), 1u);
    EXPECT_EQ(last.scalars[0].first, "a/eval_fvu");
    // The carried records keep their tags and values; one file-version event leads.
    const TfRecords r = tfrecord_read(files[0].string());
    EXPECT_EQ(tb_event_parse(r.payloads[0]).file_version, "brain.Event:2");
    EXPECT_EQ(tb_event_parse(r.payloads[1]).scalars.size(), 2u);
    EXPECT_FALSE(fs::exists(dir / ".pending-events"));
    {
        TensorBoardWriter w(dir.string());  // --overwrite: nothing carried over
        w.write(50, {{"a/l0", 3.0f}});
    }
    files = event_files(dir);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(scalar_steps(files[0]), (std::vector<int64_t>{50}));
}

// An earlier version wrote one tb/ directory with tags "<sae id>/<key>": resuming such a run
// splits it into tb/<id>/ with the shared tags, steps and values kept, before the writers
// carry the events up to the resumed step.
TEST(TensorBoardWriter, EarlierLayoutIsSplitIntoOneRunPerSae) {
    saetrain::testing::TempDir tmp;
    const fs::path dir = tmp.path / "tb";
    fs::create_directories(dir);
    {
        std::ofstream out(dir / "events.out.tfevents.1.host.1", std::ios::binary);
        out << tfrecord_frame(tb_event_file_version(1.0));
        for (int64_t s = 10; s <= 40; s += 10)
            out << tfrecord_frame(
                tb_event_scalars(double(s), s,
                                 {{"topk-x4-k8/fvu", 0.1f * float(s)},
                                  {"topk-x4-k8-lr0.001/dead_frac", 0.5f},
                                  {"gone-x1/fvu", 1.0f}}));  // an SAE not in the run: dropped
        out << tfrecord_frame(tb_event_scalars(40.5, 40, {{"topk-x4-k8/eval_fvu", 0.7f}}));
    }
    const std::vector<std::string> ids = {"topk-x4-k8", "topk-x4-k8-lr0.001"};
    ASSERT_TRUE(tensorboard_split_legacy(dir.string(), ids));
    EXPECT_TRUE(event_files(dir).empty());  // the old file is gone
    EXPECT_FALSE(fs::exists(dir / "gone-x1"));
    for (const std::string& id : ids) {
        TensorBoardWriter w((dir / id).string(), /*resumed_step=*/30);
    }
    const std::vector<fs::path> a = event_files(dir / "topk-x4-k8");
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(scalar_steps(a[0]), (std::vector<int64_t>{10, 20, 30}));
    const TfRecords r = tfrecord_read(a[0].string());
    const TbEvent second = tb_event_parse(r.payloads[2]);
    ASSERT_EQ(second.scalars.size(), 1u);
    EXPECT_EQ(second.scalars[0].first, "train/fvu");
    EXPECT_EQ(second.scalars[0].second, 2.0f);
    EXPECT_EQ(second.wall_time, 20.0);
    const std::vector<fs::path> b = event_files(dir / "topk-x4-k8-lr0.001");
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(tb_event_parse(tfrecord_read(b[0].string()).payloads[1]).scalars[0].first,
              "train/dead_frac");
    EXPECT_FALSE(tensorboard_split_legacy(dir.string(), ids));  // nothing left to split
}
