// policy.gguf_quant: GGUF tensors as quantized matrices. On the fixtures of policy.gguf
// (tests/gguf/types.gguf, written by the `gguf` package) each block format keeps the stored bytes
// and dequantizes to GgufFile::read's values (== gguf.quants.dequantize) bit for bit; F32, F16,
// Q5_K and Q6_K are requantized; the tiny llama's projections load and multiply as their fp32
// import does; an unsupported type, a missing tensor, a vector and a 3-D tensor are errors naming
// the file and the tensor.
#include "troupe/policy/io/gguf_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "troupe/kernels/ops.h"
#include "troupe/policy/io/gguf_import.h"

namespace fs = std::filesystem;
namespace k = troupe::kernels;
using namespace troupe::policy::io;

namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_GGUF_FIXTURES");
  return (fs::path(dir ? dir : "tests/gguf") / name).string();
}

std::vector<float> dequantized(const k::QuantMatrix& m) {
  std::vector<float> w(static_cast<size_t>(m.rows) * m.cols);
  k::dequantize_rows(m.view(), 0, m.rows, w.data());
  return w;
}

TEST(GgufQuant, BlockFormatsKeepTheirBytesAndDequantizeBitForBit) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  const struct {
    const char* name;
    k::QuantFormat format;
  } cases[] = {{"q8_0", k::QuantFormat::q8_0}, {"q4_0", k::QuantFormat::q4_0}, {"q4_1", k::QuantFormat::q4_1},
               {"q4_k", k::QuantFormat::q4_k}, {"bf16", k::QuantFormat::bf16}};
  for (const auto& c : cases) {
    auto m = read_quant_matrix(f.value(), c.name);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const GgufTensorInfo* t = f.value().find(c.name);
    EXPECT_EQ(m.value().format, c.format);
    EXPECT_EQ(m.value().rows, 2);
    EXPECT_EQ(m.value().cols, 256);
    ASSERT_EQ(m.value().bytes.size(), t->nbytes);
    EXPECT_EQ(std::memcmp(m.value().bytes.data(), f.value().tensor_data(*t), t->nbytes), 0) << c.name;
    const auto ref = f.value().read(c.name).value(), expected = f.value().read(std::string(c.name) + ".expected").value();
    const auto got = dequantized(m.value());
    ASSERT_EQ(got.size(), ref.data.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data.data(), got.size() * 4), 0) << c.name << ": not GgufFile::read's bits";
    EXPECT_EQ(std::memcmp(got.data(), expected.data.data(), got.size() * 4), 0) << c.name << ": not the gguf package's bits";
  }
}

TEST(GgufQuant, OtherTypesAreRequantized) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok());
  for (const char* name : {"f32", "f16", "q5_k", "q6_k"}) {
    for (auto fallback : {k::QuantFormat::q8_0, k::QuantFormat::q4_k}) {
      auto m = read_quant_matrix(f.value(), name, fallback);
      ASSERT_TRUE(m.ok()) << m.error().message;
      EXPECT_EQ(m.value().format, fallback);
      const auto ref = f.value().read(name).value();
      const auto got = dequantized(m.value());
      double err = 0, amax = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - ref.data[i])), amax = std::max(amax, std::fabs(double(ref.data[i])));
      EXPECT_LE(err, (fallback == k::QuantFormat::q8_0 ? 0.01 : 0.2) * amax) << name;
    }
  }
  auto odd = read_quant_matrix(f.value(), "f32", k::QuantFormat::q4_k);
  ASSERT_TRUE(odd.ok());  // 256 columns: one q4_k block per row
}

TEST(GgufQuant, ErrorsNameTheFileAndTensor) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok());
  auto missing = read_quant_matrix(f.value(), "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("types.gguf: no tensor 'nope'"), std::string::npos) << missing.error().message;
  auto cube = read_quant_matrix(f.value(), "vec3d");
  ASSERT_FALSE(cube.ok());
  EXPECT_NE(cube.error().message.find("types.gguf: tensor 'vec3d' has 3 dimensions; a quantized matrix needs 2"),
            std::string::npos)
      << cube.error().message;
  auto u = GgufFile::open(fixture("unsupported.gguf"));
  ASSERT_TRUE(u.ok());
  auto q50 = read_quant_matrix(u.value(), "odd");
  ASSERT_FALSE(q50.ok());
  EXPECT_NE(q50.error().message.find("unsupported.gguf: tensor 'odd': tensor type Q5_0 cannot be held quantized"),
            std::string::npos)
      << q50.error().message;
  auto llama = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(llama.ok());
  auto norm = read_quant_matrix(llama.value(), "output_norm.weight");
  ASSERT_FALSE(norm.ok());
  EXPECT_NE(norm.error().message.find("tiny_llama.gguf: tensor 'output_norm.weight' has 1 dimensions"), std::string::npos);
}

// Every projection of the tiny llama (Q8_0, Q4_0, Q4_1 as stored, F16/F32 requantized to q8_0):
// y = x W^T through the quant op equals matmul_forward on the dequantized blocks, and for the
// stored formats on GgufFile::read's fp32 import.
TEST(GgufQuant, TinyLlamaProjectionsMultiplyAsTheirImport) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  int checked = 0;
  for (const auto& t : f.value().tensors()) {
    if (t.ne.size() != 2 || t.name.rfind("blk.", 0) != 0) continue;
    auto m = read_quant_matrix(f.value(), t.name);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const auto& q = m.value();
    const auto w = quant_format_of_ggml(t.type) ? f.value().read(t.name).value().data : dequantized(q);
    std::vector<float> x(static_cast<size_t>(q.cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
    std::vector<float> y(static_cast<size_t>(q.rows)), yref(y.size());
    k::quant_matmul_forward(y.data(), x.data(), q.view(), 1);
    k::matmul_forward(yref.data(), x.data(), w.data(), 1, q.cols, q.rows);
    EXPECT_EQ(std::memcmp(y.data(), yref.data(), y.size() * 4), 0) << t.name << " (" << ggml_type_name(t.type) << ")";
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

// llama's q/k: moving rows of blocks gives unpermute_qk's rows of values.
TEST(GgufQuant, UnpermuteQkMovesRowsOfBlocks) {
  auto f = GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(f.ok());
  const int64_t heads = f.value().get_int("llama.attention.head_count").value();
  auto m = read_quant_matrix(f.value(), "blk.0.attn_q.weight");
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto moved = unpermute_qk_rows(m.value(), heads, "q");
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  const Tensor before{{m.value().rows, m.value().cols}, dequantized(m.value())};
  const auto ref = unpermute_qk(before, heads, "q").value();
  EXPECT_EQ(dequantized(moved.value()), ref.data);
  auto bad = unpermute_qk_rows(m.value(), 7, "model.gguf: tensor 'blk.0.attn_q.weight'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("model.gguf: tensor 'blk.0.attn_q.weight': "), std::string::npos);
}

}  // namespace
