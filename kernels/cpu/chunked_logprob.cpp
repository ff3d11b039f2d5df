// The chunked LM head + log-softmax (troupe/kernels/chunked_logprob.h). Each chunk's logits come
// from matmul_forward on the chunk's rows of W (the same fixed-row-block GEMM as the whole head),
// and each row keeps an online (max, sum e^(z-m), sum e^(z-m) z) that a larger chunk max rescales.
#include "troupe/kernels/chunked_logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <cblas.h>
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_LOGPROB_X86 1
#endif

#include "blas_gemm.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {

namespace {

#if TROUPE_LOGPROB_X86
#define TROUPE_AVX2 __attribute__((target("avx2,fma")))

bool avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// e^x in 8 lanes: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, times 2^n;
// within 2 ulp of e^x); 0 below -87.33 (-inf included), clamped at 88.37.
TROUPE_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// (v0 + v4) + (v2 + v6) + ((v1 + v5) + (v3 + v7)), the same for every row.
TROUPE_AVX2 inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TROUPE_AVX2 inline __m256i first_lanes(int n) {  // lanes [0, n) set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// fold_chunk's float body in 8 lanes: the chunk's max, then its sums as 8 lane sums.
TROUPE_AVX2 void fold_chunk_avx2(const float* z, int cols, float inv_t, float& m, float& s, float& sz) {
  const __m256 it = _mm256_set1_ps(inv_t), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const int full = cols & ~7, rest = cols - full;
  const __m256i tail = first_lanes(rest);
  __m256 mx = ninf;
  for (int i = 0; i < full; i += 8) mx = _mm256_max_ps(mx, _mm256_mul_ps(_mm256_loadu_ps(z + i), it));
  if (rest) {
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(z + full, tail), it);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(tail)));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float cm = _mm_cvtss_f32(h);
  if (cm > m) {  // a larger max: rescale what the earlier chunks summed
    const float r = std::exp(m - cm);  // 0 on the first chunk
    s *= r;
    sz *= r;
    m = cm;
  }
  const __m256 mv = _mm256_set1_ps(m);
  __m256 se = _mm256_setzero_ps(), sze = _mm256_setzero_ps();
  for (int i = 0; i < full; i += 8) {
    const __m256 zi = _mm256_mul_ps(_mm256_loadu_ps(z + i), it);
    const __m256 e = exp8(_mm256_sub_ps(zi, mv));
    se = _mm256_add_ps(se, e);
    sze = _mm256_fmadd_ps(e, zi, sze);
  }
  if (rest) {
    const __m256 keep = _mm256_castsi256_ps(tail);
    const __m256 zi = _mm256_and_ps(keep, _mm256_mul_ps(_mm256_maskload_ps(z + full, tail), it));
    const __m256 e = _mm256_and_ps(keep, exp8(_mm256_sub_ps(zi, mv)));
    se = _mm256_add_ps(se, e);
    sze = _mm256_fmadd_ps(e, zi, sze);
  }
  s += lane_sum(se);
  sz += lane_sum(sze);
}

// (-gl p - ge p (logp + H)) / T = p (-gl - ge (logp + H)) / T of 8 logits, p = e^(z/T - L).
TROUPE_AVX2 inline __m256 dlogits8(__m256 zv, __m256 it, __m256 lv, __m256 hv, __m256 ngl, __m256 nge) {
  const __m256 lp = _mm256_fmsub_ps(zv, it, lv);
  const __m256 p = exp8(lp);
  return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_fmadd_ps(nge, _mm256_add_ps(lp, hv), ngl)), it);
}

// dlogits_chunk's float body in 8 lanes.
TROUPE_AVX2 void dlogits_chunk_avx2(float* z, int cols, float inv_t, float L, float H, float gl, float ge) {
  const __m256 it = _mm256_set1_ps(inv_t), lv = _mm256_set1_ps(L), hv = _mm256_set1_ps(H);
  const __m256 ngl = _mm256_set1_ps(-gl), nge = _mm256_set1_ps(-ge);
  const int full = cols & ~7, rest = cols - full;
  for (int i = 0; i < full; i += 8) _mm256_storeu_ps(z + i, dlogits8(_mm256_loadu_ps(z + i), it, lv, hv, ngl, nge));
  if (rest) {
    const __m256i tail = first_lanes(rest);
    _mm256_maskstore_ps(z + full, tail, dlogits8(_mm256_maskload_ps(z + full, tail), it, lv, hv, ngl, nge));
  }
}
#endif

// Folds one chunk of a row's logits z (columns c0 .. c0 + cols) into its running state: m the
// largest z / temperature so far, s = sum e^(z/t - m), sz = sum e^(z/t - m) z/t, zt = z[target]/t.
// The chunked forward and the fused head fold each row through this one function, chunk by chunk
// in the same order, so both give the same bits. Floats on an AVX2 CPU take 8 lanes (a polynomial
// e^x, 8 lane sums); doubles and other CPUs one element at a time with std::exp.
template <class T>
inline void fold_chunk(const T* z, int c0, int cols, T inv_t, int32_t target, T& m, T& s, T& sz, T& zt) {
  if (target >= c0 && target < c0 + cols) zt = z[target - c0] * inv_t;
#if TROUPE_LOGPROB_X86
  if constexpr (std::is_same_v<T, float>) {
    if (avx2()) {
      fold_chunk_avx2(z, cols, inv_t, m, s, sz);
      return;
    }
  }
#endif
  T cm = -std::numeric_limits<T>::infinity();
  for (int i = 0; i < cols; ++i) cm = std::max(cm, z[i] * inv_t);
  if (cm > m) {  // a larger max: rescale what the earlier chunks summed
    const T r = std::exp(m - cm);  // 0 on the first chunk
    s *= r;
    sz *= r;
    m = cm;
  }
  for (int i = 0; i < cols; ++i) {
    const T zi = z[i] * inv_t;
    const T e = std::exp(zi - m);
    s += e;
    sz += e * zi;
  }
}

// A row's state after its last chunk -> lse (in m), entropy (in sz) and log-prob (in zt).
template <class T>
inline void finish_row(int32_t target, T& m, T s, T& sz, T& zt) {
  const T L = m + std::log(s);
  sz = L - sz / s;
  zt = target >= 0 ? zt - L : T(0);
  m = L;
}

// One chunk of a row's logits (columns c0 .. c0 + cols) in, d/dlogits of dlogp logp + dentropy H out:
// d logp / dz_i = [i == target] - p_i;  d H / dz_i = -p_i (log p_i + H); then d/dlogits = d/dz / T.
template <class T>
inline void dlogits_chunk(T* z, int c0, int cols, T inv_t, T L, T entropy, int32_t target, T dlogp, T dentropy) {
  const T gl = target >= 0 ? dlogp : T(0);
  const T ge = dentropy;
  const T H = ge != T(0) ? entropy : T(0);
  bool done = false;
#if TROUPE_LOGPROB_X86
  if constexpr (std::is_same_v<T, float>) {
    if (avx2()) {
      dlogits_chunk_avx2(z, cols, inv_t, L, H, gl, ge);
      done = true;
    }
  }
#endif
  if (!done)
    for (int i = 0; i < cols; ++i) {
      const T logp_i = z[i] * inv_t - L;
      const T p = std::exp(logp_i);
      z[i] = (-gl * p - ge * p * (logp_i + H)) * inv_t;
    }
  if (gl != T(0) && target >= c0 && target < c0 + cols) z[target - c0] += gl * inv_t;
}

// The fused call's GEMMs, as fixed blocks of the output (whatever the thread count, so results
// do not depend on it), each one single-threaded BLAS call, the blocks spread over the threads.
constexpr int64_t kFusedMinRows = 64;
constexpr int kFusedVocabBlock = 2048;  // columns of the logits / rows of dW per block
constexpr int kFusedHiddenBlock = 64;   // columns of dh per block

// S (R, V) = h (R, C) W^T; in the batch-invariant mode matmul_forward (its fixed per-element chain,
// the chunked forward's and the sampler's bits).
template <class T>
void tile_logits(T* S, const T* h, const T* W, int R, int C, int V) {
  if (std::is_same_v<T, float> && batch_invariant()) {
    matmul_forward(S, h, W, R, C, V);
    return;
  }
  const int blocks = (V + kFusedVocabBlock - 1) / kFusedVocabBlock;
#pragma omp parallel for schedule(static) if (gemm_worth_splitting(double(R) * V * C))
  for (int b = 0; b < blocks; ++b) {
    const int c0 = b * kFusedVocabBlock, cols = std::min(kFusedVocabBlock, V - c0);
    gemm(CblasNoTrans, CblasTrans, R, cols, C, T(1), h, C, W + static_cast<size_t>(c0) * C, C, T(0), S + c0, V);
  }
}

// dh (R, C) += S W and dW (V, C) += S^T h for the tile's logits gradient S (R, V).
template <class T>
void tile_backward(T* dh, T* dW, const T* S, const T* h, const T* W, int R, int C, int V) {
  const int hb = (C + kFusedHiddenBlock - 1) / kFusedHiddenBlock, vb = (V + kFusedVocabBlock - 1) / kFusedVocabBlock;
#pragma omp parallel for schedule(static) if (gemm_worth_splitting(double(R) * V * C))
  for (int b = 0; b < hb; ++b) {
    const int j0 = b * kFusedHiddenBlock, cols = std::min(kFusedHiddenBlock, C - j0);
    gemm(CblasNoTrans, CblasNoTrans, R, cols, V, T(1), S, V, W + j0, C, T(1), dh + j0, C);
  }
  if (!dW) return;
#pragma omp parallel for schedule(static) if (gemm_worth_splitting(double(R) * V * C))
  for (int b = 0; b < vb; ++b) {
    const int v0 = b * kFusedVocabBlock, rows = std::min(kFusedVocabBlock, V - v0);
    gemm(CblasTrans, CblasNoTrans, rows, C, R, T(1), S + v0, V, h, C, T(1), dW + static_cast<size_t>(v0) * C, C);
  }
}

}  // namespace

size_t chunked_logprob_scratch_floats(int N, int V, int chunk) {
  const int cols = chunk > 0 ? std::min(V, chunk) : V;
  return static_cast<size_t>(std::max(N, 0)) * static_cast<size_t>(std::max(cols, 0));
}

int chunked_logprob_fused_rows(int N, int V, int chunk) {
  if (N <= 0 || V <= 0) return 0;
  if (chunk <= 0 || V <= chunk) return N;
  // as many whole rows as N x chunk floats hold, but up to kFusedMinRows when that is at most a
  // quarter of the rows: OpenBLAS runs a few-row GEMM well below its speed (42 rows: ~25% slower)
  const int64_t rows = std::max<int64_t>(static_cast<int64_t>(N) * chunk / V, std::min<int64_t>(kFusedMinRows, N / 4));
  return static_cast<int>(std::clamp<int64_t>(rows, 1, N));
}

size_t chunked_logprob_fused_scratch_floats(int N, int V, int chunk) {
  return std::max(chunked_logprob_scratch_floats(N, V, chunk),
                  static_cast<size_t>(chunked_logprob_fused_rows(N, V, chunk)) * static_cast<size_t>(std::max(V, 0)));
}

template <class T>
void chunked_logprob_forward(T* logp, T* entropy, T* lse, const T* h, const T* W, const int32_t* targets,
                             float temperature, int N, int C, int V, int chunk, T* scratch) {
  if (N <= 0) return;
  if (chunk <= 0 || V <= chunk) {  // one chunk: exactly the whole-vocabulary ops
    matmul_forward(scratch, h, W, N, C, V);
    logprob_forward(logp, entropy, lse, scratch, targets, temperature, N, V);
    return;
  }
  const T inv_t = T(1) / T(temperature);
  // running state per row, kept in the outputs: lse = max, entropy = sum e^(z-m) z, logp = z[target]
  std::vector<T> sum(static_cast<size_t>(N), T(0));
  for (int n = 0; n < N; ++n) {
    lse[n] = -std::numeric_limits<T>::infinity();
    entropy[n] = T(0);
    logp[n] = T(0);
  }
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = std::min(chunk, V - c0);
    matmul_forward(scratch, h, W + static_cast<size_t>(c0) * C, N, C, cols);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * cols))
    for (int n = 0; n < N; ++n)
      fold_chunk(scratch + static_cast<size_t>(n) * cols, c0, cols, inv_t, targets[n], lse[n], sum[n], entropy[n],
                 logp[n]);
  }
  for (int n = 0; n < N; ++n) finish_row(targets[n], lse[n], sum[n], entropy[n], logp[n]);
}

template <class T>
void chunked_logprob_backward(T* dh, T* dW, const T* dlogp, const T* dentropy, const T* h, const T* W, const T* lse,
                              const T* entropy, const int32_t* targets, float temperature, int N, int C, int V,
                              int chunk, T* scratch) {
  if (N <= 0) return;
  if (chunk <= 0 || V <= chunk) {  // one chunk: exactly the whole-vocabulary ops
    matmul_forward(scratch, h, W, N, C, V);
    logprob_backward(scratch, dlogp, dentropy, scratch, lse, targets, temperature, N, V);
    matmul_backward(dh, dW, scratch, h, W, N, C, V);
    return;
  }
  const T inv_t = T(1) / T(temperature);
  for (int c0 = 0; c0 < V; c0 += chunk) {
    const int cols = std::min(chunk, V - c0);
    const T* Wc = W + static_cast<size_t>(c0) * C;
    matmul_forward(scratch, h, Wc, N, C, cols);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * cols))
    for (int n = 0; n < N; ++n)
      dlogits_chunk(scratch + static_cast<size_t>(n) * cols, c0, cols, inv_t, lse[n], entropy[n], targets[n],
                    dlogp ? dlogp[n] : T(0), dentropy ? dentropy[n] : T(0));
    matmul_backward(dh, dW ? dW + static_cast<size_t>(c0) * C : static_cast<T*>(nullptr), scratch, h, Wc, N, C, cols);
  }
}


template <class T>
void chunked_logprob_fused(T* logp, T* entropy, T* lse, T* dh, T* dW, const T* dlogp, const T* dentropy,
                           const RowLossGrad& grad, const T* h, const T* W, const int32_t* targets, float temperature,
                           int N, int C, int V, int chunk, T* scratch) {
  if (N <= 0) return;
  if (chunk <= 0 || V <= chunk) {  // one chunk: exactly the whole-vocabulary ops, in place
    matmul_forward(scratch, h, W, N, C, V);
    logprob_forward(logp, entropy, lse, scratch, targets, temperature, N, V);
    grad(0, N);
    logprob_backward(scratch, dlogp, dentropy, scratch, lse, targets, temperature, N, V);
    matmul_backward(dh, dW, scratch, h, W, N, C, V);
    return;
  }
  const T inv_t = T(1) / T(temperature);
  const int R = chunked_logprob_fused_rows(N, V, chunk);
  for (int t0 = 0; t0 < N; t0 += R) {
    const int rows = std::min(R, N - t0);
    const T* ht = h + static_cast<size_t>(t0) * C;
    tile_logits(scratch, ht, W, rows, C, V);  // the tile's (rows, V) logits
#pragma omp parallel for schedule(static) if (parallel_worth(double(rows) * V))
    for (int r = 0; r < rows; ++r) {
      const int n = t0 + r;
      const T* z = scratch + static_cast<size_t>(r) * V;
      T m = -std::numeric_limits<T>::infinity(), s = T(0), sz = T(0), zt = T(0);
      for (int c0 = 0; c0 < V; c0 += chunk) fold_chunk(z + c0, c0, std::min(chunk, V - c0), inv_t, targets[n], m, s, sz, zt);
      finish_row(targets[n], m, s, sz, zt);
      lse[n] = m;
      entropy[n] = sz;
      logp[n] = zt;
    }
    grad(t0, t0 + rows);  // the loss's derivative for these rows, from their log-probs and entropies
#pragma omp parallel for schedule(static) if (parallel_worth(double(rows) * V))
    for (int r = 0; r < rows; ++r) {
      const int n = t0 + r;
      T* z = scratch + static_cast<size_t>(r) * V;
      for (int c0 = 0; c0 < V; c0 += chunk)
        dlogits_chunk(z + c0, c0, std::min(chunk, V - c0), inv_t, lse[n], entropy[n], targets[n],
                      dlogp ? dlogp[n] : T(0), dentropy ? dentropy[n] : T(0));
    }
    tile_backward(dh + static_cast<size_t>(t0) * C, dW, scratch, ht, W, rows, C, V);
  }
}

template void chunked_logprob_forward<float>(float*, float*, float*, const float*, const float*, const int32_t*, float,
                                             int, int, int, int, float*);
template void chunked_logprob_forward<double>(double*, double*, double*, const double*, const double*, const int32_t*,
                                              float, int, int, int, int, double*);
template void chunked_logprob_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                              const float*, const float*, const int32_t*, float, int, int, int, int,
                                              float*);
template void chunked_logprob_backward<double>(double*, double*, const double*, const double*, const double*,
                                               const double*, const double*, const double*, const int32_t*, float, int,
                                               int, int, int, double*);

template void chunked_logprob_fused<float>(float*, float*, float*, float*, float*, const float*, const float*,
                                           const RowLossGrad&, const float*, const float*, const int32_t*, float, int,
                                           int, int, int, float*);
template void chunked_logprob_fused<double>(double*, double*, double*, double*, double*, const double*, const double*,
                                            const RowLossGrad&, const double*, const double*, const int32_t*, float,
                                            int, int, int, int, double*);

}  // namespace troupe::kernels
