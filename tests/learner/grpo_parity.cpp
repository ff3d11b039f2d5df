// learner.grpo_torch_parity: random inputs for every GRPO loss variant (aggregation modes, KL
// estimators and clamps, clip settings incl. dual clip / delta / GSPO, on- and off-policy), the SFT
// loss and every advantage mode; our outputs go to a JSON file that tests/learner/grpo_reference.py
// recomputes with PyTorch autograd from the formulas. Exit code = the script's (non-zero on mismatch).

#include <cstdio>
#include <cstdlib>
#include <random>

#include <nlohmann/json.hpp>

#include "troupe/learner/advantages.h"
#include "troupe/learner/loss.h"
#include "torch_reference.h"

using namespace troupe::learner;
using namespace troupe::learner::testing;
using nlohmann::json;

namespace {

using troupe::learner::testing::name;  // next to this file's own overloads


struct Case {
  int S = 0, T = 0;
  std::vector<int32_t> cu;
  std::vector<float> mask, logp, old, ref, adv, ent;
};

Case random_case(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0, 1);
  std::normal_distribution<float> nd(0, 1);
  Case c;
  c.S = 2 + static_cast<int>(u(rng) * 4);
  c.cu.push_back(0);
  for (int s = 0; s < c.S; ++s) {
    const int len = 2 + static_cast<int>(u(rng) * 9), prompt = 1 + static_cast<int>(u(rng) * 2);
    for (int t = 0; t < len; ++t) {
      c.mask.push_back(t < prompt ? 0.0f : 1.0f);
      const float lp = -0.05f - 4.0f * u(rng);
      c.logp.push_back(lp);
      c.old.push_back(lp + 0.4f * nd(rng));
      c.ref.push_back(lp + 0.8f * nd(rng));
      c.ent.push_back(3.0f * u(rng));
    }
    c.cu.push_back(static_cast<int32_t>(c.mask.size()));
    c.adv.push_back(nd(rng));
  }
  c.T = static_cast<int>(c.mask.size());
  return c;
}

// The names the reference script reads (the YAML's choices, plus seq-mean-token-sum).
const char* name(KlEstimator k) { return k == KlEstimator::k1 ? "k1" : k == KlEstimator::k2 ? "k2" : "k3"; }
const char* name(AdvantageEstimator e) {
  return e == AdvantageEstimator::grpo ? "grpo" : e == AdvantageEstimator::rloo ? "rloo" : "reinforce_pp";
}
const char* name(StdMode m) { return m == StdMode::group ? "group" : m == StdMode::batch ? "batch" : "none"; }

json config_json(const GrpoLossConfig& g) {
  return {{"clip_low", g.clip_low},
          {"clip_high", g.clip_high},
          {"two_sided_clip", g.two_sided_clip},
          {"dual_clip", g.dual_clip},
          {"log_ratio_clamp", g.log_ratio_clamp},
          {"sequence_level_ratio", g.sequence_level_ratio},
          {"kl_coef", g.kl_coef},
          {"kl_type", name(g.kl_type)},
          {"kl_input_clamp", g.kl_input_clamp},
          {"kl_output_clamp", g.kl_output_clamp},
          {"entropy_coef", g.entropy_coef},
          {"agg_mode", name(g.agg_mode)},
          {"agg_norm_length", g.agg_norm_length}};
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(2026);
  json cases = json::array();
  int n_loss = 0;
  for (auto agg : {LossAggMode::token_mean, LossAggMode::seq_mean_token_mean, LossAggMode::seq_mean_token_sum,
                   LossAggMode::seq_mean_token_sum_norm})
    for (auto kl : {KlEstimator::k1, KlEstimator::k2, KlEstimator::k3})
      for (int clip = 0; clip < 5; ++clip)
        for (bool sequence_level : {false, true})
          for (int policy = 0; policy < 2; ++policy) {
            GrpoLossConfig g;
            g.agg_mode = agg;
            g.kl_type = kl;
            g.sequence_level_ratio = sequence_level;
            g.agg_norm_length = 12;
            g.kl_input_clamp = g.kl_output_clamp = 0;  // KL clamps only where a variant sets them
            g.kl_coef = (clip % 2 == 0) ? 0.04f : 0.0f;
            g.entropy_coef = clip == 4 ? 0.0f : 0.01f;
            if (clip == 1) g.clip_high = 0.28f;
            if (clip == 2) { g.dual_clip = 3.0f; g.log_ratio_clamp = 0.6f; }
            if (clip == 3) { g.two_sided_clip = 1.4f; g.kl_input_clamp = 0.7f; g.kl_output_clamp = 0.2f; }
            if (clip == 4) { g.clip_low = 0.1f; g.clip_high = 0.15f; g.kl_input_clamp = 20; g.kl_output_clamp = 10; }
            Case c = random_case(rng);
            const bool off_policy = policy == 1;
            LossNorm norm;
            for (float m : c.mask) norm.num_tokens += m;
            norm.num_tokens *= 1.75;  // this micro-batch is part of a bigger optimizer step
            norm.num_seqs = c.S + 3;
            TokenBatch b{c.T, c.S, c.cu.data(), c.mask.data(), off_policy ? c.old.data() : nullptr,
                         (g.kl_coef != 0 || kl == KlEstimator::k2) ? c.ref.data() : nullptr, c.adv.data()};
            std::vector<float> dlogp(c.T), dent(c.T);
            auto r = grpo_loss_fused(dlogp.data(), dent.data(), c.logp.data(), g.entropy_coef != 0 ? c.ent.data() : nullptr, b,
                                     g, norm);
            if (!r.ok()) {
              std::fprintf(stderr, "grpo_loss_fused: %s\n", r.error().message.c_str());
              return 1;
            }
            LossSummary sm = finalize(*r);
            cases.push_back({{"kind", "grpo"},
                             {"config", config_json(g)},
                             {"cu_seqlens", c.cu},
                             {"mask", vec(c.mask)},
                             {"logp", vec(c.logp)},
                             {"old", off_policy ? vec(c.old) : json(nullptr)},
                             {"ref", b.logp_ref ? vec(c.ref) : json(nullptr)},
                             {"advantages", vec(c.adv)},
                             {"entropy", g.entropy_coef != 0 ? vec(c.ent) : json(nullptr)},
                             {"num_tokens", norm.num_tokens},
                             {"num_seqs", norm.num_seqs},
                             {"ours", {{"loss", r->loss}, {"dlogp", vec(dlogp)}, {"dentropy", vec(dent)},
                                       {"kl", sm.kl}, {"clip_frac_low", sm.clip_frac_low},
                                       {"clip_frac_high", sm.clip_frac_high}, {"entropy", sm.entropy}}}});
            ++n_loss;
          }
  {  // SFT
    Case c = random_case(rng);
    LossNorm norm{20, 0};
    TokenBatch b{c.T, c.S, c.cu.data(), c.mask.data(), nullptr, nullptr, c.adv.data()};
    std::vector<float> dlogp(c.T);
    auto r = sft_loss(dlogp.data(), nullptr, c.logp.data(), nullptr, b, norm);
    cases.push_back({{"kind", "sft"}, {"cu_seqlens", c.cu}, {"mask", vec(c.mask)}, {"logp", vec(c.logp)},
                     {"num_tokens", norm.num_tokens}, {"ours", {{"loss", r->loss}, {"dlogp", vec(dlogp)}}}});
  }
  // advantages: random rewards with ties, all-equal groups, NaNs, for every estimator and std mode
  std::uniform_int_distribution<int> small(0, 3);
  for (auto est : {AdvantageEstimator::grpo, AdvantageEstimator::rloo, AdvantageEstimator::reinforce_pp})
    for (auto mode : {StdMode::group, StdMode::batch, StdMode::none})
      for (int G : {1, 2, 5}) {
        AdvantageConfig a;
        a.adv_estimator = est;
        a.scale_rewards = mode;
        a.std_eps = G == 5 ? 1e-6f : 1e-4f;
        a.reward_scale = G == 2 ? 2.0f : 1.0f;
        a.reward_clip = G == 2 ? 3.0f : 0.0f;
        std::vector<float> r;
        for (int g = 0; g < 4; ++g)
          for (int i = 0; i < G; ++i) r.push_back(g == 1 ? 1.0f : small(rng) * 0.5f + (g == 3 && i == 0 ? 0.1f : 0.0f));
        auto adv = compute_advantages(r, G, a);
        if (!adv.ok()) return 1;
        cases.push_back({{"kind", "advantages"}, {"adv_estimator", name(est)}, {"scale_rewards", name(mode)},
                         {"std_eps", a.std_eps}, {"reward_scale", a.reward_scale}, {"reward_clip", a.reward_clip},
                         {"group_size", G}, {"rewards", vec(r)}, {"ours", vec(*adv)}});
      }
  const std::string what = std::to_string(n_loss) + " GRPO loss cases, 1 SFT case and " +
                           std::to_string(cases.size() - n_loss - 1) + " advantage cases";
  return run_torch_reference(cases, "troupe_grpo_parity", what);
}
