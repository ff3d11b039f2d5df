// Kernel bodies of the random ops (sampling.cu). fill_normal: splitmix64 advances its state by a
// constant per draw, so draw d of a stream is a pure function of the start state and d, and every
// Box-Muller pair is computed independently (the CPU's sequential order, in parallel). Sampling:
// one block takes the row's max, first argmax and sum of e^(z-m) (double); CUB sorts the
// probabilities when top-k/top-p truncate; one thread then walks the kept prefix with a uniform
// the host drew from the caller's stream (the CPU op draws the same one).
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

inline constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;

// The value splitmix64 returns on draw d (0-based) from state s0.
TROUPE_HD inline uint64_t splitmix_at(uint64_t s0, uint64_t d) {
  uint64_t z = s0 + (d + 1) * kSplitmixGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
TROUPE_HD inline double uniform_at(uint64_t s0, uint64_t d) {
  return static_cast<double>(splitmix_at(s0, d) >> 11) * (1.0 / 9007199254740992.0);
}

struct FillNormalBody {  // over ceil(n/2) pairs
  float* x;
  size_t n;
  double stddev;
  uint64_t s0;
  TROUPE_HD void operator()(size_t p) const {
    const size_t i = 2 * p;
    double u1 = uniform_at(s0, i);
    u1 = u1 > 1e-300 ? u1 : 1e-300;
    const double u2 = uniform_at(s0, i + 1);
    const double r = hd_sqrt(-2.0 * hd_log(u1)), a = 2.0 * 3.14159265358979323846 * u2;
    x[i] = static_cast<float>(stddev * r * hd_cos(a));
    if (i + 1 < n) x[i + 1] = static_cast<float>(stddev * r * hd_sin(a));
  }
};

// stats: [0] max of z = logits * inv_t, [1] sum e^(z - max); *arg: the first index of the max;
// prob (V) = e^(z - max) (unnormalized); order (V) = 0..V-1 (the sort's input values).
struct SampleStatsBody {  // one row
  double* stats;
  int32_t* arg;
  double* prob;
  int32_t* order;
  const float* logits;
  double inv_t;
  int V;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int) const {
    double m = -__builtin_huge_val();
    for (int i = L.lane(); i < V; i += L.count()) m = hd_max(m, logits[i] * inv_t);
    m = L.max(m);
    int first = V;
    for (int i = L.lane(); i < V; i += L.count())
      if (logits[i] * inv_t == m && i < first) first = i;
    first = L.min(first);
    double s = 0;
    for (int i = L.lane(); i < V; i += L.count()) {
      prob[i] = hd_exp(logits[i] * inv_t - m);
      s += prob[i];
      order[i] = i;
    }
    s = L.sum(s);
    if (L.lane() == 0) {
      stats[0] = m;
      stats[1] = s;
      *arg = first < V ? first : 0;
    }
  }
};

// One thread: the token (and its log-prob) from the stats, the probabilities and, when
// truncating, `sorted` = token ids by descending probability (ties: lower id first).
struct SampleFinishBody {
  int32_t* token;
  float* logprob;
  const double* stats;
  const int32_t* arg;
  const double* prob;
  const int32_t* sorted;  // null: no truncation
  const float* logits;
  double inv_t, u01;
  int V, top_k;
  float top_p;
  bool greedy;
  TROUPE_HD void operator()(size_t) const {
    const double m = stats[0], s = stats[1];
    const double lse = m + hd_log(s);
    int32_t tok = *arg;
    if (!greedy) {
      if (sorted) {
        int keep = (top_k > 0 && top_k < V) ? top_k : V;
        if (top_p < 1.0f) {
          double cum = 0;
          int n = 0;
          while (n < keep) {
            cum += prob[sorted[n]] / s;
            ++n;
            if (cum >= top_p) break;
          }
          keep = n > 1 ? n : 1;
        }
        double kept = 0;
        for (int i = 0; i < keep; ++i) kept += prob[sorted[i]];
        double u = u01 * kept;
        tok = sorted[keep - 1];
        for (int i = 0; i < keep; ++i) {
          u -= prob[sorted[i]];
          if (u < 0) {
            tok = sorted[i];
            break;
          }
        }
      } else {
        double u = u01 * s;
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
    *token = tok;
    *logprob = static_cast<float>(logits[tok] * inv_t - lse);
  }
};

}  // namespace troupe::kernels::cuda
