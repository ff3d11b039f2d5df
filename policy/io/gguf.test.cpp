// policy.gguf: the GGUF reader against files written by the `gguf` Python package
// (tests/gguf/make_fixtures.py): metadata of every value type, every tensor type equal to the
// package's own dequantization, alignment, and each corrupt-file path (an error naming the file).
#include "troupe/policy/io/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_temp_dir.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;

namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_GGUF_FIXTURES");
  return (fs::path(dir ? dir : "tests/gguf") / name).string();
}

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  auto p = (troupe::policy::io::testing::make_temp_dir("gguf", name) / "f.gguf").string();
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

template <class T>
void poke(std::string& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Opening must fail with a message naming the file and containing `what`.
void expect_open_error(const std::string& path, const std::string& what) {
  auto f = GgufFile::open(path);
  ASSERT_FALSE(f.ok()) << path;
  EXPECT_NE(f.error().message.find(path), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find(what), std::string::npos) << f.error().message;
}

}  // namespace

TEST(Gguf, MetadataOfEveryType) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(*f->get_string("general.architecture"), "test");
  EXPECT_EQ(*f->get_int("t.u8"), 200);
  EXPECT_EQ(*f->get_int("t.i8"), -100);
  EXPECT_EQ(*f->get_int("t.u16"), 60000);
  EXPECT_EQ(*f->get_int("t.i16"), -30000);
  EXPECT_EQ(*f->get_int("t.u32"), 4000000000LL);
  EXPECT_EQ(*f->get_int("t.i32"), -2000000000LL);
  EXPECT_EQ(*f->get_int("t.u64"), 10000000000000LL);
  EXPECT_EQ(*f->get_int("t.i64"), -10000000000000LL);
  EXPECT_EQ(*f->get_float("t.f32"), 0.15625);
  EXPECT_EQ(*f->get_float("t.f64"), -1.0e100);
  EXPECT_EQ(*f->get_bool("t.bool"), true);
  EXPECT_EQ(*f->get_string("t.str"), "h\u00e9llo \u4e16\u754c");
  EXPECT_EQ(*f->get_strings("t.strs"), (std::vector<std::string>{"a", "", "\u00fc\u00df"}));
  EXPECT_EQ(*f->get_ints("t.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->get_floats("t.floats"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(*f->get_ints("t.u8s"), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(f->get("t.bools")->array.size(), 2u);
  EXPECT_TRUE(f->get("t.bools")->array[0].b);
  // Wrong type and missing keys name the key and the file.
  auto wrong = f->get_string("t.u8");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("t.u8"), std::string::npos);
  EXPECT_NE(wrong.error().message.find("types.gguf"), std::string::npos);
  EXPECT_FALSE(f->get_int("no.such.key").ok());
}

TEST(Gguf, EveryTypeEqualsThePackagesDequantization) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  for (const char* name : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"}) {
    SCOPED_TRACE(name);
    auto got = f->read(name);
    ASSERT_TRUE(got.ok()) << got.error().message;
    auto want = f->read(std::string(name) + ".expected");
    ASSERT_TRUE(want.ok()) << want.error().message;
    EXPECT_EQ(got->shape, (std::vector<int64_t>{2, 256}));
    ASSERT_EQ(got->data.size(), want->data.size());
    size_t bad = 0;
    for (size_t k = 0; k < got->data.size(); ++k)
      if (!(std::fabs(got->data[k] - want->data[k]) <= 1e-6f * std::max(1.0f, std::fabs(want->data[k])))) ++bad;
    EXPECT_EQ(bad, 0u);
  }
  auto v = f->read("vec3d");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(f->find("vec3d")->ne, (std::vector<int64_t>{4, 3, 2}));
}

TEST(Gguf, UnsupportedTypeNamesTypeAndTensor) {
  auto f = GgufFile::open(fixture("unsupported.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto t = f->read("odd");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("Q5_0"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("'odd'"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("unsupported.gguf"), std::string::npos) << t.error().message;
  EXPECT_FALSE(f->read("absent").ok());
}

TEST(Gguf, TruncatedFilesAreErrors) {
  const std::string good = read_bytes(fixture("types.gguf"));
  ASSERT_GT(good.size(), 1000u);
  for (size_t n : {size_t{0}, size_t{3}, size_t{8}, size_t{20}, size_t{30}, size_t{100}, size_t{400}, size_t{1000},
                   good.size() / 2, good.size() - 100}) {
    SCOPED_TRACE(n);
    auto p = write_temp("trunc" + std::to_string(n), good.substr(0, n));
    auto f = GgufFile::open(p);
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.error().message.find(p), std::string::npos) << f.error().message;
  }
}

TEST(Gguf, CorruptHeadersAreErrors) {
  const std::string good = read_bytes(fixture("types.gguf"));
  {
    std::string b = good;
    b[0] = 'X';
    expect_open_error(write_temp("magic", b), "bad magic");
  }
  {
    std::string b = good;
    poke<uint32_t>(b, 4, 7);
    expect_open_error(write_temp("version", b), "version 7");
  }
  {
    std::string b = good;
    poke<uint64_t>(b, 8, uint64_t{1} << 50);
    expect_open_error(write_temp("ntensors", b), "tensor count");
  }
  {
    std::string b = good;
    poke<uint64_t>(b, 16, uint64_t{1} << 50);
    expect_open_error(write_temp("nkv", b), "metadata count");
  }
  {
    std::string b = good;
    poke<uint64_t>(b, 24, uint64_t{1} << 40);  // the first key's length
    expect_open_error(write_temp("strlen", b), "string length");
  }
  {
    std::string b = good;  // vec3d's info: name, n_dims, 3 dims, type, offset
    const size_t at = b.find("vec3d");
    ASSERT_NE(at, std::string::npos);
    poke<uint64_t>(b, at + 5 + 4 + 3 * 8 + 4, uint64_t{64} << 30);
    expect_open_error(write_temp("offset", b), "runs past the end");
  }
  expect_open_error("/nonexistent/x.gguf", "cannot open");
}
