// Sampling from the LM head over the vocabulary in chunks: the logits of `chunk` vocabulary
// columns at a time (a GEMM against those rows of the head weight), never an (N, V) buffer. Each
// row draws exactly what sample_token draws from its whole logits row, from the same RNG stream:
//   pass 1 (every chunk): the row's max z / temperature and its argmax;
//   pass 2 (every chunk): sum_i e^(z_i - max) in index order (the same sum as sample_token, so the
//     same log-sum-exp), and for top-k rows the k most likely tokens (ties to the lower id);
//   then greedy rows take the argmax, top-k rows (with or without top-p) sample among their k;
//   pass 3 (only when a row samples the full vocabulary): the walk of the cumulative sum.
// A row with top-p but no top-k (or a top-k larger than one chunk) needs its whole sorted
// distribution: it alone gets one (1, V) logits row and sample_token. With V <= chunk (or chunk
// <= 0) every row runs matmul_forward + sample_token on its whole row, bit for bit the unchunked
// sampler.
//   h (N, C) the final-norm output, W (V, C) the head weight, z = h W^T.
#pragma once

#include <cstddef>
#include <cstdint>

#include "troupe/kernels/random.h"

namespace troupe::kernels {

// Bytes of scratch chunked_sample needs (8-byte aligned): at most N x min(V, chunk) logits, the
// per-row running state and top-k candidates, and one whole row with sample_token's scratch.
size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k);

// tokens (N), logprobs (N) [assigned, host]: row n's token from softmax(z_n / sp[n].temperature)
// as sample_token(logprobs + n, z_n, V, sp[n], rng + n, ...) would draw it; sp, rng (N) host.
// max_top_k bounds sp[n].top_k for the scratch size (chunked_sample_scratch_bytes).
void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V, int chunk,
                    const SampleParams* sp, uint64_t* rng, int max_top_k, void* scratch);

}  // namespace troupe::kernels
