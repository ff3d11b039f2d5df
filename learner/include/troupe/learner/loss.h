// Per-token GRPO and SFT losses on a packed batch: T token positions, S sequences (cu_seqlens).
// The model gives logp (T) and entropy (T) at each position; these functions return the loss and
// ASSIGN dlogp (T) and dentropy (T) = d loss / d logp, d loss / d entropy (0 where mask = 0).
// Normalisation uses GLOBAL counts (all ranks, all micro-batches of one optimizer step), so summing
// the gradients of every micro-batch on every rank gives the gradient of the whole mini-batch.
#pragma once

#include <cstdint>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"
#include "troupe/learner/config.h"

namespace troupe::learner {

// Inputs of one micro-batch, all per position t of the packed batch (T) or per sequence (S).
struct TokenBatch {
  int T = 0;
  int S = 0;
  const int32_t* cu_seqlens = nullptr;  // (S+1) sequence s owns positions [cu[s], cu[s+1])
  const float* mask = nullptr;          // (T) 1 on completion-token targets (EOS included), 0 elsewhere
  const float* logp_old = nullptr;      // (T) log-probs at generation; nullptr = on-policy (old = logp, detached)
  const float* logp_ref = nullptr;      // (T) reference log-probs; may be nullptr when kl_coef == 0
  const float* advantages = nullptr;    // (S) one advantage per sequence (outcome supervision)
  // (T) a constant (detached) factor on each token's policy-gradient term, e.g. the truncated
  // importance weight min(pi_old / pi_behaviour, cap) of stale async samples; nullptr = 1
  const float* is_weight = nullptr;
  // (S) each sequence's mask sum over all its positions when the batch holds only some rows of its
  // sequences (a tile of the fused head; token-level ratio only); nullptr = summed from mask here
  const double* seq_tokens = nullptr;
};

// Global denominators of one optimizer step.
struct LossNorm {
  double num_tokens = 0;  // sum of mask over the whole mini-batch, all ranks (token-mean)
  double num_seqs = 0;    // sequences in the whole mini-batch, all ranks (seq-mean-*)
};

// Metric sums of one micro-batch. Sums add across micro-batches and ranks; finalize() divides.
struct LossMetrics {
  double loss = 0;            // already globally normalised: the sum over micro-batches is the step's loss
  double pg_loss = 0;         // the policy-gradient part of `loss`
  double kl_loss = 0;         // kl_coef * KL part of `loss` (0 when kl_coef == 0)
  double tokens = 0;          // sum of mask
  double kl_sum = 0;          // sum_t m * KL_t (computed even when kl_coef == 0 if ref is given)
  double clip_low_sum = 0;    // tokens with rho < 1 - clip_low and A < 0 (TRL)
  double clip_high_sum = 0;   // tokens with rho > 1 + clip_high and A > 0 (TRL)
  double dual_clip_sum = 0;   // tokens where the dual clip bound was active
  double entropy_sum = 0;     // sum_t m * H_t
  double ratio_sum = 0;       // sum_t m * rho_t
  double is_weight_sum = 0;   // sum_t m * is_weight_t (= tokens when no weights are given)
  void add(const LossMetrics& o);
};

// Means per token of a step's summed metrics.
struct LossSummary {
  double loss = 0, pg_loss = 0, kl_loss = 0, kl = 0, clip_frac_low = 0, clip_frac_high = 0, dual_clip_frac = 0,
         entropy = 0, ratio_mean = 0, is_weight_mean = 1, tokens = 0;
};
LossSummary finalize(const LossMetrics& m);

// The fused GRPO loss: one pass over the tokens of each sequence computes loss, both gradients and
// every metric. `entropy` may be nullptr when entropy_coef == 0 (then dentropy may be nullptr too).
// Errors: bad sizes, missing ref with kl_coef != 0, non-positive normalisers. The math is the
// backend's grpo_loss op (the trainer passes its model's backend); the arrays must be ones that
// backend can read (host arrays on the CPU backend).
Result<LossMetrics> grpo_loss_fused(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                                    const TokenBatch& batch, const GrpoLossConfig& cfg, const LossNorm& norm,
                                    const kernels::Backend& backend = kernels::cpu_backend());

// The same loss composed from separate simple elementwise ops with temporaries (the benchmark
// baseline and a cross-check of the fused one). Same contract.
Result<LossMetrics> grpo_loss_composed(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                                       const TokenBatch& batch, const GrpoLossConfig& cfg, const LossNorm& norm);

// SFT: NLL of the completion tokens, token-mean over the global token count:
// loss = -sum_t m_t logp_t / norm.num_tokens. Only mask and cu_seqlens of `batch` are read.
Result<LossMetrics> sft_loss(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                             const TokenBatch& batch, const LossNorm& norm);

// Per-token weight of the aggregation: loss = sum_t w_t * l_t with w_t = m_t * weight(seq).
// Exposed for the trainer and tests. Errors when the normaliser it needs is not positive.
Result<double> aggregation_weight(LossAggMode mode, double seq_tokens, const LossNorm& norm, int agg_norm_length);

}  // namespace troupe::learner
