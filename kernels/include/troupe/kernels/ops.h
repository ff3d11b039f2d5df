// Dense transformer ops on CPU as forward/backward pairs: the specification every
// device version is tested against. Templated on the scalar (float for the model, double for the
// finite-difference checks). Shape letters: N tokens (or rows), C channels, OC output channels,
// NH query heads, NKV key/value heads, HD head dim, V vocab, B sequences in a decode batch.
// Accumulation: parameter gradients (dweight, dwte) are ACCUMULATED (+=); matmul_backward and
// rmsnorm_backward also ACCUMULATE dinp (so a residual stream gradient can be summed in place);
// every other output is ASSIGNED. No op allocates memory: scratch is passed in by the caller.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::kernels {

// Whether a loop of `work` elementary operations is worth an OpenMP parallel region: small ones
// (decode steps, norms of a few rows) run on the calling thread, since waking and synchronising a
// team costs more than they do, above all on a loaded machine.
inline bool parallel_worth(double work) { return work >= 65536.0; }

// ---- GEMM cut into fixed row blocks ---------------------------------------------------------------
// C (M, N) = alpha op(A) op(B) + beta C, row-major (BLAS), computed as blocks of kGemmRowBlock rows
// of C, the same blocks whatever the thread count and whether or not the caller is inside a
// parallel region; outside one, a GEMM of more than 1e6 multiply-adds spreads its blocks over the
// threads. BLAS may pick a different micro-kernel (rounding differently) for a different M, so
// fixed blocks are what make every op's result independent of the thread count.
//
// A float GEMM of at most kGemmRowBlock rows (a decode step: one row per sequence) against a wide
// operand (N * K >= kGemmWideMin) is instead cut into fixed blocks of kGemmColBlock columns of C,
// spread over the threads above 1e6 multiply-adds like the row blocks: one row block would
// otherwise run on one thread. Its one- and two-row C = A B^T form (matmul_forward at
// batch 1 and 2) runs our AVX2/FMA row-times-row kernel (cpu/small_gemm.h) where the CPU has it,
// the rest OpenBLAS per column block. Again the blocks, and so the bits, do not depend on the
// thread count. Smaller GEMMs (the tiny models of the tests and the quickstart) keep one call.
inline constexpr int kGemmRowBlock = 64;
inline constexpr int kGemmColBlock = 64;
inline constexpr double kGemmWideMin = 65536.0;
inline constexpr int kGemmKernelMaxRows = 2;
void gemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc);
void gemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc);

// ---- linear layer with Hugging Face (out, in) weights -------------------------------------------
// out (N, OC) = inp (N, C) . weight (OC, C)^T                                       [assigned]
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int N, int C, int OC);
// dinp (N, C) += dout . weight; dweight (OC, C) += dout^T . inp. Either may be null.  [+=]
template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N, int C, int OC);
// Bias of a linear layer: out (N, OC) += bias (OC) on every row.                        [+=]
template <class T>
void bias_forward(T* out, const T* bias, int N, int OC);
// dbias (OC) += sum over rows of dout (N, OC).                                          [+=]
template <class T>
void bias_backward(T* dbias, const T* dout, int N, int OC);

// ---- per-row sigmoid gate (Qwen2-MoE's shared_expert_gate) ---------------------------------------
// out (N, C) = sigmoid(gate[n]) * x (N, C); gate (N) logits.                            [assigned]
template <class T>
void sigmoid_gate_forward(T* out, const T* gate, const T* x, int N, int C);
// dgate (N) = sig' * <dout[n], x[n]>; dx (N, C) = sigmoid(gate[n]) * dout.               [assigned]
template <class T>
void sigmoid_gate_backward(T* dgate, T* dx, const T* dout, const T* gate, const T* x, int N, int C);

// ---- token embedding ------------------------------------------------------------------------------
// out (N, C) = wte (V, C)[tokens]; tokens must be in [0, V) (the model validates them). [assigned]
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C);
// dwte (V, C) += scatter of dout (N, C) by tokens.                                     [+=]
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C);

// ---- RMSNorm over the last dim (rows of C) --------------------------------------------------------
// out (N, C) = inp * rstd * weight; rstd (N) saved = 1/sqrt(mean(inp^2) + eps).         [assigned]
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps);
// dinp (N, C) += ...; dweight (C) += ... (dweight may be null). dinp must not alias dout. [+=]
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd,
                      int N, int C);

// ---- rotary position embedding (Hugging Face rotate_half convention) -----------------------------
// cos/sin (N, HD/2) for each token's position: angle_i = pos * theta^(-2i/HD).          [assigned]
void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD, float theta);
// Same with the inverse frequencies given (HD/2), for scaled RoPE (linear, llama3):
// angle_i = fp32(pos) * inv_freq[i].                                                    [assigned]
void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int N,
                           int HD);
// out (N, NH, HD): x1 = x[:HD/2], x2 = x[HD/2:]; out1 = x1 cos - x2 sin; out2 = x2 cos + x1 sin.
// In place (out == inp) is allowed.                                                     [assigned]
template <class T>
void rope_forward(T* out, const T* inp, const float* cos, const float* sin, int N, int NH, int HD);
// dinp (N, NH, HD), the transpose rotation. In place allowed.                            [assigned]
template <class T>
void rope_backward(T* dinp, const T* dout, const float* cos, const float* sin, int N, int NH, int HD);

// ---- causal grouped-query attention over packed sequences ----------------------------------------
// Sequence s is tokens [cu_seqlens[s], cu_seqlens[s+1]); token t attends the keys j <= t of its own
// sequence (attention never crosses cu_seqlens). Query head h uses kv head h / (NH / NKV).
// q (N, NH, HD), k/v (N, NKV, HD), out (N, NH, HD), lse (N, NH) saved log-sum-exp of the scaled
// scores; scale = 1/sqrt(HD).
// Fast path: per (sequence, head) causal score blocks (32 query rows x the keys they see) through
// BLAS; scratch holds one (32 x L) block per thread for the forward and two for the backward
// (L = max_seqlen). The number of threads used is capped by what scratch_floats allows, so any
// scratch >= attention_scratch_floats(L, 1) works.
size_t attention_scratch_floats(int max_seqlen, int threads);  // backward size (forward needs half)
template <class T>
void attention_forward(T* out, T* lse, T* scratch, size_t scratch_floats, const T* q, const T* k, const T* v,
                       const int32_t* cu_seqlens, int S, int max_seqlen, int N, int NH, int NKV, int HD);
// dq (N, NH, HD), dk/dv (N, NKV, HD). One writer per output row (deterministic).          [assigned]
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* scratch, size_t scratch_floats, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const T* lse, const int32_t* cu_seqlens, int S,
                        int max_seqlen, int N, int NH, int NKV, int HD);

// Reference path (the spec the fast path is tested against): token t attends keys
// seq_start[t] <= j <= t; seq_end[t] is one past its sequence's last token. Online softmax, no
// scratch beyond ref_scratch (N*NH values) in backward.                                  [assigned]
template <class T>
void attention_forward_reference(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* seq_start,
                                 const int32_t* seq_end, int N, int NH, int NKV, int HD);
template <class T>
void attention_backward_reference(T* dq, T* dk, T* dv, T* ref_scratch, const T* dout, const T* q, const T* k,
                                  const T* v, const T* out, const T* lse, const int32_t* seq_start,
                                  const int32_t* seq_end, int N, int NH, int NKV, int HD);
// One new query per sequence against a KV cache (inference). q/out (B, NH, HD);
// k_cache/v_cache (slots, cache_len, NKV, HD); query b attends the first kv_len[b] rows of cache
// slot slot[b] (slot == nullptr: slot b), so finished sequences can drop out of the batch.  [assigned]
template <class T>
void attention_decode_forward(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* kv_len,
                              const int32_t* slot, int B, int cache_len, int NH, int NKV, int HD);

// ---- elementwise add (the residual stream) -------------------------------------------------------
// out (n) = a + b; out may alias a or b.                                                 [assigned]
template <class T>
void add_forward(T* out, const T* a, const T* b, size_t n);
// (Its backward is the identity on both inputs: the model accumulates it into the residual gradient.)

// ---- KV cache ---------------------------------------------------------------------------------------
// k_cache/v_cache (slots, cache_len, KD): row t of k/v (T, KD) goes to (slot[t], pos[t]).   [assigned]
void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v, const int32_t* slot,
                    const int32_t* pos, int T, int cache_len, int KD);

// ---- packed-sequence layout ---------------------------------------------------------------------------
// From cu_seqlens (S+1) of T tokens: each token's position in its sequence, sequence id and the
// bounds [seq_start, seq_end) of its sequence, all (T). Returns the longest sequence.     [assigned]
int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                      const int32_t* cu_seqlens, int S);

// ---- SwiGLU activation (elementwise over N values) -----------------------------------------------
// out = silu(gate) * up.                                                                 [assigned]
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int N);
// dgate, dup (N).                                                                        [assigned]
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N);

// ---- log-prob of the target and entropy under softmax(logits / temperature) ----------------------
// logits (N, V); targets (N) in [-1, V), -1 = none (logp 0). logp (N), entropy (N), lse (N) saved =
// logsumexp(logits / temperature). temperature > 0.                                       [assigned]
template <class T>
void logprob_forward(T* logp, T* entropy, T* lse, const T* logits, const int32_t* targets, float temperature,
                     int N, int V);
// dlogits (N, V) from upstream dlogp (N) and dentropy (N); either may be null (= zeros).
// In place (dlogits == logits) is allowed.                                               [assigned]
template <class T>
void logprob_backward(T* dlogits, const T* dlogp, const T* dentropy, const T* logits, const T* lse,
                      const int32_t* targets, float temperature, int N, int V);

}  // namespace troupe::kernels
