// The LM head and its log-softmax over the vocabulary in chunks: logits of `chunk` vocabulary
// columns at a time (a GEMM against those rows of the head weight), folded into each row's
// running max, sum of exponentials and sum of p * z, so that no (N, V) logits buffer exists. The
// backward recomputes each chunk's logits and accumulates the head's input and weight gradients
// chunk by chunk. With V <= chunk it is one chunk: the same GEMM and the same loops as the
// whole-vocabulary ops (matmul_forward + logprob_forward), bit for bit. The fused call runs the head
// once for a loss whose derivative in each row's log-prob and entropy depends on that row alone: see
// chunked_logprob_fused.
//   h (N, C) the final-norm output, W (V, C) the head weight (Hugging Face (out, in) layout),
//   z = h W^T / temperature, targets (N) (-1 = no target: logp 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace troupe::kernels {

// Floats of scratch the two calls need: N x min(V, chunk).
size_t chunked_logprob_scratch_floats(int N, int V, int chunk);

// logp (N), entropy (N), lse (N) [assigned]: log softmax(z)[target], H(softmax(z)), logsumexp(z).
template <class T>
void chunked_logprob_forward(T* logp, T* entropy, T* lse, const T* h, const T* W, const int32_t* targets,
                             float temperature, int N, int C, int V, int chunk, T* scratch);

// dh (N, C) += d/dh and dW (V, C) += d/dW of sum_n dlogp[n] logp[n] + dentropy[n] entropy[n]
// (either may be null), from the forward's lse and entropy. dW may be null.
template <class T>
void chunked_logprob_backward(T* dh, T* dW, const T* dlogp, const T* dentropy, const T* h, const T* W, const T* lse,
                              const T* entropy, const int32_t* targets, float temperature, int N, int C, int V,
                              int chunk, T* scratch);

// ---- forward and backward in one pass, for a loss that is a sum of per-row terms ----------------
// The loss's derivative for rows [t0, t1): it reads logp and entropy there (already assigned) and
// assigns dlogp there (and dentropy, when the fused call is given one). Called once per row tile,
// tiles in order, on the calling thread.
using RowLossGrad = std::function<void(int t0, int t1)>;

// Rows per tile of the fused call: as many whole-vocabulary rows as N x chunk floats hold, but at
// least min(64, N / 4) (OpenBLAS runs GEMMs of fewer rows well below its speed) and at least 1; N
// when V <= chunk. So a tile is at most max(N x chunk, a quarter of N x V) floats.
int chunked_logprob_fused_rows(int N, int V, int chunk);
// Floats of scratch the fused call needs: the larger of chunked_logprob_scratch_floats and one tile.
size_t chunked_logprob_fused_scratch_floats(int N, int V, int chunk);

// chunked_logprob_forward, grad and chunked_logprob_backward in one pass over tiles of
// chunked_logprob_fused_rows rows: each tile's (rows, V) logits once (one GEMM), each row's
// log-softmax folded over `chunk`-column chunks exactly as chunked_logprob_forward folds it (so
// logp/entropy/lse of a row are the same bits whenever the GEMM gives the same logits, as in the
// batch-invariant mode), grad(t0, t1), then the tile's logits gradient in place and its two GEMM
// products dh[t0..t1) += dlogits W and dW += dlogits^T h[t0..t1). Three GEMMs over the vocabulary
// instead of the separate calls' four (their backward recomputes the logits), each as fixed blocks
// of its output (one single-threaded BLAS call each, spread over the threads: results do not
// depend on the thread count). Outputs logp, entropy, lse (N) assigned; dh (N, C) and dW (V, C)
// accumulated (+=; dW may be null); dentropy null = no entropy term. With V <= chunk it is one tile
// through the whole-vocabulary ops, bit for bit what the separate calls give.
template <class T>
void chunked_logprob_fused(T* logp, T* entropy, T* lse, T* dh, T* dW, const T* dlogp, const T* dentropy,
                           const RowLossGrad& grad, const T* h, const T* W, const int32_t* targets, float temperature,
                           int N, int C, int V, int chunk, T* scratch);

}  // namespace troupe::kernels
