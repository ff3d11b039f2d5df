// Shared helpers of `troupe bench`: medians, interleaving, and the JSON-lines row format.
#include "troupe/bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace troupe::bench {

Row make_row(const std::string& suite, const std::string& case_name, const Metric& metric,
             const Paired& figures, const std::string& baseline_name, nlohmann::json extra) {
  return Row{suite,         case_name,     metric.name,     metric.unit, figures.ours, figures.baseline,
             baseline_name, metric.better, std::move(extra)};
}

double ratio_of(const Row& row) {
  if (row.better == Better::higher) return row.baseline > 0 ? row.ours / row.baseline : 0.0;
  return row.ours > 0 ? row.baseline / row.ours : 0.0;
}

void emit(const Row& row) {
  nlohmann::json j = {{"suite", row.suite},       {"case", row.case_name},
                      {"metric", row.metric},     {"unit", row.unit},
                      {"ours", row.ours},         {"baseline", row.baseline},
                      {"baseline_name", row.baseline_name}, {"ratio", ratio_of(row)}};
  for (auto it = row.extra.begin(); it != row.extra.end(); ++it) j[it.key()] = it.value();
  std::cout << j.dump() << std::endl;
}

void skip_baseline(const std::string& suite, const std::string& case_name, const std::string& why) {
  std::fprintf(stderr, "troupe bench %s: no row for %s: %s\n", suite.c_str(), case_name.c_str(), why.c_str());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Paired interleaved(int reps, const std::function<double()>& ours, const std::function<double()>& baseline) {
  reps = std::max(reps, 5);
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    // Alternate which goes first so drift (thermal, caches) does not favour one side.
    if (i % 2 == 0) {
      a.push_back(ours());
      b.push_back(baseline());
    } else {
      b.push_back(baseline());
      a.push_back(ours());
    }
  }
  return {median(a), median(b)};
}

Paired interleaved_n(int reps, const std::function<double()>& ours, const std::function<double()>& baseline) {
  if (reps >= 5) return interleaved(reps, ours, baseline);
  std::vector<double> a, b;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const bool ours_first = i % 2 == 0;
    if (ours_first) a.push_back(ours());
    b.push_back(baseline());
    if (!ours_first) a.push_back(ours());
  }
  return {median(a), median(b)};
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double time_s(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace troupe::bench
