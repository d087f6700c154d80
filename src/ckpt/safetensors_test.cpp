#include "ckpt/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/test_temp_dir.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file made of the given header text (length prefix added) and data bytes.
  std::string write_raw(const std::string& name, const std::string& header,
                        const std::vector<uint8_t>& data) {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    bytes += header;
    bytes.append(data.begin(), data.end());
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  static std::vector<uint8_t> read_all(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  foundry::testing::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

// The message of the Error that `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  std::vector<float> matrix(12);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = 0.5f * static_cast<float>(i) - 3.0f;
  matrix[3] = -0.0f;
  const std::vector<uint16_t> halves = {0x3f80, 0xbf80, 0x7fc0, 0x0001, 0xffff};
  const int64_t scalar = -1234567890123;
  const std::vector<TensorToWrite> tensors = {
      {"a.matrix", StDtype::F32, {3, 4}, matrix.data()},
      {"b.halves", StDtype::BF16, {5}, halves.data()},
      {"c.scalar", StDtype::I64, {}, &scalar},
      {"d.empty", StDtype::F32, {0, 7}, nullptr},
  };
  const std::string file = path("t.safetensors");
  const FileDigest digest = write_safetensors(file, tensors, {{"format", "pt"}, {"k", "v"}});

  const auto bytes = read_all(file);
  EXPECT_EQ(digest.bytes, bytes.size());
  EXPECT_EQ(digest.xxh3_64, hash64(bytes.data(), bytes.size()));

  SafetensorsReader reader(file);
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  ASSERT_EQ(reader.tensors().size(), 4u);
  const TensorView& m = reader.get("a.matrix");
  EXPECT_EQ(m.dtype, StDtype::F32);
  EXPECT_EQ(m.shape, (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(m.bytes, 48u);
  EXPECT_EQ(std::memcmp(m.data, matrix.data(), 48), 0);
  const TensorView& h = reader.get("b.halves");
  EXPECT_EQ(h.dtype, StDtype::BF16);
  ASSERT_EQ(h.bytes, 10u);
  EXPECT_EQ(std::memcmp(h.data, halves.data(), 10), 0);
  const TensorView& s = reader.get("c.scalar");
  EXPECT_TRUE(s.shape.empty());
  ASSERT_EQ(s.bytes, 8u);
  EXPECT_EQ(std::memcmp(s.data, &scalar, 8), 0);
  EXPECT_EQ(reader.get("d.empty").bytes, 0u);
  EXPECT_EQ(reader.find("missing"), nullptr);
  EXPECT_NE(error_of([&] { reader.get("missing"); }).find("missing"), std::string::npos);
}

// Reads the file byte by byte against the format, independently of the reader.
TEST_F(SafetensorsTest, FileLayoutFollowsTheSpec) {
  const std::vector<float> first = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<uint16_t> second = {7, 8, 9};
  const std::string file = path("spec.safetensors");
  write_safetensors(file,
                    {{"first", StDtype::F32, {2, 3}, first.data()},
                     {"second", StDtype::BF16, {3}, second.data()}},
                    {{"format", "pt"}});
  const auto bytes = read_all(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{bytes[i]} << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "data must start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 24 + 6);

  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
  EXPECT_EQ(header.front(), '{');
  const size_t json_end = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', json_end + 1), std::string::npos)
      << "only spaces may pad the header";
  const json parsed = json::parse(header);
  EXPECT_EQ(parsed["__metadata__"], json({{"format", "pt"}}));
  EXPECT_EQ(parsed["first"]["dtype"], "F32");
  EXPECT_EQ(parsed["first"]["shape"], json({2, 3}));
  EXPECT_EQ(parsed["first"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(parsed["second"]["dtype"], "BF16");
  EXPECT_EQ(parsed["second"]["shape"], json({3}));
  EXPECT_EQ(parsed["second"]["data_offsets"], json({24, 30}));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, first.data(), 24), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 24, second.data(), 6), 0);
}

TEST_F(SafetensorsTest, WriterRejectsRepeatedAndReservedNames) {
  const float x = 1;
  EXPECT_THROW(write_safetensors(path("r.safetensors"),
                                 {{"x", StDtype::F32, {1}, &x}, {"x", StDtype::F32, {1}, &x}}),
               Error);
  EXPECT_THROW(write_safetensors(path("r.safetensors"), {{"__metadata__", StDtype::F32, {1}, &x}}),
               Error);
  EXPECT_FALSE(fs::exists(path("r.safetensors")));
}

TEST_F(SafetensorsTest, StreamWriterWritesTheSameFileTensorByTensor) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<uint16_t> b = {7, 8, 9};
  const std::vector<TensorToWrite> tensors = {{"a", StDtype::F32, {2, 3}, a.data()},
                                              {"b", StDtype::BF16, {3}, b.data()}};
  const FileDigest whole =
      write_safetensors(path("whole.safetensors"), tensors, {{"format", "pt"}});
  SafetensorsStreamWriter writer(path("streamed.safetensors"),
                                 {{"a", StDtype::F32, {2, 3}}, {"b", StDtype::BF16, {3}}},
                                 {{"format", "pt"}});
  writer.write_tensor("a", a.data());
  writer.write_tensor("b", b.data());
  const FileDigest streamed = writer.finish();
  EXPECT_EQ(streamed.bytes, whole.bytes);
  EXPECT_EQ(streamed.xxh3_64, whole.xxh3_64);
}

TEST_F(SafetensorsTest, StreamWriterRemovesAnUnfinishedFile) {
  const float x = 1;
  {
    SafetensorsStreamWriter writer(path("s.safetensors"),
                                   {{"x", StDtype::F32, {1}}, {"y", StDtype::F32, {1}}});
    writer.write_tensor("x", &x);
    EXPECT_THROW(writer.write_tensor("x", &x), Error);  // out of order
    EXPECT_THROW(writer.finish(), Error);               // "y" never written
  }
  EXPECT_FALSE(fs::exists(path("s.safetensors")));
}

TEST_F(SafetensorsTest, ReaderAcceptsAHandWrittenFile) {
  // Two U8 tensors, the second zero-sized, no metadata, unpadded header.
  const std::string file = write_raw(
      "hand.safetensors",
      R"({"b":{"dtype":"U8","shape":[0],"data_offsets":[3,3]},)"
      R"("a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})",
      {1, 2, 3});
  SafetensorsReader reader(file);
  ASSERT_EQ(reader.tensors().size(), 2u);
  EXPECT_EQ(reader.tensors()[0].name, "a");
  EXPECT_EQ(reader.get("a").data[2], 3);
  EXPECT_TRUE(reader.metadata().empty());
}

TEST_F(SafetensorsTest, ReaderRejectsATruncatedFile) {
  std::vector<float> values(64, 1.0f);
  const std::string file = path("trunc.safetensors");
  write_safetensors(file, {{"w.first", StDtype::F32, {32}, values.data()},
                           {"w.last", StDtype::F32, {32}, values.data() + 32}});
  fs::resize_file(file, fs::file_size(file) - 1);
  const std::string message = error_of([&] { SafetensorsReader r(file); });
  EXPECT_NE(message.find(file), std::string::npos) << message;
  EXPECT_NE(message.find("w.last"), std::string::npos) << message;

  fs::resize_file(file, 5);
  EXPECT_NE(error_of([&] { SafetensorsReader r(file); }).find("too short"), std::string::npos);
}

TEST_F(SafetensorsTest, ReaderRejectsHeaderLengthBeyondFileSize) {
  const float x = 1;
  const std::string file = path("len.safetensors");
  write_safetensors(file, {{"x", StDtype::F32, {1}, &x}});
  auto bytes = read_all(file);
  bytes[0] = 0xff;
  bytes[3] = 0x01;  // ~16 MB
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  const std::string message = error_of([&] { SafetensorsReader r(file); });
  EXPECT_NE(message.find("header length"), std::string::npos) << message;
  EXPECT_NE(message.find(file), std::string::npos) << message;
}

TEST_F(SafetensorsTest, ReaderRejectsOverlappingOffsets) {
  const std::string file = write_raw(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::vector<uint8_t>(12));
  const std::string message = error_of([&] { SafetensorsReader r(file); });
  EXPECT_NE(message.find("overlap"), std::string::npos) << message;
  EXPECT_NE(message.find("'b'"), std::string::npos) << message;
  EXPECT_NE(message.find("'a'"), std::string::npos) << message;
}

TEST_F(SafetensorsTest, ReaderRejectsDtypeShapeMismatch) {
  const std::string file = write_raw(
      "mismatch.safetensors",
      R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", std::vector<uint8_t>(24));
  const std::string message = error_of([&] { SafetensorsReader r(file); });
  EXPECT_NE(message.find("'w'"), std::string::npos) << message;
  EXPECT_NE(message.find("needs 12 bytes"), std::string::npos) << message;
}

TEST_F(SafetensorsTest, ReaderRejectsMalformedHeaders) {
  struct Case {
    const char* header;
    size_t data_bytes;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4, "not valid JSON"},
      {R"([1, 2])", 0, "JSON object"},
      {R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "not a size"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "end before"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "reach past"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "belong to no tensor"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "after the last tensor"},
      {R"({"__metadata__":{"n":1}})", 0, "not a string"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4,
       "more than 2^64"},
  };
  for (const Case& c : cases) {
    const std::string file =
        write_raw("bad.safetensors", c.header, std::vector<uint8_t>(c.data_bytes));
    const std::string message = error_of([&] { SafetensorsReader r(file); });
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "header " << c.header << " gave: " << message;
  }
}

}  // namespace
}  // namespace foundry
