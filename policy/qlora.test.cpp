// QLoRA (policy.base_dtype): a quantized frozen base under LoRA adapters. Forward and adapter
// gradients against the fp32 model holding the dequantized base, finite differences of the adapter
// gradients through the quantized base, the fresh init's draws, a GGUF loaded straight into its
// blocks against its fp32 import, determinism, and every refused configuration naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "test_models.h"
#include "troupe/policy/io/gguf_quant.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::policy {
namespace {

namespace fs = std::filesystem;
using test::batch_of;

// A dense llama-family model whose widths are multiples of 256 (q4_k's block): 2 layers.
ModelConfig qcfg(BaseDtype d, int rank = 4) {
  ModelConfig c;
  c.family = ModelFamily::qwen3;
  c.vocab_size = 61;
  c.hidden_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.num_experts = 0;
  c.base_dtype = d;
  c.lora.rank = rank;
  c.lora.alpha = 8;
  return c;
}

PackedBatch sample_batch(int V, const std::vector<int>& lens = {7, 3, 12}) { return test::random_batch(V, lens, 5); }

// Nonzero B (a fresh one is zero) and a larger A, the same for every model of a test.
void randomize_adapters(Model& m, unsigned seed = 3) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  auto p = m.params();
  for (float& x : p) x = d(g);
}

Model create(const ModelConfig& c, uint64_t seed = 11) {
  auto m = Model::create(c, seed);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return std::move(m.value());
}

// The fp32 model (LoRA, same adapters) whose base holds `q`'s base dequantized.
Model dequantized_twin(const Model& q) {
  ModelConfig c = q.config();
  c.base_dtype = BaseDtype::fp32;
  Model f = create(c);
  std::vector<float> flat(f.base_params().begin(), f.base_params().end());
  for (const TensorSpec& spec : f.base_tensors()) {
    const TensorSpec* qs = q.find_base_tensor(spec.name);
    EXPECT_TRUE(qs) << spec.name;
    auto v = q.base_tensor_values(*qs);
    EXPECT_TRUE(v.ok()) << v.error().message;
    std::copy(v->begin(), v->end(), flat.begin() + static_cast<std::ptrdiff_t>(spec.offset));
  }
  EXPECT_TRUE(f.set_base_params(flat).ok());
  EXPECT_TRUE(f.set_params(q.params()).ok());
  return f;
}

double run_loss(Model& m, const PackedBatch& b, bool backward) { return test::weighted_loss(m, b, 1.0f, backward); }

// The base's linear weights are blocks, everything else stays in the fp32 arena.
TEST(QLora, QuantizedTensorsAreBlocksOnly) {
  Model q = create(qcfg(BaseDtype::q4_k));
  Model f = create(qcfg(BaseDtype::fp32));
  EXPECT_TRUE(q.base_quantized());
  EXPECT_FALSE(f.base_quantized());
  size_t quantized = 0, floats = 0;
  for (const auto& t : q.base_tensors()) (t.quantized ? quantized : floats) += t.numel();
  EXPECT_EQ(floats, q.base_params().size());
  EXPECT_EQ(quantized + floats, f.base_params().size());
  EXPECT_EQ(q.base_tensors().size(), f.base_tensors().size());
  EXPECT_TRUE(q.find_base_tensor("model.layers.1.mlp.down_proj.weight")->quantized);
  EXPECT_FALSE(q.find_base_tensor("model.embed_tokens.weight")->quantized);
  auto m = q.base_quant_matrix("model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->format, kernels::QuantFormat::q4_k);
  EXPECT_EQ(m->rows, 256);
  // The fresh init draws what the fp32 init draws, quantized: non-quantized tensors bit for bit,
  // but the LM head, whose fp32 values are its sampling blocks' (q8_0) dequantized.
  for (const auto& t : q.base_tensors()) {
    if (t.quantized || t.name == "lm_head.weight") continue;
    const TensorSpec* ft = f.find_base_tensor(t.name);
    EXPECT_TRUE(std::equal(q.base_params().begin() + t.offset, q.base_params().begin() + t.offset + t.numel(),
                           f.base_params().begin() + ft->offset))
        << t.name;
  }
  const TensorSpec* fq = f.find_base_tensor("model.layers.1.mlp.up_proj.weight");
  auto want = kernels::quantize_rows(kernels::QuantFormat::q4_k, f.base_params().data() + fq->offset, 512, 256);
  auto have = q.base_quant_matrix("model.layers.1.mlp.up_proj.weight");
  ASSERT_TRUE(want.ok() && have.ok());
  EXPECT_EQ(want->bytes, have->bytes);
  const TensorSpec* fh = f.find_base_tensor("lm_head.weight");
  auto head = q.base_quant_matrix("lm_head.weight");
  auto head_want = kernels::quantize_rows(kernels::QuantFormat::q8_0, f.base_params().data() + fh->offset, 61, 256);
  ASSERT_TRUE(head.ok() && head_want.ok());
  EXPECT_EQ(head->bytes, head_want->bytes);
  auto head_values = q.base_tensor_values(*q.find_base_tensor("lm_head.weight"));
  std::vector<float> deq(61 * 256);
  kernels::dequantize_rows(head->view(), 0, 61, deq.data());
  EXPECT_EQ(*head_values, deq);
}

// Forward log-probs and adapter gradients equal the fp32 model holding the dequantized base: the
// same weights, only the GEMMs' summation order may differ (T <= 64: the quantized ops take
// gemm_blocked's paths, kernels/README.md), so 1e-5 relative is fp32 rounding, not the format.
TEST(QLora, MatchesTheDequantizedFp32Model) {
  for (BaseDtype d : {BaseDtype::bf16, BaseDtype::q8_0, BaseDtype::q4_k}) {
    Model q = create(qcfg(d));
    randomize_adapters(q);
    Model f = dequantized_twin(q);
    for (const auto& lens : {std::vector<int>{7, 3, 12}, std::vector<int>{40, 50}}) {  // 22 and 90 tokens
      PackedBatch b = sample_batch(61, lens);
      q.zero_grads();
      f.zero_grads();
      const double lq = run_loss(q, b, true), lf = run_loss(f, b, true);
      EXPECT_NEAR(lq, lf, 1e-5 * (1 + std::fabs(lf))) << enum_string(d);
      auto gq = q.grads(), gf = f.grads();
      ASSERT_EQ(gq.size(), gf.size());
      double num = 0, den = 0;
      for (size_t i = 0; i < gq.size(); ++i) {
        num += (double(gq[i]) - gf[i]) * (double(gq[i]) - gf[i]);
        den += double(gf[i]) * gf[i];
      }
      EXPECT_GT(den, 0);
      EXPECT_LT(std::sqrt(num / den), 1e-5) << enum_string(d) << " T=" << b.tokens.size();
    }
  }
}

// Against the unquantized fp32 model the difference is the format's rounding: bf16 (8 bits of
// mantissa) < q8_0 (127 steps per block of 32) < q4_k (15 steps per sub-block of 32), all small.
TEST(QLora, FormatErrorIsOrderedAndSmall) {
  Model f = create(qcfg(BaseDtype::fp32));
  randomize_adapters(f);
  PackedBatch b = sample_batch(61);
  const size_t T = b.tokens.size();
  std::vector<float> ref(T), ent(T);
  ASSERT_TRUE(f.forward_train(b, 1.0f, ref.data(), ent.data()).ok());
  std::vector<double> err;
  for (BaseDtype d : {BaseDtype::bf16, BaseDtype::q8_0, BaseDtype::q4_k}) {
    Model q = create(qcfg(d));
    ASSERT_TRUE(q.set_params(f.params()).ok());
    std::vector<float> lp(T);
    ASSERT_TRUE(q.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
    double e = 0;
    for (size_t t = 0; t < T; ++t) e = std::max(e, std::fabs(double(lp[t]) - ref[t]));
    err.push_back(e);
  }
  EXPECT_LT(err[0], err[1] * 1.5);  // bf16's 2^-9 relative vs q8_0's up to amax/254: comparable
  EXPECT_LT(err[1], err[2]);
  // q4_k's step on N(0, 0.02) weights is ~(max - min) / 15 of a sub-block, ~0.007: half of it is
  // ~15% of a weight's spread, so log-probs move by up to ~0.1 nats in this 2-layer model.
  EXPECT_LT(err[2], 0.25);
}

// Central differences of the adapters' gradients through a q4_k base.
TEST(QLora, FiniteDifferenceAdapterGradients) {
  Model m = create(qcfg(BaseDtype::q4_k, 2));
  randomize_adapters(m);
  PackedBatch b = sample_batch(61);
  m.zero_grads();
  run_loss(m, b, true);
  std::vector<float> g(m.grads().begin(), m.grads().end());
  std::mt19937 r(13);
  for (const auto& t : m.tensors())
    for (int rep = 0; rep < 2; ++rep) {
      const size_t i = t.offset + r() % t.numel();
      const float orig = m.params()[i], h = 2e-3f;
      m.params()[i] = orig + h;
      const double lp = run_loss(m, b, false);
      m.params()[i] = orig - h;
      const double lm = run_loss(m, b, false);
      m.params()[i] = orig;
      const double num = (lp - lm) / (2 * h);
      EXPECT_TRUE(std::isfinite(g[i]));
      EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << t.name;
    }
}

// Same seed, same steps: bit-identical adapters; the base never moves.
TEST(QLora, SeededStepsAreBitIdentical) {
  auto train = [](uint64_t seed) {
    Model m = create(qcfg(BaseDtype::q8_0), seed);
    PackedBatch b = sample_batch(61);
    for (int step = 0; step < 3; ++step) {
      m.zero_grads();
      run_loss(m, b, true);
      auto p = m.params();
      auto g = m.grads();
      for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.5f * g[i];
    }
    return m;
  };
  Model a = train(11), b = train(11);
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  auto qa = a.base_quant_matrix("model.layers.0.mlp.gate_proj.weight");
  Model fresh = create(qcfg(BaseDtype::q8_0), 11);
  auto qf = fresh.base_quant_matrix("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(qa->bytes, qf->bytes);
  std::vector<float> pa(a.params().begin(), a.params().end()), pf(fresh.params().begin(), fresh.params().end());
  EXPECT_NE(pa, pf);
}

// Sampling through a quantized base: the KV-cache decode samples what the packed forward scores.
TEST(QLora, GenerateMatchesForward) {
  Model m = create(qcfg(BaseDtype::q4_k));
  randomize_adapters(m);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.max_new_tokens = 6;
  sp.seed = 4;
  auto g = m.generate({{1, 2, 3}, {4, 5}}, sp);
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<int32_t> seq = {1, 2, 3};
  seq.insert(seq.end(), (*g)[0].tokens.begin(), (*g)[0].tokens.end());
  PackedBatch b = batch_of({seq});
  std::vector<float> lp(seq.size()), ent(seq.size());
  ASSERT_TRUE(m.forward_train(b, 1.0f, lp.data(), ent.data()).ok());
  for (size_t i = 0; i < (*g)[0].tokens.size(); ++i) EXPECT_NEAR((*g)[0].logprobs[i], lp[2 + i], 1e-4);
}

// Exact on-policy through a quantized base with adapters on every projection: in batch-invariant
// mode the KV-cache decode (its projection groups: the base's chains and the adapters' low-rank
// products in one region, 1 and 2 rows per step; q8_0's head blocks) gives the log-probs the
// learner's packed forward recomputes, bit for bit, for every block format of the base.
TEST(QLora, BatchInvariantDecodeIsTheRecomputeBitForBit) {
  for (BaseDtype d : {BaseDtype::q8_0, BaseDtype::q4_k, BaseDtype::bf16}) {
    ModelConfig c = qcfg(d, 8);
    c.batch_invariant = true;
    Model m = create(c);
    randomize_adapters(m);
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4, 5}, {9}};
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.max_new_tokens = 7;
    sp.seed = 8;
    auto g = m.generate(prompts, sp);
    ASSERT_TRUE(g.ok()) << g.error().message;
    std::vector<std::vector<int32_t>> full;
    for (size_t i = 0; i < prompts.size(); ++i) {
      full.push_back(prompts[i]);
      full.back().insert(full.back().end(), (*g)[i].tokens.begin(), (*g)[i].tokens.end());
    }
    PackedBatch b = batch_of(full);
    std::vector<float> lp(b.tokens.size());
    ASSERT_TRUE(m.forward_train(b, 1.0f, lp.data(), nullptr).ok());
    for (size_t i = 0; i < prompts.size(); ++i)
      for (size_t j = 0; j < (*g)[i].tokens.size(); ++j)
        ASSERT_EQ((*g)[i].logprobs[j], lp[b.cu_seqlens[i] + prompts[i].size() - 1 + j])
            << enum_string(d) << " seq " << i << " token " << j;
  }
}

// The device path (cpu_fenced: blocks in device memory) is the cpu backend's bit for bit.
TEST(QLora, FencedBackendBitForBit) {
  ModelConfig c = qcfg(BaseDtype::q4_k);
  Model a = create(c);
  c.device = kernels::DeviceKind::cpu_fenced;
  Model b = create(c);
  randomize_adapters(a);
  ASSERT_TRUE(b.set_params(a.params()).ok());
  PackedBatch batch = sample_batch(61);
  a.zero_grads();
  b.zero_grads();
  EXPECT_EQ(run_loss(a, batch, true), run_loss(b, batch, true));
  std::vector<float> ga(a.grads().begin(), a.grads().end()), gb(b.grads().begin(), b.grads().end());
  EXPECT_EQ(ga, gb);
}

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TROUPE_GGUF_FIXTURES");
  return (fs::path(dir ? dir : "tests/gguf") / name).string();
}

void use_temp_cache() {
  static const fs::path dir = fs::temp_directory_path() / ("troupe_qlora_cache_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ::setenv("TROUPE_CACHE", dir.c_str(), 1);
}

// A GGUF straight into its blocks (llama: q/k un-permuted) computes what its fp32 import computes
// with the same blocks dequantized; the blocks stored as Q8_0/Q4_0/Q4_1 dequantize to the import's
// values bit for bit; F32/F16 projections are requantized into q8_0.
TEST(QLora, GgufStraightLoadEqualsDequantizedImport) {
  use_temp_cache();
  for (const char* file : {"tiny_llama.gguf", "tiny_qwen3.gguf"}) {
    ExecutionOptions x;
    x.base_dtype = BaseDtype::gguf;
    auto q = io::load_model(fixture(file), x);
    ASSERT_TRUE(q.ok()) << q.error().message;
    auto imp = io::load_model(fixture(file));
    ASSERT_TRUE(imp.ok()) << imp.error().message;
    Model& qm = q->model;
    Model& fm = imp->model;
    EXPECT_TRUE(qm.base_quantized());
    auto gguf = io::GgufFile::open(fixture(file));
    ASSERT_TRUE(gguf.ok());
    std::vector<float> flat(fm.params().begin(), fm.params().end());
    int exact = 0;
    for (const TensorSpec& spec : fm.tensors()) {
      const TensorSpec* qs = qm.find_base_tensor(spec.name);
      ASSERT_TRUE(qs) << spec.name;
      auto v = qm.base_tensor_values(*qs);
      ASSERT_TRUE(v.ok()) << v.error().message;
      const float* want = fm.params().data() + spec.offset;
      // stored blocks and fp32 tensors equal the import bit for bit; F32/F16 projections are
      // requantized into q8_0 (within half a step d / 2, d = amax / 127 of the block rounded to fp16)
      const bool same = std::equal(v->begin(), v->end(), want);
      if (same) ++exact;
      float amax = 0;
      for (size_t i = 0; i < v->size(); ++i) amax = std::max(amax, std::fabs(want[i]));
      for (size_t i = 0; i < v->size(); ++i) ASSERT_NEAR((*v)[i], want[i], amax / 127 * 0.51f + 1e-6f) << spec.name;
      std::copy(v->begin(), v->end(), flat.begin() + static_cast<std::ptrdiff_t>(spec.offset));
    }
    EXPECT_GT(exact, static_cast<int>(fm.tensors().size()) / 2) << file;
    ASSERT_TRUE(fm.set_params(flat).ok());
    PackedBatch b = sample_batch(fm.config().vocab_size);
    std::vector<float> lq(b.tokens.size() * fm.config().vocab_size), lf(lq.size());
    ASSERT_TRUE(qm.forward_logits(b, lq.data()).ok());
    ASSERT_TRUE(fm.forward_logits(b, lf.data()).ok());
    for (size_t i = 0; i < lq.size(); ++i) ASSERT_NEAR(lq[i], lf[i], 1e-5 * (1 + std::fabs(lf[i]))) << file << " " << i;
  }
}

// Each stored Q8_0/Q4_0/Q4_1 projection keeps the file's bytes (q/k: rows moved, never re-blocked).
TEST(QLora, GgufKeepsTheFileBlocks) {
  use_temp_cache();
  ExecutionOptions x;
  x.base_dtype = BaseDtype::gguf;
  auto q = io::load_model(fixture("tiny_llama.gguf"), x);
  ASSERT_TRUE(q.ok()) << q.error().message;
  auto gguf = io::GgufFile::open(fixture("tiny_llama.gguf"));
  ASSERT_TRUE(gguf.ok());
  for (const auto& [g, hf] : {std::pair{"blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"},
                              std::pair{"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
                              std::pair{"blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"}}) {
    auto want = io::read_quant_matrix(*gguf, g);
    auto have = q->model.base_quant_matrix(hf);
    ASSERT_TRUE(want.ok() && have.ok()) << hf;
    EXPECT_EQ(want->format, have->format) << hf;
    EXPECT_EQ(want->bytes, have->bytes) << hf;
  }
}

// Refused configurations name policy.base_dtype.
TEST(QLora, BadInputNamesTheKey) {
  // full fine-tuning of a quantized base
  Model m = create(qcfg(BaseDtype::q8_0, 0));
  PackedBatch b = sample_batch(61);
  std::vector<float> lp(b.tokens.size()), ent(lp.size()), d(lp.size(), 1.0f);
  ASSERT_TRUE(m.forward_train(b, 1.0f, lp.data(), ent.data()).ok());  // scoring and sampling are fine
  Status s = m.backward_train(d.data(), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("policy.base_dtype: q8_0: a quantized base is frozen"), std::string::npos)
      << s.error().message;
  // q4_k on a width that is not a multiple of 256
  ModelConfig c = qcfg(BaseDtype::q4_k);
  c.hidden_size = 96, c.head_dim = 24;
  auto bad = Model::create(c, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("policy.base_dtype: q4_k: model.layers.0.self_attn.q_proj.weight"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("not a multiple of the 256-value block"), std::string::npos);
  // gguf without a .gguf file: a fresh model has no blocks; a model directory is refused
  auto fresh = Model::create(qcfg(BaseDtype::gguf), 1);
  ASSERT_TRUE(fresh.ok());
  std::vector<float> logits(b.tokens.size() * 61);
  Status f = fresh->forward_logits(b, logits.data());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("policy.base_dtype: gguf: base tensor model.layers.0.self_attn.q_proj.weight was never loaded"),
            std::string::npos)
      << f.error().message;
  ExecutionOptions x;
  x.base_dtype = BaseDtype::gguf;
  auto dir = io::load_model("/nonexistent/model_dir", x);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().message.find("policy.base_dtype: gguf keeps the blocks of a .gguf policy.path; /nonexistent/model_dir is not a .gguf file"),
            std::string::npos)
      << dir.error().message;
  // the names
  EXPECT_FALSE(enum_from_name<BaseDtype>("q3_x").has_value());
  EXPECT_EQ(enum_string(BaseDtype::q4_k), "q4_k");
}

}  // namespace
}  // namespace troupe::policy
