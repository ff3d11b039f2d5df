// run_scale_sim: the real coordinator finishes its GRPO phase against simulated roles on the
// deterministic scheduler; the simulation is the same every run, async staleness stays within
// max_staleness, and the simulated step time follows the timing model.
#include <gtest/gtest.h>

#include "troupe/bench/scale_sim.h"

namespace troupe::bench {
namespace {

ScaleSimConfig small(bool async) {
  ScaleSimConfig c;
  c.generators = 10;
  c.learners = 2;
  c.steps = 4;
  c.async = async;
  return c;
}

TEST(ScaleSim, SyncRunFinishesEveryStepAndTrainsOnPolicy) {
  auto r = run_scale_sim(small(false));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->steps, 4);
  EXPECT_GT(r->coordinator_ms_per_step, 0.0);
  EXPECT_GT(r->steps_per_s, 0.0);
  ASSERT_EQ(r->staleness.size(), 1u);  // sync: every sample trained by the version that sampled it
  EXPECT_EQ(r->staleness.begin()->first, 0);
  EXPECT_EQ(r->staleness.begin()->second, 4 * 10 * 4);  // steps x prompts x G
  // a sync step is at least a generation (prefill + 8..64 decode steps), an env call and a
  // learner step after another
  const SimTiming t;
  for (double s : r->step_sim_s) EXPECT_GT(s, t.prefill_s + 8 * t.decode_step_s);
}

TEST(ScaleSim, AsyncStalenessIsBoundedAndAsyncIsFaster) {
  auto sync = run_scale_sim(small(false));
  auto async = run_scale_sim(small(true));
  ASSERT_TRUE(sync.ok()) << sync.error().message;
  ASSERT_TRUE(async.ok()) << async.error().message;
  EXPECT_EQ(async->steps, 4);
  std::int64_t n = 0;
  for (auto [lag, count] : async->staleness) {
    EXPECT_GE(lag, 0);
    EXPECT_LE(lag, 1);  // max_staleness
    n += count;
  }
  EXPECT_EQ(n, 4 * 10 * 4);
  EXPECT_GT(async->staleness.count(1), 0u);  // generation ran ahead of training
  EXPECT_GT(async->steps_per_s, sync->steps_per_s);
}

TEST(ScaleSim, SameConfigSameSimulation) {
  auto a = run_scale_sim(small(true));
  auto b = run_scale_sim(small(true));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->step_sim_s, b->step_sim_s);
  EXPECT_EQ(a->staleness, b->staleness);
  EXPECT_EQ(a->messages, b->messages);
}

TEST(ScaleSim, ManyGeneratorsAndLearners) {
  ScaleSimConfig c;
  c.generators = 200;
  c.learners = 16;
  c.steps = 3;
  c.relay_fanout = 0;  // the star
  auto r = run_scale_sim(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->steps, 3);
  // weight syncs go one generator after another over learner 0's link: 200 deltas per step
  const SimTiming t;
  for (size_t i = 1; i < r->step_sim_s.size(); ++i)
    EXPECT_GT(r->step_sim_s[i], 200 * t.delta_bytes / t.link_bytes_per_s * 0.99);
}

// At 1,000 generators the star's syncs (1,000 deltas over learner 0's link) outlast a step's
// generation; the relay tree (fan-out 4: learner 0's link carries 4 copies) makes every step shorter.
TEST(ScaleSim, RelayTreeShortensStepsAtAThousandGenerators) {
  ScaleSimConfig c;
  c.generators = 1000;
  c.learners = 4;
  c.steps = 3;
  c.relay_fanout = 0;
  auto star = run_scale_sim(c);
  c.relay_fanout = 4;
  auto tree = run_scale_sim(c);
  ASSERT_TRUE(star.ok() && tree.ok());
  EXPECT_EQ(tree->steps, 3);
  for (size_t i = 1; i < tree->step_sim_s.size(); ++i) EXPECT_LT(tree->step_sim_s[i], 0.8 * star->step_sim_s[i]);
}

TEST(ScaleSim, BadSizesAreRefused) {
  ScaleSimConfig c;
  c.generators = 0;
  auto r = run_scale_sim(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("generators"), std::string::npos);
}

}  // namespace
}  // namespace troupe::bench
