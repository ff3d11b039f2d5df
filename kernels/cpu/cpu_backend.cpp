// The CPU backend: the Backend table (backend.h) as a thin layer over the CPU ops (ops.h, moe.h,
// random.h, grpo_loss.h). Buffers are host memory (calloc), every op runs to completion on the
// calling thread's OpenMP team, so the queue is always drained and synchronize() has nothing to do.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool host_visible() const override { return true; }

  void copy_host_to_device(void* dst, const void* src, size_t bytes) const override { copy(dst, src, bytes); }
  void copy_device_to_host(void* dst, const void* src, size_t bytes) const override { copy(dst, src, bytes); }
  void copy_device_to_device(void* dst, const void* src, size_t bytes) const override {
    copy(dst, src, bytes);
  }
  void synchronize() const override {}

  void zero(float* x, size_t n) const override { std::fill(x, x + n, 0.0f); }
  void fill(float* x, size_t n, float value) const override { std::fill(x, x + n, value); }
  void scale(float* x, size_t n, double s) const override {
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * s);
  }
  void fill_normal(float* x, size_t n, double stddev, uint64_t* rng) const override {
    kernels::fill_normal(x, n, stddev, rng);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, int N, int C,
                      int OC) const override {
    kernels::matmul_forward(out, inp, weight, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       int N, int C, int OC) const override {
    kernels::matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC);
  }
  void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) const override {
    kernels::quant_matmul_forward(y, x, W, T);
  }
  void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T) const override {
    kernels::quant_matmul_backward_input(dx, dy, W, T);
  }
  void quant_projections_forward(const QuantProjection* p, int n, const float* x, int T) const override {
    kernels::quant_projections_forward(p, n, x, T);
  }
  void lora_forward(float* out, const float* inp, const float* A, const float* B, float* scratch, int N, int C, int OC,
                    int r, float scale) const override {
    kernels::lora_forward(out, inp, A, B, scratch, N, C, OC, r, scale);
  }
  void lora_backward(float* dinp, float* dA, float* dB, const float* dout, const float* inp, const float* A,
                     const float* B, float* scratch, int N, int C, int OC, int r, float scale) const override {
    kernels::lora_backward(dinp, dA, dB, dout, inp, A, B, scratch, N, C, OC, r, scale);
  }
  void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed) const override {
    kernels::lora_dropout(out, in, n, p, seed);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C) const override {
    kernels::embedding_forward(out, tokens, wte, N, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N,
                          int C) const override {
    kernels::embedding_backward(dwte, dout, tokens, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) const override {
    kernels::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) const override {
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD,
                    float theta) const override {
    kernels::rope_cos_sin(cos, sin, positions, N, HD, theta);
  }
  void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int N,
                             int HD) const override {
    kernels::rope_cos_sin_inv_freq(cos, sin, positions, inv_freq, N, HD);
  }
  void bias_forward(float* out, const float* bias, int N, int OC) const override {
    kernels::bias_forward(out, bias, N, OC);
  }
  void bias_backward(float* dbias, const float* dout, int N, int OC) const override {
    kernels::bias_backward(dbias, dout, N, OC);
  }
  void sigmoid_gate_forward(float* out, const float* gate, const float* x, int N, int C) const override {
    kernels::sigmoid_gate_forward(out, gate, x, N, C);
  }
  void sigmoid_gate_backward(float* dgate, float* dx, const float* dout, const float* gate, const float* x,
                             int N, int C) const override {
    kernels::sigmoid_gate_backward(dgate, dx, dout, gate, x, N, C);
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int N, int NH,
                    int HD) const override {
    kernels::rope_forward(out, inp, cos, sin, N, NH, HD);
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int N, int NH,
                     int HD) const override {
    kernels::rope_backward(dinp, dout, cos, sin, N, NH, HD);
  }
  size_t attention_scratch_floats(int max_seqlen) const override {
    return kernels::attention_scratch_floats(max_seqlen, omp_get_max_threads());
  }
  void attention_forward(float* out, float* lse, float* scratch, size_t scratch_floats, const float* q,
                         const float* k, const float* v, const int32_t* cu_seqlens, int S, int max_seqlen,
                         int N, int NH, int NKV, int HD) const override {
    kernels::attention_forward(out, lse, scratch, scratch_floats, q, k, v, cu_seqlens, S, max_seqlen, N, NH,
                               NKV, HD);
  }
  void attention_backward(float* dq, float* dk, float* dv, float* scratch, size_t scratch_floats,
                          const float* dout, const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const int32_t* cu_seqlens, int S, int max_seqlen, int N, int NH,
                          int NKV, int HD) const override {
    kernels::attention_backward(dq, dk, dv, scratch, scratch_floats, dout, q, k, v, out, lse, cu_seqlens, S,
                                max_seqlen, N, NH, NKV, HD);
  }
  void attention_decode_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH,
                                int NKV, int HD) const override {
    kernels::attention_decode_forward(out, q, k_cache, v_cache, kv_len, slot, B, cache_len, NH, NKV, HD);
  }
  void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v, const int32_t* slot,
                      const int32_t* pos, int T, int cache_len, int KD) const override {
    kernels::kv_cache_write(k_cache, v_cache, k, v, slot, pos, T, cache_len, KD);
  }
  void add(float* out, const float* a, const float* b, size_t n) const override { add_forward(out, a, b, n); }
  void swiglu_forward(float* out, const float* gate, const float* up, int N) const override {
    kernels::swiglu_forward(out, gate, up, N);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       int N) const override {
    kernels::swiglu_backward(dgate, dup, dout, gate, up, N);
  }
  void logprob_forward(float* logp, float* entropy, float* lse, const float* logits, const int32_t* targets,
                       float temperature, int N, int V) const override {
    kernels::logprob_forward(logp, entropy, lse, logits, targets, temperature, N, V);
  }
  void logprob_backward(float* dlogits, const float* dlogp, const float* dentropy, const float* logits,
                        const float* lse, const int32_t* targets, float temperature, int N,
                        int V) const override {
    kernels::logprob_backward(dlogits, dlogp, dentropy, logits, lse, targets, temperature, N, V);
  }
  void chunked_logprob_forward(float* logp, float* entropy, float* lse, const float* h, const float* W,
                               const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                               float* scratch) const override {
    kernels::chunked_logprob_forward(logp, entropy, lse, h, W, targets, temperature, N, C, V, chunk, scratch);
  }
  void chunked_logprob_backward(float* dh, float* dW, const float* dlogp, const float* dentropy, const float* h,
                                const float* W, const float* lse, const float* entropy, const int32_t* targets,
                                float temperature, int N, int C, int V, int chunk, float* scratch) const override {
    kernels::chunked_logprob_backward(dh, dW, dlogp, dentropy, h, W, lse, entropy, targets, temperature, N, C, V,
                                      chunk, scratch);
  }
  void chunked_logprob_fused(float* logp, float* entropy, float* lse, float* dh, float* dW, const float* dlogp,
                             const float* dentropy, const RowLossGrad& grad, const float* h, const float* W,
                             const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                             float* scratch) const override {
    kernels::chunked_logprob_fused(logp, entropy, lse, dh, dW, dlogp, dentropy, grad, h, W, targets, temperature, N, C,
                                   V, chunk, scratch);
  }

  size_t moe_saved_floats(const MoeConfig& cfg, int N) const override {
    return kernels::moe_saved_floats(cfg, N);
  }
  size_t moe_scratch_floats(const MoeConfig& cfg, int N) const override {
    return kernels::moe_scratch_floats(cfg, N);
  }
  void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                   const MoeConfig& cfg, int N, float* scratch, const int32_t* route) const override {
    kernels::moe_forward(out, saved, stats, inp, w, cfg, N, scratch, route);
  }
  void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                    const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                    float* scratch) const override {
    kernels::moe_backward(dinp, g, dout, daux, inp, saved, w, cfg, N, scratch);
  }
  void moe_experts_to_host(int32_t* host_experts, const float* saved, const MoeConfig& cfg, int N) const override {
    if (N > 0) copy(host_experts, moe_saved_routing(saved, cfg, N).experts, sizeof(int32_t) * N * cfg.K);
  }
  Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                        const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                        const MoeExpertGroup& group) const override {
    return kernels::moe_ep_forward(out, saved, stats, inp, w, cfg, N, scratch, route, group);
  }
  Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                         const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                         const MoeExpertGroup& group) const override {
    return kernels::moe_ep_backward(dinp, g, dout, daux, inp, saved, w, cfg, N, scratch, group);
  }
  Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) const override {
    return kernels::moe_ep_serve_forward(w, cfg, group);
  }
  Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                               const MoeExpertGroup& group) const override {
    return kernels::moe_ep_serve_backward(g, w, cfg, group);
  }

  int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                        const int32_t* cu_seqlens, int S) const override {
    return kernels::packed_seq_layout(positions, seq_ids, seq_start, seq_end, cu_seqlens, S);
  }

  size_t sample_scratch_bytes(int V) const override { return kernels::sample_scratch_bytes(V); }
  int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp, uint64_t* rng,
                       void* scratch) const override {
    return kernels::sample_token(logprob, logits, V, sp, rng, scratch);
  }
  size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k) const override {
    return kernels::chunked_sample_scratch_bytes(N, V, chunk, max_top_k);
  }
  void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V,
                      int chunk, const SampleParams* sp, uint64_t* rng, int max_top_k, void* scratch) const override {
    kernels::chunked_sample(tokens, logprobs, h, W, N, C, V, chunk, sp, rng, max_top_k, scratch);
  }

  double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale) const override {
    return kernels::grad_norm_clip(g, n, max_norm, scale);
  }
  double add_squares(const float* g, size_t n, double acc) const override { return kernels::add_squares(g, n, acc); }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k,
                    const float* scale) const override {
    kernels::adamw_update(p, g, m, v, n, k, scale);
  }

  GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& batch,
                         const GrpoLossParams& params, const GrpoLossAggregation& agg) const override {
    return kernels::grpo_loss(dlogp, dentropy, batch, params, agg);
  }

 protected:
  void* alloc_bytes(size_t bytes) const override { return std::calloc(bytes, 1); }
  void free_bytes(void* data, size_t) const override { std::free(data); }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memmove(dst, src, bytes);
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace troupe::kernels
