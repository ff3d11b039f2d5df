// CPU reference + fast implementation of the dense ops in troupe/kernels/ops.h. GEMMs go to
// OpenBLAS (sgemm/dgemm), row loops are OpenMP-parallel, nothing allocates. Every loop that could
// race (parameter gradients, attention dk/dv) is partitioned so each output has one writer, which
// keeps results independent of the thread count.
#include "troupe/kernels/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "blas_gemm.h"
#include "small_gemm.h"
#include "troupe/kernels/batch_invariant.h"
#include "troupe/kernels/bf16_weights.h"

namespace troupe::kernels {

namespace {

// BLAS runs single-threaded and the ops split each GEMM over OpenMP threads themselves: one thread
// pool instead of OpenBLAS's and OpenMP's competing for the same cores (on a loaded 2-core box the
// two pools spinning against each other cost more than the GEMMs), and callers that already run in
// parallel (one GEMM per MoE expert) get no nested oversubscription. Set once, for the process.
const bool blas_single_threaded = [] {
  openblas_set_num_threads(1);
  return true;
}();

// A float GEMM of one row block against a wide B, as fixed blocks of kGemmColBlock columns of C
// (ops.h). False when the shape is not one: the row blocks below take it.
template <class T>
bool gemm_column_blocks(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                        int ldb, T beta, T* Cm, int ldc) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (M > kGemmRowBlock || N <= kGemmColBlock || double(N) * K < kGemmWideMin) return false;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const bool kernel = !trans_a && trans_b && M <= kGemmKernelMaxRows && K > 0 && small_gemm::available();
    const int blocks = (N + kGemmColBlock - 1) / kGemmColBlock;
    const bool split = gemm_worth_splitting(double(M) * N * K);
#pragma omp parallel for schedule(static) if (split)
    for (int b = 0; b < blocks; ++b) {
      const int c0 = b * kGemmColBlock, cols = std::min(N - c0, kGemmColBlock);
      if (kernel) {
        small_gemm::gemm_nt_rows(M, c0, c0 + cols, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
      } else {
        const T* bb = trans_b ? B + static_cast<size_t>(c0) * ldb : B + c0;  // op(B) column c0
        gemm(ta, tb, M, cols, K, alpha, A, lda, bb, ldb, beta, Cm + c0, ldc);
      }
    }
    return true;
  }
}

// Batch-invariant C = alpha A B^T + beta C (batch_invariant.h): every element is small_gemm's one
// fixed chain over K (or, without AVX2/FMA, one sequential sum), whatever M is; blocks of rows and
// columns only spread the elements over threads.
void gemm_nt_invariant(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                       float* Cm, int ldc) {
  const bool kernel = K > 0 && small_gemm::available();
  const int rb = (M + kGemmRowBlock - 1) / kGemmRowBlock, cb = (N + kGemmColBlock - 1) / kGemmColBlock;
  const bool split = gemm_worth_splitting(double(M) * N * K);
#pragma omp parallel for schedule(static) if (split)
  for (int b = 0; b < rb * cb; ++b) {
    const int r0 = (b / cb) * kGemmRowBlock, rows = std::min(M - r0, kGemmRowBlock);
    const int c0 = (b % cb) * kGemmColBlock, c1 = std::min(N, c0 + kGemmColBlock);
    const float* a = A + static_cast<size_t>(r0) * lda;
    float* c = Cm + static_cast<size_t>(r0) * ldc;
    if (kernel) {
      small_gemm::gemm_nt_rows(rows, c0, c1, K, alpha, a, lda, B, ldb, beta, c, ldc);
      continue;
    }
    for (int i = 0; i < rows; ++i)
      for (int j = c0; j < c1; ++j) {
        const float* x = a + static_cast<size_t>(i) * lda;
        const float* y = B + static_cast<size_t>(j) * ldb;
        float s = 0;
        for (int k = 0; k < K; ++k) s += x[k] * y[k];
        float& out = c[static_cast<size_t>(i) * ldc + j];
        out = beta == 0.0f ? alpha * s : alpha * s + beta * out;
      }
  }
}

template <class T>
void gemm_blocked_impl(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                       const T* B, int ldb, T beta, T* Cm, int ldc) {
  if (M <= 0 || N <= 0) return;
  (void)blas_single_threaded;
  if constexpr (std::is_same_v<T, float>) {
    if (!trans_a && trans_b && batch_invariant()) {  // every forward GEMM of the model has this form
      gemm_nt_invariant(M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
      return;
    }
  }
  if (gemm_column_blocks(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc)) return;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int blocks = (M + kGemmRowBlock - 1) / kGemmRowBlock;
  const bool split = blocks > 1 && gemm_worth_splitting(double(M) * N * K);
#pragma omp parallel for schedule(static) if (split)
  for (int b = 0; b < blocks; ++b) {
    const int r0 = b * kGemmRowBlock, rows = std::min(M - r0, kGemmRowBlock);
    const T* a = trans_a ? A + r0 : A + static_cast<size_t>(r0) * lda;  // op(A) row r0
    gemm(ta, tb, rows, N, K, alpha, a, lda, B, ldb, beta, Cm + static_cast<size_t>(r0) * ldc, ldc);
  }
}

template <class T>
inline T dot(const T* a, const T* b, int n) {
  T s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// score[i] = dot(q, key i) for n <= kDecodeKeys keys `stride` apart, each the same chain as dot()
// (one running sum, d = 0..HD-1): a full group runs its keys' chains side by side, which the CPU
// overlaps (and the compiler may vectorize across keys), where one dot() waits on each addition.
constexpr int kDecodeKeys = 8;
template <class T>
inline void key_scores(T* score, const T* q, const T* keys, size_t stride, int n, int HD) {
  if (n < kDecodeKeys) {
    for (int i = 0; i < n; ++i) score[i] = dot(q, keys + i * stride, HD);
    return;
  }
  T s[kDecodeKeys] = {};
  for (int d = 0; d < HD; ++d) {
    const T qd = q[d];
    for (int i = 0; i < kDecodeKeys; ++i) s[i] += qd * keys[i * stride + d];
  }
  for (int i = 0; i < kDecodeKeys; ++i) score[i] = s[i];
}

// One key of an online softmax: the output row o (HD) holds sum_j e^(s_j - m) v_j over the keys
// seen so far, m their largest score and l = sum_j e^(s_j - m); a new largest score rescales both.
template <class T>
inline void online_softmax_step(T* o, T& m, T& l, T s, const T* vv, int HD) {
  if (s > m) {
    const T r = std::exp(m - s);  // exp(-inf) = 0 on the first key
    l *= r;
    for (int d = 0; d < HD; ++d) o[d] *= r;
    m = s;
  }
  const T w = std::exp(s - m);
  l += w;
  for (int d = 0; d < HD; ++d) o[d] += w * vv[d];
}

}  // namespace

void gemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_blocked_impl(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc) {
  gemm_blocked_impl(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// ---- matmul -----------------------------------------------------------------------------------------

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (C <= 0) {
    std::fill(out, out + static_cast<size_t>(N) * OC, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (Bf16Weights* w = bf16_weights(); w && !batch_invariant()) {  // a frozen model's bf16 forward
      w->matmul(out, inp, weight, N, C, OC);
      return;
    }
  }
  gemm_blocked_impl(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
}

template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N, int C, int OC) {
  if (N <= 0 || OC <= 0 || C <= 0) return;
  // dinp blocks of token rows, dweight blocks of output rows: each output element has one writer.
  if (dinp) gemm_blocked_impl(false, false, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C);
  if (dweight) gemm_blocked_impl(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
}

template <class T>
void bias_forward(T* out, const T* bias, int N, int OC) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * OC))
  for (int n = 0; n < N; ++n) {
    T* row = out + static_cast<size_t>(n) * OC;
    for (int o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

template <class T>
void bias_backward(T* dbias, const T* dout, int N, int OC) {
  // Columns split over threads; each column sums its rows in order (independent of the thread count).
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * OC))
  for (int o = 0; o < OC; ++o) {
    T s = 0;
    for (int n = 0; n < N; ++n) s += dout[static_cast<size_t>(n) * OC + o];
    dbias[o] += s;
  }
}

template <class T>
void sigmoid_gate_forward(T* out, const T* gate, const T* x, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int n = 0; n < N; ++n) {
    const T sig = T(1) / (T(1) + std::exp(-gate[n]));
    const size_t r = static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) out[r + c] = sig * x[r + c];
  }
}

template <class T>
void sigmoid_gate_backward(T* dgate, T* dx, const T* dout, const T* gate, const T* x, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int n = 0; n < N; ++n) {
    const T sig = T(1) / (T(1) + std::exp(-gate[n]));
    const size_t r = static_cast<size_t>(n) * C;
    T dot = 0;
    for (int c = 0; c < C; ++c) {
      dot += dout[r + c] * x[r + c];
      dx[r + c] = sig * dout[r + c];
    }
    dgate[n] = sig * (T(1) - sig) * dot;
  }
}

// ---- embedding ------------------------------------------------------------------------------------

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int n = 0; n < N; ++n) {
    const T* row = wte + static_cast<size_t>(tokens[n]) * C;
    std::copy(row, row + C, out + static_cast<size_t>(n) * C);
  }
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C) {
  // Tokens repeat, so rows are not independent; split the channels instead (one writer each).
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = std::min(C, c0 + 16);
    for (int n = 0; n < N; ++n) {
      T* drow = dwte + static_cast<size_t>(tokens[n]) * C;
      const T* g = dout + static_cast<size_t>(n) * C;
      for (int c = c0; c < c1; ++c) drow[c] += g[c];
    }
  }
}

// ---- RMSNorm --------------------------------------------------------------------------------------

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;
    T* y = out + static_cast<size_t>(n) * C;
    T ss = dot(x, x, C);
    T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;
    const T* dy = dout + static_cast<size_t>(n) * C;
    T* dx = dinp + static_cast<size_t>(n) * C;
    const T r = rstd[n];
    T s = 0;  // sum_c w_c dy_c x_c
    for (int c = 0; c < C; ++c) s += weight[c] * dy[c] * x[c];
    const T k = r * r * r * s / T(C);
    for (int c = 0; c < C; ++c) dx[c] += r * weight[c] * dy[c] - k * x[c];
  }
  if (!dweight) return;
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = std::min(C, c0 + 16);
    T acc[16] = {};
    for (int n = 0; n < N; ++n) {
      const T* x = inp + static_cast<size_t>(n) * C;
      const T* dy = dout + static_cast<size_t>(n) * C;
      for (int c = c0; c < c1; ++c) acc[c - c0] += dy[c] * x[c] * rstd[n];
    }
    for (int c = c0; c < c1; ++c) dweight[c] += acc[c - c0];
  }
}

// ---- RoPE -----------------------------------------------------------------------------------------

void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD, float theta) {
  const int half = HD / 2;
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * HD * 8))
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < half; ++i) {
      // Same rounding as Hugging Face: inv_freq in fp32, angle = fp32(pos) * inv_freq in fp32.
      const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(HD));
      const float angle = static_cast<float>(positions[n]) * inv_freq;
      cos[static_cast<size_t>(n) * half + i] = std::cos(angle);
      sin[static_cast<size_t>(n) * half + i] = std::sin(angle);
    }
  }
}

// Rotates each head's (x1, x2) halves by +angle (sign = 1) or -angle (sign = -1). The backward of
// a rotation is the rotation by the opposite angle; negating sin is exact, so both directions give
// the same bits as writing the two formulas out. Safe in place (out == inp).
template <class T>
void rope_rotate(T* out, const T* inp, const float* cos, const float* sin, T sign, int N, int NH, int HD) {
  const int half = HD / 2;
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * NH * HD))
  for (int n = 0; n < N; ++n) {
    const float* cs = cos + static_cast<size_t>(n) * half;
    const float* sn = sin + static_cast<size_t>(n) * half;
    for (int h = 0; h < NH; ++h) {
      const T* x = inp + (static_cast<size_t>(n) * NH + h) * HD;
      T* y = out + (static_cast<size_t>(n) * NH + h) * HD;
      for (int i = 0; i < half; ++i) {
        const T x1 = x[i], x2 = x[i + half], c = T(cs[i]), s = sign * T(sn[i]);
        y[i] = x1 * c - x2 * s;
        y[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

template <class T>
void rope_forward(T* out, const T* inp, const float* cos, const float* sin, int N, int NH, int HD) {
  rope_rotate(out, inp, cos, sin, T(1), N, NH, HD);
}

template <class T>
void rope_backward(T* dinp, const T* dout, const float* cos, const float* sin, int N, int NH, int HD) {
  rope_rotate(dinp, dout, cos, sin, T(-1), N, NH, HD);
}

// ---- attention ------------------------------------------------------------------------------------

template <class T>
void attention_forward_reference(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* seq_start,
                       const int32_t* seq_end, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  // One (token, head) per iteration; online softmax accumulates straight into the output row.
#pragma omp parallel for schedule(dynamic, 16) if (parallel_worth(double(N) * NH * HD * 16))
  for (int64_t th = 0; th < static_cast<int64_t>(N) * NH; ++th) {
    const int t = static_cast<int>(th / NH), h = static_cast<int>(th % NH), g = h / group;
    const T* qv = q + static_cast<size_t>(th) * HD;
    T* o = out + static_cast<size_t>(th) * HD;
    std::fill(o, o + HD, T(0));
    T m = -std::numeric_limits<T>::infinity(), l = 0;
    for (int j = seq_start[t]; j <= t; ++j) {
      const T* kv = k + (static_cast<size_t>(j) * NKV + g) * HD;
      const T* vv = v + (static_cast<size_t>(j) * NKV + g) * HD;
      online_softmax_step(o, m, l, dot(qv, kv, HD) * scale, vv, HD);
    }
    const T inv = T(1) / l;
    for (int d = 0; d < HD; ++d) o[d] *= inv;
    lse[th] = m + std::log(l);
  }
}

template <class T>
void attention_backward_reference(T* dq, T* dk, T* dv, T* scratch, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const int32_t* seq_start, const int32_t* seq_end, int N,
                        int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  T* Dsum = scratch;  // (N, NH): sum_d dout * out, the softmax-backward row term
  const int64_t NTH = static_cast<int64_t>(N) * NH;
#pragma omp parallel for schedule(static) if (parallel_worth(double(NTH) * HD))
  for (int64_t th = 0; th < NTH; ++th)
    Dsum[th] = dot(dout + static_cast<size_t>(th) * HD, out + static_cast<size_t>(th) * HD, HD);

  // dq: one writer per (query, head).
#pragma omp parallel for schedule(dynamic, 16) if (parallel_worth(double(NTH) * HD * 16))
  for (int64_t th = 0; th < NTH; ++th) {
    const int t = static_cast<int>(th / NH), h = static_cast<int>(th % NH), g = h / group;
    const T* qv = q + static_cast<size_t>(th) * HD;
    const T* dov = dout + static_cast<size_t>(th) * HD;
    T* dqv = dq + static_cast<size_t>(th) * HD;
    std::fill(dqv, dqv + HD, T(0));
    for (int j = seq_start[t]; j <= t; ++j) {
      const T* kv = k + (static_cast<size_t>(j) * NKV + g) * HD;
      const T* vv = v + (static_cast<size_t>(j) * NKV + g) * HD;
      const T p = std::exp(dot(qv, kv, HD) * scale - lse[th]);
      const T ds = p * (dot(dov, vv, HD) - Dsum[th]) * scale;
      for (int d = 0; d < HD; ++d) dqv[d] += ds * kv[d];
    }
  }

  // dk, dv: one writer per (key, kv head); loops over the queries of its group that see it.
#pragma omp parallel for schedule(dynamic, 16) if (parallel_worth(double(NTH) * HD * 16))
  for (int64_t jg = 0; jg < static_cast<int64_t>(N) * NKV; ++jg) {
    const int j = static_cast<int>(jg / NKV), g = static_cast<int>(jg % NKV);
    const T* kv = k + static_cast<size_t>(jg) * HD;
    const T* vv = v + static_cast<size_t>(jg) * HD;
    T* dkv = dk + static_cast<size_t>(jg) * HD;
    T* dvv = dv + static_cast<size_t>(jg) * HD;
    std::fill(dkv, dkv + HD, T(0));
    std::fill(dvv, dvv + HD, T(0));
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int t = j; t < seq_end[j]; ++t) {
        const size_t th = static_cast<size_t>(t) * NH + h;
        const T* qv = q + th * HD;
        const T* dov = dout + th * HD;
        const T p = std::exp(dot(qv, kv, HD) * scale - lse[th]);
        const T ds = p * (dot(dov, vv, HD) - Dsum[th]) * scale;
        for (int d = 0; d < HD; ++d) {
          dvv[d] += p * dov[d];
          dkv[d] += ds * qv[d];
        }
      }
    }
  }
}

// Fast path: score tiles through BLAS. Forward: one task per (sequence, head); backward: one task
// per (sequence, kv head), looping over the query heads of its group so dk/dv have one writer.
constexpr int kAttnBlock = 32;  // query rows per score block

size_t attention_scratch_floats(int max_seqlen, int threads) {
  return static_cast<size_t>(std::max(threads, 1)) * 2 * static_cast<size_t>(std::min(max_seqlen, kAttnBlock)) *
         max_seqlen;
}

// One query row against its n keys (and values) `stride` apart: the scores in groups of
// kDecodeKeys, the online softmax in key order, then o / l; *lse = m + log l when lse is given.
// The decode step and the batch-invariant training attention both run exactly this.
template <class T>
inline void attend_row(T* o, T* lse, const T* qv, const T* kc, const T* vc, size_t stride, int n, int HD, T scale) {
  std::fill(o, o + HD, T(0));
  T m = -std::numeric_limits<T>::infinity(), l = 0;
  T score[kDecodeKeys];
  for (int j0 = 0; j0 < n; j0 += kDecodeKeys) {
    const int c = std::min(kDecodeKeys, n - j0);
    key_scores(score, qv, kc + j0 * stride, stride, c, HD);
    for (int i = 0; i < c; ++i) online_softmax_step(o, m, l, score[i] * scale, vc + (j0 + i) * stride, HD);
  }
  if (l > 0) {
    const T inv = T(1) / l;
    for (int d = 0; d < HD; ++d) o[d] *= inv;
  }
  if (lse) *lse = m + std::log(l);
}

// attention_forward in batch-invariant mode: each (token, head) is attend_row over the keys of its
// sequence up to itself, as a decode step at that position computes it.
template <class T>
void attention_forward_invariant(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* cu_seqlens, int S,
                                 int N, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  const size_t KS = static_cast<size_t>(NKV) * HD;
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(double(N) * NH * HD * 16))
  for (int64_t sh = 0; sh < static_cast<int64_t>(S) * NH; ++sh) {
    const int s = static_cast<int>(sh / NH), h = static_cast<int>(sh % NH), g = h / group;
    const int a = cu_seqlens[s], Ls = cu_seqlens[s + 1] - a;
    const T* K = k + static_cast<size_t>(a) * KS + static_cast<size_t>(g) * HD;
    const T* Vv = v + static_cast<size_t>(a) * KS + static_cast<size_t>(g) * HD;
    for (int i = 0; i < Ls; ++i) {
      const size_t row = static_cast<size_t>(a + i) * NH + h;
      attend_row(out + row * HD, lse + row, q + row * HD, K, Vv, KS, i + 1, HD, scale);
    }
  }
}

template <class T>
void attention_forward(T* out, T* lse, T* scratch, size_t scratch_floats, const T* q, const T* k, const T* v,
                       const int32_t* cu_seqlens, int S, int max_seqlen, int N, int NH, int NKV, int HD) {
  if (batch_invariant()) {
    attention_forward_invariant(out, lse, q, k, v, cu_seqlens, S, N, NH, NKV, HD);
    return;
  }
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  const size_t tile = static_cast<size_t>(std::min(max_seqlen, kAttnBlock)) * max_seqlen;  // one score block
  const int slots = static_cast<int>(std::max<size_t>(1, scratch_floats / std::max<size_t>(tile, 1)));
  const int nt = std::min(slots, parallel_worth(double(N) * NH * HD * 16) ? omp_get_max_threads() : 1);
  const int QS = NH * HD, KS = NKV * HD;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t sh = 0; sh < static_cast<int64_t>(S) * NH; ++sh) {
    const int s = static_cast<int>(sh / NH), h = static_cast<int>(sh % NH), g = h / group;
    const int a = cu_seqlens[s], Ls = cu_seqlens[s + 1] - a;
    if (Ls <= 0) continue;
    T* P = scratch + static_cast<size_t>(omp_get_thread_num()) * tile;
    const T* Q = q + (static_cast<size_t>(a) * NH + h) * HD;
    const T* K = k + (static_cast<size_t>(a) * NKV + g) * HD;
    const T* Vv = v + (static_cast<size_t>(a) * NKV + g) * HD;
    // Query rows in blocks of kAttnBlock: block [r0, r1) only needs keys [0, r1) (causal), so the
    // masked upper triangle is mostly never computed. P is (r1 - r0) x r1 with leading dim r1.
    for (int r0 = 0; r0 < Ls; r0 += kAttnBlock) {
      const int r1 = std::min(Ls, r0 + kAttnBlock), nr = r1 - r0;
      gemm(CblasNoTrans, CblasTrans, nr, r1, HD, scale, Q + static_cast<size_t>(r0) * QS, QS, K, KS, T(0), P, r1);
      for (int i = 0; i < nr; ++i) {
        const int gi = r0 + i;
        T* row = P + static_cast<size_t>(i) * r1;
        T m = row[0];
        for (int j = 1; j <= gi; ++j) m = std::max(m, row[j]);
        T sum = 0;
        for (int j = 0; j <= gi; ++j) sum += (row[j] = std::exp(row[j] - m));
        const T inv = T(1) / sum;
        for (int j = 0; j <= gi; ++j) row[j] *= inv;
        for (int j = gi + 1; j < r1; ++j) row[j] = T(0);
        lse[static_cast<size_t>(a + gi) * NH + h] = m + std::log(sum);
      }
      gemm(CblasNoTrans, CblasNoTrans, nr, HD, r1, T(1), P, r1, Vv, KS, T(0),
           out + (static_cast<size_t>(a + r0) * NH + h) * HD, QS);
    }
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* scratch, size_t scratch_floats, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const T* lse, const int32_t* cu_seqlens, int S,
                        int max_seqlen, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  const size_t tile = static_cast<size_t>(std::min(max_seqlen, kAttnBlock)) * max_seqlen;  // one score block
  const int slots = static_cast<int>(std::max<size_t>(1, scratch_floats / std::max<size_t>(2 * tile, 1)));
  const int nt = std::min(slots, parallel_worth(double(N) * NH * HD * 16) ? omp_get_max_threads() : 1);
  const int QS = NH * HD, KS = NKV * HD;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t sg = 0; sg < static_cast<int64_t>(S) * NKV; ++sg) {
    const int s = static_cast<int>(sg / NKV), g = static_cast<int>(sg % NKV);
    const int a = cu_seqlens[s], Ls = cu_seqlens[s + 1] - a;
    if (Ls <= 0) continue;
    T* P = scratch + static_cast<size_t>(omp_get_thread_num()) * 2 * tile;
    T* dP = P + tile;
    const T* K = k + (static_cast<size_t>(a) * NKV + g) * HD;
    const T* Vv = v + (static_cast<size_t>(a) * NKV + g) * HD;
    T* dK = dk + (static_cast<size_t>(a) * NKV + g) * HD;
    T* dV = dv + (static_cast<size_t>(a) * NKV + g) * HD;
    for (int i = 0; i < Ls; ++i) {
      std::fill(dK + static_cast<size_t>(i) * KS, dK + static_cast<size_t>(i) * KS + HD, T(0));
      std::fill(dV + static_cast<size_t>(i) * KS, dV + static_cast<size_t>(i) * KS + HD, T(0));
    }
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const size_t qo = (static_cast<size_t>(a) * NH + h) * HD;
      const T* Q = q + qo;
      const T* dO = dout + qo;
      const T* O = out + qo;
      for (int r0 = 0; r0 < Ls; r0 += kAttnBlock) {  // same causal row blocks as the forward
        const int r1 = std::min(Ls, r0 + kAttnBlock), nr = r1 - r0;
        const size_t ro = static_cast<size_t>(r0) * QS;
        gemm(CblasNoTrans, CblasTrans, nr, r1, HD, scale, Q + ro, QS, K, KS, T(0), P, r1);
        gemm(CblasNoTrans, CblasTrans, nr, r1, HD, T(1), dO + ro, QS, Vv, KS, T(0), dP, r1);
        for (int i = 0; i < nr; ++i) {
          const int gi = r0 + i;
          T* prow = P + static_cast<size_t>(i) * r1;
          T* drow = dP + static_cast<size_t>(i) * r1;
          const T L = lse[static_cast<size_t>(a + gi) * NH + h];
          const T D = dot(dO + static_cast<size_t>(gi) * QS, O + static_cast<size_t>(gi) * QS, HD);
          for (int j = 0; j <= gi; ++j) {
            prow[j] = std::exp(prow[j] - L);
            drow[j] = prow[j] * (drow[j] - D) * scale;
          }
          for (int j = gi + 1; j < r1; ++j) prow[j] = drow[j] = T(0);
        }
        gemm(CblasNoTrans, CblasNoTrans, nr, HD, r1, T(1), dP, r1, K, KS, T(0), dq + qo + ro, QS);
        gemm(CblasTrans, CblasNoTrans, r1, HD, nr, T(1), dP, r1, Q + ro, QS, T(1), dK, KS);
        gemm(CblasTrans, CblasNoTrans, r1, HD, nr, T(1), P, r1, dO + ro, QS, T(1), dV, KS);
      }
    }
  }
}

template <class T>
void attention_decode_forward(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* kv_len,
                              const int32_t* slot, int B, int cache_len, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(double(B) * NH * HD * 16))
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
    const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH), g = h / group;
    const size_t stride = static_cast<size_t>(NKV) * HD;  // from one position's key to the next
    const size_t first = (static_cast<size_t>(slot ? slot[b] : b) * cache_len * NKV + g) * HD;
    attend_row(out + static_cast<size_t>(bh) * HD, static_cast<T*>(nullptr), q + static_cast<size_t>(bh) * HD,
               k_cache + first, v_cache + first, stride, kv_len[b], HD, scale);
  }
}

// ---- elementwise add, KV cache, packed layout ---------------------------------------------------

template <class T>
void add_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(n)))
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v, const int32_t* slot,
                    const int32_t* pos, int T, int cache_len, int KD) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(T) * KD))
  for (int t = 0; t < T; ++t) {
    const size_t row = (static_cast<size_t>(slot[t]) * cache_len + pos[t]) * KD;
    std::copy(k + static_cast<size_t>(t) * KD, k + static_cast<size_t>(t + 1) * KD, k_cache + row);
    std::copy(v + static_cast<size_t>(t) * KD, v + static_cast<size_t>(t + 1) * KD, v_cache + row);
  }
}

int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                      const int32_t* cu_seqlens, int S) {
  int max_seqlen = 0;
  for (int s = 0; s < S; ++s) {
    const int a = cu_seqlens[s], e = cu_seqlens[s + 1];
    max_seqlen = std::max(max_seqlen, e - a);
    for (int t = a; t < e; ++t) {
      positions[t] = t - a;
      seq_ids[t] = s;
      seq_start[t] = a;
      seq_end[t] = e;
    }
  }
  return max_seqlen;
}

// ---- SwiGLU ---------------------------------------------------------------------------------------

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int N) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N)))
  for (int i = 0; i < N; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + std::exp(-g)) * up[i];
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N)))
  for (int i = 0; i < N; ++i) {
    const T g = gate[i];
    const T sig = T(1) / (T(1) + std::exp(-g));
    const T silu = g * sig;
    dgate[i] = dout[i] * up[i] * (sig + silu * (T(1) - sig));
    dup[i] = dout[i] * silu;
  }
}

// ---- log-prob and entropy -------------------------------------------------------------------------

template <class T>
void logprob_forward(T* logp, T* entropy, T* lse, const T* logits, const int32_t* targets, float temperature,
                     int N, int V) {
  const T inv_t = T(1) / T(temperature);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * V))
  for (int n = 0; n < N; ++n) {
    const T* z = logits + static_cast<size_t>(n) * V;
    T m = -std::numeric_limits<T>::infinity();
    for (int i = 0; i < V; ++i) m = std::max(m, z[i] * inv_t);
    T s = 0, sz = 0;  // sum e^(z-m), sum e^(z-m) * z
    for (int i = 0; i < V; ++i) {
      const T zi = z[i] * inv_t;
      const T e = std::exp(zi - m);
      s += e;
      sz += e * zi;
    }
    const T L = m + std::log(s);
    lse[n] = L;
    entropy[n] = L - sz / s;  // H = lse - E_p[z]
    logp[n] = targets[n] >= 0 ? z[targets[n]] * inv_t - L : T(0);
  }
}

template <class T>
void logprob_backward(T* dlogits, const T* dlogp, const T* dentropy, const T* logits, const T* lse,
                      const int32_t* targets, float temperature, int N, int V) {
  const T inv_t = T(1) / T(temperature);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * V))
  for (int n = 0; n < N; ++n) {
    const T* z = logits + static_cast<size_t>(n) * V;
    T* dz = dlogits + static_cast<size_t>(n) * V;
    const T L = lse[n];
    const T gl = (dlogp && targets[n] >= 0) ? dlogp[n] : T(0);
    const T ge = dentropy ? dentropy[n] : T(0);
    T H = 0;
    if (ge != T(0)) {
      T sz = 0;
      for (int i = 0; i < V; ++i) sz += std::exp(z[i] * inv_t - L) * z[i] * inv_t;
      H = L - sz;
    }
    // d logp / dz_i = [i == target] - p_i;  d H / dz_i = -p_i (log p_i + H); then d/dlogits = d/dz / T.
    for (int i = 0; i < V; ++i) {
      const T logp_i = z[i] * inv_t - L;
      const T p = std::exp(logp_i);
      T g = -gl * p - ge * p * (logp_i + H);
      dz[i] = g * inv_t;
    }
    if (gl != T(0)) dz[targets[n]] += gl * inv_t;
  }
}

void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int N,
                           int HD) {
  const int half = HD / 2;
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * HD * 8))
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[n]) * inv_freq[i];
      cos[static_cast<size_t>(n) * half + i] = std::cos(angle);
      sin[static_cast<size_t>(n) * half + i] = std::sin(angle);
    }
  }
}

// ---- explicit instantiations ----------------------------------------------------------------------

#define TROUPE_OPS_INSTANTIATE(T)                                                                          \
  template void matmul_forward<T>(T*, const T*, const T*, int, int, int);                                  \
  template void matmul_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int);                   \
  template void bias_forward<T>(T*, const T*, int, int);                                                   \
  template void bias_backward<T>(T*, const T*, int, int);                                                  \
  template void sigmoid_gate_forward<T>(T*, const T*, const T*, int, int);                                 \
  template void sigmoid_gate_backward<T>(T*, T*, const T*, const T*, const T*, int, int);                  \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int);                              \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int, int);                             \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, float);                           \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);             \
  template void rope_forward<T>(T*, const T*, const float*, const float*, int, int, int);                  \
  template void rope_backward<T>(T*, const T*, const float*, const float*, int, int, int);                 \
  template void attention_forward_reference<T>(T*, T*, const T*, const T*, const T*, const int32_t*,        \
                                               const int32_t*, int, int, int, int);                        \
  template void attention_backward_reference<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                                const T*, const T*, const int32_t*, const int32_t*, int, int, \
                                                int, int);                                                 \
  template void attention_forward<T>(T*, T*, T*, size_t, const T*, const T*, const T*, const int32_t*, int, \
                                     int, int, int, int, int);                                             \
  template void attention_backward<T>(T*, T*, T*, T*, size_t, const T*, const T*, const T*, const T*,      \
                                      const T*, const T*, const int32_t*, int, int, int, int, int, int);   \
  template void attention_decode_forward<T>(T*, const T*, const T*, const T*, const int32_t*,             \
                                            const int32_t*, int, int, int, int, int);                      \
  template void add_forward<T>(T*, const T*, const T*, size_t);                                             \
  template void swiglu_forward<T>(T*, const T*, const T*, int);                                            \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int);                             \
  template void logprob_forward<T>(T*, T*, T*, const T*, const int32_t*, float, int, int);                 \
  template void logprob_backward<T>(T*, const T*, const T*, const T*, const T*, const int32_t*, float, int, int);

TROUPE_OPS_INSTANTIATE(float)
TROUPE_OPS_INSTANTIATE(double)
#undef TROUPE_OPS_INSTANTIATE

}  // namespace troupe::kernels
