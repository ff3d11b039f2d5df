// Sampling from the LM head over the vocabulary in chunks: the logits of `chunk` vocabulary
// columns at a time (a GEMM of the N rows against those rows of the head weight). Each row draws
// exactly what sample_token draws from its whole logits row, from the same RNG stream, in up to
// three passes over the chunks:
//   pass 1 (every chunk): the row's max z / temperature and its argmax;
//   pass 2 (every chunk): sum_i e^(z_i - max) in index order (the same sum as sample_token, so the
//     same log-sum-exp), and for top-k rows the k most likely tokens (ties to the lower id);
//   then greedy rows take the argmax, top-k rows (with or without top-p) sample among their k;
//   pass 3 (only when a row samples the full vocabulary): the walk of the cumulative sum.
// When the (N, V) logits fit cache_bytes (N * V * 4 <= kChunkedSampleCacheBytes, 64 MiB, by
// default: 341 rows of SmolLM2's 49,152-token vocabulary) each chunk's GEMM runs once and its
// logits stay in the scratch for the later passes; beyond it each pass recomputes them with the same
// GEMM call, holding one (N, chunk) chunk. Both give the same bits (the same GEMM per chunk, the
// same per-row reductions in the same order).
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

// The default budget for keeping every chunk's logits instead of recomputing them (bytes).
inline constexpr size_t kChunkedSampleCacheBytes = size_t{64} << 20;

// Bytes of scratch chunked_sample needs (8-byte aligned): the logits (N x V with one chunk; beyond
// it N x chunk, or up to cache_bytes for the cached (N', V) of any N' <= N, so a scratch sized for
// N serves every call of at most N rows with the same V, chunk, max_top_k and cache_bytes), the
// per-row running state and top-k candidates, and one whole row with sample_token's scratch.
size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k,
                                    size_t cache_bytes = kChunkedSampleCacheBytes);

// tokens (N), logprobs (N) [assigned, host]: row n's token from softmax(z_n / sp[n].temperature)
// as sample_token(logprobs + n, z_n, V, sp[n], rng + n, ...) would draw it; sp, rng (N) host.
// max_top_k bounds sp[n].top_k for the scratch size (chunked_sample_scratch_bytes); cache_bytes is
// the budget above (the scratch sized with the same one; tests pass 0 to force recomputing).
void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V, int chunk,
                    const SampleParams* sp, uint64_t* rng, int max_top_k, void* scratch,
                    size_t cache_bytes = kChunkedSampleCacheBytes);

}  // namespace troupe::kernels
