// On-policy distillation (distill.h): the reverse-KL advantage and its metrics against hand values,
// the whole distillation gradient through the trainer (reverse KL + the top-k forward-KL term, the
// GRPO advantage mixed in by reward_coef) against finite differences of the surrogate loss, the
// sample checks, and a teacher with another tokenizer refused naming both fingerprints.
#include "troupe/learner/distill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "troupe/learner/trainer.h"

using namespace troupe::learner;

namespace {

TEST(Distill, ReverseKlAdvantageByHand) {
  // two tokens, the second masked out; weights 1/N_tok = 1
  const float logp[2] = {-1.0f, -2.0f}, teacher[2] = {-0.5f, -4.0f}, mask[2] = {1, 0};
  const double w[2] = {1.0, 0.0};
  float d[2] = {0.25f, 0.0f};  // what the GRPO loss assigned: the term adds to it
  DistillSums s;
  distill_reverse_kl(d, logp, teacher, nullptr, mask, w, 2, 2.0f, s);
  // A = 2 (-0.5 - -1) = 1: d = 0.25 - 1
  EXPECT_FLOAT_EQ(d[0], -0.75f);
  EXPECT_FLOAT_EQ(d[1], 0.0f);
  EXPECT_DOUBLE_EQ(s.tokens, 1.0);
  EXPECT_DOUBLE_EQ(s.reverse_kl_sum, -0.5);  // log p_student - log p_teacher
  EXPECT_DOUBLE_EQ(s.teacher_logp_sum, -0.5);
  EXPECT_DOUBLE_EQ(s.loss, -1.0);
  // off-policy: the ratio exp(logp - old) multiplies the term
  const float old[2] = {-1.5f, -2.0f};
  float d2[2] = {0, 0};
  DistillSums s2;
  distill_reverse_kl(d2, logp, teacher, old, mask, w, 2, 2.0f, s2);
  EXPECT_NEAR(d2[0], -std::exp(0.5), 1e-6);
}

TEST(Distill, TopkTermByHand) {
  const float student[2] = {-1.0f, -3.0f}, teacher[2] = {std::log(0.6f), std::log(0.3f)}, mask[1] = {1};
  const double w[1] = {0.5};
  float d[2];
  DistillSums s;
  distill_topk_forward_kl(d, student, teacher, mask, w, 1, 2, 1.0f, s);
  EXPECT_NEAR(d[0], -0.5 * 0.6, 1e-6);
  EXPECT_NEAR(d[1], -0.5 * 0.3, 1e-6);
  const double kl = 0.6 * (std::log(0.6) + 1.0) + 0.3 * (std::log(0.3) + 3.0);
  EXPECT_NEAR(s.topk_kl_sum, kl, 1e-6);
  EXPECT_NEAR(s.topk_loss, 0.5 * kl, 1e-6);
}

struct Fixture {
  int V = 6, K = 2;
  std::vector<Sample> batch;
  Fixture() {
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int> tok(0, V - 1), clen(2, 5);
    std::normal_distribution<float> nd(0, 1);
    for (int i = 0; i < 4; ++i) {
      Sample s;
      s.prompt = {tok(rng), tok(rng)};
      for (int c = clen(rng); c > 0; --c) s.completion.push_back(tok(rng));
      s.advantage = nd(rng);
      for (size_t j = 0; j < s.completion.size(); ++j) {
        s.teacher_logprobs.push_back(-1.5f + 0.5f * nd(rng));
        for (int k = 0; k < K; ++k) {
          s.teacher_topk_ids.push_back((tok(rng) + k) % V);
          s.teacher_topk_logprobs.push_back(std::log(k == 0 ? 0.5f : 0.2f));
        }
      }
      batch.push_back(s);
    }
  }
};

LearnerConfig distill_config(int topk, float reward_coef) {
  LearnerConfig c;
  c.optimizer.lr = 0;  // the gradient stays in grads() to be checked
  c.optimizer.max_grad_norm = 0;
  c.loss.entropy_coef = 0;
  c.distill.teacher = "teacher";
  c.distill.coef = 0.7f;
  c.distill.topk = topk;
  c.distill.reward_coef = reward_coef;
  return c;
}

// The surrogate whose gradient the trainer takes, at parameters p: per completion token, with lp0
// the log-probs at the starting parameters (the detached advantage and the on-policy ratio's base),
//   -w (coef (teacher - lp0) + reward_coef A) exp(lp - lp0) + coef w sum_j pT_j (lT_j - lS_j)
// where w = 1 / N_tok (token-mean) and the GRPO on-policy term is -w A exp(lp - lp0).
double surrogate(BigramModel& m, std::span<const float> p, const Fixture& f, const LearnerConfig& c,
                 const std::vector<std::vector<float>>& lp0) {
  std::copy(p.begin(), p.end(), m.params().begin());
  double n_tok = 0;
  for (const auto& s : f.batch) n_tok += static_cast<double>(s.completion.size());
  double loss = 0;
  for (size_t i = 0; i < f.batch.size(); ++i) {
    const auto& s = f.batch[i];
    troupe::policy::PackedBatch b;
    b.cu_seqlens = {0};
    for (size_t t = 0; t + 1 < s.prompt.size() + s.completion.size(); ++t) {
      const size_t P = s.prompt.size();
      b.tokens.push_back(t < P ? s.prompt[t] : s.completion[t - P]);
      b.targets.push_back(t + 1 < P ? s.prompt[t + 1] : s.completion[t + 1 - P]);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    std::vector<float> lp(b.tokens.size());
    EXPECT_TRUE(m.forward_train(b, 1.0f, lp.data(), nullptr).ok());
    const size_t P = s.prompt.size();
    for (size_t j = 0; j < s.completion.size(); ++j) {
      const double l = lp[P - 1 + j], l0 = lp0[i][j];
      const double adv = c.distill.coef * (s.teacher_logprobs[j] - l0) + c.distill.reward_coef * s.advantage;
      loss += -adv * std::exp(l - l0) / n_tok;
    }
    for (int k = 0; k < c.distill.topk; ++k) {  // the student's log-probs of the teacher's k-th tokens
      auto bk = b;
      for (size_t j = 0; j < s.completion.size(); ++j) bk.targets[P - 1 + j] = s.teacher_topk_ids[j * 2 + k];
      std::vector<float> lk(bk.tokens.size());
      EXPECT_TRUE(m.forward_train(bk, 1.0f, lk.data(), nullptr).ok());
      for (size_t j = 0; j < s.completion.size(); ++j) {
        const double lt = s.teacher_topk_logprobs[j * 2 + k];
        loss += c.distill.coef * std::exp(lt) * (lt - lk[P - 1 + j]) / n_tok;
      }
    }
  }
  return loss;
}

void check_gradient(int topk, float reward_coef) {
  Fixture f;
  const LearnerConfig c = distill_config(topk, reward_coef);
  BigramModel model(f.V, 11, 0.5f);
  std::vector<float> p0(model.params().begin(), model.params().end());
  std::vector<Sample> batch = f.batch;
  if (topk == 0) {
    for (auto& s : batch) {
      s.teacher_topk_ids.clear();
      s.teacher_topk_logprobs.clear();
    }
  }
  auto lp0 = compute_completion_logprobs(model, batch, 1.0f);
  ASSERT_TRUE(lp0.ok());
  LocalCommunicator comm;
  Trainer tr(model, c, comm);
  auto m = tr.train_step(batch);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(m->distill.tokens, 0);
  if (topk > 0) {
    EXPECT_GT(m->distill.topk_kl_sum, 0);
  }
  std::vector<float> g(model.grads().begin(), model.grads().end());
  BigramModel probe(f.V, 11, 0.5f);
  int checked = 0;
  for (size_t i = 0; i < p0.size(); i += 5) {
    const float eps = 1e-2f;
    auto p = p0;
    p[i] += eps;
    const double up = surrogate(probe, p, f, c, *lp0);
    p[i] -= 2 * eps;
    const double down = surrogate(probe, p, f, c, *lp0);
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(g[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "param " << i << " topk " << topk;
    ++checked;
  }
  EXPECT_GT(checked, 5);
  double biggest = 0;
  for (float x : g) biggest = std::max(biggest, static_cast<double>(std::fabs(x)));
  EXPECT_GT(biggest, 1e-3);  // a gradient worth checking
}

TEST(Distill, ReverseKlGradientMatchesFiniteDifferences) { check_gradient(0, 0.0f); }
TEST(Distill, TopkAndRewardGradientMatchFiniteDifferences) { check_gradient(2, 0.5f); }

TEST(Distill, SamplesNeedTeacherNumbers) {
  Fixture f;
  BigramModel model(f.V, 11, 0.5f);
  LocalCommunicator comm;
  Trainer tr(model, distill_config(2, 0), comm);
  auto batch = f.batch;
  batch[2].teacher_logprobs.clear();
  auto r = tr.train_step(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sample 2"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("teacher_logprobs"), std::string::npos) << r.error().message;
  batch = f.batch;
  batch[1].teacher_topk_ids.pop_back();
  r = tr.train_step(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("distill.topk = 2"), std::string::npos) << r.error().message;
}

TEST(Distill, AnotherTokenizerIsRefusedNamingBoth) {
  troupe::policy::io::CharTokenizerSpec byte, chars;
  byte.kind = "byte";
  chars.kind = "char";
  chars.chars = "0123456789+-= ";
  auto a = troupe::policy::io::make_char_tokenizer(byte);
  auto b = troupe::policy::io::make_char_tokenizer(chars);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(check_distill_tokenizers(**a, "student", **a, "teacher").ok());
  auto again = troupe::policy::io::make_char_tokenizer(byte);
  EXPECT_EQ(tokenizer_fingerprint(**a), tokenizer_fingerprint(**again));
  auto st = check_distill_tokenizers(**a, "student-dir", **b, "teacher-dir");
  ASSERT_FALSE(st.ok());
  const std::string& msg = st.error().message;
  EXPECT_NE(msg.find("distill.teacher"), std::string::npos) << msg;
  EXPECT_NE(msg.find("teacher-dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find("student-dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tokenizer_fingerprint(**a)), std::string::npos) << msg;
  EXPECT_NE(msg.find(tokenizer_fingerprint(**b)), std::string::npos) << msg;
}

}  // namespace
