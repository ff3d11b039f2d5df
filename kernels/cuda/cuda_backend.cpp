// The CUDA backend: the Backend table (backend.h) on one NVIDIA GPU. Buffers are cudaMalloc'd
// device memory from the device's stream-ordered pool (cudaMallocAsync, kept between steps); every op is queued on the backend's one non-blocking stream (its queue), GEMMs
// through cuBLAS bound to that stream, everything else through the custom kernels of this folder
// (launchers.h). Copies to the host and ops that return host values (grpo_loss, sample_token, MoE
// stats) wait for the queue; nothing else does. A failing CUDA/cuBLAS call throws CudaError
// (check.h) naming the call, file, line and error. Thread-safe: a lock serializes the queuing of
// ops and copies, so roles of one process (learner and generator threads) may share the GPU.
// Copies to pinned host memory (copy_to_host_async: the host mirror of the weights) run on a copy
// stream of their own, after an event on the op stream and before an event the host or the op
// stream waits for.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "bf16_weight_cache.h"
#include "bodies/adamw.h"
#include "bodies/grpo_loss.h"
#include "bodies/moe_ep_buffers.h"
#include "check.h"
#include "device_pick.h"
#include "memory_pool.h"
#include "workspace_grow.h"
#include "activation_reload.h"
#include "launchers.h"
#include "nccl_comm.h"
#include "nccl_moe_exchange.h"
#include "sparse_driver.h"
#include "sparse_memory.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/device.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels {
namespace {

using cuda::Queue;

// NCCL for the learners' gradient all-reduce and the sharded learners' reduce-scatter and
// all-gather (on the compute stream: the gradients and weights are its work), and the weight
// broadcast, which runs on a stream of its own that first waits (an event) for the work queued so
// far, so learner 0's compute stream is never held by a broadcast. Each call returns once its
// collective is done or throws naming the rank (the watchdog, nccl_comm.h).
class NcclCollective final : public DeviceCollective {
 public:
  NcclCollective(const std::vector<uint8_t>& id, int nranks, int rank, cudaStream_t stream)
      : comm_(id, nranks, rank), stream_(stream) {
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&bcast_, cudaStreamNonBlocking));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~NcclCollective() override {
    TROUPE_CUDA_REPORT(cudaEventDestroy(ready_));
    TROUPE_CUDA_REPORT(cudaStreamDestroy(bcast_));
  }
  void all_reduce_sum(float* buf, size_t n) override { comm_.all_reduce_sum(buf, n, stream_); }
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {
    comm_.reduce_scatter_sum(buf, bounds, stream_);
  }
  void all_gather(float* buf, std::span<const size_t> bounds) override { comm_.all_gather(buf, bounds, stream_); }
  void broadcast(float* buf, size_t n, int root) override {
    TROUPE_CUDA_CHECK(cudaEventRecord(ready_, stream_));  // buf's staging copy is queued before
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(bcast_, ready_, 0));
    comm_.broadcast(buf, n, root, bcast_);
  }

 private:
  cuda::NcclComm comm_;
  cudaStream_t stream_;
  cudaStream_t bcast_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    TROUPE_CUDA_CHECK(cudaSetDevice(device_));
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&q_.stream, cudaStreamNonBlocking));
    TROUPE_CUBLAS_CHECK(cublasCreate(&q_.blas));
    TROUPE_CUBLAS_CHECK(cublasSetStream(q_.blas, q_.stream));
    TROUPE_CUBLAS_CHECK(cublasSetMathMode(q_.blas, CUBLAS_PEDANTIC_MATH));  // fp32 GEMMs, no TF32
    q_.bf16 = &bf16_ws_;  // policy.compute_dtype bf16: cuda::gemm's rounded operands
    q_.weights = &weights_;  // ... and the weights' bf16 copies, converted once per write
    // Buffers come from the device's default pool in stream order; what a step frees stays in the
    // pool for the next step (no release threshold) instead of going back to the driver.
    TROUPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;
    TROUPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    q_.experts = &expert_ws_;  // the MoE experts' batched GEMMs (expert_gemm.h)
    q_.decode = &decode_ws_;  // split-K decode attention's partials
    q_.moe_ep = &moe_ep_ws_;  // the expert-parallel MoE layer's owner scratch, shared by the layers
    moe_ep_ws_.release = [](void* p) {  // (also at exit, when the runtime may be gone: silent)
      (void)cudaFree(p);
      (void)cudaGetLastError();
    };
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }
  // The process-wide backend lives until exit, when the CUDA runtime may already be gone: its
  // stream, handle and workspace are left to the driver's teardown.
  ~CudaBackend() override = default;

  const Queue& queue() const { return q_; }

  std::string_view name() const override { return "cuda"; }
  bool host_visible() const override { return false; }
  bool supports_bf16_compute() const override { return true; }  // cuda::gemm: GemmEx on bf16 copies
  void weights_written(const float* w, size_t n) const override {
    const Guard guard(*this);
    weights_.weights_written(w, n);
  }
  std::string memory_report() const override {
    const Guard guard(*this);
    cuda::PoolFigures f;
    uint64_t v = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v) == cudaSuccess) f.reserved = v;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &v) == cudaSuccess) f.used = v;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) f.device_free = free_b, f.device_total = total_b;
    (void)cudaGetLastError();
    return cuda::pool_report(f);
  }

  // Sparse buffers: the driver's virtual memory management (sparse_memory.h). Unmapping waits for
  // the queues first (a kernel or copy still reading a granule must finish before it goes).
  size_t sparse_granularity() const override {
    const Guard guard(*this);
    return sparse().granularity();
  }
  Status map_sparse(const Buffer& buf, size_t offset, size_t bytes) const override {
    const Guard guard(*this);
    Status st = sparse().map(buf.data(), offset, bytes);
    if (st.ok()) return st;
    TROUPE_CUDA_REPORT(cudaStreamSynchronize(q_.stream));  // out of memory: the pool's cached blocks go back, once more
    TROUPE_CUDA_REPORT(cudaMemPoolTrimTo(pool_, 0));
    return sparse().map(buf.data(), offset, bytes);
  }
  Status unmap_sparse(const Buffer& buf, size_t offset, size_t bytes) const override {
    const Guard guard(*this);
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    return sparse().unmap(buf.data(), offset, bytes);
  }
  std::vector<std::pair<size_t, size_t>> mapped_ranges(const Buffer& buf) const override {
    const Guard guard(*this);
    if (!sparse().owns(buf.data())) return Backend::mapped_ranges(buf);
    return sparse().mapped_ranges(buf.data());
  }
  size_t sparse_mapped_bytes() const override {
    const Guard guard(*this);
    return sparse().mapped_bytes();
  }
  size_t sparse_mapped_peak() const override {
    const Guard guard(*this);
    return sparse().peak_bytes();
  }
  void reset_sparse_peak() const override {
    const Guard guard(*this);
    sparse().reset_peak();
  }

  void copy_host_to_device(void* dst, const void* src, size_t bytes) const override {
    const Guard guard(*this);
    if (!bytes) return;
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));  // the caller may reuse src on return
  }
  void copy_device_to_host(void* dst, const void* src, size_t bytes) const override {
    const Guard guard(*this);
    if (!bytes) return;
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));
  }
  void copy_device_to_device(void* dst, const void* src, size_t bytes) const override {
    const Guard guard(*this);
    if (bytes) TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, q_.stream));
  }
  void synchronize() const override { const Guard guard(*this); TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream)); }

  // The copy stream: it waits for an event recorded on the op stream now (the copy sees every op
  // queued before), copies into pinned memory, and records the event wait_copy / order_after_copy
  // wait for. One in-order stream: copy t landed means every earlier copy did.
  CopyTicket copy_to_host_async(void* dst, const void* src, size_t bytes) const override {
    const Guard guard(*this);
    cudaEvent_t ready = nullptr, done = nullptr;
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(cudaEventRecord(ready, q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, ready, 0));
    TROUPE_CUDA_REPORT(cudaEventDestroy(ready));  // (released once the wait has passed it)
    if (bytes) TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
    TROUPE_CUDA_CHECK(cudaEventRecord(done, copy_stream_));
    const std::lock_guard lock(copy_mu_);
    copies_.emplace(++next_copy_, done);
    return CopyTicket{next_copy_};
  }
  // Holds only the copy queue's lock while it waits, so other roles keep queuing ops.
  void wait_copy(CopyTicket t) const override {
    if (!t) return;
    TROUPE_CUDA_CHECK(cudaSetDevice(device_));
    const std::lock_guard lock(copy_mu_);
    const auto last = copies_.upper_bound(t.id);
    if (last == copies_.begin()) return;  // already waited for
    TROUPE_CUDA_CHECK(cudaEventSynchronize(std::prev(last)->second));
    for (auto it = copies_.begin(); it != last; ++it) TROUPE_CUDA_REPORT(cudaEventDestroy(it->second));
    copies_.erase(copies_.begin(), last);
  }
  void order_after_copy(CopyTicket t) const override {
    if (!t) return;
    const Guard guard(*this);
    const std::lock_guard lock(copy_mu_);
    const auto last = copies_.upper_bound(t.id);
    if (last != copies_.begin()) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(q_.stream, std::prev(last)->second, 0));
  }

  void zero(float* x, size_t n) const override {
    const Guard guard(*this);
    if (n) TROUPE_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), q_.stream));
  }
  void fill(float* x, size_t n, float value) const override { const Guard guard(*this); cuda::launch_fill(q_, x, n, value); }
  void scale(float* x, size_t n, double s) const override { const Guard guard(*this); cuda::launch_scale(q_, x, n, s); }
  void fill_normal(float* x, size_t n, double stddev, uint64_t* rng) const override {
    const Guard guard(*this);
    cuda::launch_fill_normal(q_, x, n, stddev, rng);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC) const override {
    const Guard guard(*this);
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) return zero(out, static_cast<size_t>(N) * OC);
    cuda::gemm(q_, false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  }
  void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) const override {
    const Guard guard(*this);
    cuda::launch_quant_matmul_forward(q_, y, x, W, T);
  }
  void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T) const override {
    const Guard guard(*this);
    cuda::launch_quant_matmul_backward_input(q_, dx, dy, W, T);
  }
  void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, int N,
                       int C, int OC) const override {
                         const Guard guard(*this);
    if (N <= 0 || OC <= 0 || C <= 0) return;
    if (dinp) cuda::gemm(q_, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight) cuda::gemm(q_, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  }
  // LoRA (lora.h): the CPU specification's GEMMs, through cuBLAS.
  void lora_forward(float* out, const float* inp, const float* A, const float* B, float* scratch, int N, int C, int OC,
                    int r, float scale) const override {
    const Guard guard(*this);
    if (N <= 0 || C <= 0 || OC <= 0 || r <= 0) return;
    cuda::gemm(q_, false, true, N, r, C, 1.0f, inp, C, A, C, 0.0f, scratch, r);
    cuda::gemm(q_, false, true, N, OC, r, scale, scratch, r, B, r, 1.0f, out, OC);
  }
  void lora_backward(float* dinp, float* dA, float* dB, const float* dout, const float* inp, const float* A,
                     const float* B, float* scratch, int N, int C, int OC, int r, float scale) const override {
    const Guard guard(*this);
    if (N <= 0 || C <= 0 || OC <= 0 || r <= 0) return;
    float* u = scratch;
    float* du = scratch + static_cast<size_t>(N) * r;
    cuda::gemm(q_, false, true, N, r, C, 1.0f, inp, C, A, C, 0.0f, u, r);
    cuda::gemm(q_, true, false, OC, r, N, scale, dout, OC, u, r, 1.0f, dB, r);
    cuda::gemm(q_, false, false, N, r, OC, scale, dout, OC, B, r, 0.0f, du, r);
    cuda::gemm(q_, true, false, r, C, N, 1.0f, du, r, inp, C, 1.0f, dA, C);
    if (dinp) cuda::gemm(q_, false, false, N, C, r, 1.0f, du, r, A, C, 1.0f, dinp, C);
  }
  void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed) const override {
    const Guard guard(*this);
    cuda::launch_lora_dropout(q_, out, in, n, p, seed);
  }
  void bias_forward(float* out, const float* bias, int N, int OC) const override {
    const Guard guard(*this);
    cuda::launch_bias_forward(q_, out, bias, N, OC);
  }
  void bias_backward(float* dbias, const float* dout, int N, int OC) const override {
    const Guard guard(*this);
    cuda::launch_bias_backward(q_, dbias, dout, N, OC);
  }
  void sigmoid_gate_forward(float* out, const float* gate, const float* x, int N, int C) const override {
    const Guard guard(*this);
    cuda::launch_sigmoid_gate_forward(q_, out, gate, x, N, C);
  }
  void sigmoid_gate_backward(float* dgate, float* dx, const float* dout, const float* gate, const float* x, int N,
                             int C) const override {
                               const Guard guard(*this);
    cuda::launch_sigmoid_gate_backward(q_, dgate, dx, dout, gate, x, N, C);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C) const override {
    const Guard guard(*this);
    cuda::launch_embedding_forward(q_, out, tokens, wte, N, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C) const override {
    const Guard guard(*this);
    cuda::launch_embedding_backward(q_, dwte, dout, tokens, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) const override {
                         const Guard guard(*this);
    cuda::launch_rmsnorm_forward(q_, out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) const override {
                          const Guard guard(*this);
    cuda::launch_rmsnorm_backward(q_, dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD, float theta) const override {
    const Guard guard(*this);
    cuda::launch_rope_cos_sin(q_, cos, sin, positions, nullptr, N, HD, theta);
  }
  void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int N,
                             int HD) const override {
                               const Guard guard(*this);
    cuda::launch_rope_cos_sin(q_, cos, sin, positions, inv_freq, N, HD, 0.0f);
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int N, int NH,
                    int HD) const override {
                      const Guard guard(*this);
    cuda::launch_rope_rotate(q_, out, inp, cos, sin, 1.0f, N, NH, HD);
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int N, int NH,
                     int HD) const override {
                       const Guard guard(*this);
    cuda::launch_rope_rotate(q_, dinp, dout, cos, sin, -1.0f, N, NH, HD);
  }
  // The attention kernels need no scratch (bodies/flash_attention.h); one float keeps callers' buffers non-empty.
  size_t attention_scratch_floats(int) const override { return 1; }
  void attention_forward(float* out, float* lse, float*, size_t, const float* q, const float* k, const float* v,
                         const int32_t* cu_seqlens, int S, int, int N, int NH, int NKV, int HD) const override {
                           const Guard guard(*this);
    cuda::launch_attention_forward(q_, out, lse, q, k, v, cu_seqlens, S, N, NH, NKV, HD);
  }
  void attention_backward(float* dq, float* dk, float* dv, float*, size_t, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const int32_t* cu_seqlens, int S, int, int N, int NH, int NKV, int HD) const override {
                            const Guard guard(*this);
    cuda::launch_attention_backward(q_, dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, S, N, NH, NKV, HD);
  }
  void attention_decode_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH, int NKV,
                                int HD) const override {
                                  const Guard guard(*this);
    cuda::launch_attention_decode(q_, out, q, k_cache, v_cache, kv_len, slot, B, cache_len, NH, NKV, HD);
  }
  void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v, const int32_t* slot,
                      const int32_t* pos, int T, int cache_len, int KD) const override {
                        const Guard guard(*this);
    cuda::launch_kv_cache_write(q_, k_cache, v_cache, k, v, slot, pos, T, cache_len, KD);
  }
  void add(float* out, const float* a, const float* b, size_t n) const override { const Guard guard(*this); cuda::launch_add(q_, out, a, b, n); }
  void swiglu_forward(float* out, const float* gate, const float* up, int N) const override {
    const Guard guard(*this);
    cuda::launch_swiglu_forward(q_, out, gate, up, static_cast<size_t>(N));
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       int N) const override {
                         const Guard guard(*this);
    cuda::launch_swiglu_backward(q_, dgate, dup, dout, gate, up, static_cast<size_t>(N));
  }
  void logprob_forward(float* logp, float* entropy, float* lse, const float* logits, const int32_t* targets,
                       float temperature, int N, int V) const override {
                         const Guard guard(*this);
    cuda::launch_logprob_forward(q_, logp, entropy, lse, logits, targets, temperature, N, V);
  }
  void logprob_backward(float* dlogits, const float* dlogp, const float* dentropy, const float* logits,
                        const float* lse, const int32_t* targets, float temperature, int N, int V) const override {
                          const Guard guard(*this);
    cuda::launch_logprob_backward(q_, dlogits, dlogp, dentropy, logits, lse, targets, temperature, N, V);
  }
  void chunked_logprob_forward(float* logp, float* entropy, float* lse, const float* h, const float* W,
                               const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                               float* scratch) const override {
                                 const Guard guard(*this);
    float* sum = static_cast<float*>(workspace(sizeof(float) * static_cast<size_t>(N > 0 ? N : 0)));
    cuda::launch_chunked_logprob_forward(q_, logp, entropy, lse, h, W, targets, temperature, N, C, V, chunk, scratch,
                                         sum);
  }
  void chunked_logprob_backward(float* dh, float* dW, const float* dlogp, const float* dentropy, const float* h,
                                const float* W, const float* lse, const float* entropy, const int32_t* targets,
                                float temperature, int N, int C, int V, int chunk, float* scratch) const override {
                                  const Guard guard(*this);
    cuda::launch_chunked_logprob_backward(q_, dh, dW, dlogp, dentropy, h, W, lse, entropy, targets, temperature, N, C,
                                          V, chunk, scratch);
  }

  size_t moe_saved_floats(const MoeConfig& cfg, int N) const override { return cuda::moe_device_saved_floats(cfg, N); }
  size_t moe_scratch_floats(const MoeConfig& cfg, int N) const override {
    const Guard guard(*this);
    return cuda::moe_device_scratch_floats(cfg, N);
  }
  void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                   const MoeConfig& cfg, int N, float* scratch, const int32_t* route) const override {
                     const Guard guard(*this);
    // routing replay is not implemented on the device: the config refuses it with policy.device cuda
    if (route) throw cuda::CudaError("CudaBackend::moe_forward: routing replay (recorded experts) is not implemented on CUDA");
    cuda::launch_moe_forward(q_, out, saved, stats, inp, w, cfg, N, scratch);
  }
  void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                    const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                    float* scratch) const override {
                      const Guard guard(*this);
    cuda::launch_moe_backward(q_, dinp, g, dout, daux, inp, saved, w, cfg, N, scratch);
  }
  void moe_experts_to_host(int32_t* host_experts, const float* saved, const MoeConfig& cfg, int N) const override {
    const Guard guard(*this);
    cuda::copy_moe_experts_to_host(q_, host_experts, saved, cfg, N);
  }

  // The expert-parallel layer (moe_ep.cu): the group's exchange must be join_expert_exchange's
  // (device rows); the lock is held through its exchanges, so the rows and the layer's buffers
  // stay in this queue's order.
  Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                        const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                        const MoeExpertGroup& group) const override {
    const Guard guard(*this);
    return cuda::launch_moe_ep_forward(q_, out, saved, stats, inp, w, cfg, N, scratch, route, group);
  }
  Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                         const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                         const MoeExpertGroup& group) const override {
    const Guard guard(*this);
    return cuda::launch_moe_ep_backward(q_, dinp, g, dout, daux, inp, saved, w, cfg, N, scratch, group);
  }
  Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) const override {
    const Guard guard(*this);
    return cuda::launch_moe_ep_serve_forward(q_, w, cfg, group);
  }
  Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                               const MoeExpertGroup& group) const override {
    const Guard guard(*this);
    return cuda::launch_moe_ep_serve_backward(q_, g, w, cfg, group);
  }

  int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                        const int32_t* cu_seqlens, int S) const override {
                          const Guard guard(*this);
    return kernels::packed_seq_layout(positions, seq_ids, seq_start, seq_end, cu_seqlens, S);  // host arrays
  }

  size_t sample_scratch_bytes(int V) const override { return cuda::sample_device_scratch_bytes(V); }
  int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp, uint64_t* rng,
                       void* scratch) const override {
                         const Guard guard(*this);
    return cuda::launch_sample_token(q_, logprob, logits, V, sp, rng, scratch);
  }

  // Sampling from the LM head without an (N, V) logits buffer: each row's whole logits row (one
  // GEMM against the head into a (1, V) scratch row), then sample_token on it -- what
  // chunked_sample draws by its contract (chunked_sample.h: sample_token on the row's whole
  // logits), a block of rows at a time rather than over vocabulary chunks: one GEMM gives the
  // block's (rows, V) logits, every row's sampling kernels are queued back to back, and one copy
  // brings the block's tokens and log-probs back (one wait per block, not per row). A block holds
  // as many rows as keep its logits within kSampleBlockBytes.
  static constexpr size_t kSampleBlockBytes = size_t(64) << 20;
  static int sample_block_rows(int N, int V) {
    const size_t per_row = sizeof(float) * static_cast<size_t>(V > 0 ? V : 1);
    const size_t fit = std::max<size_t>(1, kSampleBlockBytes / per_row);
    return static_cast<int>(std::min<size_t>(fit, static_cast<size_t>(N > 0 ? N : 1)));
  }
  static size_t logits_bytes(int rows, int V) {
    return (sizeof(float) * static_cast<size_t>(rows) * static_cast<size_t>(V > 0 ? V : 0) + 255) / 256 * 256;
  }
  size_t chunked_sample_scratch_bytes(int N, int V, int, int) const override {
    const Guard guard(*this);
    const int rows = sample_block_rows(N, V);
    return logits_bytes(rows, V) + cuda::sample_rows_device_scratch_bytes(rows, V);
  }
  void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V, int,
                      const SampleParams* sp, uint64_t* rng, int, void* scratch) const override {
    const Guard guard(*this);
    if (N <= 0) return;
    // (the scratch was sized for at most N rows: a smaller N here gets blocks no larger than that)
    const int block = sample_block_rows(N, V);
    float* logits = static_cast<float*>(scratch);
    void* tmp = static_cast<char*>(scratch) + logits_bytes(block, V);
    for (int n0 = 0; n0 < N; n0 += block) {
      const int rows = std::min(block, N - n0);
      matmul_forward(logits, h + static_cast<size_t>(n0) * C, W, rows, C, V);
      cuda::launch_sample_tokens(q_, tokens + n0, logprobs + n0, logits, rows, V, sp + n0, rng + n0, tmp);
    }
  }

  // Double-buffered reload of checkpointed layer inputs: pinned store, a copy stream, events.
  Result<std::unique_ptr<LayerOffload>> make_layer_offload(const OffloadOptions& options) const override {
    const Guard guard(*this);
    return cuda::make_cuda_layer_offload(q_, options);
  }

  // NCCL between the ranks' GPUs (nccl_comm.h), on this backend's stream.
  std::vector<uint8_t> collective_id() const override {
    const Guard guard(*this);
    return cuda::NcclComm::available() ? cuda::NcclComm::unique_id() : std::vector<uint8_t>{};
  }
  Result<std::unique_ptr<DeviceCollective>> join_collective(const std::vector<uint8_t>& id, int nranks,
                                                            int rank) const override {
                                                              const Guard guard(*this);
    try {
      return std::unique_ptr<DeviceCollective>(new NcclCollective(id, nranks, rank, q_.stream));
    } catch (const cuda::CudaError& e) {
      return make_error(ErrorCode::internal, std::string("cuda backend: joining the NCCL communicator (rank ") +
                                                 std::to_string(rank) + " of " + std::to_string(nranks) +
                                                 "): " + e.what());
    }
  }

  // The expert-parallel group's exchange: an NCCL communicator of the group's GPUs of its own,
  // its all-to-alls on this backend's stream (nccl_moe_exchange.h).
  Result<std::unique_ptr<MoeExchange>> join_expert_exchange(const std::vector<uint8_t>& id, int nranks,
                                                            int rank) const override {
    const Guard guard(*this);
    try {
      auto comm = std::make_unique<cuda::NcclComm>(id, nranks, rank);
      return std::unique_ptr<MoeExchange>(new cuda::NcclMoeExchange(std::move(comm), q_.stream));
    } catch (const cuda::CudaError& e) {
      return make_error(ErrorCode::internal, std::string("cuda backend: joining the expert-parallel group's NCCL "
                                                         "communicator (rank ") +
                                                 std::to_string(rank) + " of " + std::to_string(nranks) +
                                                 "): " + e.what());
    }
  }

  // CUDA graphs of recorded ops (a decode step): stream capture on the queue, thread-local mode.
  // The lock is held from graph_begin to graph_end, so no other thread's work lands in the graph.
  // A graph remembers the backend's own workspaces it was recorded with; a launch after one of
  // them was reallocated (grown) is refused, since the graph would read the freed one.
  bool supports_graphs() const override { return true; }
  Status graph_begin() const override {
    mu_.lock();
    (void)cudaSetDevice(device_);
    const cudaError_t e = cudaStreamBeginCapture(q_.stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      mu_.unlock();
      return make_error(ErrorCode::internal, std::string("cuda backend: cudaStreamBeginCapture: ") + cudaGetErrorString(e));
    }
    return {};
  }
  Status graph_end(uint64_t id) const override {
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(q_.stream, &g);
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess && g) e = cudaGraphInstantiate(&exec, g, 0);
    if (g) (void)cudaGraphDestroy(g);
    if (e != cudaSuccess || !exec) {
      (void)cudaGetLastError();  // a failed recording leaves the stream usable
      mu_.unlock();
      return make_error(ErrorCode::internal, std::string("cuda backend: recording a graph: ") +
                                                 cudaGetErrorString(e == cudaSuccess ? cudaErrorStreamCaptureInvalidated : e));
    }
    graph_drop(id);
    graphs_[id] = Graph{exec, workspaces()};
    mu_.unlock();
    return {};
  }
  Status graph_launch(uint64_t id) const override {
    const Guard guard(*this);
    const auto it = graphs_.find(id);
    if (it == graphs_.end()) return make_error(ErrorCode::internal, "cuda backend: no graph " + std::to_string(id));
    if (it->second.workspaces != workspaces())
      return make_error(ErrorCode::internal, "cuda backend: graph " + std::to_string(id) +
                                                 " was recorded with workspaces reallocated since");
    TROUPE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, q_.stream));
    return {};
  }
  void graph_drop(uint64_t id) const override {
    const Guard guard(*this);
    const auto it = graphs_.find(id);
    if (it == graphs_.end()) return;
    TROUPE_CUDA_REPORT(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
  }

  // The optimizer (optimizer.cu): one tensor (the flat arena) cut into chunks, its table in the
  // workspace; only the norm comes down (grad_norm_clip), the gradients never do.
  double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale) const override {
    const Guard guard(*this);
    return norm_and_clip(g, n, max_norm, scale);
  }
  // A sharded learner's part of the global norm: the square of its shard's norm (max_norm 0: the
  // coefficient, 1, goes to the table's scratch float).
  double add_squares(const float* g, size_t n, double acc) const override {
    const Guard guard(*this);
    const double norm = norm_and_clip(g, n, 0.0, nullptr);
    return acc + norm * norm;
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k,
                    const float* scale) const override {
    const Guard guard(*this);
    const OptTable t = opt_table(cuda::AdamWTensor{p, g, m, v, n});
    const cuda::AdamWCoefficients ck{k.b1, k.b2, k.step_size, k.inv_sqrt_bc2, k.decay, k.eps};
    if (t.n > 0) cuda::launch_adamw(q_, t.tensor, t.chunks, t.n, ck, scale);
  }

  GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& batch, const GrpoLossParams& params,
                         const GrpoLossAggregation& agg) const override {
                           const Guard guard(*this);
    const size_t bytes = sizeof(double) * cuda::kGrpoSums * static_cast<size_t>(batch.S > 0 ? batch.S : 0);
    return cuda::launch_grpo_loss(q_, dlogp, dentropy, static_cast<double*>(workspace(bytes)), batch, params, agg);
  }

 protected:
  // Stream-ordered: the block may reuse memory freed earlier on the queue. Out of memory: the pool's
  // cached blocks go back to the driver and the call is tried once more; failing again, nullptr
  // (Backend::alloc names the tensor, the bytes and memory_report()) with the error cleared, so
  // the backend stays usable.
  void* alloc_bytes(size_t bytes) const override {
    const Guard guard(*this);
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, q_.stream);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TROUPE_CUDA_REPORT(cudaStreamSynchronize(q_.stream));
      TROUPE_CUDA_REPORT(cudaMemPoolTrimTo(pool_, 0));
      err = cudaMallocAsync(&p, bytes, q_.stream);
    }
    if (err != cudaSuccess) {
      if (err != cudaErrorMemoryAllocation) cuda::report_cuda_error(err, "cudaMallocAsync", __FILE__, __LINE__);
      (void)cudaGetLastError();
      return nullptr;
    }
    if (cudaMemsetAsync(p, 0, bytes, q_.stream) != cudaSuccess) {
      (void)cudaGetLastError();
      TROUPE_CUDA_REPORT(cudaFreeAsync(p, q_.stream));
      return nullptr;
    }
    return p;
  }
  void free_bytes(void* data, size_t) const override {
    const Guard guard(*this);
    weights_.forget(data);  // a weight arena's bf16 copy goes with it
    if (sparse().owns(data)) {  // (its granules go back to the pool once the queues are done with them)
      TROUPE_CUDA_REPORT(cudaStreamSynchronize(q_.stream));
      TROUPE_CUDA_REPORT(cudaStreamSynchronize(copy_stream_));
      sparse().free(data);
      return;
    }
    // Stream-ordered: the memory returns to the pool once the queue's work before this point is
    // done. An error here (a failed kernel earlier) is reported, not thrown.
    TROUPE_CUDA_REPORT(cudaFreeAsync(data, q_.stream));
  }
  void* reserve_sparse_bytes(size_t bytes) const override {
    const Guard guard(*this);
    return sparse().reserve(bytes);
  }
  // Page-locked (the copy engine reads and writes it without a staging copy), zero-filled.
  void* alloc_host_bytes(size_t bytes) const override {
    const Guard guard(*this);
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    std::memset(p, 0, bytes);
    return p;
  }
  void free_host_bytes(void* data, size_t) const override {
    (void)cudaFreeHost(data);  // (also at exit, when the runtime may be gone: silent)
    (void)cudaGetLastError();
  }

 private:
  // Device workspace the table's ops need beyond their arguments (the chunked log-softmax's
  // running sums, the GRPO loss's per-sequence metric rows): grown, never shrunk.
  void* workspace(size_t bytes) const {
    if (bytes <= ws_bytes_) return ws_;
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));  // the old one may still be in use
    const cuda::WorkspaceMemory mem{[this](size_t n) { return TROUPE_DEVICE_ALLOC(n, q_.stream); },
                                    [](void* p) { TROUPE_CUDA_CHECK(cudaFree(p)); }};
    // A failed grow leaves an empty workspace (the next op tries again) and throws, like any
    // failing call of an op, naming the workspace and the bytes.
    if (Status st = cuda::grow_workspace("ops scratch", ws_, ws_bytes_, bytes, mem); !st.ok())
      throw cuda::CudaError(st.error().message);
    return ws_;
  }

  // The backend's own device scratch a recorded graph may point into (grown by reallocation).
  std::array<const void*, 4> workspaces() const {
    return {ws_, bf16_ws_.data, decode_ws_.data, expert_ws_.pointers};
  }
  struct Graph {
    cudaGraphExec_t exec;
    std::array<const void*, 4> workspaces;
  };
  mutable std::map<uint64_t, Graph> graphs_;

  // The optimizer ops' table in the workspace: [tensor][chunks][per-chunk partial sums][norm], the
  // tensor and chunks uploaded on the queue (stream order keeps them until the launch has read them).
  static constexpr size_t kOptChunk = size_t{1} << 16;
  struct OptTable {
    cuda::AdamWTensor* tensor;
    cuda::AdamWChunk* chunks;
    int n;
    double* partial;
    double* norm;
    float* scratch;  // a coefficient nobody reads (add_squares)
  };
  // The norm of g[0, n) with the coefficient written to scale (null: the table's scratch), the
  // caller holding the guard.
  double norm_and_clip(const float* g, size_t n, double max_norm, float* scale) const {
    const OptTable t = opt_table(cuda::AdamWTensor{nullptr, g, nullptr, nullptr, n});
    if (!scale) scale = t.scratch;
    double norm = 0;
    if (t.n == 0) {  // an empty arena: norm 0, no clipping
      const float one = 1.0f;
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(scale, &one, sizeof one, cudaMemcpyHostToDevice, q_.stream));
      TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));
      return 0;
    }
    cuda::launch_grad_norm(q_, t.tensor, t.chunks, t.n, t.partial, max_norm, t.norm, scale);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(&norm, t.norm, sizeof norm, cudaMemcpyDeviceToHost, q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));
    return norm;
  }
  OptTable opt_table(const cuda::AdamWTensor& t) const {
    const std::vector<cuda::AdamWChunk> chunks = cuda::adamw_chunks({t}, kOptChunk);
    const size_t n = chunks.size();
    const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t at_chunks = up(sizeof t), at_partial = at_chunks + up(n * sizeof(cuda::AdamWChunk));
    const size_t at_norm = at_partial + up(n * sizeof(double));
    char* ws = static_cast<char*>(workspace(at_norm + sizeof(double) + sizeof(float)));
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(ws, &t, sizeof t, cudaMemcpyHostToDevice, q_.stream));
    if (n)
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(ws + at_chunks, chunks.data(), n * sizeof(cuda::AdamWChunk),
                                        cudaMemcpyHostToDevice, q_.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q_.stream));  // the host table may go on return
    return {reinterpret_cast<cuda::AdamWTensor*>(ws), reinterpret_cast<cuda::AdamWChunk*>(ws + at_chunks),
            static_cast<int>(n), reinterpret_cast<double*>(ws + at_partial), reinterpret_cast<double*>(ws + at_norm),
            reinterpret_cast<float*>(ws + at_norm + sizeof(double))};
  }

  // Roles of one process (a learner and a generator thread) may share the GPU: every op and copy
  // holds this lock while it queues its work, so the shared workspaces are used in stream order.
  // It also makes the backend's GPU the calling thread's current device (the CUDA runtime's
  // current device is per thread, and the stream and buffers belong to that device).
  struct Guard {
    explicit Guard(const CudaBackend& b) : lock(b.mu_) { TROUPE_CUDA_CHECK(cudaSetDevice(b.device_)); }
    std::lock_guard<std::recursive_mutex> lock;
  };
  mutable std::recursive_mutex mu_;
  int device_ = 0;
  Queue q_;
  cuda::Bf16Workspace bf16_ws_;
  cudaMemPool_t pool_ = nullptr;
  // The weights' bf16 copies: blocks from the pool, converted on the queue (bf16_weight_cache.h).
  mutable cuda::Bf16WeightCache weights_{cuda::Bf16WeightCache::Memory{
      [this](size_t n) { return static_cast<uint16_t*>(TROUPE_DEVICE_ALLOC(n * sizeof(uint16_t), q_.stream)); },
      [](uint16_t* p) {  // (also at exit, when the runtime may be gone: silent)
        (void)cudaFree(p);
        (void)cudaGetLastError();
      },
      [this](uint16_t* dst, const float* src, size_t n) { cuda::convert_to_bf16(q_, dst, src, n); }}};
  cuda::ExpertGemmWorkspace expert_ws_;
  cuda::DecodeWorkspace decode_ws_;
  cuda::MoeEpScratch moe_ep_ws_;
  mutable void* ws_ = nullptr;
  mutable size_t ws_bytes_ = 0;
  // The copy queue (copy_to_host_async): its stream and the events of copies not yet waited for.
  cudaStream_t copy_stream_ = nullptr;
  mutable std::mutex copy_mu_;
  mutable std::map<uint64_t, cudaEvent_t> copies_;
  mutable uint64_t next_copy_ = 0;
  // Sparse buffers, made on first use (the driver's entry points resolved then).
  cuda::SparseMemory& sparse() const {
    if (!sparse_) sparse_ = std::make_unique<cuda::SparseMemory>(cuda::sparse_driver(device_));
    return *sparse_;
  }
  mutable std::unique_ptr<cuda::SparseMemory> sparse_;
};

}  // namespace

Result<const Backend*> cuda_backend() {
  static std::once_flag once;
  static std::unique_ptr<CudaBackend> backend;
  static std::string failure;
  std::call_once(once, [] {
    const CudaProbe probe = cuda_probe();
    if (!probe.error.empty()) {
      failure = "CUDA could not start on this machine's GPU: " + probe.error;
      return;
    }
    if (probe.devices == 0) {
      failure = "no usable CUDA device (cudaGetDeviceCount found none, or failed where no /dev/nvidia* "
                "exists); use cpu";
      return;
    }
    // The GPU: TROUPE_CUDA_DEVICE, else the node-local rank, one rank per GPU unless
    // policy.share_gpu (device_pick.h).
    const Result<int> device =
        cuda::pick_cuda_device(probe.devices, cuda::device_pick_env(), cuda_share_gpu());
    if (!device.ok()) {
      failure = device.error().message;
      return;
    }
    try {
      backend = std::make_unique<CudaBackend>(*device);
    } catch (const cuda::CudaError& e) {
      failure = std::string("the CUDA backend could not start: ") + e.what();
    }
  });
  if (!backend) return invalid_input(failure);
  return static_cast<const Backend*>(backend.get());
}

namespace cuda {
const Queue& backend_queue(const Backend& b) { return static_cast<const CudaBackend&>(b).queue(); }
}  // namespace cuda

}  // namespace troupe::kernels
