// learner.mismatch_corrections: every loss.mismatch_correction rule (tis, mis, seq_geo_mask,
// icepop) on random packed batches, through learner::correction_weights and the fused GRPO loss
// with those weights, for several loss settings; grpo_reference.py recomputes the weights from the
// published formulas and the loss and its gradient with PyTorch autograd. Exit code = the script's.

#include <cstdio>
#include <cstdlib>
#include <random>

#include <nlohmann/json.hpp>

#include "troupe/learner/correction.h"
#include "troupe/learner/loss.h"
#include "torch_reference.h"

using namespace troupe::learner;
using namespace troupe::learner::testing;
using nlohmann::json;

namespace {

using troupe::learner::testing::name;  // next to this file's own overloads


const char* name(MismatchCorrection m) {
  switch (m) {
    case MismatchCorrection::tis: return "tis";
    case MismatchCorrection::mis: return "mis";
    case MismatchCorrection::seq_geo_mask: return "seq_geo_mask";
    case MismatchCorrection::icepop: return "icepop";
    case MismatchCorrection::none: break;
  }
  return "none";
}

}  // namespace

int main() {
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<float> u(0, 1);
  std::normal_distribution<float> nd(0, 1);
  json cases = json::array();
  int n = 0;
  for (auto mode : {MismatchCorrection::tis, MismatchCorrection::mis, MismatchCorrection::seq_geo_mask,
                    MismatchCorrection::icepop})
    for (int variant = 0; variant < 6; ++variant) {
      GrpoLossConfig g;
      g.mismatch_correction = mode;
      g.kl_input_clamp = g.kl_output_clamp = 0;
      g.agg_mode = variant % 2 == 0 ? LossAggMode::token_mean : LossAggMode::seq_mean_token_mean;
      g.sequence_level_ratio = variant == 3;
      g.entropy_coef = variant == 4 ? 0.01f : 0.0f;
      if (variant == 5) g.clip_high = 0.28f;
      g.tis_cap = variant < 3 ? 2.0f : 1.5f;
      g.mis_low = variant < 3 ? 0.0f : 0.6f;
      g.mis_high = 2.0f;
      g.geo_mask_low = 0.8f;
      g.geo_mask_high = variant < 3 ? 1.25f : 1.1f;
      // the random case: learner log-probs (current = old, the on-policy first update), the
      // sampler's a noisy copy, a PPO old policy for half of the variants
      const int S = 3 + static_cast<int>(u(rng) * 4);
      std::vector<int32_t> cu{0};
      std::vector<float> mask, logp, old, sampler, adv, ent;
      const bool with_old = variant % 3 == 1;
      for (int s = 0; s < S; ++s) {
        const int len = 3 + static_cast<int>(u(rng) * 9), prompt = 1 + static_cast<int>(u(rng) * 2);
        const float seq_shift = 0.15f * nd(rng);  // sequences drift as a whole too (seq_geo_mask)
        for (int t = 0; t < len; ++t) {
          mask.push_back(t < prompt ? 0.0f : 1.0f);
          const float lp = -0.05f - 4.0f * u(rng);
          logp.push_back(lp);
          old.push_back(lp + 0.2f * nd(rng));
          sampler.push_back(lp + seq_shift + 0.5f * nd(rng));
          ent.push_back(3.0f * u(rng));
        }
        cu.push_back(static_cast<int32_t>(mask.size()));
        adv.push_back(nd(rng));
      }
      const int T = static_cast<int>(mask.size());
      std::vector<float> w(T), dlogp(T), dent(T);
      const float* base = with_old ? old.data() : logp.data();  // as the trainer: pi_old, else the current
      correction_weights(w.data(), base, sampler.data(), mask.data(), cu.data(), S, T, mode, g);
      LossNorm norm;
      for (float m : mask) norm.num_tokens += m;
      norm.num_seqs = S;
      TokenBatch b{T, S, cu.data(), mask.data(), with_old ? old.data() : nullptr, nullptr, adv.data(), w.data()};
      auto r = grpo_loss_fused(dlogp.data(), dent.data(), logp.data(), g.entropy_coef != 0 ? ent.data() : nullptr, b,
                               g, norm);
      if (!r.ok()) {
        std::fprintf(stderr, "grpo_loss_fused: %s\n", r.error().message.c_str());
        return 1;
      }
      const LossSummary sm = finalize(*r);
      cases.push_back({{"kind", "correction"},
                       {"correction", {{"mode", name(mode)}, {"tis_cap", g.tis_cap}, {"mis_low", g.mis_low},
                                       {"mis_high", g.mis_high}, {"geo_mask_low", g.geo_mask_low},
                                       {"geo_mask_high", g.geo_mask_high}, {"icepop_low", g.icepop_low},
                                       {"icepop_high", g.icepop_high}}},
                       {"config", {{"clip_low", g.clip_low}, {"clip_high", g.clip_high},
                                   {"two_sided_clip", g.two_sided_clip}, {"dual_clip", g.dual_clip},
                                   {"log_ratio_clamp", g.log_ratio_clamp},
                                   {"sequence_level_ratio", g.sequence_level_ratio}, {"kl_coef", g.kl_coef},
                                   {"kl_type", "k3"}, {"kl_input_clamp", g.kl_input_clamp},
                                   {"kl_output_clamp", g.kl_output_clamp}, {"entropy_coef", g.entropy_coef},
                                   {"agg_mode", name(g.agg_mode)}, {"agg_norm_length", g.agg_norm_length}}},
                       {"cu_seqlens", cu},
                       {"mask", vec(mask)},
                       {"logp", vec(logp)},
                       {"old", with_old ? vec(old) : json(nullptr)},
                       {"sampler", vec(sampler)},
                       {"ref", nullptr},
                       {"advantages", vec(adv)},
                       {"entropy", g.entropy_coef != 0 ? vec(ent) : json(nullptr)},
                       {"num_tokens", norm.num_tokens},
                       {"num_seqs", norm.num_seqs},
                       {"ours", {{"loss", r->loss}, {"dlogp", vec(dlogp)}, {"dentropy", vec(dent)},
                                 {"weights", vec(w)}, {"is_weight_mean", sm.is_weight_mean},
                                 {"clip_frac_low", sm.clip_frac_low}, {"clip_frac_high", sm.clip_frac_high},
                                 {"entropy", sm.entropy}}}});
      ++n;
    }
  return run_torch_reference(cases, "troupe_mismatch_corrections", std::to_string(n) + " mismatch-correction cases");
}
