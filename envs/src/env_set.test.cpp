// envs.env_set: weighted env choice is deterministic and follows the weights; SFT examples come
// from reference completions and score 1 with the env's own verifier.
#include "troupe/envs/env_set.h"

#include <gtest/gtest.h>

using namespace troupe::envs;

TEST(EnvSet, WeightedPick) {
  auto set = EnvSet::from_json(json::parse(R"([{"name": "arithmetic", "weight": 3},
                                                {"name": "countdown", "weight": 1},
                                                {"name": "calculator", "weight": 0}])"),
                               "cfg: envs");
  ASSERT_TRUE(set.ok()) << set.error().message;
  ASSERT_EQ((*set)->size(), 3u);
  EXPECT_EQ(*(*set)->index_of("countdown"), 1u);
  EXPECT_FALSE((*set)->index_of("nope").ok());
  int counts[3] = {0, 0, 0};
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 4000; ++i) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;  // xorshift draws
    counts[(*set)->pick(x)]++;
  }
  EXPECT_NEAR(counts[0] / 4000.0, 0.75, 0.04);
  EXPECT_NEAR(counts[1] / 4000.0, 0.25, 0.04);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ((*set)->pick(12345), (*set)->pick(12345));
  EXPECT_EQ((*set)->pick(~0ull), 1u);  // top of the range never lands on a zero-weight env
  EXPECT_FALSE(EnvSet::from_json(json::parse(R"([{"name": "arithmetic", "weight": 0}])"), "cfg").ok());
}

TEST(EnvSet, SftExamplesFromReferenceCompletions) {
  auto spec = parse_env_spec({{"name", "arithmetic"}}, "t");
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok());
  auto ex = sft_examples(**c, Split::train, 100, 50);
  ASSERT_TRUE(ex.ok()) << ex.error().message;
  ASSERT_EQ(ex->size(), 50u);
  for (const auto& e : *ex) {
    EXPECT_EQ(e.prompt.back(), '=');
    EXPECT_EQ((*c)->verify(e.metadata, e.completion)->reward, 1.0);
  }
  auto t = begin_trajectory("ep", "arithmetic", (*c)->info(), 100, Split::train, Observation{(*ex)[0].prompt, {}, (*ex)[0].metadata});
  EXPECT_EQ(to_json(t)["env"]["version"], "1");
  EXPECT_GT(t.start_unix_s, 1.0e9);
}
