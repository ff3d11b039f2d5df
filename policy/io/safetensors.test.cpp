// policy.safetensors: round trips in F32/BF16/F16, shards, and every corrupt-file error path
// (each must name the file and, where there is one, the tensor).
#include "troupe/policy/io/safetensors.h"

#include <gtest/gtest.h>

#include "test_temp_dir.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace troupe::policy::io;

namespace {

fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("safetensors", name); }

TensorMap sample() {
  TensorMap m;
  m["a.weight"] = Tensor{{2, 3}, {1.0f, -2.0f, 3.5f, 0.0f, 1e-3f, -7.25f}};
  m["b"] = Tensor{{4}, {0.5f, 0.25f, -0.125f, 100.0f}};
  m["scalar"] = Tensor{{}, {42.0f}};
  return m;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A file with a hand-made header and `data_bytes` zero bytes of data.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  s += header;
  s += std::string(data_bytes, '\0');
  write_bytes(p, s);
}

void expect_error(const troupe::Error& e, const std::vector<std::string>& parts) {
  EXPECT_EQ(e.code, troupe::ErrorCode::invalid_input) << e.message;
  for (const auto& part : parts) EXPECT_NE(e.message.find(part), std::string::npos) << "'" << part << "' not in: " << e.message;
}

}  // namespace

TEST(Safetensors, RoundTripF32WithMetadata) {
  auto d = temp_dir("f32");
  auto path = (d / "m.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, sample(), {{"format", "pt"}}).ok());
  // The header length is a multiple of 8 and the JSON parses on its own.
  std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["a.weight"]["dtype"], "F32");

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->metadata().at("format"), "pt");
  auto all = read_safetensors(path);
  ASSERT_TRUE(all.ok());
  for (const auto& [name, t] : sample()) {
    ASSERT_TRUE(all->count(name)) << name;
    EXPECT_EQ(all->at(name).shape, t.shape);
    EXPECT_EQ(all->at(name).data, t.data);
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Safetensors, RoundTripBf16AndF16) {
  auto d = temp_dir("half");
  for (DType dt : {DType::bf16, DType::f16}) {
    auto path = (d / (std::string(dtype_name(dt)) + ".safetensors")).string();
    ASSERT_TRUE(write_safetensors(path, sample(), {}, dt).ok());
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(f->find("b")->dtype, dtype_name(dt));
    auto t = f->read("a.weight");
    ASSERT_TRUE(t.ok());
    const auto ref = sample()["a.weight"].data;
    const float rel = dt == DType::bf16 ? 1.0f / 128 : 1.0f / 1024;
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t->data[i], ref[i], std::fabs(ref[i]) * rel) << i;
    EXPECT_EQ(f->read("b")->data[3], 100.0f);
  }
}

TEST(Safetensors, HalfConversionsExactValues) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-3.0f), 0xc040);
  for (uint32_t h = 0; h < 0x7c00; ++h) EXPECT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h) << h;
}

TEST(Safetensors, MissingTensorNamesTensorAndFile) {
  auto d = temp_dir("missing");
  auto path = (d / "m.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, sample()).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  auto t = f->read("no.such.weight");
  ASSERT_FALSE(t.ok());
  expect_error(t.error(), {"no.such.weight", path, "missing"});
}

TEST(Safetensors, WrongShapeNamesBothShapes) {
  auto d = temp_dir("shape");
  auto path = (d / "m.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, sample()).ok());
  auto f = SafetensorsFile::open(path);
  auto t = f->read("a.weight", {3, 2});
  ASSERT_FALSE(t.ok());
  expect_error(t.error(), {"a.weight", path, "(2, 3)", "(3, 2)"});
  EXPECT_TRUE(f->read("a.weight", {2, 3}).ok());
}

TEST(Safetensors, UnsupportedDtypeNamesTensor) {
  auto d = temp_dir("dtype");
  auto p = d / "i64.safetensors";
  write_raw(p, R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
  auto f = SafetensorsFile::open(p.string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto t = f->read("ids");
  ASSERT_FALSE(t.ok());
  expect_error(t.error(), {"ids", p.string(), "I64"});
  // A dtype no one knows is a header error.
  write_raw(p, R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2);
  auto g = SafetensorsFile::open(p.string());
  ASSERT_FALSE(g.ok());
  expect_error(g.error(), {"'x'", "Q4", p.string()});
}

TEST(Safetensors, TruncatedDataNamesTensor) {
  auto d = temp_dir("trunc");
  auto path = d / "m.safetensors";
  ASSERT_TRUE(write_safetensors(path.string(), sample()).ok());
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 5));
  auto f = SafetensorsFile::open(path.string());
  ASSERT_FALSE(f.ok());
  expect_error(f.error(), {"truncated", path.string(), "'b'"});
}

TEST(Safetensors, TruncatedHeaderAndTinyFile) {
  auto d = temp_dir("trunch");
  auto path = d / "m.safetensors";
  ASSERT_TRUE(write_safetensors(path.string(), sample()).ok());
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, 20));
  auto f = SafetensorsFile::open(path.string());
  ASSERT_FALSE(f.ok());
  expect_error(f.error(), {"header length", path.string()});
  write_bytes(path, "abc");
  auto g = SafetensorsFile::open(path.string());
  ASSERT_FALSE(g.ok());
  expect_error(g.error(), {"truncated", path.string()});
  auto h = SafetensorsFile::open((d / "absent.safetensors").string());
  ASSERT_FALSE(h.ok());
  expect_error(h.error(), {"absent.safetensors", "cannot open"});
}

TEST(Safetensors, BadHeaders) {
  auto d = temp_dir("badh");
  auto p = d / "m.safetensors";
  struct Case {
    std::string header;
    size_t data;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases = {
      {"{not json", 0, {"not JSON"}},
      {"[1,2]", 0, {"JSON object"}},
      {R"({"w":{"dtype":"F32","shape":[2]}})", 8, {"'w'", "data_offsets"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, {"'w'", "needs 8"}},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"'w'", "negative"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"'w'", "end < begin"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":1}})", 8, {"__metadata__"}},
  };
  for (const auto& c : cases) {
    write_raw(p, c.header, c.data);
    auto f = SafetensorsFile::open(p.string());
    ASSERT_FALSE(f.ok()) << c.header;
    auto parts = c.parts;
    parts.push_back(p.string());
    expect_error(f.error(), parts);
  }
  // A huge header length is caught before any allocation of that size.
  std::string s(8, '\xff');
  write_bytes(p, s + "{}");
  auto f = SafetensorsFile::open(p.string());
  ASSERT_FALSE(f.ok());
  expect_error(f.error(), {"header length"});
}

TEST(Safetensors, ShardedIndex) {
  auto d = temp_dir("shards");
  TensorMap a, b;
  a["x"] = Tensor{{2}, {1, 2}};
  b["y"] = Tensor{{1, 2}, {3, 4}};
  ASSERT_TRUE(write_safetensors((d / "model-00001-of-00002.safetensors").string(), a).ok());
  ASSERT_TRUE(write_safetensors((d / "model-00002-of-00002.safetensors").string(), b).ok());
  nlohmann::json idx = {{"metadata", {{"total_size", 16}}},
                        {"weight_map", {{"x", "model-00001-of-00002.safetensors"}, {"y", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(d / "model.safetensors.index.json") << idx.dump();
  auto w = WeightSource::open_dir(d.string());
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(w->read("y")->data, (std::vector<float>{3, 4}));
  EXPECT_NE(w->file_of("y").find("00002"), std::string::npos);
  auto m = w->read("z");
  ASSERT_FALSE(m.ok());
  expect_error(m.error(), {"'z'", "model.safetensors.index.json"});

  // An index naming a tensor its shard lacks.
  idx["weight_map"]["q"] = "model-00001-of-00002.safetensors";
  std::ofstream(d / "model.safetensors.index.json") << idx.dump();
  auto bad = WeightSource::open_dir(d.string());
  ASSERT_FALSE(bad.ok());
  expect_error(bad.error(), {"'q'", "model-00001-of-00002.safetensors"});

  auto none = WeightSource::open_dir((d / "nowhere").string());
  ASSERT_FALSE(none.ok());
  expect_error(none.error(), {"model.safetensors"});
}
