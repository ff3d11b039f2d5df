// RewardCentering (reward_center.h): batch and running means of reward-model scores.
// Invariant: the running mean is updated in the order the scores are given (mean += (x - mean) / n),
// so equal inputs and state give bit-identical outputs on every machine.
#include "troupe/envs/reward_center.h"

#include <bit>
#include <string>

namespace troupe::envs {

double RewardCentering::apply(std::span<double> scores, std::span<const char> valid) {
  if (how_ == RewardCenter::none) return 0;
  double subtract = 0;
  if (how_ == RewardCenter::batch) {
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < scores.size(); ++i)
      if (i < valid.size() && valid[i]) {
        sum += scores[i];
        ++n;
      }
    if (n == 0) return 0;
    subtract = sum / static_cast<double>(n);
  } else {
    for (size_t i = 0; i < scores.size(); ++i)
      if (i < valid.size() && valid[i]) {
        ++count_;
        mean_ += (scores[i] - mean_) / static_cast<double>(count_);
      }
    if (count_ == 0) return 0;
    subtract = mean_;
  }
  for (size_t i = 0; i < scores.size(); ++i)
    if (i < valid.size() && valid[i]) scores[i] -= subtract;
  return subtract;
}

nlohmann::json RewardCentering::state() const {
  // the mean's bits as well as its value, so a restore is exact whatever the JSON printer rounds
  return {{"count", count_}, {"mean", mean_}, {"mean_bits", std::bit_cast<uint64_t>(mean_)}};
}

Status RewardCentering::restore(const nlohmann::json& state) {
  if (!state.is_object()) return invalid_input("reward centering state: not a mapping");
  if (!state.contains("count") || !state["count"].is_number_integer() || state["count"].get<int64_t>() < 0)
    return invalid_input("reward centering state: 'count' must be a non-negative integer");
  if (!state.contains("mean_bits") || !state["mean_bits"].is_number_unsigned())
    return invalid_input("reward centering state: 'mean_bits' must be an unsigned integer");
  count_ = state["count"].get<int64_t>();
  mean_ = std::bit_cast<double>(state["mean_bits"].get<uint64_t>());
  return {};
}

}  // namespace troupe::envs
