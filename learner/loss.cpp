// GRPO / SFT losses (see loss.h). The fused path visits each token once (twice for GSPO, whose
// ratio needs the sequence mean first) and writes loss, gradients and metrics together; the
// composed path builds the same loss from separate elementwise ops with temporaries. Ties of
// min/max split the gradient in half, and clamps pass the gradient at their bounds (as autograd).
#include "troupe/learner/loss.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "troupe/kernels/backend.h"

namespace troupe::learner {

void LossMetrics::add(const LossMetrics& o) {
  loss += o.loss;
  pg_loss += o.pg_loss;
  kl_loss += o.kl_loss;
  tokens += o.tokens;
  kl_sum += o.kl_sum;
  clip_low_sum += o.clip_low_sum;
  clip_high_sum += o.clip_high_sum;
  dual_clip_sum += o.dual_clip_sum;
  entropy_sum += o.entropy_sum;
  ratio_sum += o.ratio_sum;
  is_weight_sum += o.is_weight_sum;
}

LossSummary finalize(const LossMetrics& m) {
  LossSummary s;
  s.loss = m.loss;
  s.pg_loss = m.pg_loss;
  s.kl_loss = m.kl_loss;
  s.tokens = m.tokens;
  if (m.tokens > 0) {
    s.kl = m.kl_sum / m.tokens;
    s.clip_frac_low = m.clip_low_sum / m.tokens;
    s.clip_frac_high = m.clip_high_sum / m.tokens;
    s.dual_clip_frac = m.dual_clip_sum / m.tokens;
    s.entropy = m.entropy_sum / m.tokens;
    s.ratio_mean = m.ratio_sum / m.tokens;
    s.is_weight_mean = m.is_weight_sum / m.tokens;
  }
  return s;
}

Result<double> aggregation_weight(LossAggMode mode, double seq_tokens, const LossNorm& norm, int agg_norm_length) {
  switch (mode) {
    case LossAggMode::token_mean:
      if (!(norm.num_tokens > 0)) return invalid_input("grpo loss: token-mean needs a positive global token count");
      return 1.0 / norm.num_tokens;
    case LossAggMode::seq_mean_token_mean:
      if (!(norm.num_seqs > 0)) return invalid_input("grpo loss: seq-mean-token-mean needs a positive sequence count");
      return 1.0 / (std::max(seq_tokens, 1.0) * norm.num_seqs);
    case LossAggMode::seq_mean_token_sum:
      if (!(norm.num_seqs > 0)) return invalid_input("grpo loss: seq-mean-token-sum needs a positive sequence count");
      return 1.0 / norm.num_seqs;
    case LossAggMode::seq_mean_token_sum_norm:
      if (!(norm.num_seqs > 0)) return invalid_input("grpo loss: seq-mean-token-sum-norm needs a positive sequence count");
      if (!(agg_norm_length > 0))
        return invalid_input("grpo loss: seq-mean-token-sum-norm needs agg_norm_length > 0 (e.g. max_completion_length)");
      return 1.0 / (norm.num_seqs * agg_norm_length);
  }
  return invalid_input("grpo loss: unknown agg_mode");
}

namespace {

Status check_batch(const TokenBatch& b, const GrpoLossConfig& cfg, const float* logp, const float* entropy,
                   const float* dlogp, const float* dentropy) {
  if (b.T < 0 || b.S < 0) return invalid_input("grpo loss: negative T or S");
  if (!b.cu_seqlens || !b.mask || !logp || !dlogp || (b.S > 0 && !b.advantages))
    return invalid_input("grpo loss: cu_seqlens, mask, logp, dlogp and advantages are required");
  if (b.cu_seqlens[0] != 0 || b.cu_seqlens[b.S] != b.T)
    return invalid_input("grpo loss: cu_seqlens must start at 0 and end at T=" + std::to_string(b.T));
  for (int s = 0; s < b.S; ++s)
    if (b.cu_seqlens[s + 1] < b.cu_seqlens[s]) return invalid_input("grpo loss: cu_seqlens is not sorted at " + std::to_string(s));
  if (cfg.kl_coef != 0 && !b.logp_ref)
    return invalid_input("grpo loss: kl_coef = " + std::to_string(cfg.kl_coef) + " needs reference log-probs (logp_ref)");
  if (cfg.entropy_coef != 0 && (!entropy || !dentropy))
    return invalid_input("grpo loss: entropy_coef != 0 needs the per-token entropy");
  if (cfg.clip_low < 0 || cfg.clip_high < 0) return invalid_input("grpo loss: clip_low and clip_high must be >= 0");
  return Status::ok_status();
}

inline double clampd(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }
inline double pass(double x, double lo, double hi) { return (x >= lo && x <= hi) ? 1.0 : 0.0; }

}  // namespace

Result<LossMetrics> grpo_loss_fused(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                                    const TokenBatch& b, const GrpoLossConfig& cfg, const LossNorm& norm,
                                    const kernels::Backend& backend) {
  TROUPE_TRY(check_batch(b, cfg, logp, entropy, dlogp, dentropy));
  // The per-sequence weight is 1 / d (token-mean, seq-mean-token-sum[-norm]) or
  // 1 / (max(seq tokens, 1) d) (seq-mean-token-mean); aggregation_weight says which d is invalid.
  if (b.S > 0) TROUPE_TRY(aggregation_weight(cfg.agg_mode, 1.0, norm, cfg.agg_norm_length));
  kernels::GrpoLossAggregation agg;
  agg.per_seq_tokens = cfg.agg_mode == LossAggMode::seq_mean_token_mean;
  agg.denominator = cfg.agg_mode == LossAggMode::token_mean ? norm.num_tokens
                    : cfg.agg_mode == LossAggMode::seq_mean_token_sum_norm
                        ? norm.num_seqs * static_cast<double>(cfg.agg_norm_length)
                        : norm.num_seqs;
  const kernels::GrpoLossBatch kb{b.T,  b.S,        b.cu_seqlens, b.mask,      b.advantages,
                                  logp, b.logp_old, b.logp_ref,   b.is_weight, entropy, b.seq_tokens};
  const kernels::GrpoLossSums s = backend.grpo_loss(dlogp, dentropy, kb, cfg, agg);
  // LossMetrics in field order.
  return LossMetrics{s.loss,        s.pg_loss,      s.kl_loss,       s.tokens,
                     s.kl_sum,      s.clip_low_sum, s.clip_high_sum, s.dual_clip_sum,
                     s.entropy_sum, s.ratio_sum,    s.is_weight_sum};
}

// ---- composed: one simple op per step, each with its own temporary, forward then backward ----

namespace {
using Vec = std::vector<double>;

Vec op_sub(const float* a, const float* b, int n) {  // b may be null (= a, detached)
  Vec out(n);
  for (int i = 0; i < n; ++i) out[i] = b ? static_cast<double>(a[i]) - b[i] : 0.0;
  return out;
}
Vec op_clamp(const Vec& x, double lo, double hi) {
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = clampd(x[i], lo, hi);
  return out;
}
Vec op_clamp_grad(const Vec& dy, const Vec& x, double lo, double hi) {
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = dy[i] * pass(x[i], lo, hi);
  return out;
}
Vec op_exp(const Vec& x) {
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::exp(x[i]);
  return out;
}
Vec op_mul(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * b[i];
  return out;
}
Vec op_broadcast_seq(const float* per_seq, const int32_t* cu, int S, int T) {
  Vec out(T);
  for (int s = 0; s < S; ++s)
    for (int t = cu[s]; t < cu[s + 1]; ++t) out[t] = per_seq[s];
  return out;
}
Vec op_seq_sum(const Vec& x, const int32_t* cu, int S) {
  Vec out(S, 0.0);
  for (int s = 0; s < S; ++s)
    for (int t = cu[s]; t < cu[s + 1]; ++t) out[s] += x[t];
  return out;
}
Vec op_broadcast_vec(const Vec& per_seq, const int32_t* cu, int S, int T) {
  Vec out(T);
  for (int s = 0; s < S; ++s)
    for (int t = cu[s]; t < cu[s + 1]; ++t) out[t] = per_seq[s];
  return out;
}

// The KL penalty per token against the reference policy, kl[t], and its derivative in logp, dkl[t]
// (with the optional input and output clamps).
void kl_term(Vec& kl, Vec& dkl, const float* logp_ref, const float* logp, const GrpoLossConfig& cfg, int T) {
  Vec x(T);
  for (int t = 0; t < T; ++t) x[t] = static_cast<double>(logp_ref[t]) - logp[t];
  Vec xc = cfg.kl_input_clamp > 0 ? op_clamp(x, -cfg.kl_input_clamp, cfg.kl_input_clamp) : x;
  Vec dk_dx(T);
  for (int t = 0; t < T; ++t) {
    switch (cfg.kl_type) {
      case KlEstimator::k1: kl[t] = -xc[t]; dk_dx[t] = -1.0; break;
      case KlEstimator::k2: kl[t] = 0.5 * xc[t] * xc[t]; dk_dx[t] = xc[t]; break;
      case KlEstimator::k3: kl[t] = std::exp(xc[t]) - 1.0 - xc[t]; dk_dx[t] = std::exp(xc[t]) - 1.0; break;
    }
  }
  Vec kl_raw = kl;
  if (cfg.kl_output_clamp > 0) {
    kl = op_clamp(kl_raw, -cfg.kl_output_clamp, cfg.kl_output_clamp);
    dk_dx = op_clamp_grad(dk_dx, kl_raw, -cfg.kl_output_clamp, cfg.kl_output_clamp);
  }
  if (cfg.kl_input_clamp > 0) dk_dx = op_clamp_grad(dk_dx, x, -cfg.kl_input_clamp, cfg.kl_input_clamp);
  for (int t = 0; t < T; ++t) dkl[t] = -dk_dx[t];
}
}  // namespace

Result<LossMetrics> grpo_loss_composed(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                                       const TokenBatch& b, const GrpoLossConfig& cfg, const LossNorm& norm) {
  TROUPE_TRY(check_batch(b, cfg, logp, entropy, dlogp, dentropy));
  const int T = b.T, S = b.S;
  const int32_t* cu = b.cu_seqlens;
  const bool seq_level = cfg.sequence_level_ratio;
  Vec mask(b.mask, b.mask + T);
  Vec adv = op_broadcast_seq(b.advantages, cu, S, T);
  // weights w_t = m_t * agg(seq)
  Vec seq_tokens = op_seq_sum(mask, cu, S);
  Vec seq_w(S);
  for (int s = 0; s < S; ++s) {
    TROUPE_ASSIGN_OR_RETURN(seq_w[s], aggregation_weight(cfg.agg_mode, seq_tokens[s], norm, cfg.agg_norm_length));
  }
  Vec w = op_mul(mask, op_broadcast_vec(seq_w, cu, S, T));

  // forward
  Vec log_ratio = op_sub(logp, b.logp_old, T);
  Vec lr_in;  // the input of the optional clamp
  Vec seq_mean_lr;
  if (seq_level) {
    Vec seq_sum = op_seq_sum(op_mul(log_ratio, mask), cu, S);
    seq_mean_lr.resize(S);
    for (int s = 0; s < S; ++s) seq_mean_lr[s] = seq_sum[s] / std::max(seq_tokens[s], 1.0);
    log_ratio = op_broadcast_vec(seq_mean_lr, cu, S, T);
  }
  lr_in = log_ratio;
  if (cfg.log_ratio_clamp > 0) log_ratio = op_clamp(log_ratio, -cfg.log_ratio_clamp, cfg.log_ratio_clamp);
  Vec ratio = op_exp(log_ratio);
  Vec ratio1 = cfg.two_sided_clip > 0 ? op_clamp(ratio, -INFINITY, cfg.two_sided_clip) : ratio;
  Vec ratio2 = op_clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
  Vec surr1 = op_mul(ratio1, adv), surr2 = op_mul(ratio2, adv);
  Vec pg(T), pick1(T), pick2(T);  // d pg / d surr1, d surr2 (-1, -1/2 on ties)
  for (int t = 0; t < T; ++t) {
    const double a = -surr1[t], c = -surr2[t];
    pg[t] = std::max(a, c);
    pick1[t] = a > c ? -1.0 : (a == c ? -0.5 : 0.0);
    pick2[t] = c > a ? -1.0 : (a == c ? -0.5 : 0.0);
  }
  Vec dual_scale(T, 1.0), dual_active(T, 0.0);
  if (cfg.dual_clip > 1) {
    for (int t = 0; t < T; ++t) {
      if (adv[t] >= 0) continue;
      const double c3 = -adv[t] * cfg.dual_clip;
      if (c3 < pg[t]) {
        pg[t] = c3;
        dual_scale[t] = 0.0;
        dual_active[t] = 1.0;
      } else if (c3 == pg[t]) {
        dual_scale[t] = 0.5;
      }
    }
  }
  Vec iw(T, 1.0);
  if (b.is_weight)
    for (int t = 0; t < T; ++t) iw[t] = b.is_weight[t];
  pg = op_mul(pg, iw);
  Vec per_tok = pg;
  Vec kl(T, 0.0), dkl(T, 0.0);
  if (b.logp_ref) {
    kl_term(kl, dkl, b.logp_ref, logp, cfg, T);
    if (cfg.kl_coef != 0)
      for (int t = 0; t < T; ++t) per_tok[t] += cfg.kl_coef * kl[t];
  }
  if (entropy)
    for (int t = 0; t < T; ++t) per_tok[t] -= cfg.entropy_coef * entropy[t];

  LossMetrics m;
  for (int t = 0; t < T; ++t) {
    m.loss += w[t] * per_tok[t];
    m.pg_loss += w[t] * pg[t];
    if (cfg.kl_coef != 0) m.kl_loss += w[t] * cfg.kl_coef * kl[t];
    m.tokens += mask[t];
    m.kl_sum += mask[t] * kl[t];
    if (entropy) m.entropy_sum += mask[t] * entropy[t];
    m.ratio_sum += mask[t] * ratio[t];
    m.is_weight_sum += mask[t] * iw[t];
    m.clip_low_sum += mask[t] * (ratio[t] < 1.0 - cfg.clip_low && adv[t] < 0);
    m.clip_high_sum += mask[t] * (ratio[t] > 1.0 + cfg.clip_high && adv[t] > 0);
    m.dual_clip_sum += mask[t] * dual_active[t];
  }

  // backward: d loss / d per_tok = w
  Vec d_pg(T);
  for (int t = 0; t < T; ++t) d_pg[t] = w[t] * dual_scale[t] * iw[t];
  Vec d_ratio1 = op_mul(op_mul(d_pg, pick1), adv);
  Vec d_ratio2 = op_mul(op_mul(d_pg, pick2), adv);
  if (cfg.two_sided_clip > 0) d_ratio1 = op_clamp_grad(d_ratio1, ratio, -INFINITY, cfg.two_sided_clip);
  d_ratio2 = op_clamp_grad(d_ratio2, ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
  Vec d_ratio(T);
  for (int t = 0; t < T; ++t) d_ratio[t] = d_ratio1[t] + d_ratio2[t];
  Vec d_log_ratio = op_mul(d_ratio, ratio);
  if (cfg.log_ratio_clamp > 0) d_log_ratio = op_clamp_grad(d_log_ratio, lr_in, -cfg.log_ratio_clamp, cfg.log_ratio_clamp);
  Vec d_logp(T);
  if (seq_level) {
    Vec d_seq = op_seq_sum(d_log_ratio, cu, S);  // broadcast backward
    for (int s = 0; s < S; ++s) d_seq[s] /= std::max(seq_tokens[s], 1.0);
    d_logp = op_mul(op_broadcast_vec(d_seq, cu, S, T), mask);
  } else {
    d_logp = d_log_ratio;
  }
  for (int t = 0; t < T; ++t) {
    double g = d_logp[t];
    if (cfg.kl_coef != 0) g += w[t] * cfg.kl_coef * dkl[t];
    dlogp[t] = mask[t] != 0 ? static_cast<float>(g) : 0.0f;
    if (dentropy) dentropy[t] = mask[t] != 0 ? static_cast<float>(-w[t] * cfg.entropy_coef) : 0.0f;
  }
  return m;
}

Result<LossMetrics> sft_loss(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                             const TokenBatch& b, const LossNorm& norm) {
  if (!b.mask || !logp || !dlogp) return invalid_input("sft loss: mask, logp and dlogp are required");
  if (!(norm.num_tokens > 0)) return invalid_input("sft loss: needs a positive global token count");
  LossMetrics m;
  const double inv = 1.0 / norm.num_tokens;
  for (int t = 0; t < b.T; ++t) {
    const double mt = b.mask[t];
    m.loss += -mt * logp[t] * inv;
    m.tokens += mt;
    if (entropy) m.entropy_sum += mt * entropy[t];
    dlogp[t] = static_cast<float>(-mt * inv);
    if (dentropy) dentropy[t] = 0.0f;
  }
  m.pg_loss = m.loss;
  m.ratio_sum = m.tokens;
  return m;
}

}  // namespace troupe::learner
