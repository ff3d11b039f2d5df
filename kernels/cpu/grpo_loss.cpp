// CPU body of the fused GRPO per-token loss (troupe/kernels/grpo_loss.h): one pass over the tokens
// of each sequence (two for the sequence-level ratio, which needs the sequence mean first) writes
// the loss, both gradients and every metric together.
#include "troupe/kernels/grpo_loss.h"

#include <algorithm>
#include <cmath>

namespace troupe::kernels {
namespace {

inline double clampd(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }
inline double pass(double x, double lo, double hi) { return (x >= lo && x <= hi) ? 1.0 : 0.0; }

// Clipped surrogate for one ratio value: the loss and d loss / d rho.
struct Surrogate {
  double loss, dloss_drho;
  bool clip_low, clip_high, dual;
};

inline Surrogate surrogate(double rho, double A, const GrpoLossParams& p) {
  const double lo = 1.0 - p.clip_low, hi = 1.0 + p.clip_high;
  double r1 = rho, d1 = 1.0;
  if (p.two_sided_clip > 0) {
    r1 = std::min<double>(rho, p.two_sided_clip);
    d1 = rho <= p.two_sided_clip ? 1.0 : 0.0;
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
  if (p.dual_clip > 1 && A < 0) {  // dual clip: min(-A c, max(a, b)) for negative advantages
    const double c3 = -A * p.dual_clip;
    if (c3 < l) {
      l = c3;
      g = 0;
      dual = true;
    } else if (c3 == l) {
      g *= 0.5;
    }
  }
  return {l, g, rho < lo && A<0, rho> hi && A > 0, dual};
}

// KL estimate of one token and d kl / d logp.
inline void kl_token(double logp, double ref, const GrpoLossParams& p, double& kl, double& dkl_dlogp) {
  double x = ref - logp, din = 1.0;
  if (p.kl_input_clamp > 0) {
    din = pass(x, -p.kl_input_clamp, p.kl_input_clamp);
    x = clampd(x, -p.kl_input_clamp, p.kl_input_clamp);
  }
  double dx;
  switch (p.kl_type) {
    case KlEstimator::k1:
      kl = -x;
      dx = -1.0;
      break;
    case KlEstimator::k2:
      kl = 0.5 * x * x;
      dx = x;
      break;
    case KlEstimator::k3:
    default: {
      const double e = std::exp(x);
      kl = e - 1.0 - x;
      dx = e - 1.0;
      break;
    }
  }
  double dout = 1.0;
  if (p.kl_output_clamp > 0) {
    dout = pass(kl, -p.kl_output_clamp, p.kl_output_clamp);
    kl = clampd(kl, -p.kl_output_clamp, p.kl_output_clamp);
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

GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& b, const GrpoLossParams& p,
                       const GrpoLossAggregation& agg) {
  GrpoLossSums m;
  const bool seq_level = p.sequence_level_ratio;
  const float* logp = b.logp;
  const float* entropy = b.entropy;
  for (int s = 0; s < b.S; ++s) {
    const int t0 = b.cu_seqlens[s], t1 = b.cu_seqlens[s + 1];
    const double A = b.advantages[s];
    double seq_tokens = 0, seq_lr = 0, seq_iw = 0;  // seq_iw: sum of m * is_weight
    for (int t = t0; t < t1; ++t) {
      seq_tokens += b.mask[t];
      seq_iw += b.mask[t] * (b.is_weight ? b.is_weight[t] : 1.0);
      if (seq_level && b.logp_old && b.mask[t] != 0)
        seq_lr += b.mask[t] * (static_cast<double>(logp[t]) - b.logp_old[t]);
    }
    if (b.seq_tokens) seq_tokens = b.seq_tokens[s];
    const double ws = agg.per_seq_tokens ? 1.0 / (std::max(seq_tokens, 1.0) * agg.denominator) : 1.0 / agg.denominator;
    // Sequence level: one ratio per sequence, rho = exp(mean_t m (logp - old)); its loss is shared
    // by every token, so d loss / d logp_t = (sum of token weights) * dpg/drho * rho * m_t / L.
    Surrogate sq{0, 0, false, false, false};
    double seq_rho = 1.0, seq_scale = 0.0;
    if (seq_level) {
      double dlr = 1.0;
      const double lr = log_ratio_of(seq_lr / std::max(seq_tokens, 1.0), 0.0, p.log_ratio_clamp, dlr);
      seq_rho = std::exp(lr);
      sq = surrogate(seq_rho, A, p);
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
        rho = b.logp_old ? std::exp(log_ratio_of(logp[t], b.logp_old[t], p.log_ratio_clamp, dlr)) : 1.0;
        Surrogate su = surrogate(rho, A, p);
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
        kl_token(logp[t], b.logp_ref[t], p, kl, dkl);
        m.kl_sum += mt * kl;
        if (p.kl_coef != 0) {
          l += p.kl_coef * kl;
          m.kl_loss += w * p.kl_coef * kl;
          g += w * p.kl_coef * dkl;
        }
      }
      if (entropy) {
        m.entropy_sum += mt * entropy[t];
        l -= p.entropy_coef * entropy[t];
      }
      if (dentropy) dentropy[t] = static_cast<float>(-w * p.entropy_coef);
      m.loss += w * l;
      m.ratio_sum += mt * rho;
      m.tokens += mt;
      dlogp[t] = static_cast<float>(g);
    }
  }
  return m;
}

}  // namespace troupe::kernels
