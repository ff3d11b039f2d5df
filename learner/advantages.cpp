// Group advantages (see advantages.h). Statistics are accumulated in double and skip NaN rewards,
// so a missing score never poisons its group; every division is guarded so the output is finite.
#include "troupe/learner/advantages.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace troupe::learner {

namespace {

struct MeanStd {
  double mean = 0;
  double std = 0;  // unbiased (Bessel); 0 when fewer than two values
  int n = 0;
};

MeanStd mean_std(const float* r, int n) {
  MeanStd out;
  double sum = 0;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(r[i])) {
      sum += r[i];
      ++out.n;
    }
  if (out.n == 0) return out;
  out.mean = sum / out.n;
  if (out.n < 2) return out;
  double ss = 0;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(r[i])) ss += (r[i] - out.mean) * (r[i] - out.mean);
  out.std = std::sqrt(ss / (out.n - 1));
  return out;
}

bool all_equal(const float* r, int n) {
  const float* first = nullptr;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(r[i])) continue;
    if (!first) first = &r[i];
    else if (r[i] != *first) return false;
  }
  return true;
}

}  // namespace

float overlong_penalty(int completion_len, int max_completion_length, int buffer_len, float factor) {
  if (buffer_len <= 0) return 0.0f;
  int expected = max_completion_length - buffer_len;
  if (completion_len <= expected) return 0.0f;
  if (completion_len > max_completion_length) return -factor;
  return static_cast<float>(expected - completion_len) / static_cast<float>(buffer_len) * factor;
}

Status compute_advantages(std::span<float> adv, std::span<const float> rewards_in, int group_size,
                          const AdvantageConfig& cfg) {
  if (group_size < 1) return invalid_input("advantages: group_size must be >= 1, got " + std::to_string(group_size));
  const size_t n = rewards_in.size();
  if (n % static_cast<size_t>(group_size) != 0)
    return invalid_input("advantages: " + std::to_string(n) + " rewards is not a multiple of group_size " +
                         std::to_string(group_size));
  if (adv.size() != n) return invalid_input("advantages: output has " + std::to_string(adv.size()) +
                                            " entries for " + std::to_string(n) + " rewards");
  std::vector<float> r(rewards_in.begin(), rewards_in.end());
  for (float& x : r) {
    if (std::isnan(x)) continue;
    if (std::isinf(x)) return invalid_input("advantages: reward is infinite");
    x *= cfg.reward_scale;
    if (cfg.reward_clip > 0) x = std::clamp(x, -cfg.reward_clip, cfg.reward_clip);
  }
  const int num_groups = static_cast<int>(n / group_size);
  const double eps = cfg.std_eps;
  MeanStd batch = mean_std(r.data(), static_cast<int>(n));

  for (int g = 0; g < num_groups; ++g) {
    const float* rg = r.data() + static_cast<size_t>(g) * group_size;
    float* ag = adv.data() + static_cast<size_t>(g) * group_size;
    MeanStd gs = mean_std(rg, group_size);
    const bool equal = all_equal(rg, group_size);
    for (int i = 0; i < group_size; ++i) {
      if (std::isnan(rg[i]) || equal || gs.n < 2) {  // no signal: all equal, G = 1, or unscorable
        ag[i] = 0.0f;
        continue;
      }
      double a = 0;
      switch (cfg.adv_estimator) {
        case AdvantageEstimator::grpo:
        case AdvantageEstimator::reinforce_pp:
          a = rg[i] - gs.mean;
          break;
        case AdvantageEstimator::rloo:  // r_i - mean of the others = G/(G-1) * (r_i - mean)
          a = (rg[i] - gs.mean) * gs.n / (gs.n - 1.0);
          break;
      }
      if (cfg.adv_estimator == AdvantageEstimator::grpo) {
        if (cfg.scale_rewards == StdMode::group) a /= (gs.std + eps);
        else if (cfg.scale_rewards == StdMode::batch) a /= (batch.std + eps);
      }
      ag[i] = static_cast<float>(a);
    }
  }

  if (cfg.adv_estimator == AdvantageEstimator::reinforce_pp) {
    // REINFORCE++ (baseline variant, as in OpenRLHF/veRL): whiten the centred rewards over the
    // whole batch: A <- (A - mean_B A) / (std_B A + eps), over every scored completion (also those
    // of all-equal groups, as veRL does); a batch with no spread is left at 0.
    std::vector<float> live;
    for (size_t i = 0; i < n; ++i)
      if (!std::isnan(r[i])) live.push_back(adv[i]);
    MeanStd ws = mean_std(live.data(), static_cast<int>(live.size()));
    if (ws.n >= 2 && ws.std > 0)
      for (size_t i = 0; i < n; ++i)
        if (!std::isnan(r[i])) adv[i] = static_cast<float>((adv[i] - ws.mean) / (ws.std + eps));
  }
  return Status::ok_status();
}

Result<std::vector<float>> compute_advantages(std::span<const float> rewards, int group_size,
                                              const AdvantageConfig& cfg) {
  std::vector<float> adv(rewards.size());
  TROUPE_TRY(compute_advantages(std::span<float>(adv), rewards, group_size, cfg));
  return adv;
}

int dapo_filter_groups(std::vector<char>& keep, std::span<const float> rewards, int group_size) {
  keep.clear();
  if (group_size < 1) return 0;
  const size_t num_groups = rewards.size() / static_cast<size_t>(group_size);
  int kept = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    bool k = !all_equal(rewards.data() + g * group_size, group_size);
    keep.push_back(k ? 1 : 0);
    kept += k;
  }
  return kept;
}

Stats stats_of(std::span<const float> v) {
  Stats s;
  if (v.empty()) return s;
  double sum = 0;
  s.min = v[0];
  s.max = v[0];
  for (float x : v) {
    sum += x;
    s.min = std::min<double>(s.min, x);
    s.max = std::max<double>(s.max, x);
  }
  s.count = static_cast<int>(v.size());
  s.mean = sum / s.count;
  double ss = 0;
  for (float x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / s.count);
  return s;
}

}  // namespace troupe::learner
