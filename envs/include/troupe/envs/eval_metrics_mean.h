// EvalMetricsMean: several servers' eval aggregates (each a JSON object of numbers with an
// "episodes" count) merged into one, each metric the mean of theirs weighted by their episodes.
// Objects without a positive "episodes" add nothing; "episodes" itself is the total.
#pragma once

#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace troupe::envs {

class EvalMetricsMean {
 public:
  void add(const nlohmann::json& m) {
    const double weight = m.is_object() ? m.value("episodes", 0.0) : 0.0;
    if (weight <= 0) return;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it->is_number() && it.key() != "episodes") {
        sums_[it.key()].first += weight * it->get<double>();
        sums_[it.key()].second += weight;
      }
    sums_["episodes"].first += weight;
    sums_["episodes"].second = 1;
  }

  // Each merged metric written into `out` as prefix + name.
  void write(nlohmann::json& out, const std::string& prefix = "") const {
    for (const auto& [name, v] : sums_) out[prefix + name] = v.first / v.second;
  }

 private:
  std::map<std::string, std::pair<double, double>> sums_;  // name -> (weighted sum, weight)
};

}  // namespace troupe::envs
