// The step driver: the bigram test model's backward against finite differences, the update's
// invariance to the micro-batch split (count and token budget), num_iterations, SFT, and the
// errors for malformed samples.
#include "troupe/learner/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace troupe::learner;

namespace {

std::vector<Sample> random_batch(uint64_t seed, int n, int V, bool with_old, bool with_ref) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1), plen(1, 4), clen(1, 8);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(n);
  for (auto& s : out) {
    for (int i = plen(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = clen(rng); i > 0; --i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
    s.truncated = (tok(rng) % 3) == 0;
    for (size_t j = 0; j < s.completion.size(); ++j) {
      if (with_old) s.old_logprobs.push_back(-2.5f + 0.3f * nd(rng));
      if (with_ref) s.ref_logprobs.push_back(-2.5f + 0.3f * nd(rng));
    }
  }
  return out;
}

std::vector<float> train_params(const LearnerConfig& cfg, const std::vector<Sample>& batch, int steps = 1) {
  BigramModel model(12, 7);
  LocalCommunicator comm;
  Trainer tr(model, cfg, comm);
  for (int i = 0; i < steps; ++i) {
    auto r = tr.train_step(batch);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  }
  auto p = model.params();
  return {p.begin(), p.end()};
}

LearnerConfig base_config() {
  LearnerConfig c;
  c.optimizer.lr = 1e-2f;
  c.optimizer.max_grad_norm = 0.5f;
  c.optimizer.weight_decay = 0.01f;
  c.loss.kl_coef = 0.04f;
  c.loss.clip_high = 0.28f;
  c.loss.entropy_coef = 0.01f;
  c.batch.num_mini_batches = 2;
  c.batch.num_iterations = 2;
  c.batch.temperature = 0.7f;
  c.batch.mask_truncated = true;
  c.max_completion_length = 8;
  return c;
}

}  // namespace

TEST(BigramModel, BackwardMatchesFiniteDifferences) {
  BigramModel model(5, 3);
  troupe::policy::PackedBatch b;
  b.tokens = {0, 3, 2, 4, 1};
  b.targets = {3, 2, -1, 1, 0};
  b.cu_seqlens = {0, 3, 5};
  const std::vector<float> dlogp{0.3f, -1.0f, 0.0f, 0.5f, 0.7f}, dent{0.2f, 0.1f, 0.0f, -0.4f, 0.3f};
  std::vector<float> logp(5), ent(5);
  ASSERT_TRUE(model.forward_train(b, 0.8f, logp.data(), ent.data()).ok());
  model.zero_grads();
  ASSERT_TRUE(model.backward_train(dlogp.data(), dent.data()).ok());
  std::vector<float> g(model.grads().begin(), model.grads().end());
  auto objective = [&]() {
    std::vector<float> lp(5), e(5);
    EXPECT_TRUE(model.forward_train(b, 0.8f, lp.data(), e.data()).ok());
    double f = 0;
    for (int t = 0; t < 5; ++t) f += dlogp[t] * lp[t] + dent[t] * e[t];
    return f;
  };
  for (size_t i = 0; i < g.size(); ++i) {
    float& p = model.params()[i];
    const float p0 = p;
    p = p0 + 1e-2f;
    const double fp = objective();
    p = p0 - 1e-2f;
    const double fm = objective();
    p = p0;
    EXPECT_NEAR(g[i], (fp - fm) / 2e-2, 2e-4) << "param " << i;
  }
}

TEST(Trainer, UpdateIsInvariantToMicroBatchSplit) {
  const auto batch = random_batch(1, 12, 12, true, true);
  for (auto agg : {LossAggMode::token_mean, LossAggMode::seq_mean_token_mean, LossAggMode::seq_mean_token_sum_norm}) {
    LearnerConfig c = base_config();
    c.loss.agg_mode = agg;
    const auto ref = train_params(c, batch);
    BigramModel init(12, 7);
    double moved = 0;
    for (size_t i = 0; i < ref.size(); ++i) moved = std::max(moved, std::abs(double(ref[i]) - init.params()[i]));
    EXPECT_GT(moved, 1e-2) << "the update must be large enough for the comparison to mean something";
    for (int split = 0; split < 4; ++split) {
      LearnerConfig s = c;
      if (split == 0) s.batch.micro_batch_size = 1;
      if (split == 1) s.batch.micro_batch_size = 4;
      if (split == 2) s.batch.micro_batch_tokens = 9;
      if (split == 3) s.batch.micro_batch_tokens = 1;  // every sample alone
      const auto got = train_params(s, batch);
      ASSERT_EQ(got.size(), ref.size());
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
      EXPECT_LT(worst, 2e-6) << static_cast<int>(agg) << " split " << split;
    }
  }
}

// A step observer watches only the last optimizer step of each train step (2 mini-batches x 2
// iterations here: 4 optimizer steps, 1 watched), and sees the parameters the step ends with.
TEST(Trainer, StepObserverWatchesTheLastOptimizerStep) {
  struct Watch : StepObserver {
    std::vector<std::pair<size_t, size_t>> whole;
    std::vector<float> seen;
    int begun = 0, ended = 0;
    std::span<const std::pair<size_t, size_t>> begin_step(size_t n) override {
      ++begun;
      whole = {{0, n}};
      seen.assign(n, 0.0f);
      return whole;
    }
    void updated(size_t, size_t b, size_t e, const float* p) override { std::copy(p + b, p + e, seen.begin() + static_cast<std::ptrdiff_t>(b)); }
    void end_step() override { ++ended; }
  } watch;
  const auto batch = random_batch(1, 12, 12, true, true);
  BigramModel model(12, 7);
  LocalCommunicator comm;
  Trainer tr(model, base_config(), comm);
  tr.set_step_observer(&watch);
  auto r = tr.train_step(batch);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->optimizer_steps, 4);
  EXPECT_EQ(watch.begun, 1);
  EXPECT_EQ(watch.ended, 1);
  const auto p = model.params();
  EXPECT_TRUE(std::equal(p.begin(), p.end(), watch.seen.begin(), watch.seen.end()));
}

TEST(Trainer, StreamedPartsEqualTheWholeBatch) {
  // A batch that arrives in parts (async rollouts streamed to the learner) makes the same update
  // as train_step on the whole batch, for every aggregation mode, also with empty parts and
  // micro-batching inside the parts; metrics agree too.
  const auto batch = random_batch(3, 12, 12, true, true);
  for (auto agg :
       {LossAggMode::token_mean, LossAggMode::seq_mean_token_mean, LossAggMode::seq_mean_token_sum_norm}) {
    LearnerConfig c = base_config();
    c.batch.num_mini_batches = 1;
    c.batch.num_iterations = 1;
    c.loss.agg_mode = agg;
    BigramModel whole_model(12, 7);
    LocalCommunicator comm;
    Trainer whole(whole_model, c, comm);
    auto ref = whole.train_step(batch);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    for (int mb : {0, 2}) {
      LearnerConfig s = c;
      s.batch.micro_batch_size = mb;
      BigramModel model(12, 7);
      Trainer tr(model, s, comm);
      const std::vector<std::pair<int, int>> parts = {{0, 5}, {5, 5}, {5, 9}, {9, 12}};
      for (auto [a, b] : parts) {
        ASSERT_TRUE(tr.accumulate(std::vector<Sample>(batch.begin() + a, batch.begin() + b)).ok());
        EXPECT_TRUE(tr.accumulating());
      }
      auto got = tr.finish_accumulated();
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_FALSE(tr.accumulating());
      double worst = 0;
      for (size_t i = 0; i < model.params().size(); ++i)
        worst = std::max(worst, std::abs(double(model.params()[i]) - whole_model.params()[i]));
      EXPECT_LT(worst, 2e-6) << static_cast<int>(agg) << " micro_batch_size " << mb;
      EXPECT_NEAR(got->loss.loss, ref->loss.loss, 1e-6);
      EXPECT_NEAR(got->grad_norm, ref->grad_norm, 1e-5);
      EXPECT_EQ(got->tokens, ref->tokens);
      EXPECT_EQ(got->optimizer_steps, 1);
      EXPECT_NEAR(got->advantages.mean, ref->advantages.mean, 1e-6);
    }
  }
}

TEST(Trainer, StreamedStepErrors) {
  const auto batch = random_batch(4, 6, 12, true, false);
  LearnerConfig c = base_config();
  c.loss.kl_coef = 0;
  BigramModel model(12, 7);
  LocalCommunicator comm;
  {
    Trainer tr(model, c, comm);  // two mini-batches, two passes: not one on-policy update
    auto st = tr.accumulate(batch);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("num_iterations = 1 and num_mini_batches = 1"), std::string::npos)
        << st.error().message;
  }
  c.batch.num_mini_batches = 1;
  c.batch.num_iterations = 1;
  Trainer tr(model, c, comm);
  EXPECT_FALSE(tr.finish_accumulated().ok());  // nothing accumulated
  ASSERT_TRUE(tr.accumulate({}).ok());
  auto empty = tr.finish_accumulated();
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("every part of the streamed step was empty"), std::string::npos);
  ASSERT_TRUE(tr.accumulate(std::vector<Sample>(batch.begin(), batch.begin() + 3)).ok());
  auto no_old = std::vector<Sample>(batch.begin() + 3, batch.end());
  for (auto& s : no_old) s.old_logprobs.clear();
  auto mixed = tr.accumulate(no_old);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.error().message.find("every part of a streamed batch"), std::string::npos);
  auto during = tr.train_step(batch);
  ASSERT_FALSE(during.ok());
  EXPECT_NE(during.error().message.find("while a streamed step"), std::string::npos);
  ASSERT_TRUE(tr.finish_accumulated().ok());  // the good parts still make a step
  EXPECT_TRUE(tr.train_step(batch).ok());
}

// Expert parallelism: an E that does not divide the learner rank count (here one rank) is refused
// naming the key, by a streamed part (which joins the groups as a step does) and by a step.
TEST(Trainer, ExpertParallelRefusals) {
  const auto batch = random_batch(4, 6, 12, true, false);
  LearnerConfig c = base_config();
  c.loss.kl_coef = 0;
  c.batch.num_mini_batches = 1;
  c.batch.num_iterations = 1;
  c.expert_parallel = 2;
  BigramModel model(12, 7);
  LocalCommunicator comm;
  Trainer tr(model, c, comm);
  auto streamed = tr.accumulate(batch);
  ASSERT_FALSE(streamed.ok());
  EXPECT_NE(streamed.error().message.find("policy.moe.expert_parallel: 2 does not divide the learner rank count 1"),
            std::string::npos)
      << streamed.error().message;
  auto step = tr.train_step(batch);  // 2 does not divide one rank
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.error().message.find("policy.moe.expert_parallel: 2 does not divide the learner rank count 1"),
            std::string::npos)
      << step.error().message;
}

TEST(Trainer, SplitsByTokenBudget) {
  EXPECT_EQ(split_micro_batches({3, 3, 3, 5, 1}, 0, 6), (std::vector<int>{0, 2, 3, 5}));
  EXPECT_EQ(split_micro_batches({9, 1}, 0, 4), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(split_micro_batches({1, 1, 1, 1, 1}, 2, 0), (std::vector<int>{0, 2, 4, 5}));
  EXPECT_EQ(split_micro_batches({1, 1}, 0, 0), (std::vector<int>{0, 2}));
}

TEST(Trainer, RecomputesOldLogprobsAndReportsMetrics) {
  // Without recorded old log-probs the first update is on-policy (ratio 1), so clip fractions are
  // 0 for one pass; with several passes the recomputed old log-probs make the ratio move.
  auto batch = random_batch(2, 8, 12, false, true);
  LearnerConfig c = base_config();
  c.batch.num_iterations = 1;
  c.batch.num_mini_batches = 1;
  BigramModel model(12, 1);
  LocalCommunicator comm;
  Trainer tr(model, c, comm);
  auto r = tr.train_step(batch);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_DOUBLE_EQ(r->loss.ratio_mean, 1.0);
  EXPECT_EQ(r->loss.clip_frac_low + r->loss.clip_frac_high, 0.0);
  EXPECT_GT(r->loss.kl, 0.0);
  EXPECT_GT(r->loss.entropy, 0.0);
  EXPECT_GT(r->grad_norm, 0.0);
  EXPECT_EQ(r->optimizer_steps, 1);
  c.batch.num_iterations = 3;
  c.batch.num_mini_batches = 2;
  c.optimizer.lr = 0.5f;
  Trainer tr2(model, c, comm);
  r = tr2.train_step(batch);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->optimizer_steps, 6);
  EXPECT_NE(r->loss.ratio_mean, 1.0);
  EXPECT_GT(r->loss.clip_frac_low + r->loss.clip_frac_high, 0.0);
}

// behavior_logprobs (rollout.stale_policy: importance_weight): the ratio is against the current
// weights and each token's policy-gradient term is weighted by min(pi_current / pi_behavior, cap).
TEST(Trainer, BehaviorLogprobsWeightThePolicyGradient) {
  LearnerConfig c = base_config();
  c.batch.num_iterations = 1;
  c.batch.num_mini_batches = 1;
  c.loss.kl_coef = 0;
  c.loss.entropy_coef = 0;
  c.importance_weight_cap = 2.0f;
  auto batch = random_batch(4, 8, 12, false, false);
  for (auto& s : batch) s.truncated = false;
  auto step = [&](float shift) {  // behavior = current - shift (shift < 0: no behavior log-probs)
    BigramModel model(12, 3);
    LocalCommunicator comm;
    Trainer tr(model, c, comm);
    auto b = batch;
    if (shift >= 0) {
      auto cur = compute_completion_logprobs(model, b, c.batch.temperature);
      EXPECT_TRUE(cur.ok());
      for (size_t i = 0; i < b.size(); ++i) {
        b[i].behavior_logprobs = (*cur)[i];
        for (auto& v : b[i].behavior_logprobs) v -= shift;
      }
    }
    auto r = tr.train_step(b);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return *r;
  };
  const auto plain = step(-1), same = step(0), more = step(std::log(1.5f)), capped = step(std::log(5.0f));
  EXPECT_DOUBLE_EQ(plain.loss.is_weight_mean, 1.0);
  EXPECT_NEAR(same.loss.is_weight_mean, 1.0, 1e-6);
  EXPECT_NEAR(same.loss.pg_loss, plain.loss.pg_loss, 1e-6 * std::abs(plain.loss.pg_loss));
  EXPECT_NEAR(more.loss.is_weight_mean, 1.5, 1e-5);
  EXPECT_NEAR(more.loss.pg_loss, 1.5 * plain.loss.pg_loss, 1e-5 * std::abs(plain.loss.pg_loss));
  EXPECT_DOUBLE_EQ(capped.loss.is_weight_mean, 2.0);
  EXPECT_NEAR(capped.loss.pg_loss, 2.0 * plain.loss.pg_loss, 1e-5 * std::abs(plain.loss.pg_loss));
  EXPECT_DOUBLE_EQ(more.loss.ratio_mean, 1.0) << "the ratio is against the current weights";
  // behavior log-probs of the wrong length name the sample
  auto bad = batch;
  for (auto& s : bad) s.behavior_logprobs.assign(s.completion.size(), -1.0f);
  bad[3].behavior_logprobs.pop_back();
  BigramModel model(12, 3);
  LocalCommunicator comm;
  Trainer tr(model, c, comm);
  auto r = tr.train_step(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sample 3: behavior_logprobs has"), std::string::npos) << r.error().message;
}

TEST(Trainer, SftLowersTheNll) {
  LearnerConfig c;
  c.phase = Phase::sft;
  c.optimizer.lr = 0.05f;
  auto batch = random_batch(3, 6, 12, false, false);
  BigramModel model(12, 1);
  LocalCommunicator comm;
  Trainer tr(model, c, comm);
  auto first = tr.train_step(batch);
  ASSERT_TRUE(first.ok());
  double last = 0;
  for (int i = 0; i < 30; ++i) last = tr.train_step(batch)->loss.loss;
  EXPECT_LT(last, first->loss.loss - 0.3);
}

TEST(Trainer, BadSamplesAreErrorsNamingTheSample) {
  BigramModel model(12, 1);
  LocalCommunicator comm;
  LearnerConfig c = base_config();
  Trainer tr(model, c, comm);
  auto batch = random_batch(4, 4, 12, true, true);
  batch[2].old_logprobs.pop_back();
  auto r = tr.train_step(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sample 2: old_logprobs"), std::string::npos) << r.error().message;
  batch = random_batch(4, 4, 12, true, false);
  r = tr.train_step(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("needs ref_logprobs"), std::string::npos);
  EXPECT_FALSE(tr.train_step({}).ok());
  batch = random_batch(4, 1, 12, true, true);
  r = tr.train_step(batch);  // 1 sample, 2 mini-batches
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("num_mini_batches"), std::string::npos);
  batch = random_batch(4, 4, 12, true, true);
  batch[1].completion[0] = 99;
  EXPECT_FALSE(tr.train_step(batch).ok());
}

TEST(PrepareGrpoBatch, OverlongPenaltyFilterAndAdvantages) {
  LearnerConfig c;
  c.max_completion_length = 6;
  c.advantage.overlong_buffer_len = 2;
  c.advantage.dynamic_sampling = true;
  c.advantage.scale_rewards = StdMode::none;
  std::vector<Sample> s(6);
  const float rewards[] = {1, 1, 0, 1, 1, 1};
  const int lens[] = {2, 2, 2, 2, 5, 2};  // sample 4: 5 tokens in a 2-token buffer before 6 -> -0.5
  for (int i = 0; i < 6; ++i) {
    s[i].prompt = {1};
    s[i].completion.assign(lens[i], 2);
    s[i].reward = rewards[i];
  }
  auto r = prepare_grpo_batch(s, 2, c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->groups_in, 3);
  EXPECT_EQ(r->groups_kept, 2);  // group 0 (1, 1) is all equal
  ASSERT_EQ(r->samples.size(), 4u);
  EXPECT_FLOAT_EQ(r->samples[0].advantage, -0.5f);
  EXPECT_FLOAT_EQ(r->samples[1].advantage, 0.5f);
  EXPECT_FLOAT_EQ(r->samples[2].reward, 0.5f);
  EXPECT_FLOAT_EQ(r->samples[2].advantage, -0.25f);
  EXPECT_FLOAT_EQ(r->samples[3].advantage, 0.25f);
  EXPECT_FALSE(prepare_grpo_batch(s, 4, c).ok());
}

namespace {

// Samples with score_mismatch compare the sampler's log-probs with the learner's before the
// update: exact log-probs give 0, a known shift gives that shift, on the free path (one optimizer
// step) and on the pre-pass (several mini-batches), for old and for behavior log-probs.
TEST(Trainer, MismatchMetricsCompareSamplerAndLearnerBeforeTheUpdate) {
  auto batch = random_batch(5, 8, 12, false, false);
  BigramModel probe(12, 3);
  auto exact = compute_completion_logprobs(probe, batch, base_config().batch.temperature);
  ASSERT_TRUE(exact.ok());
  double tokens = 0;
  for (const auto& s : batch) tokens += static_cast<double>(s.completion.size());
  for (int mini : {1, 2})
    for (bool behavior : {false, true})
      for (float shift : {0.0f, 0.01f}) {
        auto b = batch;
        for (size_t i = 0; i < b.size(); ++i) {
          std::vector<float> lp = (*exact)[i];
          for (size_t j = 0; j < lp.size(); ++j) lp[j] += (j % 2 == 0 ? shift : -shift);
          (behavior ? b[i].behavior_logprobs : b[i].old_logprobs) = lp;
          b[i].score_mismatch = i != 3;  // sample 3 was not sampled by these weights
        }
        LearnerConfig c = base_config();
        c.batch.num_mini_batches = mini;
        c.batch.num_iterations = 1;
        c.loss.kl_coef = 0;
        c.optimizer.lr = 0.1f;
        BigramModel model(12, 3);
        LocalCommunicator comm;
        Trainer tr(model, c, comm);
        auto r = tr.train_step(b);
        ASSERT_TRUE(r.ok()) << r.error().message;
        const auto m = summarize(r->mismatch);
        const std::string where = "mini " + std::to_string(mini) + " behavior " + std::to_string(behavior);
        EXPECT_DOUBLE_EQ(m.tokens, tokens - static_cast<double>(b[3].completion.size())) << where;
        EXPECT_NEAR(m.logprob_diff_max, shift, 1e-6) << where;
        EXPECT_NEAR(m.logprob_diff_mean, shift, 1e-6) << where;
        EXPECT_EQ(m.mismatch_frac, shift > 1e-3f ? 1.0 : 0.0) << where;
        EXPECT_GE(m.mismatch_kl, 0.0);
        EXPECT_NEAR(m.mismatch_kl, 0.5 * shift * shift, 1e-6) << where;  // k3 ~ x^2 / 2
        EXPECT_FALSE(m.has_routing);
      }
}

}  // namespace

namespace {

// A policy::Model behind the learner's interface without forward_backward_train: the interface's
// default (forward_train, the loss's derivative over every row, backward_train).
class SeparateCalls final : public PolicyModel {
 public:
  explicit SeparateCalls(troupe::policy::Model& m) : m_(m) {}
  std::span<float> params() override { return m_.params(); }
  std::span<float> grads() override { return m_.grads(); }
  const std::vector<troupe::policy::TensorSpec>& tensors() const override { return m_.tensors(); }
  void zero_grads() override { m_.zero_grads(); }
  troupe::Status forward_train(const troupe::policy::PackedBatch& b, float temperature, float* logp,
                               float* entropy) override {
    return m_.forward_train(b, temperature, logp, entropy);
  }
  troupe::Status backward_train(const float* dlogp, const float* dentropy) override {
    return m_.backward_train(dlogp, dentropy);
  }

 private:
  troupe::policy::Model& m_;
};

}  // namespace

// A model whose head runs over vocabulary chunks takes the per-token losses tile by tile of rows
// (forward_backward_train, tiles cutting sequences): the step's gradients and loss equal the
// separate calls' to 1e-6 relative for GRPO (token-mean and seq-mean-token-mean, KL, entropy,
// on-policy importance weights computed per tile) and SFT; the losses that need a sequence mean of
// the current log-probs (on-policy seq_geo_mask, the sequence-level ratio) take the separate
// calls, bit for bit.
TEST(Trainer, TiledHeadEqualsSeparateCalls) {
  troupe::policy::ModelConfig mc;  // the tiny MoE, a vocabulary of 64 in chunks of 8
  mc.vocab_size = 64;
  mc.num_hidden_layers = 2;
  mc.logprob_chunk = 8;
  auto compare = [&](const LearnerConfig& c, const std::vector<Sample>& batch, bool bitwise, const char* what) {
    auto a = troupe::policy::Model::create(mc, 3);
    auto b = troupe::policy::Model::create(mc, 3);
    ASSERT_TRUE(a.ok() && b.ok());
    ModelAdapter tiled(*a);
    SeparateCalls separate(*b);
    LocalCommunicator comm_a, comm_b;
    Trainer ta(tiled, c, comm_a), tb(separate, c, comm_b);
    auto ra = ta.train_step(batch);
    auto rb = tb.train_step(batch);
    ASSERT_TRUE(ra.ok() && rb.ok()) << what << ": " << (ra.ok() ? rb.error().message : ra.error().message);
    const auto ga = tiled.grads(), gb = separate.grads();
    double num = 0, den = 0;
    for (size_t i = 0; i < ga.size(); ++i) {
      num = std::max(num, std::fabs(double(ga[i]) - gb[i]));
      den = std::max(den, std::fabs(double(gb[i])));
    }
    EXPECT_GT(den, 0.0) << what;
    if (bitwise) {
      EXPECT_EQ(num, 0.0) << what;
      EXPECT_EQ(ra->loss.loss, rb->loss.loss) << what;
    } else {
      EXPECT_LT(num / den, 1e-6) << what;
      EXPECT_NEAR(ra->loss.loss, rb->loss.loss, 1e-6 * std::fabs(rb->loss.loss)) << what;
      EXPECT_NEAR(ra->loss.entropy, rb->loss.entropy, 1e-6 * std::fabs(rb->loss.entropy)) << what;
    }
  };
  LearnerConfig c = base_config();
  c.batch.num_mini_batches = 1;
  c.batch.num_iterations = 1;
  const auto batch = random_batch(5, 12, mc.vocab_size, true, true);  // about 80 rows: tiles of 20
  compare(c, batch, false, "grpo token-mean, KL, entropy");
  LearnerConfig seq = c;
  seq.loss.agg_mode = LossAggMode::seq_mean_token_mean;
  compare(seq, batch, false, "grpo seq-mean-token-mean");
  auto on_policy = random_batch(6, 12, mc.vocab_size, false, true);
  for (auto& s : on_policy)
    for (size_t j = 0; j < s.completion.size(); ++j) s.behavior_logprobs.push_back(-4.0f + 0.1f * float(j % 5));
  LearnerConfig tis = c;
  tis.importance_weight_cap = 3.0f;
  compare(tis, on_policy, false, "grpo on-policy, truncated importance weights per tile");
  LearnerConfig geo = c;
  geo.loss.mismatch_correction = MismatchCorrection::seq_geo_mask;
  geo.loss.geo_mask_low = 0.0f;
  geo.loss.geo_mask_high = 1e9f;
  compare(geo, on_policy, true, "grpo on-policy seq_geo_mask (separate calls)");
  LearnerConfig gspo = c;
  gspo.loss.sequence_level_ratio = true;
  compare(gspo, batch, true, "grpo sequence-level ratio (separate calls)");
  LearnerConfig sft;
  sft.phase = Phase::sft;
  compare(sft, batch, false, "sft");
}

namespace {

// Two identical learner ranks seen from rank 0: every all-reduce doubles (x + x), broadcasts keep.
class TwinRanks final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  troupe::Status allreduce_sum(std::span<float> b) override {
    for (float& x : b) x = x + x;
    return {};
  }
  troupe::Status allreduce_sum(std::span<double> b) override {
    for (double& x : b) x = x + x;
    return {};
  }
  troupe::Status barrier() override { return {}; }
  troupe::Status broadcast(std::span<float>, int) override { return {}; }
};

// The same on the device: x + x through the backend's add op, counting its calls.
class TwinDevice final : public troupe::kernels::DeviceCollective {
 public:
  explicit TwinDevice(const troupe::kernels::Backend& be) : be_(be) {}
  void all_reduce_sum(float* buf, size_t n) override {
    ++calls;
    be_.add(buf, buf, buf, n);
  }
  void broadcast(float*, size_t, int) override {}
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {  // rank 0's shard
    be_.add(buf, buf, buf, bounds[1]);
  }
  void all_gather(float*, std::span<const size_t>) override {}  // (the twin's shard is the same)
  int calls = 0;

 private:
  const troupe::kernels::Backend& be_;
};

}  // namespace

// Learner ranks whose gradients live on a device sum them there (NCCL on GPUs) before they come
// down: on the fenced device backend, a step with the device collective equals, bit for bit, the
// step that all-reduces the host copy; the device sum ran once per optimizer step.
TEST(Trainer, DeviceCollectiveEqualsHostAllReduce) {
  troupe::policy::ModelConfig mc;
  mc.vocab_size = 32;
  mc.num_hidden_layers = 2;
  mc.device = troupe::kernels::DeviceKind::cpu_fenced;
  auto a = troupe::policy::Model::create(mc, 3);
  auto b = troupe::policy::Model::create(mc, 3);
  ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? "" : a.error().message);
  ModelAdapter host_sum(*a), device_sum(*b);
  TwinRanks comm_a, comm_b;
  TwinDevice dev(b->backend());
  LearnerConfig c = base_config();
  Trainer ta(host_sum, c, comm_a), tb(device_sum, c, comm_b, &dev);
  const auto batch = random_batch(9, 8, mc.vocab_size, true, true);
  for (int step = 0; step < 2; ++step) {
    auto ra = ta.train_step(batch);
    auto rb = tb.train_step(batch);
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message : ra.error().message);
    EXPECT_EQ(ra->loss.loss, rb->loss.loss);
    EXPECT_EQ(ra->grad_norm, rb->grad_norm);
  }
  EXPECT_EQ(dev.calls, 2 * c.batch.num_mini_batches * c.batch.num_iterations);
  const auto pa = host_sum.params(), pb = device_sum.params();
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size_bytes()));
  // A backend without device collectives (cpu, cpu_fenced): no collective, the host path.
  auto none = join_device_collective(b->backend(), comm_b);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}
