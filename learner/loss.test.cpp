// The fused GRPO loss against the composed one for every variant, and both against central finite
// differences of the loss in logp / entropy (tokens near a clip kink are skipped: the loss is not
// differentiable there). Also SFT, error paths and hand-computed on-policy values.
#include "troupe/learner/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace troupe::learner;

namespace {

struct Inputs {
  int T = 0, S = 0;
  std::vector<int32_t> cu;
  std::vector<float> mask, logp, old, ref, adv, ent, iw;
  TokenBatch view(bool with_old = true, bool with_ref = true, bool with_iw = false) const {
    TokenBatch b;
    b.T = T;
    b.S = S;
    b.cu_seqlens = cu.data();
    b.mask = mask.data();
    b.logp_old = with_old ? old.data() : nullptr;
    b.logp_ref = with_ref ? ref.data() : nullptr;
    b.advantages = adv.data();
    b.is_weight = with_iw ? iw.data() : nullptr;
    return b;
  }
};

Inputs random_inputs(uint64_t seed, int S = 5) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::normal_distribution<float> nd(0, 1);
  Inputs in;
  in.S = S;
  in.cu.push_back(0);
  for (int s = 0; s < S; ++s) {
    const int len = 3 + static_cast<int>(u(rng) * 8);
    const int prompt = 1 + static_cast<int>(u(rng) * 3);
    for (int t = 0; t < len; ++t) {
      in.mask.push_back(t < prompt ? 0.0f : 1.0f);
      const float lp = -0.1f - 3.0f * u(rng);
      in.logp.push_back(lp);
      in.old.push_back(lp + 0.35f * nd(rng));
      in.ref.push_back(lp + 0.5f * nd(rng));
      in.ent.push_back(2.0f * u(rng));
      in.iw.push_back(0.2f + 1.8f * u(rng));
    }
    in.cu.push_back(static_cast<int32_t>(in.mask.size()));
    in.adv.push_back(nd(rng));
  }
  in.T = static_cast<int>(in.mask.size());
  return in;
}

std::vector<GrpoLossConfig> variants() {
  std::vector<GrpoLossConfig> out;
  for (auto agg : {LossAggMode::token_mean, LossAggMode::seq_mean_token_mean, LossAggMode::seq_mean_token_sum,
                   LossAggMode::seq_mean_token_sum_norm})
    for (auto kl : {KlEstimator::k1, KlEstimator::k2, KlEstimator::k3})
      for (int clip = 0; clip < 4; ++clip)
        for (bool sequence_level : {false, true}) {
          GrpoLossConfig c;
          c.agg_mode = agg;
          c.kl_type = kl;
          c.sequence_level_ratio = sequence_level;
          c.agg_norm_length = 16;
          c.kl_input_clamp = c.kl_output_clamp = 0;  // KL clamps only where a variant sets them
          c.kl_coef = 0.04f;
          c.entropy_coef = 0.01f;
          if (clip == 1) c.clip_high = 0.28f;
          if (clip == 2) { c.dual_clip = 3.0f; c.log_ratio_clamp = 0.5f; }
          if (clip == 3) { c.two_sided_clip = 1.5f; c.kl_input_clamp = 0.6f; c.kl_output_clamp = 0.15f; }
          out.push_back(c);
        }
  return out;
}

LossNorm norm_of(const Inputs& in) {
  LossNorm n;
  for (float m : in.mask) n.num_tokens += m;
  n.num_seqs = in.S;
  return n;
}

}  // namespace

TEST(GrpoLoss, FusedMatchesComposedForEveryVariant) {
  int checked = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    Inputs in = random_inputs(seed);
    for (const auto& c : variants()) {
      for (int v = 0; v < 3; ++v) {
        const bool with_old = v != 1, with_iw = v == 2;
        std::vector<float> g1(in.T), g2(in.T), e1(in.T), e2(in.T);
        auto a = grpo_loss_fused(g1.data(), e1.data(), in.logp.data(), in.ent.data(), in.view(with_old, true, with_iw),
                                 c, norm_of(in));
        auto b = grpo_loss_composed(g2.data(), e2.data(), in.logp.data(), in.ent.data(),
                                    in.view(with_old, true, with_iw), c, norm_of(in));
        ASSERT_TRUE(a.ok() && b.ok());
        EXPECT_NEAR(a->loss, b->loss, 1e-9 + 1e-9 * std::abs(b->loss));
        EXPECT_NEAR(a->kl_sum, b->kl_sum, 1e-9);
        EXPECT_NEAR(a->clip_low_sum, b->clip_low_sum, 0);
        EXPECT_NEAR(a->clip_high_sum, b->clip_high_sum, 0);
        EXPECT_NEAR(a->dual_clip_sum, b->dual_clip_sum, 0);
        EXPECT_NEAR(a->is_weight_sum, b->is_weight_sum, 1e-9);
        for (int t = 0; t < in.T; ++t) {
          ASSERT_NEAR(g1[t], g2[t], 1e-7 + 1e-6 * std::abs(g2[t])) << "t=" << t << " agg " << static_cast<int>(c.agg_mode);
          ASSERT_EQ(e1[t], e2[t]);
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(GrpoLoss, GradientMatchesFiniteDifferences) {
  Inputs in = random_inputs(11, 6);
  // logp is perturbed in double through a copy; steps in float are too coarse, so use h = 1e-3
  // and compare with a tolerance that covers float rounding of the inputs.
  const double h = 1e-3;
  int checked = 0, skipped = 0;
  const auto all = variants();
  for (size_t vi = 0; vi < all.size(); ++vi) {
    const auto& c = all[vi];
    const bool iw = vi % 2 == 1;  // every other variant with per-token importance weights
    std::vector<float> g(in.T), ge(in.T);
    auto base = grpo_loss_fused(g.data(), ge.data(), in.logp.data(), in.ent.data(), in.view(true, true, iw), c, norm_of(in));
    ASSERT_TRUE(base.ok());
    for (int t = 0; t < in.T; ++t) {
      if (in.mask[t] == 0) {
        EXPECT_EQ(g[t], 0.0f);
        continue;
      }
      auto loss_at = [&](float delta_logp, float delta_ent) {
        Inputs p = in;
        p.logp[t] += delta_logp;
        p.ent[t] += delta_ent;
        std::vector<float> d1(in.T), d2(in.T);
        return grpo_loss_fused(d1.data(), d2.data(), p.logp.data(), p.ent.data(), p.view(true, true, iw), c, norm_of(in))
            ->loss;
      };
      const float hf = static_cast<float>(h);
      const double hp = static_cast<double>(in.logp[t] + hf) - in.logp[t];
      const double hm = in.logp[t] - static_cast<double>(in.logp[t] - hf);
      const double fd = (loss_at(hf, 0) - loss_at(-hf, 0)) / (hp + hm);
      // skip tokens whose ratio / KL sits within the step of a kink
      const int s = static_cast<int>(std::upper_bound(in.cu.begin(), in.cu.end(), t) - in.cu.begin()) - 1;
      double lr = in.logp[t] - in.old[t];
      if (c.sequence_level_ratio) {
        double sum = 0, n = 0;
        for (int u = in.cu[s]; u < in.cu[s + 1]; ++u) { sum += in.mask[u] * (in.logp[u] - in.old[u]); n += in.mask[u]; }
        lr = sum / n;
      }
      const double rho = std::exp(lr), x = in.ref[t] - in.logp[t];
      auto near = [&](double v, double k) { return std::abs(v - k) < 0.02; };
      bool kink = near(rho, 1 - c.clip_low) || near(rho, 1 + c.clip_high) || (c.two_sided_clip > 0 && near(rho, c.two_sided_clip)) ||
                  (c.log_ratio_clamp > 0 && near(std::abs(lr), c.log_ratio_clamp)) ||
                  (c.kl_input_clamp > 0 && near(std::abs(x), c.kl_input_clamp));
      if (c.kl_output_clamp > 0) {
        double k = c.kl_type == KlEstimator::k1 ? -x : c.kl_type == KlEstimator::k2 ? 0.5 * x * x : std::exp(x) - 1 - x;
        kink = kink || near(std::abs(k), c.kl_output_clamp);
      }
      if (c.dual_clip > 0 && in.adv[s] < 0) kink = kink || near(rho, c.dual_clip) || rho > 1.5;
      if (kink) {
        ++skipped;
        continue;
      }
      ++checked;
      EXPECT_NEAR(g[t], fd, 2e-4 + 1e-3 * std::abs(fd)) << "token " << t << " agg " << static_cast<int>(c.agg_mode)
                                                        << " kl " << static_cast<int>(c.kl_type);
      const double fde = (loss_at(0, hf) - loss_at(0, -hf)) / (2 * h);
      EXPECT_NEAR(ge[t], fde, 2e-4 + 1e-3 * std::abs(fde));
    }
  }
  EXPECT_GT(checked, 5 * skipped) << "too many tokens near a kink to say anything";
  EXPECT_GT(checked, 1000);
}

TEST(GrpoLoss, OnPolicyGradientIsMinusAdvantageOverTokens) {
  // ratio 1, kl_coef 0: loss = -mean A, dlogp = -A_s / num_tokens (reference doc checklist item 2)
  Inputs in = random_inputs(3, 3);
  GrpoLossConfig c;
  std::vector<float> g(in.T);
  auto m = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, in.view(false, false), c, norm_of(in));
  ASSERT_TRUE(m.ok());
  const double n = norm_of(in).num_tokens;
  double expect = 0;
  for (int s = 0; s < in.S; ++s)
    for (int t = in.cu[s]; t < in.cu[s + 1]; ++t) {
      EXPECT_FLOAT_EQ(g[t], static_cast<float>(-in.mask[t] * in.adv[s] / n));
      expect += -in.mask[t] * in.adv[s] / n;
    }
  EXPECT_NEAR(m->loss, expect, 1e-12);
  EXPECT_EQ(m->clip_low_sum + m->clip_high_sum, 0);
  EXPECT_DOUBLE_EQ(m->ratio_sum, n);
}

// is_weight scales each token's policy-gradient term (loss and gradient), not the KL or entropy:
// on-policy, kl_coef 0, no entropy, dlogp_t = -w_t A_s / num_tokens.
TEST(GrpoLoss, ImportanceWeightScalesThePolicyGradientTerm) {
  Inputs in = random_inputs(5, 4);
  GrpoLossConfig c;
  std::vector<float> g(in.T);
  auto m = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, in.view(false, false, true), c, norm_of(in));
  ASSERT_TRUE(m.ok());
  const double n = norm_of(in).num_tokens;
  double wsum = 0;
  for (int s = 0; s < in.S; ++s)
    for (int t = in.cu[s]; t < in.cu[s + 1]; ++t) {
      EXPECT_FLOAT_EQ(g[t], static_cast<float>(-in.mask[t] * in.iw[t] * in.adv[s] / n));
      wsum += in.mask[t] * in.iw[t];
    }
  EXPECT_NEAR(m->is_weight_sum, wsum, 1e-6);
  // the KL term is not weighted
  c.kl_coef = 0.1f;
  std::vector<float> g1(in.T), g2(in.T);
  Inputs zero_adv = in;
  for (auto& a : zero_adv.adv) a = 0;
  ASSERT_TRUE(grpo_loss_fused(g1.data(), nullptr, in.logp.data(), nullptr, zero_adv.view(false, true, true), c, norm_of(in)).ok());
  ASSERT_TRUE(grpo_loss_fused(g2.data(), nullptr, in.logp.data(), nullptr, zero_adv.view(false, true, false), c, norm_of(in)).ok());
  for (int t = 0; t < in.T; ++t) ASSERT_EQ(g1[t], g2[t]);
}

TEST(GrpoLoss, ClipFractionsFollowTrl) {
  // one sequence of two tokens: rho = e^0.5 > 1.2 with A > 0 (high), rho = e^-0.5 < 0.8 with A > 0 (not low)
  std::vector<int32_t> cu{0, 2};
  std::vector<float> mask{1, 1}, logp{-1, -1}, old{-1.5f, -0.5f}, adv{1.0f};
  TokenBatch b{2, 1, cu.data(), mask.data(), old.data(), nullptr, adv.data()};
  std::vector<float> g(2);
  auto m = grpo_loss_fused(g.data(), nullptr, logp.data(), nullptr, b, GrpoLossConfig{}, LossNorm{2, 1});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->clip_high_sum, 1);
  EXPECT_EQ(m->clip_low_sum, 0);
  EXPECT_EQ(g[0], 0.0f);               // clipped above with A > 0: no gradient
  EXPECT_FLOAT_EQ(g[1], -std::exp(-0.5f) / 2);  // below 1-eps with A > 0: unclipped term is the min
  adv[0] = -1.0f;
  m = grpo_loss_fused(g.data(), nullptr, logp.data(), nullptr, b, GrpoLossConfig{}, LossNorm{2, 1});
  EXPECT_EQ(m->clip_low_sum, 1);
  EXPECT_EQ(m->clip_high_sum, 0);
}

TEST(GrpoLoss, ErrorsNameTheProblem) {
  Inputs in = random_inputs(1, 2);
  std::vector<float> g(in.T);
  GrpoLossConfig c;
  c.kl_coef = 0.1f;
  auto r = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, in.view(true, false), c, norm_of(in));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("reference"), std::string::npos);
  c.kl_coef = 0;
  c.agg_mode = LossAggMode::seq_mean_token_sum_norm;
  c.agg_norm_length = 0;
  r = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, in.view(), c, norm_of(in));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("agg_norm_length"), std::string::npos);
  c = GrpoLossConfig{};
  r = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, in.view(), c, LossNorm{0, 0});
  ASSERT_FALSE(r.ok());
  std::vector<int32_t> bad_cu{0, 3};
  TokenBatch b = in.view();
  b.S = 1;
  b.cu_seqlens = bad_cu.data();
  r = grpo_loss_fused(g.data(), nullptr, in.logp.data(), nullptr, b, c, norm_of(in));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cu_seqlens"), std::string::npos);
}

TEST(SftLoss, NllOnCompletionTokensOnly) {
  Inputs in = random_inputs(5, 3);
  std::vector<float> g(in.T);
  auto m = sft_loss(g.data(), nullptr, in.logp.data(), nullptr, in.view(), LossNorm{10, 3});
  ASSERT_TRUE(m.ok());
  double expect = 0;
  for (int t = 0; t < in.T; ++t) {
    expect -= static_cast<double>(in.mask[t]) * in.logp[t] / 10.0;
    EXPECT_FLOAT_EQ(g[t], -in.mask[t] / 10.0f);
  }
  EXPECT_NEAR(m->loss, expect, 1e-9);
}
