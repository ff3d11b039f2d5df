// Group advantages from scalar rewards (outcome supervision): GRPO (group / batch / no std),
// RLOO, REINFORCE++; reward scaling/clipping, DAPO soft overlong punishment and dynamic-sampling
// filter. Rewards come as groups of G consecutive entries (N = num_groups * G). Invariant: the
// result is finite for any finite input (G = 1 and all-equal groups give exactly 0).
#pragma once

#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/config.h"

namespace troupe::learner {

// DAPO Eq. 13 soft overlong punishment (TRL get_soft_overlong_punishment, veRL DAPO reward manager):
// 0 if len <= L_max - L_cache; ((L_max - L_cache) - len) / L_cache * factor inside the buffer; -factor beyond L_max.
float overlong_penalty(int completion_len, int max_completion_length, int buffer_len, float factor);

// adv (N) <- advantages of rewards (N) in groups of `group_size`. Applies reward_scale and
// reward_clip first. NaN rewards (unscorable) count as missing in the statistics and get A = 0
// (TRL's nanmean/nanstd). Errors if N is not a multiple of group_size or group_size < 1.
Status compute_advantages(std::span<float> adv, std::span<const float> rewards, int group_size,
                          const AdvantageConfig& cfg);
Result<std::vector<float>> compute_advantages(std::span<const float> rewards, int group_size,
                                              const AdvantageConfig& cfg);

// DAPO dynamic sampling: keep[g] = 1 when group g has at least two distinct (non-NaN) rewards.
// Returns how many groups are kept; the coordinator over-samples until it has enough of them.
int dapo_filter_groups(std::vector<char>& keep, std::span<const float> rewards, int group_size);

// Mean/std/min/max of a vector (population std), for the per-step metrics.
struct Stats {
  double mean = 0, std = 0, min = 0, max = 0;
  int count = 0;
};
Stats stats_of(std::span<const float> v);

}  // namespace troupe::learner
