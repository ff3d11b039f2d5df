// Host-side launchers of the custom kernels, one group per kernel family .cu file. Each runs its
// bodies (bodies/*.h) on `stream`; pointers are device memory unless the name says host. The CUDA
// backend (cuda_backend.cpp) and the GPU tests (tests/gpu/) call these; shapes and [assigned]/[+=]
// contracts are those of the CPU ops in ops.h, moe.h, chunked_logprob.h, grpo_loss.h, random.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bodies/gemm_args.h"
#include "troupe/base/result.h"
#include "troupe/kernels/grpo_loss.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/kernels/quant_matrix.h"
#include "troupe/kernels/random.h"

namespace troupe::kernels {
class Backend;
// The CUDA backend (cuda_backend.cpp): an error when no usable device exists or it cannot start.
Result<const Backend*> cuda_backend();
}  // namespace troupe::kernels

namespace troupe::kernels::cuda {

// Device scratch of the bf16 GEMMs: their operands rounded to bf16 (grown, never shrunk).
struct Bf16Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Device scratch of split-K decode attention (attention.cu): per-split partial max, sum and
// accumulator (grown, never shrunk).
struct DecodeWorkspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// What gemm_batch (expert_gemm.cpp) keeps between calls: the device array of operand pointers the
// grouped GEMM reads (grown, never shrunk), and the side streams with their own cuBLAS handles and
// events (made on first use).
struct ExpertGemmWorkspace {
  void* pointers = nullptr;
  size_t pointer_bytes = 0;
  std::vector<cudaStream_t> streams;
  std::vector<cublasHandle_t> handles;
  std::vector<cudaEvent_t> done;
  cudaEvent_t fork = nullptr;
};

// The queue every launcher of one backend uses: its stream, its cuBLAS handle (bound to it), the
// bf16 GEMMs' workspace (null: fp32 GEMMs only), gemm_batch's (null: one GEMM after the other),
// split-K decode's (null: decode attention one thread per (sequence, head)) and the expert-parallel
// layer's scratch (null: made and freed within each call).
class Bf16WeightCache;  // bf16_weight_cache.h
struct MoeEpScratch;    // bodies/moe_ep_buffers.h
struct Queue {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Bf16Workspace* bf16 = nullptr;
  Bf16WeightCache* weights = nullptr;  // bf16 copies of the weight arenas (null: every operand packed)
  ExpertGemmWorkspace* experts = nullptr;
  DecodeWorkspace* decode = nullptr;
  MoeEpScratch* moe_ep = nullptr;  // the expert-parallel layer's owner scratch (null: one per call)
};

// The queue of the CUDA backend `b` (b must be what cuda_backend() returned).
const Queue& backend_queue(const Backend& b);

// Row-major C (M, N) = alpha op(A) op(B) + beta C: cublasSgemm (fp32 in, fp32 accumulate), or,
// while the calling thread's compute_dtype() is bf16 (compute_dtype.h), cublasGemmEx on copies of
// A and B rounded to bf16 (bodies/bf16.h) with fp32 accumulation and C (needs q.bf16): an operand
// inside a weight arena q.weights knows reads its bf16 copy, any other is packed per call. fp32
// GEMMs use TF32 tensor cores while the thread's allow_tf32() is on (policy.allow_tf32).
void gemm(const Queue& q, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// expert_gemm.cpp: independent row-major GEMMs (one phase of the MoE experts' segments), issued
// as expert_gemm() says (troupe/kernels/expert_gemm.h): one cuBLAS grouped-batched GEMM, one GEMM
// per call spread over side streams joined back through events, or one after the other. Without
// q.experts, or while compute_dtype() is bf16, one after the other through gemm().
void gemm_batch(const Queue& q, const std::vector<RowMajorGemm>& calls);
// dst (n) = src (n) rounded to bf16 (bodies/bf16.h), on q's stream: the weight copies' conversion.
void convert_to_bf16(const Queue& q, uint16_t* dst, const float* src, size_t n);

// optimizer.cu: the device AdamW over a table of tensors cut into chunks (bodies/adamw.h; the
// tables and every pointer in them device memory). launch_grad_norm writes partial[n_chunks], the
// global norm and the clipping coefficient (clip_grad_norm's; 1 = none); launch_adamw runs the
// fused step with the gradients scaled by *scale (null: unscaled).
struct AdamWTensor;
struct AdamWChunk;
struct AdamWCoefficients;
void launch_grad_norm(const Queue& q, const AdamWTensor* tensors, const AdamWChunk* chunks, int n_chunks,
                      double* partial, double max_norm, double* norm, float* scale);
void launch_adamw(const Queue& q, const AdamWTensor* tensors, const AdamWChunk* chunks, int n_chunks,
                  const AdamWCoefficients& k, const float* scale);

// swiglu.cu: the elementwise family
void launch_fill(const Queue& q, float* x, size_t n, float value);
void launch_scale(const Queue& q, float* x, size_t n, double s);
void launch_add(const Queue& q, float* out, const float* a, const float* b, size_t n);
void launch_lora_dropout(const Queue& q, float* out, const float* in, size_t n, float p, uint64_t seed);
void launch_swiglu_forward(const Queue& q, float* out, const float* gate, const float* up, size_t n);
void launch_swiglu_backward(const Queue& q, float* dgate, float* dup, const float* dout, const float* gate,
                            const float* up, size_t n);
void launch_bias_forward(const Queue& q, float* out, const float* bias, int N, int OC);
void launch_bias_backward(const Queue& q, float* dbias, const float* dout, int N, int OC);
void launch_sigmoid_gate_forward(const Queue& q, float* out, const float* gate, const float* x, int N, int C);
void launch_sigmoid_gate_backward(const Queue& q, float* dgate, float* dx, const float* dout, const float* gate,
                                  const float* x, int N, int C);

// embedding.cu
void launch_embedding_forward(const Queue& q, float* out, const int32_t* tokens, const float* wte, int N, int C);
void launch_embedding_backward(const Queue& q, float* dwte, const float* dout, const int32_t* tokens, int N, int C);

// quant_matmul.cu: frozen weights in ggml blocks (quant_matrix.h), W.data device memory
void launch_quant_matmul_forward(const Queue& q, float* y, const float* x, const QuantWeights& W, int T);
void launch_quant_matmul_backward_input(const Queue& q, float* dx, const float* dy, const QuantWeights& W, int T);

// rmsnorm.cu
void launch_rmsnorm_forward(const Queue& q, float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps);
void launch_rmsnorm_backward(const Queue& q, float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C);

// rope.cu (inv_freq null: theta^(-2i/HD))
void launch_rope_cos_sin(const Queue& q, float* cos, float* sin, const int32_t* positions, const float* inv_freq,
                         int N, int HD, float theta);
void launch_rope_rotate(const Queue& q, float* out, const float* inp, const float* cos, const float* sin, float sign,
                        int N, int NH, int HD);

// logprob.cu; `sum` is N floats of device workspace for the chunked forward
void launch_logprob_forward(const Queue& q, float* logp, float* entropy, float* lse, const float* logits,
                            const int32_t* targets, float temperature, int N, int V);
void launch_logprob_backward(const Queue& q, float* dlogits, const float* dlogp, const float* dentropy,
                             const float* logits, const float* lse, const int32_t* targets, float temperature, int N,
                             int V);
void launch_chunked_logprob_forward(const Queue& q, float* logp, float* entropy, float* lse, const float* h,
                                    const float* W, const int32_t* targets, float temperature, int N, int C, int V,
                                    int chunk, float* scratch, float* sum);
void launch_chunked_logprob_backward(const Queue& q, float* dh, float* dW, const float* dlogp, const float* dentropy,
                                     const float* h, const float* W, const float* lse, const float* entropy,
                                     const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                     float* scratch);

// grpo_loss.cu; sums: S * kGrpoSums doubles of device workspace. Waits for the queue (the sums
// come back to the host).
GrpoLossSums launch_grpo_loss(const Queue& q, float* dlogp, float* dentropy, double* sums, const GrpoLossBatch& b,
                              const GrpoLossParams& p, const GrpoLossAggregation& agg);

// attention.cu: FlashAttention-2 tiles (bodies/flash_attention.h); decode split-K over q.decode
void launch_attention_forward(const Queue& q, float* out, float* lse, const float* qv, const float* k, const float* v,
                              const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD);
void launch_attention_backward(const Queue& q, float* dq, float* dk, float* dv, const float* dout, const float* qv,
                               const float* k, const float* v, const float* out, const float* lse,
                               const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD);
void launch_attention_decode(const Queue& q, float* out, const float* qv, const float* k_cache, const float* v_cache,
                             const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH, int NKV, int HD);
void launch_kv_cache_write(const Queue& q, float* k_cache, float* v_cache, const float* k, const float* v,
                           const int32_t* slot, const int32_t* pos, int T, int cache_len, int KD);

// moe_route.cu: the whole layer (grouped path), and the dispatcher round trip for tests
size_t moe_device_saved_floats(const MoeConfig& cfg, int N);
size_t moe_device_scratch_floats(const MoeConfig& cfg, int N);
void launch_moe_forward(const Queue& q, float* out, float* saved, MoeStats* host_stats, const float* inp,
                        const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch);
void launch_moe_backward(const Queue& q, float* dinp, const MoeGrads& g, const float* dout, float daux,
                         const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                         float* scratch);
// The (N, K) chosen experts of a forward's saved buffer, copied to the host (waits for the queue).
void copy_moe_experts_to_host(const Queue& q, int32_t* host_experts, const float* saved, const MoeConfig& cfg,
                              int N);
size_t moe_plan_tmp_bytes(int NK, int E);

// moe_ep.cu: the expert-parallel layer (bodies/moe_ep_layer.h; the CPU kernels::moe_ep_* are its
// specification) on q, its rows exchanged by group.exchange, which must move device buffers (the
// NCCL exchange, nccl_moe_exchange.h). A refused input, a failed exchange (a peer gone, the NCCL
// deadline) or a failing CUDA call comes back as a Status naming this rank of the group.
Status launch_moe_ep_forward(const Queue& q, float* out, float* saved, MoeStats* host_stats, const float* inp,
                             const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                             const MoeExpertGroup& group);
Status launch_moe_ep_backward(const Queue& q, float* dinp, const MoeGrads& g, const float* dout, float daux,
                              const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                              float* scratch, const MoeExpertGroup& group);
Status launch_moe_ep_serve_forward(const Queue& q, const MoeWeights& w, const MoeConfig& cfg,
                                   const MoeExpertGroup& group);
Status launch_moe_ep_serve_backward(const Queue& q, const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                                    const MoeExpertGroup& group);
void launch_moe_round_trip(const Queue& q, float* out, float* back, int32_t* offsets, int32_t* row_slot,
                           int32_t* slot_row, const int32_t* experts, const float* weights, const float* inp, int N,
                           int K, int E, int C, float* xp, void* plan_tmp);

// sampling.cu; rng and logprob are host memory
void launch_fill_normal(const Queue& q, float* x, size_t n, double stddev, uint64_t* host_rng);
size_t sample_device_scratch_bytes(int V);
int32_t launch_sample_token(const Queue& q, float* host_logprob, const float* logits, int V, const SampleParams& sp,
                            uint64_t* host_rng, void* scratch);
// `rows` rows of logits (rows, V) at once: each row sampled as launch_sample_token does (its own
// params and rng, drawn in row order), every row's kernels queued back to back in its own part of
// the scratch, then one copy of the tokens and log-probs to the host and one wait.
size_t sample_rows_device_scratch_bytes(int rows, int V);
void launch_sample_tokens(const Queue& q, int32_t* host_tokens, float* host_logprobs, const float* logits, int rows,
                          int V, const SampleParams* sp, uint64_t* host_rng, void* scratch);

}  // namespace troupe::kernels::cuda
