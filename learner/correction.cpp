// The correction weights of loss.mismatch_correction and of stale async samples (correction.h).
#include "troupe/learner/correction.h"

#include <algorithm>
#include <cmath>

namespace troupe::learner {

void correction_weights(float* w, const float* learner, const float* sampler, const float* mask,
                        const int32_t* cu_seqlens, int S, int T, MismatchCorrection mode, const GrpoLossConfig& cfg,
                        double tis_cap) {
  auto rho = [&](int t) { return std::exp(static_cast<double>(learner[t]) - sampler[t]); };
  auto inside = [](double x, double lo, double hi) { return x >= lo && x <= hi; };
  const double cap = tis_cap > 0 ? tis_cap : static_cast<double>(cfg.tis_cap);
  if (mode == MismatchCorrection::seq_geo_mask) {
    for (int s = 0; s < S; ++s) {
      double log_sum = 0, n = 0;
      for (int t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t)
        if (mask[t] != 0) {
          log_sum += mask[t] * (static_cast<double>(learner[t]) - sampler[t]);
          n += mask[t];
        }
      const double geo = std::exp(log_sum / std::max(n, 1.0));
      const float keep = inside(geo, cfg.geo_mask_low, cfg.geo_mask_high) ? 1.0f : 0.0f;
      for (int t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) w[t] = mask[t] != 0 ? keep : 0.0f;
    }
    return;
  }
  for (int t = 0; t < T; ++t) {
    if (mask[t] == 0) {
      w[t] = 0.0f;
      continue;
    }
    switch (mode) {
      case MismatchCorrection::none: w[t] = 1.0f; break;
      case MismatchCorrection::tis: w[t] = static_cast<float>(std::min(cap, rho(t))); break;
      case MismatchCorrection::mis:
      case MismatchCorrection::icepop: {  // one masked weight, each with its own bounds
        const bool mis = mode == MismatchCorrection::mis;
        const double r = rho(t);
        w[t] = inside(r, mis ? cfg.mis_low : cfg.icepop_low, mis ? cfg.mis_high : cfg.icepop_high)
                   ? static_cast<float>(r)
                   : 0.0f;
        break;
      }
      case MismatchCorrection::seq_geo_mask: break;  // handled above
    }
  }
}

}  // namespace troupe::learner
