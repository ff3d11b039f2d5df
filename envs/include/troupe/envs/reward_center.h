// Centering of reward-model scores (envs[].config.center of a `type: reward_model` env): none, the
// step's batch mean, or the running mean of every score so far. Invariant: the result depends only
// on the scores given, in order, and the state (count, mean) carried from earlier batches, so a run
// that restores state() after --resume centers exactly as the uninterrupted run.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"

namespace troupe::envs {

enum class RewardCenter { none, batch, running };

// Applies the centering to one step's scores of one env. Only entries with valid[i] != 0 (scored,
// not failed) are read or changed; failed ones are left as given.
//   none:    unchanged.
//   batch:   x - mean(valid scores of this batch).
//   running: the batch's valid scores are first added to the running mean (the mean of every valid
//            score seen so far, this batch included, each weighing the same), then x - that mean.
// Neither divides by a standard deviation (GRPO's grpo.scale_rewards scales per group already).
class RewardCentering {
 public:
  explicit RewardCentering(RewardCenter how = RewardCenter::none) : how_(how) {}
  RewardCenter how() const { return how_; }
  // Centers `scores` in place; returns the mean subtracted (0 for none or a batch without a valid score).
  double apply(std::span<double> scores, std::span<const char> valid);
  // The running statistic: how many scores and their mean (both 0 before the first).
  int64_t count() const { return count_; }
  double mean() const { return mean_; }
  // {"count": N, "mean": M} (the mean's exact double), and back; a malformed state is an error naming the key.
  nlohmann::json state() const;
  Status restore(const nlohmann::json& state);

 private:
  RewardCenter how_;
  int64_t count_ = 0;
  double mean_ = 0;
};

}  // namespace troupe::envs

namespace troupe {
template <>
struct EnumNames<envs::RewardCenter> {
  using E = envs::RewardCenter;
  static constexpr std::pair<std::string_view, E> table[] = {
      {"none", E::none}, {"batch", E::batch}, {"running", E::running}};
};
}  // namespace troupe
