// Sampling every row of a decode step in one launch, one block per row, without sorting the
// vocabulary: the block takes the row's max, first argmax and Σ e^(z-max) (double, tree order);
// top-k, top-p and the draw itself are positions in the row's descending order (probability
// descending, lower id first among ties) found by radix select -- a bitwise search over the
// order-preserving 32-bit keys of the logits, 32 block-wide counts or masses -- and, among the
// tokens that share the selected key, by a walk over contiguous id ranges (per-lane partial sums,
// their prefix, then one lane walks its range). Invariant: a row's token is the one sample_token
// (kernels/cpu/random.cpp) picks for the same uniform, except where the uniform falls within
// rounding (a few ulps of the row's sums) of a boundary between two tokens.
#pragma once

#include <cstdint>
#include <cstring>

#include "lanes.h"

namespace troupe::kernels::cuda {

// One row's settings: 1/temperature (1 when greedy), the uniform the CPU op would draw from the
// row's RNG (unused when greedy), top-k (0 = off), top-p (1 = off).
struct RowSampling {
  double inv_t;
  double u01;
  int top_k;
  float top_p;
  int greedy;
};

// The order-preserving key of a logit: a larger logit has a larger key; -0 and +0 share one.
TROUPE_HD inline uint32_t logit_key(float x) {
  if (x == 0.0f) x = 0.0f;
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A place in the row's descending order: every token whose key is above `key`, then the tokens
// with key == `key` up to id `last` (inclusive).
struct OrderPos {
  uint32_t key;
  int last;
};

template <class Lanes>
struct RowSampler {
  const Lanes& L;
  const float* logits;
  const double* prob;    // (V) e^(z - max)
  const uint32_t* keys;  // (V) logit_key
  double* part;          // (L.count()) per-lane partial sums
  int V;

  // Σ over tokens with key > t of prob (mass) or 1 (count).
  TROUPE_HD double above(uint32_t t, bool mass) const {
    double s = 0;
    for (int i = L.lane(); i < V; i += L.count())
      if (keys[i] > t) s += mass ? prob[i] : 1.0;
    return L.sum(s);
  }
  // The smallest key t with above(t) <= target (radix select, one bit per pass, high to low).
  TROUPE_HD uint32_t min_key(double target, bool mass) const {
    uint32_t lo = 0;
    for (int b = 31; b >= 0; --b) {
      const uint32_t mid = lo + ((uint32_t(1) << b) - 1u);
      if (above(mid, mass) > target) lo += uint32_t(1) << b;
    }
    return lo;
  }
  // The first id (ascending) among the tokens with key == t (every token when `all`) whose
  // running sum of weights (prob, or 1) exceeds target; the last such token when none does
  // (rounding); -1 when there is no such token.
  TROUPE_HD int crossing(uint32_t t, bool all, double target, bool mass) const {
    const int n = L.count(), chunk = (V + n - 1) / n, lo = L.lane() * chunk;
    const int hi = lo + chunk < V ? lo + chunk : V;
    double mine = 0;
    int last = -1;
    for (int i = lo; i < hi; ++i)
      if (all || keys[i] == t) mine += mass ? prob[i] : 1.0, last = i;
    part[L.lane()] = mine;
    L.sync();
    double before = 0;
    for (int l = 0; l < L.lane(); ++l) before += part[l];
    int found = V;
    if (last >= 0 && before + mine > target) {
      double c = before;
      for (int i = lo; i < hi && found == V; ++i)
        if (all || keys[i] == t) {
          c += mass ? prob[i] : 1.0;
          if (c > target) found = i;
        }
    }
    found = L.min(found);
    const int any_last = -L.min(-last);  // the largest id taking part (or -1)
    L.sync();
    return found < V ? found : any_last;
  }
  // The token at which the running mass in descending order first exceeds target.
  TROUPE_HD OrderPos locate_mass(double target) const {
    const uint32_t t = min_key(target, true);
    return {t, crossing(t, false, target - above(t, true), true)};
  }
  // The k-th token (1-based) in descending order.
  TROUPE_HD OrderPos kth(int k) const {
    const uint32_t t = min_key(static_cast<double>(k - 1), false);
    return {t, crossing(t, false, static_cast<double>(k - 1) - above(t, false), false)};
  }
  // The mass of the tokens at or before p in descending order.
  TROUPE_HD double mass_through(const OrderPos& p) const {
    double s = 0;
    for (int i = L.lane(); i < V; i += L.count())
      if (keys[i] > p.key || (keys[i] == p.key && i <= p.last)) s += prob[i];
    return L.sum(s);
  }
};

TROUPE_HD inline bool order_before(const OrderPos& a, const OrderPos& b) {
  return a.key > b.key || (a.key == b.key && a.last < b.last);
}

// Row body over the (rows, V) logits: tokens[r] and logprobs[r] (log softmax at 1/inv_t before
// truncation); prob, keys (rows, V) and part (rows, kRowLanes) are scratch.
struct SampleRowsBody {
  int32_t* tokens;
  float* logprobs;
  const float* logits;
  const RowSampling* rows;
  double* prob;
  uint32_t* keys;
  double* part;
  int V;

  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int r) const {
    const RowSampling rs = rows[r];
    const size_t off = static_cast<size_t>(r) * static_cast<size_t>(V);
    const float* z = logits + off;
    double m = -__builtin_huge_val();
    for (int i = L.lane(); i < V; i += L.count()) m = hd_max(m, z[i] * rs.inv_t);
    m = L.max(m);
    int first = V;
    for (int i = L.lane(); i < V; i += L.count())
      if (z[i] * rs.inv_t == m && i < first) first = i;
    first = L.min(first);
    double s = 0;
    for (int i = L.lane(); i < V; i += L.count()) {
      prob[off + i] = hd_exp(z[i] * rs.inv_t - m);
      keys[off + i] = logit_key(z[i]);
      s += prob[off + i];
    }
    s = L.sum(s);
    const RowSampler<Lanes> rsm{L, z, prob + off, keys + off, part + static_cast<size_t>(r) * kRowLanes, V};
    int tok = first < V ? first : 0;
    if (!rs.greedy) tok = draw(rsm, rs, s);
    if (L.lane() == 0) {
      tokens[r] = tok;
      logprobs[r] = static_cast<float>(z[tok] * rs.inv_t - (m + hd_log(s)));
    }
  }

  // The token for the row's uniform: without truncation the running mass in id order (as the CPU
  // op walks it); with it, the kept prefix of the descending order (top-k, then the smallest
  // prefix whose mass reaches top_p) and the running mass along that order.
  template <class Lanes>
  TROUPE_HD static int draw(const RowSampler<Lanes>& rsm, const RowSampling& rs, double s) {
    const int V = rsm.V;
    const bool top_k = rs.top_k > 0 && rs.top_k < V, top_p = rs.top_p < 1.0f;
    if (!top_k && !top_p) {
      const int t = rsm.crossing(0, true, rs.u01 * s, true);
      return t >= 0 ? t : V - 1;
    }
    OrderPos keep{0, -1};
    if (top_k) keep = rsm.kth(rs.top_k);
    if (top_p) {
      const OrderPos p = rsm.locate_mass(static_cast<double>(rs.top_p) * s);
      if (p.last >= 0 && (keep.last < 0 || order_before(p, keep))) keep = p;
    }
    if (keep.last < 0) keep = rsm.kth(V);
    OrderPos at = rsm.locate_mass(rs.u01 * rsm.mass_through(keep));
    if (at.last < 0 || order_before(keep, at)) at = keep;  // rounding past the kept prefix
    return at.last;
  }
};

}  // namespace troupe::kernels::cuda
