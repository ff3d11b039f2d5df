// The fused GRPO per-token loss as one op: for each sequence of a packed batch, the clipped
// surrogate of the importance ratio (token- or sequence-level), the optional KL penalty to a
// reference policy and the entropy bonus, aggregated with a per-sequence weight; it ASSIGNS
// dlogp (T) and dentropy (T) and returns the metric sums. Everything in double, then rounded to
// float once per gradient. Ties of min/max split the gradient in half; clamps pass the gradient at
// their bounds (as autograd does). The caller validates the batch and the normalisers.
#pragma once

#include <cstdint>

namespace troupe::kernels {

enum class KlEstimator { k1, k2, k3 };  // k1 = -x, k2 = x^2 / 2, k3 = e^x - 1 - x, x = ref - logp

// The loss's settings. Field names and defaults are the YAML keys (`loss.*`) that set them;
// learner::GrpoLossConfig is this struct plus the aggregation mode, so the schema writes it directly.
struct GrpoLossParams {
  float clip_low = 0.2f;              // rho clipped to [1 - clip_low, 1 + clip_high]
  float clip_high = 0.2f;
  float dual_clip = 0.0f;             // > 1: dual clip for A < 0, loss <= -A * c
  float kl_coef = 0.0f;               // KL coefficient (the KL metric is summed whenever logp_ref is given)
  KlEstimator kl_type = KlEstimator::k3;
  float kl_input_clamp = 20.0f;       // > 0: clamp x to +-this before the estimator
  float kl_output_clamp = 10.0f;      // > 0: clamp the estimate to +-this
  float entropy_coef = 0.0f;          // loss -= entropy_coef * H
  bool sequence_level_ratio = false;  // one ratio per sequence: exp(mean_t m (logp - old)) (GSPO)
  float two_sided_clip = 0.0f;        // > 0: rho <- min(rho, two_sided_clip) in the unclipped term
  float log_ratio_clamp = 0.0f;       // > 0: clamp logp - old to +-this before exp
};

// Aggregation: sequence s weighs each of its tokens by m_t / d_s with d_s = denominator, times
// max(sum of its mask, 1) when per_seq_tokens. denominator > 0.
struct GrpoLossAggregation {
  double denominator = 1.0;
  bool per_seq_tokens = false;
};

// Inputs per position t (T) or per sequence s (S); optional ones may be null.
struct GrpoLossBatch {
  int T = 0, S = 0;
  const int32_t* cu_seqlens = nullptr;  // (S+1)
  const float* mask = nullptr;          // (T)
  const float* advantages = nullptr;    // (S)
  const float* logp = nullptr;          // (T) current policy
  const float* logp_old = nullptr;      // (T) or null: on-policy (ratio 1, detached)
  const float* logp_ref = nullptr;      // (T) or null: no KL
  const float* is_weight = nullptr;     // (T) or null: 1
  const float* entropy = nullptr;       // (T) or null
  // (S) or null: each sequence's mask sum over all its positions, for a batch that holds only some
  // rows of its sequences (a tile of rows; token-level ratio only). Null: summed from mask.
  const double* seq_tokens = nullptr;
};

// Metric sums of the batch (each masked by m_t; loss, pg_loss, kl_loss already weighted).
struct GrpoLossSums {
  double loss = 0, pg_loss = 0, kl_loss = 0, tokens = 0, kl_sum = 0, clip_low_sum = 0, clip_high_sum = 0,
         dual_clip_sum = 0, entropy_sum = 0, ratio_sum = 0, is_weight_sum = 0;
};

// dlogp (T) assigned; dentropy (T) assigned when not null (-w_t * entropy_coef, 0 where m_t = 0).
GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& b, const GrpoLossParams& p,
                       const GrpoLossAggregation& agg);

}  // namespace troupe::kernels
