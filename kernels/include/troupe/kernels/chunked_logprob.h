// The LM head and its log-softmax over the vocabulary in chunks: logits of `chunk` vocabulary
// columns at a time (a GEMM against those rows of the head weight), folded into each row's
// running max, sum of exponentials and sum of p * z, so that no (N, V) logits buffer exists. The
// backward recomputes each chunk's logits and accumulates the head's input and weight gradients
// chunk by chunk. With V <= chunk it is one chunk: the same GEMM and the same loops as the
// whole-vocabulary ops (matmul_forward + logprob_forward), bit for bit.
//   h (N, C) the final-norm output, W (V, C) the head weight (Hugging Face (out, in) layout),
//   z = h W^T / temperature, targets (N) (-1 = no target: logp 0).
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace troupe::kernels
