// GRPO / SFT losses (see loss.h). The fused path visits each token once (twice for GSPO, whose
// ratio needs the sequence mean first) and writes loss, gradients and metrics together; the
// composed path builds the same loss from separate elementwise ops with temporaries. Ties of
// min/max split the gradient in half, and clamps pass the gradient at their bounds (as autograd).
#include "troupe/learner/loss.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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

// Clipped surrogate for one ratio value: returns the loss and writes d loss / d rho.
struct Surrogate {
  double loss, dloss_drho;
  bool clip_low, clip_high, dual;
};

inline Surrogate surrogate(double rho, double A, const GrpoLossConfig& cfg) {
  const double lo = 1.0 - cfg.clip_low, hi = 1.0 + cfg.clip_high;
  double r1 = rho, d1 = 1.0;
  if (cfg.two_sided_clip > 0) {
    r1 = std::min<double>(rho, cfg.two_sided_clip);
    d1 = rho <= cfg.two_sided_clip ? 1.0 : 0.0;
  }
  const double r2 = clampd(rho, lo, hi), d2 = pass(rho, lo, hi);
  const double a = -A * r1, b = -A * r2;  // -min(rho A, clip(rho) A) = max(a, b)
  double l, g;
  if (a > b) {
    l = a;
    g = -A * d1;
  } else if (b > a) {
    l = b;
    g = -A * d2;
  } else {
    l = a;
    g = 0.5 * (-A * d1 - A * d2);
  }
  bool dual = false;
  if (cfg.dual_clip > 1 && A < 0) {  // veRL dual clip: min(-A c, max(a, b)) for negative advantages
    const double c3 = -A * cfg.dual_clip;
    if (c3 < l) {
      l = c3;
      g = 0;
      dual = true;
    } else if (c3 == l) {
      g *= 0.5;
    }
  }
  return {l, g, rho < lo && A < 0, rho > hi && A > 0, dual};
}

// KL estimate of one token and d kl / d logp.
inline void kl_token(double logp, double ref, const GrpoLossConfig& cfg, double& kl, double& dkl_dlogp) {
  double x = ref - logp, din = 1.0;
  if (cfg.kl_input_clamp > 0) {
    din = pass(x, -cfg.kl_input_clamp, cfg.kl_input_clamp);
    x = clampd(x, -cfg.kl_input_clamp, cfg.kl_input_clamp);
  }
  double dx;
  switch (cfg.kl_type) {
    case KlEstimator::k1: kl = -x; dx = -1.0; break;
    case KlEstimator::k2: kl = 0.5 * x * x; dx = x; break;
    case KlEstimator::k3:
    default: {
      const double e = std::exp(x);
      kl = e - 1.0 - x;
      dx = e - 1.0;
      break;
    }
  }
  double dout = 1.0;
  if (cfg.kl_output_clamp > 0) {
    dout = pass(kl, -cfg.kl_output_clamp, cfg.kl_output_clamp);
    kl = clampd(kl, -cfg.kl_output_clamp, cfg.kl_output_clamp);
  }
  dkl_dlogp = -dx * din * dout;
}

inline double log_ratio_of(double logp, double old, float clamp_c, double& dlr) {
  double lr = logp - old;
  dlr = 1.0;
  if (clamp_c > 0) {
    dlr = pass(lr, -clamp_c, clamp_c);
    lr = clampd(lr, -clamp_c, clamp_c);
  }
  return lr;
}

}  // namespace

Result<LossMetrics> grpo_loss_fused(float* dlogp, float* dentropy, const float* logp, const float* entropy,
                                    const TokenBatch& b, const GrpoLossConfig& cfg, const LossNorm& norm) {
  TROUPE_TRY(check_batch(b, cfg, logp, entropy, dlogp, dentropy));
  LossMetrics m;
  const bool seq_level = cfg.sequence_level_ratio;
  const bool want_entropy = entropy != nullptr;
  for (int s = 0; s < b.S; ++s) {
    const int t0 = b.cu_seqlens[s], t1 = b.cu_seqlens[s + 1];
    const double A = b.advantages[s];
    double seq_tokens = 0, seq_lr = 0, seq_iw = 0;  // seq_iw: sum of m * is_weight
    for (int t = t0; t < t1; ++t) {
      seq_tokens += b.mask[t];
      seq_iw += b.mask[t] * (b.is_weight ? b.is_weight[t] : 1.0);
      if (seq_level && b.logp_old && b.mask[t] != 0) seq_lr += b.mask[t] * (static_cast<double>(logp[t]) - b.logp_old[t]);
    }
    TROUPE_ASSIGN_OR_RETURN(const double ws, aggregation_weight(cfg.agg_mode, seq_tokens, norm, cfg.agg_norm_length));
    // GSPO: one ratio per sequence, rho = exp(mean_t m (logp - old)); its loss is shared by every
    // token, so d loss / d logp_t = (sum of token weights) * dpg/drho * rho * m_t / L.
    Surrogate sq{0, 0, false, false, false};
    double seq_rho = 1.0, seq_scale = 0.0;
    if (seq_level) {
      double dlr = 1.0;
      const double lr = log_ratio_of(seq_lr / std::max(seq_tokens, 1.0), 0.0, cfg.log_ratio_clamp, dlr);
      seq_rho = std::exp(lr);
      sq = surrogate(seq_rho, A, cfg);
      seq_scale = (ws * seq_iw) * sq.dloss_drho * seq_rho * dlr / std::max(seq_tokens, 1.0);
    }
    for (int t = t0; t < t1; ++t) {
      const double mt = b.mask[t];
      if (mt == 0) {
        dlogp[t] = 0;
        if (dentropy) dentropy[t] = 0;
        continue;
      }
      const double w = mt * ws;
      double pg, g;
      double rho;
      if (seq_level) {
        pg = sq.loss;
        g = seq_scale * mt;  // already includes the token weights of the whole sequence
        rho = seq_rho;
        m.clip_low_sum += mt * sq.clip_low;
        m.clip_high_sum += mt * sq.clip_high;
        m.dual_clip_sum += mt * sq.dual;
      } else {
        double dlr = 1.0;
        rho = b.logp_old ? std::exp(log_ratio_of(logp[t], b.logp_old[t], cfg.log_ratio_clamp, dlr)) : 1.0;
        Surrogate su = surrogate(rho, A, cfg);
        pg = su.loss;
        g = w * su.dloss_drho * rho * dlr;
        m.clip_low_sum += mt * su.clip_low;
        m.clip_high_sum += mt * su.clip_high;
        m.dual_clip_sum += mt * su.dual;
      }
      const double iw = b.is_weight ? b.is_weight[t] : 1.0;
      pg *= iw;
      if (!seq_level) g *= iw;  // (the sequence-level gradient sums the weighted tokens already)
      m.is_weight_sum += mt * iw;
      double l = pg;
      m.pg_loss += w * pg;
      if (b.logp_ref) {
        double kl, dkl;
        kl_token(logp[t], b.logp_ref[t], cfg, kl, dkl);
        m.kl_sum += mt * kl;
        if (cfg.kl_coef != 0) {
          l += cfg.kl_coef * kl;
          m.kl_loss += w * cfg.kl_coef * kl;
          g += w * cfg.kl_coef * dkl;
        }
      }
      if (want_entropy) {
        m.entropy_sum += mt * entropy[t];
        l -= cfg.entropy_coef * entropy[t];
      }
      if (dentropy) dentropy[t] = static_cast<float>(-w * cfg.entropy_coef);
      m.loss += w * l;
      m.ratio_sum += mt * rho;
      m.tokens += mt;
      dlogp[t] = static_cast<float>(g);
    }
  }
  return m;
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
    Vec x(T);
    for (int t = 0; t < T; ++t) x[t] = static_cast<double>(b.logp_ref[t]) - logp[t];
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
