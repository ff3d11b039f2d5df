// Sampler/learner mismatch: how far the log-probs (and, for MoE, the routed experts) the sampler
// recorded for each response token are from what the learner computes for the same token with
// the weights of the same policy version. Sums add across micro-batches and ranks (diff_max is a
// max); summarize() gives the metrics of a step.
#pragma once

#include <cstdint>
#include <span>

namespace troupe::learner {

// |delta| above this counts in mismatch_frac.
inline constexpr double kMismatchTolerance = 1e-3;

struct MismatchSums {
  double tokens = 0;       // response tokens compared (mask != 0)
  double diff_sum = 0;     // sum |logp_sampler - logp_learner|
  double diff_max = 0;     // max of the same
  double kl_sum = 0;       // sum of k3 = e^x - 1 - x, x = logp_learner - logp_sampler (KL(sampler || learner))
  double over_tol = 0;     // tokens with |delta| > kMismatchTolerance
  double route_pairs = 0;  // (token, MoE layer) pairs compared
  double route_agree = 0;  // of which the top-k expert sets are equal
  void add(const MismatchSums& o);
};

struct MismatchSummary {
  double tokens = 0;
  double logprob_diff_max = 0, logprob_diff_mean = 0, mismatch_kl = 0, mismatch_frac = 0;
  bool has_routing = false;
  double routing_agreement = 1;  // meaningful when has_routing
};
MismatchSummary summarize(const MismatchSums& s);

// Adds the n positions whose mask is non-zero. sampler/learner: log-probs (n).
void add_logprob_mismatch(MismatchSums& out, const float* sampler, const float* learner, const float* mask, int n);
// Adds the routing of the n positions whose mask is non-zero: (n x width) expert ids, K per MoE
// layer, ascending within a layer on both sides (so set equality is element equality).
void add_routing_mismatch(MismatchSums& out, const int32_t* sampler, const int32_t* learner, const float* mask, int n,
                          int width, int K);

}  // namespace troupe::learner
