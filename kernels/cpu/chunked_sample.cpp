// The chunked LM-head sampler (troupe/kernels/chunked_sample.h). Every per-token quantity is the
// expression sample_token evaluates (z * (1 / temperature) in double, e^(that - max), sums in index
// order), so a row's token, log-prob and RNG draw equal sample_token's on the same logits.
#include "troupe/kernels/chunked_sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "troupe/kernels/ops.h"

namespace troupe::kernels {

namespace {

struct RowState {
  double inv_t = 1, m = -std::numeric_limits<double>::infinity(), s = 0, u = 0;
  int32_t arg = 0, tok = -1, n_cand = 0;
  float z_arg = 0, z_tok = 0;
  bool greedy = false, top_k = false, whole_row = false, walking = false;
};

struct Candidate {
  double prob;
  int32_t id;
  float z;
};

// The order sample_token sorts by: more probable first, ties to the lower id.
inline bool better(const Candidate& a, const Candidate& b) { return a.prob > b.prob || (a.prob == b.prob && a.id < b.id); }

inline size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k, size_t cache_bytes) {
  N = std::max(N, 0);
  V = std::max(V, 0);
  const bool whole = chunk <= 0 || V <= chunk;
  // Logits: the whole (N, V) for one chunk; beyond it, one chunk's (N, chunk) when recomputing, or
  // every chunk's when the (N', V) logits of a call with N' <= N rows fit cache_bytes, so a scratch
  // sized for N serves every smaller call (the model sizes it for its batch, then samples its
  // active rows).
  size_t logit_floats = static_cast<size_t>(N) * (whole ? static_cast<size_t>(V) : static_cast<size_t>(chunk));
  if (!whole) {
    const size_t cached_rows = std::min(static_cast<size_t>(N), cache_bytes / (sizeof(float) * V));
    logit_floats = std::max(logit_floats, cached_rows * V);
  }
  const size_t kcap = whole ? 0 : static_cast<size_t>(std::clamp(max_top_k, 0, chunk));
  return align8(sizeof(float) * logit_floats) + align8(sizeof(RowState) * N) + align8(sizeof(Candidate) * N * kcap) +
         align8(sizeof(float) * V) + sample_scratch_bytes(V);
}

void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V, int chunk,
                    const SampleParams* sp, uint64_t* rng, int max_top_k, void* scratch, size_t cache_bytes) {
  if (N <= 0 || V <= 0) return;
  char* base = static_cast<char*>(scratch);
  float* logits = reinterpret_cast<float*>(base);
  if (chunk <= 0 || V <= chunk) {  // one chunk: the whole-vocabulary head and sample_token, bit for bit
    void* row_scratch = base + align8(sizeof(float) * N * V) + align8(sizeof(RowState) * N) + align8(sizeof(float) * V);
    matmul_forward(logits, h, W, N, C, V);
    for (int n = 0; n < N; ++n)
      tokens[n] = sample_token(logprobs + n, logits + static_cast<size_t>(n) * V, V, sp[n], rng + n, row_scratch);
    return;
  }
  const int kcap = std::clamp(max_top_k, 0, chunk);
  // Every chunk's logits stay in the scratch when the (N, V) of them fit cache_bytes: chunk c0's
  // (N, cols) block at logits + N * c0, each from the very GEMM the recomputing path runs.
  const bool cached = sizeof(float) * static_cast<size_t>(N) * V <= cache_bytes;
  const size_t logit_floats = static_cast<size_t>(N) * (cached ? V : chunk);
  char* p = base + align8(sizeof(float) * logit_floats);
  RowState* st = reinterpret_cast<RowState*>(p);
  p += align8(sizeof(RowState) * N);
  Candidate* cand = reinterpret_cast<Candidate*>(p);
  p += align8(sizeof(Candidate) * N * kcap);
  float* row = reinterpret_cast<float*>(p);
  void* row_scratch = p + align8(sizeof(float) * V);
  for (int n = 0; n < N; ++n) {
    RowState& r = st[n];
    r = RowState{};
    r.greedy = sp[n].temperature <= 0.0f;
    r.inv_t = r.greedy ? 1.0 : 1.0 / sp[n].temperature;
    const bool k_on = sp[n].top_k > 0 && sp[n].top_k < V;
    r.top_k = !r.greedy && k_on && sp[n].top_k <= kcap;
    r.whole_row = !r.greedy && ((k_on && !r.top_k) || (!k_on && sp[n].top_p < 1.0f));
  }
  // Runs per_row(state, n, z, c0, cols) over every chunk in index order for every row sampled over
  // chunks: z is row n's logits of columns c0 .. c0 + cols. Recomputing, each chunk's GEMM runs
  // again on every pass; cached, the GEMMs ran once (below) and each row walks its chunks on one
  // thread. Either way a row sees the same logits in the same order, so the results are equal.
  auto for_chunks = [&](auto&& per_row) {
    if (cached) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * V))
      for (int n = 0; n < N; ++n) {
        if (st[n].whole_row) continue;
        for (int c0 = 0; c0 < V; c0 += chunk) {
          const int cols = std::min(chunk, V - c0);
          per_row(st[n], n, logits + static_cast<size_t>(N) * c0 + static_cast<size_t>(n) * cols, c0, cols);
        }
      }
      return;
    }
    for (int c0 = 0; c0 < V; c0 += chunk) {
      const int cols = std::min(chunk, V - c0);
      matmul_forward(logits, h, W + static_cast<size_t>(c0) * C, N, C, cols);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * cols))
      for (int n = 0; n < N; ++n)
        if (!st[n].whole_row) per_row(st[n], n, logits + static_cast<size_t>(n) * cols, c0, cols);
    }
  };
  if (cached)
    for (int c0 = 0; c0 < V; c0 += chunk) {
      const int cols = std::min(chunk, V - c0);
      matmul_forward(logits + static_cast<size_t>(N) * c0, h, W + static_cast<size_t>(c0) * C, N, C, cols);
    }
  // Pass 1: max and argmax (the first index of the largest z / temperature).
  for_chunks([](RowState& r, int, const float* z, int c0, int cols) {
    for (int i = 0; i < cols; ++i) {
      const double zi = z[i] * r.inv_t;
      if (zi > r.m) r.m = zi, r.arg = c0 + i, r.z_arg = z[i];
    }
  });
  // Pass 2: the sum of e^(z - max) in index order, and the top-k candidates.
  for_chunks([&](RowState& r, int n, const float* z, int c0, int cols) {
    Candidate* heap = cand + static_cast<size_t>(n) * kcap;
    const int k = sp[n].top_k;
    for (int i = 0; i < cols; ++i) {
      const double pr = std::exp(z[i] * r.inv_t - r.m);
      r.s += pr;
      if (!r.top_k) continue;
      const Candidate c{pr, c0 + i, z[i]};
      if (r.n_cand < k) {  // a heap whose top is the least likely kept candidate
        heap[r.n_cand++] = c;
        std::push_heap(heap, heap + r.n_cand, better);
      } else if (better(c, heap[0])) {
        std::pop_heap(heap, heap + k, better);
        heap[k - 1] = c;
        std::push_heap(heap, heap + k, better);
      }
    }
  });
  bool any_walk = false;
  for (int n = 0; n < N; ++n) {
    RowState& r = st[n];
    if (r.whole_row || r.greedy) continue;
    if (r.top_k) {  // sample_token's truncated branch on the same candidates in the same order
      Candidate* c = cand + static_cast<size_t>(n) * kcap;
      std::sort_heap(c, c + r.n_cand, better);
      int keep = r.n_cand;
      if (sp[n].top_p < 1.0f) {
        double cum = 0;
        int m = 0;
        while (m < keep) {
          cum += c[m].prob / r.s;
          ++m;
          if (cum >= sp[n].top_p) break;
        }
        keep = std::max(1, m);
      }
      double kept = 0;
      for (int i = 0; i < keep; ++i) kept += c[i].prob;
      double u = uniform01(rng[n]) * kept;
      r.tok = c[keep - 1].id, r.z_tok = c[keep - 1].z;
      for (int i = 0; i < keep; ++i) {
        u -= c[i].prob;
        if (u < 0) {
          r.tok = c[i].id, r.z_tok = c[i].z;
          break;
        }
      }
    } else {
      r.u = uniform01(rng[n]) * r.s;
      r.walking = true;
      any_walk = true;
    }
  }
  // Pass 3: the walk of the cumulative sum for rows sampling the full vocabulary.
  if (any_walk)
    for_chunks([V](RowState& r, int, const float* z, int c0, int cols) {
      if (!r.walking) return;
      for (int i = 0; i < cols; ++i) {
        r.u -= std::exp(z[i] * r.inv_t - r.m);
        if (r.u < 0) {
          r.tok = c0 + i, r.z_tok = z[i], r.walking = false;
          return;
        }
      }
      if (c0 + cols == V) r.tok = V - 1, r.z_tok = z[cols - 1], r.walking = false;
    });
  for (int n = 0; n < N; ++n) {
    RowState& r = st[n];
    if (r.whole_row) {  // needs its whole sorted distribution: one row of logits
      matmul_forward(row, h + static_cast<size_t>(n) * C, W, 1, C, V);
      tokens[n] = sample_token(logprobs + n, row, V, sp[n], rng + n, row_scratch);
      continue;
    }
    if (r.greedy) r.tok = r.arg, r.z_tok = r.z_arg;
    const double lse = r.m + std::log(r.s);
    tokens[n] = r.tok;
    logprobs[n] = static_cast<float>(r.z_tok * r.inv_t - lse);
  }
}

}  // namespace troupe::kernels
