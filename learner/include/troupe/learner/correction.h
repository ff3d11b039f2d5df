// Importance weights of sampled tokens: how the learner corrects for the gap between the policy
// that sampled a completion (its recorded log-probs) and the learner's log-probs, as a detached
// factor w_t on each token's policy-gradient term (TokenBatch::is_weight). One function for every
// rule: the loss.mismatch_correction options and the truncated weight of stale async samples
// (rollout.stale_policy: importance_weight = tis with rollout.importance_weight_cap).
#pragma once

#include <cstdint>

#include "troupe/learner/config.h"

namespace troupe::learner {

// rho_t = exp(learner_t - sampler_t) for positions with mask != 0 (w_t = 0 where mask = 0):
//   tis           w_t = min(rho_t, cap)                                (cap = cfg.tis_cap, or `tis_cap` when > 0)
//   mis           w_t = rho_t * [mis_low <= rho_t <= mis_high]
//   seq_geo_mask  w_t = [geo_mask_low <= exp(sum_t m_t log rho_t / sum_t m_t) <= geo_mask_high], per sequence
//   icepop        w_t = rho_t * [icepop_low <= rho_t <= icepop_high]
//   none          w_t = 1
// cu_seqlens (S+1) bounds the sequences (only seq_geo_mask reads it). The ratio is computed in
// double and rounded once to float.
void correction_weights(float* w, const float* learner, const float* sampler, const float* mask,
                        const int32_t* cu_seqlens, int S, int T, MismatchCorrection mode, const GrpoLossConfig& cfg,
                        double tis_cap = 0);

}  // namespace troupe::learner
