// policy.memory_footprint: the planner's sizes (model_footprint, training_activations,
// inference_arena_floats) equal what a real Model allocates, for every family, with and without
// activation checkpointing, offload, LoRA and a chunked LM head.
#include "troupe/policy/memory_footprint.h"

#include <gtest/gtest.h>

#include "test_models.h"
#include "troupe/policy/model.h"

namespace troupe::policy {
namespace {

// Two sequences of 7 and 5 tokens: T = 12, the longest 7.
PackedBatch two_sequences() { return test::batch_of({{1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12}}); }

void expect_sizes_match(ModelConfig c) {
  auto fp = model_footprint(c);
  ASSERT_TRUE(fp.ok()) << fp.error().message;
  Model m = test::make(c);
  if (c.lora.enabled()) {
    EXPECT_EQ(m.base_params().size(), fp->param_floats);
    EXPECT_EQ(m.params().size(), fp->lora_floats);
  } else {
    EXPECT_EQ(m.params().size(), fp->param_floats);
    EXPECT_EQ(fp->lora_floats, 0u);
  }
  EXPECT_EQ(fp->kv_floats_per_token, 2ull * c.num_hidden_layers * c.num_key_value_heads * c.head_dim);
  const PackedBatch b = two_sequences();
  const int T = static_cast<int>(b.tokens.size());
  std::vector<float> logp(T), ent(T), d(T, 0.1f);
  ASSERT_TRUE(m.forward_train(b, 1.0f, logp.data(), ent.data()).ok());
  ASSERT_TRUE(m.backward_train(d.data(), d.data()).ok());
  auto acts = training_activations(c, kernels::cpu_backend(), T, 7);
  ASSERT_TRUE(acts.ok()) << acts.error().message;
  EXPECT_EQ(m.activation_peak_bytes(), (acts->arena_floats + acts->reload_floats) * sizeof(float));
  if (c.offload_activations) {
    EXPECT_EQ(acts->store_floats, static_cast<uint64_t>(c.num_hidden_layers) * T * c.hidden_size);
  }
}

TEST(MemoryFootprint, EqualsTheModelsAllocations) {
  for (const char* family : test::kAllFamilies) {
    SCOPED_TRACE(family);
    ModelConfig c = test::tiny_family(family);
    expect_sizes_match(c);
    c.activation_checkpointing = true;
    expect_sizes_match(c);
    c.offload_activations = true;
    expect_sizes_match(c);
    c.offload_double_buffer = false;
    expect_sizes_match(c);
  }
}

TEST(MemoryFootprint, LoraAndChunkedHead) {
  ModelConfig c = test::tiny_family("llama");
  c.logprob_chunk = 16;  // V = 37: three chunks
  expect_sizes_match(c);
  c.lora.rank = 4;
  expect_sizes_match(c);
  ModelConfig moe = test::tiny("qwen3_moe");
  moe.lora.rank = 2;
  moe.lora.targets = {LoraTarget::q, LoraTarget::v};
  expect_sizes_match(moe);
  auto fp = model_footprint(moe);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->moe_sink_floats, 4u * 16 + 3u * 4 * 12 * 16);  // E C + 3 E H C
}

TEST(MemoryFootprint, BadInputIsAnError) {
  ModelConfig c = test::tiny();
  c.num_key_value_heads = 3;  // does not divide 4 heads
  EXPECT_FALSE(model_footprint(c).ok());
  c = test::tiny();
  EXPECT_FALSE(training_activations(c, kernels::cpu_backend(), 4, 8).ok());  // a sequence longer than the batch
  c.lora.rank = 1000;
  EXPECT_FALSE(model_footprint(c).ok());
}

}  // namespace
}  // namespace troupe::policy
