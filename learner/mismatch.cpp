// Sampler/learner mismatch sums and their step summary (see mismatch.h).
#include "troupe/learner/mismatch.h"

#include <algorithm>
#include <cmath>

namespace troupe::learner {

void MismatchSums::add(const MismatchSums& o) {
  tokens += o.tokens;
  diff_sum += o.diff_sum;
  diff_max = std::max(diff_max, o.diff_max);
  kl_sum += o.kl_sum;
  over_tol += o.over_tol;
  route_pairs += o.route_pairs;
  route_agree += o.route_agree;
}

MismatchSummary summarize(const MismatchSums& s) {
  MismatchSummary m;
  m.tokens = s.tokens;
  if (s.tokens > 0) {
    m.logprob_diff_max = s.diff_max;
    m.logprob_diff_mean = s.diff_sum / s.tokens;
    m.mismatch_kl = s.kl_sum / s.tokens;
    m.mismatch_frac = s.over_tol / s.tokens;
  }
  m.has_routing = s.route_pairs > 0;
  if (m.has_routing) m.routing_agreement = s.route_agree / s.route_pairs;
  return m;
}

void add_logprob_mismatch(MismatchSums& out, const float* sampler, const float* learner, const float* mask, int n) {
  for (int t = 0; t < n; ++t) {
    if (mask[t] == 0) continue;
    const double x = static_cast<double>(learner[t]) - sampler[t];
    const double d = std::fabs(x);
    out.tokens += 1;
    out.diff_sum += d;
    out.diff_max = std::max(out.diff_max, d);
    out.kl_sum += std::expm1(x) - x;
    out.over_tol += d > kMismatchTolerance ? 1.0 : 0.0;
  }
}

void add_routing_mismatch(MismatchSums& out, const int32_t* sampler, const int32_t* learner, const float* mask, int n,
                          int width, int K) {
  if (width <= 0 || K <= 0) return;
  for (int t = 0; t < n; ++t) {
    if (mask[t] == 0) continue;
    const int32_t* a = sampler + static_cast<size_t>(t) * width;
    const int32_t* b = learner + static_cast<size_t>(t) * width;
    for (int l = 0; l + K <= width; l += K) {
      out.route_pairs += 1;
      out.route_agree += std::equal(a + l, a + l + K, b + l) ? 1.0 : 0.0;
    }
  }
}

}  // namespace troupe::learner
