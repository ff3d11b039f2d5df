// CPU bodies of the random ops in troupe/kernels/random.h: normal initialization and token
// sampling. Sequential by design: one RNG stream, consumed in a fixed order.
#include "troupe/kernels/random.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe::kernels {

void fill_normal(float* x, size_t n, double stddev, uint64_t* rng) {
  uint64_t& s = *rng;
  for (size_t i = 0; i < n; i += 2) {  // Box-Muller, two normals per draw
    const double u1 = std::max(uniform01(s), 1e-300), u2 = uniform01(s);
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    x[i] = static_cast<float>(stddev * r * std::cos(a));
    if (i + 1 < n) x[i + 1] = static_cast<float>(stddev * r * std::sin(a));
  }
}

size_t sample_scratch_bytes(int V) {
  return static_cast<size_t>(std::max(V, 0)) * (sizeof(double) + sizeof(int32_t));
}

int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp, uint64_t* rng_state,
                     void* scratch) {
  uint64_t& rng = *rng_state;
  double* prob = static_cast<double*>(scratch);           // (V) e^(z - max), unnormalized
  int32_t* order = reinterpret_cast<int32_t*>(prob + V);  // (V) token ids by probability
  const bool greedy = sp.temperature <= 0.0f;
  const double inv_t = greedy ? 1.0 : 1.0 / sp.temperature;
  double m = -std::numeric_limits<double>::infinity();
  int32_t arg = 0;
  for (int i = 0; i < V; ++i) {
    const double z = logits[i] * inv_t;
    if (z > m) m = z, arg = i;
  }
  double s = 0;
  for (int i = 0; i < V; ++i) s += (prob[i] = std::exp(logits[i] * inv_t - m));
  const double lse = m + std::log(s);
  int32_t tok = arg;
  if (!greedy) {
    int keep = V;
    const bool truncate = (sp.top_k > 0 && sp.top_k < V) || sp.top_p < 1.0f;
    if (truncate) {
      for (int i = 0; i < V; ++i) order[i] = i;
      auto by_prob = [&](int32_t a, int32_t b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); };
      if (sp.top_k > 0 && sp.top_k < V) {
        keep = sp.top_k;
        std::partial_sort(order, order + keep, order + V, by_prob);
      } else {
        std::sort(order, order + V, by_prob);
      }
      if (sp.top_p < 1.0f) {
        double cum = 0;
        int n = 0;
        while (n < keep) {
          cum += prob[order[n]] / s;
          ++n;
          if (cum >= sp.top_p) break;
        }
        keep = std::max(1, n);
      }
      double kept = 0;
      for (int i = 0; i < keep; ++i) kept += prob[order[i]];
      double u = uniform01(rng) * kept;
      tok = order[keep - 1];
      for (int i = 0; i < keep; ++i) {
        u -= prob[order[i]];
        if (u < 0) {
          tok = order[i];
          break;
        }
      }
    } else {
      double u = uniform01(rng) * s;
      tok = V - 1;
      for (int i = 0; i < V; ++i) {
        u -= prob[i];
        if (u < 0) {
          tok = i;
          break;
        }
      }
    }
  }
  *logprob = static_cast<float>(logits[tok] * inv_t - lse);
  return tok;
}

}  // namespace troupe::kernels
