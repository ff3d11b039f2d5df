// Kernel body of the fused GRPO per-token loss (grpo_loss.cu): one thread per sequence runs the CPU
// op's per-sequence pass (kernels/cpu/grpo_loss.cpp, in double), writes dlogp/dentropy of its
// tokens and its metric sums to row s of `sums` (kGrpoSums doubles); the launcher adds the rows in
// sequence order.
#pragma once

#include "lanes.h"
#include "troupe/kernels/grpo_loss.h"

namespace troupe::kernels::cuda {

inline constexpr int kGrpoSums = 11;  // GrpoLossSums' fields, in declaration order

TROUPE_HD inline double grpo_clamp(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }
TROUPE_HD inline double grpo_pass(double x, double lo, double hi) { return (x >= lo && x <= hi) ? 1.0 : 0.0; }

struct GrpoSurrogate {
  double loss, dloss_drho;
  bool clip_low, clip_high, dual;
};

TROUPE_HD inline GrpoSurrogate grpo_surrogate(double rho, double A, const GrpoLossParams& p) {
  const double lo = 1.0 - p.clip_low, hi = 1.0 + p.clip_high;
  double r1 = rho, d1 = 1.0;
  if (p.two_sided_clip > 0) {
    r1 = rho < p.two_sided_clip ? rho : static_cast<double>(p.two_sided_clip);
    d1 = rho <= p.two_sided_clip ? 1.0 : 0.0;
  }
  const double r2 = grpo_clamp(rho, lo, hi), d2 = grpo_pass(rho, lo, hi);
  const double a = -A * r1, b = -A * r2;
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
  if (p.dual_clip > 1 && A < 0) {
    const double c3 = -A * p.dual_clip;
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

TROUPE_HD inline void grpo_kl(double logp, double ref, const GrpoLossParams& p, double& kl, double& dkl_dlogp) {
  double x = ref - logp, din = 1.0;
  if (p.kl_input_clamp > 0) {
    din = grpo_pass(x, -p.kl_input_clamp, p.kl_input_clamp);
    x = grpo_clamp(x, -p.kl_input_clamp, p.kl_input_clamp);
  }
  double dx;
  if (p.kl_type == KlEstimator::k1) {
    kl = -x;
    dx = -1.0;
  } else if (p.kl_type == KlEstimator::k2) {
    kl = 0.5 * x * x;
    dx = x;
  } else {
    const double e = hd_exp(x);
    kl = e - 1.0 - x;
    dx = e - 1.0;
  }
  double dout = 1.0;
  if (p.kl_output_clamp > 0) {
    dout = grpo_pass(kl, -p.kl_output_clamp, p.kl_output_clamp);
    kl = grpo_clamp(kl, -p.kl_output_clamp, p.kl_output_clamp);
  }
  dkl_dlogp = -dx * din * dout;
}

TROUPE_HD inline double grpo_log_ratio(double logp, double old, float clamp_c, double& dlr) {
  double lr = logp - old;
  dlr = 1.0;
  if (clamp_c > 0) {
    dlr = grpo_pass(lr, -clamp_c, clamp_c);
    lr = grpo_clamp(lr, -clamp_c, clamp_c);
  }
  return lr;
}

struct GrpoSequenceBody {  // over S sequences
  float* dlogp;
  float* dentropy;
  double* sums;  // (S, kGrpoSums)
  GrpoLossBatch b;
  GrpoLossParams p;
  GrpoLossAggregation agg;
  TROUPE_HD void operator()(size_t s) const {
    double m_loss = 0, m_pg = 0, m_kl_loss = 0, m_tokens = 0, m_kl = 0, m_cl = 0, m_ch = 0, m_dual = 0, m_ent = 0,
           m_ratio = 0, m_iw = 0;
    const bool seq_level = p.sequence_level_ratio;
    const int t0 = b.cu_seqlens[s], t1 = b.cu_seqlens[s + 1];
    const double A = b.advantages[s];
    double seq_tokens = 0, seq_lr = 0, seq_iw = 0;
    for (int t = t0; t < t1; ++t) {
      seq_tokens += b.mask[t];
      seq_iw += b.mask[t] * (b.is_weight ? b.is_weight[t] : 1.0);
      if (seq_level && b.logp_old && b.mask[t] != 0)
        seq_lr += b.mask[t] * (static_cast<double>(b.logp[t]) - b.logp_old[t]);
    }
    if (b.seq_tokens) seq_tokens = b.seq_tokens[s];  // a tile of rows: the whole sequence's count
    const double toks1 = seq_tokens > 1.0 ? seq_tokens : 1.0;
    const double ws = agg.per_seq_tokens ? 1.0 / (toks1 * agg.denominator) : 1.0 / agg.denominator;
    GrpoSurrogate sq{0, 0, false, false, false};
    double seq_rho = 1.0, seq_scale = 0.0;
    if (seq_level) {
      double dlr = 1.0;
      const double lr = grpo_log_ratio(seq_lr / toks1, 0.0, p.log_ratio_clamp, dlr);
      seq_rho = hd_exp(lr);
      sq = grpo_surrogate(seq_rho, A, p);
      seq_scale = (ws * seq_iw) * sq.dloss_drho * seq_rho * dlr / toks1;
    }
    for (int t = t0; t < t1; ++t) {
      const double mt = b.mask[t];
      if (mt == 0) {
        dlogp[t] = 0;
        if (dentropy) dentropy[t] = 0;
        continue;
      }
      const double w = mt * ws;
      double pg, g, rho;
      if (seq_level) {
        pg = sq.loss;
        g = seq_scale * mt;
        rho = seq_rho;
        m_cl += mt * sq.clip_low;
        m_ch += mt * sq.clip_high;
        m_dual += mt * sq.dual;
      } else {
        double dlr = 1.0;
        rho = b.logp_old ? hd_exp(grpo_log_ratio(b.logp[t], b.logp_old[t], p.log_ratio_clamp, dlr)) : 1.0;
        const GrpoSurrogate su = grpo_surrogate(rho, A, p);
        pg = su.loss;
        g = w * su.dloss_drho * rho * dlr;
        m_cl += mt * su.clip_low;
        m_ch += mt * su.clip_high;
        m_dual += mt * su.dual;
      }
      const double iw = b.is_weight ? b.is_weight[t] : 1.0;
      pg *= iw;
      if (!seq_level) g *= iw;
      m_iw += mt * iw;
      double l = pg;
      m_pg += w * pg;
      if (b.logp_ref) {
        double kl, dkl;
        grpo_kl(b.logp[t], b.logp_ref[t], p, kl, dkl);
        m_kl += mt * kl;
        if (p.kl_coef != 0) {
          l += p.kl_coef * kl;
          m_kl_loss += w * p.kl_coef * kl;
          g += w * p.kl_coef * dkl;
        }
      }
      if (b.entropy) {
        m_ent += mt * b.entropy[t];
        l -= p.entropy_coef * b.entropy[t];
      }
      if (dentropy) dentropy[t] = static_cast<float>(-w * p.entropy_coef);
      m_loss += w * l;
      m_ratio += mt * rho;
      m_tokens += mt;
      dlogp[t] = static_cast<float>(g);
    }
    double* o = sums + s * kGrpoSums;
    o[0] = m_loss, o[1] = m_pg, o[2] = m_kl_loss, o[3] = m_tokens, o[4] = m_kl, o[5] = m_cl, o[6] = m_ch,
    o[7] = m_dual, o[8] = m_ent, o[9] = m_ratio, o[10] = m_iw;
  }
};

// Adds the per-sequence rows in sequence order (the host does this after copying them back).
inline GrpoLossSums grpo_add_sums(const double* sums, int S) {
  GrpoLossSums m;
  double* f[kGrpoSums] = {&m.loss, &m.pg_loss, &m.kl_loss, &m.tokens, &m.kl_sum, &m.clip_low_sum,
                          &m.clip_high_sum, &m.dual_clip_sum, &m.entropy_sum, &m.ratio_sum, &m.is_weight_sum};
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < kGrpoSums; ++i) *f[i] += sums[static_cast<size_t>(s) * kGrpoSums + i];
  return m;
}

}  // namespace troupe::kernels::cuda
