// LoRA dropout (policy.lora.dropout): the mask's rate and scale, off by default and when not armed
// (the model's bits unchanged), the same seed giving the same bits, only the training calls
// dropping, finite-difference gradients under one fixed mask, and the device path bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lora_test_models.h"
#include "troupe/kernels/backend.h"

namespace troupe::policy {
namespace {

PackedBatch sample_batch(int V) { return test::random_batch(V, {6, 2, 9}, 5); }
const auto& kNoExperts = test::kLoraNoExperts;
using test::grads_of;
using test::lora_model;

using test::tiny_family;

LoraConfig lora(float dropout, std::vector<LoraTarget> targets = kNoExperts) {
  LoraConfig l;
  l.rank = 2;
  l.alpha = 16;
  l.dropout = dropout;
  l.targets = std::move(targets);
  return l;
}

TEST(LoraDropout, MaskRateAndScale) {
  const size_t n = 200000;
  std::vector<float> x(n, 2.0f), y(n);
  kernels::cpu_backend().lora_dropout(y.data(), x.data(), n, 0.25f, 99);
  size_t zeros = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++zeros;
    } else {
      ASSERT_EQ(v, 2.0f * (1.0f / 0.75f));
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / n, 0.25, 0.005);
  std::vector<float> again(n), other(n);
  kernels::cpu_backend().lora_dropout(again.data(), x.data(), n, 0.25f, 99);
  kernels::cpu_backend().lora_dropout(other.data(), x.data(), n, 0.25f, 100);
  EXPECT_EQ(y, again);
  EXPECT_NE(y, other);
  std::vector<float> none(n);
  kernels::cpu_backend().lora_dropout(none.data(), x.data(), n, 0.0f, 99);
  EXPECT_EQ(none, x);
}

// dropout 0, or dropout > 0 but not armed: the model's bits are those of a model without dropout.
TEST(LoraDropout, OffOrUnarmedChangesNothing) {
  const ModelConfig c = tiny_family("qwen2");
  const PackedBatch b = sample_batch(c.vocab_size);
  Model plain = lora_model(c, lora(0.0f));
  double l0 = 0;
  const auto g0 = grads_of(plain, b, &l0);
  Model zero = lora_model(c, lora(0.0f));
  zero.set_lora_dropout(true, 123);  // a no-op at dropout 0
  Model unarmed = lora_model(c, lora(0.3f));
  for (Model* m : {&zero, &unarmed}) {
    double l = 0;
    EXPECT_EQ(grads_of(*m, b, &l), g0);
    EXPECT_EQ(l, l0);
  }
  // Armed, then disarmed: back to the same bits.
  unarmed.set_lora_dropout(true, 5);
  double l = 0;
  EXPECT_NE(grads_of(unarmed, b, &l), g0);
  unarmed.set_lora_dropout(false);
  EXPECT_EQ(grads_of(unarmed, b, &l), g0);
  EXPECT_EQ(l, l0);
}

// Armed: the same seed gives the same bits, another seed others; forward_logits never drops.
TEST(LoraDropout, SeededAndTrainingCallsOnly) {
  const ModelConfig c = tiny_family("llama");
  const PackedBatch b = sample_batch(c.vocab_size);
  Model m = lora_model(c, lora(0.4f));
  std::vector<float> logits0(b.tokens.size() * c.vocab_size), logits1(logits0.size());
  ASSERT_TRUE(m.forward_logits(b, logits0.data()).ok());
  m.set_lora_dropout(true, 11);
  const auto g1 = grads_of(m, b);
  const auto g1b = grads_of(m, b);
  EXPECT_EQ(g1, g1b);
  ASSERT_TRUE(m.forward_logits(b, logits1.data()).ok());
  EXPECT_EQ(logits0, logits1);
  m.set_lora_dropout(true, 12);
  EXPECT_NE(grads_of(m, b), g1);
  // Another model with the same weights and seed: the same masks.
  Model other = lora_model(c, lora(0.4f));
  other.set_lora_dropout(true, 11);
  EXPECT_EQ(grads_of(other, b), g1);
}

// Central differences of the loss under one fixed mask (seed): the gradients backward computes.
TEST(LoraDropout, FiniteDifferenceGradientsWithAFixedMask) {
  for (const char* fam : {"llama", "qwen3", "qwen2_moe"}) {
    const ModelConfig c = tiny_family(fam);
    Model m = lora_model(c, lora(0.3f));
    m.set_lora_dropout(true, 77);
    const PackedBatch b = sample_batch(c.vocab_size);
    const auto g = grads_of(m, b);
    EXPECT_GT(test::check_adapter_gradients(m, b, g, 2e-3, 2e-2, fam), 0);
  }
}

// Activation checkpointing (the backward's recompute draws the mask again), the packed-metadata
// switch and cpu_fenced give the plain path's bits under dropout.
TEST(LoraDropout, OptimizationsAndDevicePathMatch) {
  const ModelConfig c = tiny_family("qwen2_moe");
  const PackedBatch b = sample_batch(c.vocab_size);
  Model plain = lora_model(c, lora(0.2f));
  plain.set_lora_dropout(true, 3);
  double l0 = 0;
  const auto g0 = grads_of(plain, b, &l0);
  for (int variant = 0; variant < 3; ++variant) {
    ModelConfig v = c;
    if (variant == 0) v.activation_checkpointing = true;
    if (variant == 1) v.cache_packed_metadata = false;
    if (variant == 2) v.device = kernels::DeviceKind::cpu_fenced;
    Model m = lora_model(v, lora(0.2f));
    m.set_lora_dropout(true, 3);
    double l = 0;
    EXPECT_EQ(grads_of(m, b, &l), g0) << variant;
    EXPECT_EQ(l, l0) << variant;
  }
}

}  // namespace
}  // namespace troupe::policy
