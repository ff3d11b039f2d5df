// policy.decode_graph: when a decode step is recorded as a graph and replayed (decode_graph.h),
// host decisions only: eager until the key settles, recorded once, replayed while the key holds;
// any change of rows, cache length, weights or a device buffer is a new key; the least recently
// used graph is evicted; a failed recording turns graphs off; a refused replay settles again.
// Also: on the CPU backends (no graphs) decode with policy.decode_graphs on equals it off.
#include <gtest/gtest.h>

#include "decode_graph.h"
#include "troupe/policy/decode_slots.h"
#include "troupe/policy/model.h"

using namespace troupe;
using namespace troupe::policy;
using A = DecodeGraphAction;

namespace {
int buf[4];
DecodeGraphKey key(int rows, int cache = 64, uint64_t weights = 1, const void* b = &buf[0]) {
  return DecodeGraphKey{rows, cache, weights, {b, &buf[1]}};
}
}  // namespace

TEST(DecodeGraph, SettlesRecordsThenReplays) {
  DecodeGraphPlan plan(true);
  EXPECT_EQ(plan.next(key(4)).action, A::eager);  // first sight
  const auto rec = plan.next(key(4));
  EXPECT_EQ(rec.action, A::record);
  for (int i = 0; i < 3; ++i) {
    const auto r = plan.next(key(4));
    EXPECT_EQ(r.action, A::replay);
    EXPECT_EQ(r.id, rec.id);
  }
  // Each part of the key is a new key: eager, then recorded under a new id.
  for (const DecodeGraphKey& k : {key(3), key(4, 128), key(4, 64, 2), key(4, 64, 1, &buf[2])}) {
    EXPECT_EQ(plan.next(k).action, A::eager);
    const auto r = plan.next(k);
    EXPECT_EQ(r.action, A::record);
    EXPECT_NE(r.id, rec.id);
  }
  EXPECT_EQ(plan.next(key(4)).action, A::replay);  // the old one is still held
  EXPECT_EQ(plan.graphs(), 5u);
}

TEST(DecodeGraph, UnsettledKeysStayEager) {
  DecodeGraphPlan plan(true, 3);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(plan.next(key(1 + i % 2)).action, A::eager);  // alternating: never settles
  EXPECT_EQ(plan.next(key(7)).action, A::eager);
  EXPECT_EQ(plan.next(key(7)).action, A::eager);
  EXPECT_EQ(plan.next(key(7)).action, A::record);
}

TEST(DecodeGraph, EvictsTheLeastRecentlyUsed) {
  DecodeGraphPlan plan(true, 1, 2);
  const auto a = plan.next(key(1)), b = plan.next(key(2));
  ASSERT_EQ(a.action, A::record);
  ASSERT_EQ(b.action, A::record);
  EXPECT_EQ(plan.next(key(1)).action, A::replay);  // 1 is now more recent than 2
  const auto c = plan.next(key(3));
  EXPECT_EQ(c.action, A::record);
  ASSERT_EQ(c.drop.size(), 1u);
  EXPECT_EQ(c.drop[0], b.id);
  EXPECT_EQ(plan.next(key(1)).action, A::replay);
  EXPECT_EQ(plan.graphs(), 2u);
}

TEST(DecodeGraph, FailedRecordingTurnsGraphsOff) {
  DecodeGraphPlan plan(true, 1);
  const auto a = plan.next(key(1));
  const auto b = plan.next(key(2));
  const auto dropped = plan.record_failed(b.id, "operation not permitted when stream is capturing");
  EXPECT_EQ(dropped.size(), 2u);
  EXPECT_FALSE(plan.enabled());
  EXPECT_EQ(plan.why_off(), "operation not permitted when stream is capturing");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plan.next(key(1)).action, A::eager);
  (void)a;
  DecodeGraphPlan off(false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(off.next(key(1)).action, A::eager);
}

TEST(DecodeGraph, RefusedReplaySettlesAgain) {
  DecodeGraphPlan plan(true);
  plan.next(key(4));
  const auto rec = plan.next(key(4));
  ASSERT_EQ(rec.action, A::record);
  plan.replay_refused(rec.id);  // (the backend's workspaces moved)
  EXPECT_EQ(plan.graphs(), 0u);
  EXPECT_EQ(plan.next(key(4)).action, A::eager);
  EXPECT_EQ(plan.next(key(4)).action, A::record);
}

// The CPU backends record no graphs: decode with the switch on is decode with it off, bit for bit.
TEST(DecodeGraph, CpuBackendsIgnoreTheSwitch) {
  for (auto device : {kernels::DeviceKind::cpu, kernels::DeviceKind::cpu_fenced}) {
    std::vector<std::vector<SlotToken>> runs;
    for (bool graphs : {true, false}) {
      ModelConfig mc;
      mc.vocab_size = 32;
      mc.hidden_size = 16;
      mc.num_hidden_layers = 2;
      mc.num_attention_heads = 2;
      mc.num_key_value_heads = 1;
      mc.head_dim = 8;
      mc.intermediate_size = 32;
      mc.device = device;
      mc.decode_graphs = graphs;
      auto m = Model::create(mc, 3);
      ASSERT_TRUE(m.ok()) << m.error().message;
      EXPECT_FALSE(m->backend().supports_graphs());
      EXPECT_FALSE(m->backend().graph_begin().ok());
      auto slots = DecodeSlots::create(*m, 2, 24, 16);
      ASSERT_TRUE(slots.ok()) << slots.error().message;
      SlotSampling sp;
      sp.temperature = 1.0f;
      sp.seed = 9;
      ASSERT_TRUE((*slots)->add({1, 2, 3}, sp).ok());
      ASSERT_TRUE((*slots)->add({4, 5}, sp).ok());
      std::vector<SlotToken> all;
      for (int s = 0; s < 8; ++s) {
        auto t = (*slots)->step();
        ASSERT_TRUE(t.ok()) << t.error().message;
        all.insert(all.end(), t->begin(), t->end());
      }
      runs.push_back(all);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_EQ(runs[0][i].token, runs[1][i].token);
      EXPECT_EQ(runs[0][i].logprob, runs[1][i].logprob);
    }
  }
}
