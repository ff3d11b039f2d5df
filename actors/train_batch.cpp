// What a rollout (a whole step's, or one streamed part's) gives the learners: advantages per group
// (over the kept groups with dynamic sampling), samples without tokens or with env errors left out,
// and, in async mode, everything older than max_staleness dropped (stale_policy: drop).
#include "coordinator_internal.h"
#include "troupe/actors/roles.h"
#include "troupe/learner/advantages.h"

namespace troupe::actors::coord {

Result<Prepared> prepare(const RunState& s, const Rollout& r) {
  const auto& ro = s.cfg.rollout;
  const int G = ro.num_generations;
  const bool async = s.async != nullptr;
  Prepared p;
  const int64_t lag = s.version - r.policy_version;
  const bool stale = async && lag > ro.max_staleness;
  std::vector<float> rewards;
  for (auto& g : r.groups)
    for (double x : g.rewards) rewards.push_back(static_cast<float>(x));
  auto lcfg = learner_config(s.cfg, learner::Phase::grpo);
  std::vector<char> keep(r.groups.size(), 1);
  p.groups_kept = static_cast<int>(r.groups.size());
  if (s.cfg.grpo.dynamic_sampling) {
    // the first prompts_per_step groups with distinct rewards; advantages over them only
    learner::dapo_filter_groups(keep, rewards, G);
    p.groups_kept = 0;
    std::vector<float> kept_rewards;
    for (size_t gi = 0; gi < keep.size(); ++gi) {
      if (keep[gi] && p.groups_kept < ro.prompts_per_step) {
        ++p.groups_kept;
        kept_rewards.insert(kept_rewards.end(), rewards.begin() + static_cast<std::ptrdiff_t>(gi * G),
                            rewards.begin() + static_cast<std::ptrdiff_t>((gi + 1) * G));
      } else {
        keep[gi] = 0;
      }
    }
    p.adv.assign(rewards.size(), 0.0f);
    if (!kept_rewards.empty()) {
      TROUPE_ASSIGN_OR_RETURN(auto kadv, learner::compute_advantages(kept_rewards, G, lcfg.advantage));
      size_t n = 0;
      for (size_t gi = 0; gi < keep.size(); ++gi)
        if (keep[gi])
          for (int j = 0; j < G; ++j) p.adv[gi * G + j] = kadv[n++];
    }
  } else {
    TROUPE_ASSIGN_OR_RETURN(p.adv, learner::compute_advantages(rewards, G, lcfg.advantage));
  }
  size_t n_samples = 0;
  for (const auto& g : r.groups) {
    n_samples += g.samples.size();
    for (const auto& more : g.more_samples) n_samples += more.size();
  }
  p.samples.reserve(n_samples);  // (one allocation: growing it would reallocate a large block again and again)
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    const auto& g = r.groups[gi];
    for (int j = 0; j < G; ++j) {
      // an episode the env ran (served_episodes.cpp) may have further samples, same advantage
      const size_t n_more = j < static_cast<int>(g.more_samples.size()) ? g.more_samples[j].size() : 0;
      for (size_t m = 0; m <= n_more; ++m) {
        const auto& x = m == 0 ? g.samples[j] : g.more_samples[j][m - 1];
        if (!keep[gi] || x.tokens.empty() || !g.errors[j].empty()) continue;
        if (stale && ro.stale_policy == StalePolicy::drop) {
          ++p.stale_dropped;
          continue;
        }
        TrainSample t;
        t.prompt = x.prompt_tokens;
        t.completion = x.tokens;
        if ((async && ro.stale_policy == StalePolicy::importance_weight) ||
            s.cfg.loss.mismatch_correction != learner::MismatchCorrection::none) {
          // decoupled PPO: the ratio against the learner's current weights, and the sampler's
          // log-probs only in the importance weight of pi_current / pi_sampler (truncated at the
          // cap, or the loss.mismatch_correction rule)
          t.behavior_logprobs = x.logprobs;
        } else {
          t.old_logprobs = x.logprobs;
        }
        t.mask = x.mask;
        t.policy_version = r.policy_version;
        t.version_starts = x.version_starts;  // in-flight updates: each token's version
        t.versions = x.versions;
        if (x.mask.empty()) t.experts = x.experts;  // single-turn: one record per completion token
        t.advantage = p.adv[gi * G + j];
        t.truncated = x.truncated;
        p.samples.push_back(std::move(t));
      }
    }
  }
  return p;
}

}  // namespace troupe::actors::coord
