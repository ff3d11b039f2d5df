// The backend seam: one table of everything a device must do for troupe -- allocate and free
// buffers, copy host<->device and device<->device, an in-order queue with synchronize(), and the
// op set of the model, the fused GRPO loss and the packed-sequence metadata. The model and the
// learner call ops only through a Backend; kernels/cpu/ implements it over the CPU ops of ops.h,
// moe.h, random.h and grpo_loss.h (the specification every other backend is tested against).
// backend_for("cpu") picks it; backend_for("cuda") the CUDA backend of kernels/cuda/ (kernels/README.md
// says what adding a backend takes).
//
// Pointers given to ops and copies point into Buffers of the same backend ("device memory")
// unless the parameter says host. Ops and copies run in the order they were issued on the
// backend's queue; synchronize() returns once everything issued before it has finished. A copy to
// the host returns with the data in place (it synchronizes first), and a copy from the host may
// reuse its source on return. Ops return nothing and never allocate; scratch comes from the caller.
// Shape letters and the [assigned]/[+=] contracts are those of ops.h and moe.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/chunked_sample.h"
#include "troupe/kernels/grpo_loss.h"
#include "troupe/kernels/lora.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/offload.h"
#include "troupe/kernels/quant_matrix.h"
#include "troupe/kernels/random.h"

namespace troupe::kernels {

class Backend;
class MoeExchange;
struct MoeExpertGroup;

// A collective over the ranks of a job on one backend's device buffers (NCCL on cuda): sums and
// broadcasts in place, queued on the backend's queue in call order. Every rank makes the same
// calls in the same order. A failure throws (the CUDA backend's CudaError names the call).
class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;
  virtual void all_reduce_sum(float* device_buf, size_t n) = 0;
  virtual void broadcast(float* device_buf, size_t n, int root) = 0;
  // Sharded learners (learner.shard): `bounds` (nranks + 1 ascending offsets from 0 to the buffer's
  // length, the same on every rank) cuts the buffer into one contiguous shard per rank.
  // reduce_scatter_sum: this rank's shard [bounds[rank], bounds[rank + 1]) becomes the element-wise
  // sum of every rank's (the rest of the buffer is left unspecified); all_gather: every rank's shard
  // from that rank, in place.
  virtual void reduce_scatter_sum(float* device_buf, std::span<const size_t> bounds) = 0;
  virtual void all_gather(float* device_buf, std::span<const size_t> bounds) = 0;
};

// Memory owned by one backend, freed by it when the owner goes (move-only). Two sides, one owner:
//  - Buffer (device): device memory from Backend::alloc, freed by free_bytes.
//  - HostBuffer (host): page-locked host memory from Backend::alloc_host, the host side of the
//    asynchronous copies (Backend::copy_to_host_async), freed by free_host_bytes. cuda:
//    cudaHostAlloc, so the copy engine moves it while kernels run; cpu: ordinary memory;
//    cpu_fenced: page-aligned memory whose pages under a copy in flight are fenced (PROT_NONE), so a
//    host access before wait_copy faults.
enum class MemorySide { device, host };

template <MemorySide Side>
class BackendMemory {
 public:
  BackendMemory() = default;
  BackendMemory(BackendMemory&& o) noexcept;
  BackendMemory& operator=(BackendMemory&& o) noexcept;
  BackendMemory(const BackendMemory&) = delete;
  BackendMemory& operator=(const BackendMemory&) = delete;
  ~BackendMemory();

  void* data() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }
  size_t num_floats() const { return bytes_ / sizeof(float); }
  const Backend* backend() const { return backend_; }

 private:
  friend class Backend;
  BackendMemory(const Backend* backend, void* data, size_t bytes) : backend_(backend), data_(data), bytes_(bytes) {}
  void release();

  const Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

extern template class BackendMemory<MemorySide::device>;  // backend.cpp
extern template class BackendMemory<MemorySide::host>;
using Buffer = BackendMemory<MemorySide::device>;
using HostBuffer = BackendMemory<MemorySide::host>;

// A copy queued on a backend's copy queue (copy_to_host_async); id 0: no copy.
struct CopyTicket {
  uint64_t id = 0;
  explicit operator bool() const { return id != 0; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- identity ----------------------------------------------------------------------------------
  virtual std::string_view name() const = 0;  // "cpu"
  // Whether the host may read and write this backend's buffers directly (the CPU: yes). Where it
  // may not, Model::params()/grads() need a host copy (see policy/README.md).
  virtual bool host_visible() const = 0;
  // Whether its GEMMs honour ComputeDtype::bf16 (compute_dtype.h); the model refuses bf16 otherwise.
  virtual bool supports_bf16_compute() const { return false; }
  // A model's weights [w, w + n) (a whole weight arena in this backend's memory) were written on
  // the device (initialized, uploaded from the host mirror, set): a backend that keeps converted
  // copies of the weights for its GEMMs (cuda under bf16: one bf16 copy per arena, made on the
  // first bf16 GEMM that reads it after this call, so once per optimizer step rather than once
  // per GEMM) converts them again. The first call for an arena registers it; freeing its buffer
  // forgets it. The CPU backends keep no copies.
  virtual void weights_written(const float* w, size_t n) const { (void)w, (void)n; }

  // ---- memory ------------------------------------------------------------------------------------
  // A zero-filled buffer of `bytes` (at least malloc's alignment); an error when out of memory,
  // naming `what` (the tensor, e.g. "the weights"), the bytes and memory_report(). The backend
  // stays usable after such an error.
  Result<Buffer> alloc(size_t bytes, std::string_view what = {}) const;
  // A buffer of at least `bytes`: `buf` itself when it is large enough, else a new one holding
  // buf's old contents followed by zeros (the old one is freed).
  Status grow(Buffer& buf, size_t bytes, std::string_view what = {}) const;
  // What the backend's memory holds, for out-of-memory errors (cuda: its pool and the device's
  // free bytes); empty where there is nothing to say (the CPU).
  virtual std::string memory_report() const { return {}; }
  // Sparse buffers (learner.shard parameters on a device: each layer's weights and gradients are
  // present only while they are used). alloc_sparse reserves the addresses of `bytes` with no memory
  // behind them; map_sparse backs [offset, offset + bytes) of such a buffer with memory (whole
  // granules of sparse_granularity() bytes: offset a multiple of it, the end one too or the
  // buffer's end) whose values are unspecified, and unmap_sparse gives such a range back (mapping a
  // mapped granule or unmapping an unmapped one does nothing). Ops and copies may touch mapped bytes
  // only: cpu_fenced faults on an unmapped byte and fills newly mapped memory with NaN, so a read
  // before the write shows; cuda maps physical granules into a reserved range (the driver's
  // virtual memory management). sparse_granularity() 0: no sparse buffers on this backend (the
  // default; cpu, whose host ZeRO-3 gives pages back itself).
  virtual size_t sparse_granularity() const { return 0; }
  Result<Buffer> alloc_sparse(size_t bytes, std::string_view what = {}) const;
  virtual Status map_sparse(const Buffer& buf, size_t offset, size_t bytes) const;
  virtual Status unmap_sparse(const Buffer& buf, size_t offset, size_t bytes) const;
  // The byte ranges of `buf` that are mapped, ascending, adjacent ones merged: the whole buffer
  // unless it is sparse.
  virtual std::vector<std::pair<size_t, size_t>> mapped_ranges(const Buffer& buf) const;
  // The bytes mapped in this backend's sparse buffers now, and the most at once since the last
  // reset_sparse_peak() (tests and metrics).
  virtual size_t sparse_mapped_bytes() const { return 0; }
  virtual size_t sparse_mapped_peak() const { return 0; }
  virtual void reset_sparse_peak() const {}
  virtual void copy_host_to_device(void* dst, const void* host_src, size_t bytes) const = 0;
  virtual void copy_device_to_host(void* host_dst, const void* src, size_t bytes) const = 0;
  virtual void copy_device_to_device(void* dst, const void* src, size_t bytes) const = 0;

  // ---- queue -------------------------------------------------------------------------------------
  virtual void synchronize() const = 0;

  // ---- pinned host memory and the copy queue (a host mirror refreshed while compute runs) ----------
  // Zero-filled page-locked host memory (HostBuffer); an error naming `what` and the bytes.
  Result<HostBuffer> alloc_host(size_t bytes, std::string_view what = {}) const;
  // Queues a copy of `bytes` from src (this backend's memory) to host_dst (inside a HostBuffer of
  // this backend) on the copy queue, beside the op queue: it starts once every op and copy issued
  // before this call has finished (so it holds what the last optimizer step wrote) and runs while
  // the ops issued after it run. Until wait_copy(t) returns, the host must not touch
  // [host_dst, host_dst + bytes); until order_after_copy(t) or wait_copy(t), no op may write
  // [src, src + bytes). Copies land in the order they were queued. cpu: a synchronous copy;
  // cpu_fenced: the copy is taken at the call and lands at wait_copy, the pages it lands in
  // fenced until then, and an op that writes the source of an unordered copy aborts naming the op; cuda: an event on the op stream, a
  // copy stream that waits for it, and an event after the copy.
  virtual CopyTicket copy_to_host_async(void* host_dst, const void* src, size_t bytes) const;
  // Returns once copy t and every copy queued before it have landed (t empty: at once).
  virtual void wait_copy(CopyTicket t) const { (void)t; }
  // Ops and copies issued after this call start after copy t has finished reading its source
  // (the host does not wait; t empty: nothing).
  virtual void order_after_copy(CopyTicket t) const { (void)t; }

  // ---- fills -------------------------------------------------------------------------------------
  virtual void zero(float* x, size_t n) const = 0;               // x (n) = 0
  virtual void fill(float* x, size_t n, float value) const = 0;  // x (n) = value
  // x (n) = float(double(x) * s): the streamed step's gradient normaliser, the host loop's rounding.
  virtual void scale(float* x, size_t n, double s) const = 0;
  // x (n) = stddev * N(0, 1) drawn from the host RNG state *rng (random.h fill_normal).
  virtual void fill_normal(float* x, size_t n, double stddev, uint64_t* rng) const = 0;

  // ---- dense ops (ops.h) ---------------------------------------------------------------------------
  virtual void matmul_forward(float* out, const float* inp, const float* weight, int N, int C,
                              int OC) const = 0;
  virtual void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, int N, int C, int OC) const = 0;
  // The input gradient alone, for a frozen weight (LoRA's base): dinp (N, C) += dout . weight. [+=]
  virtual void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                                     int OC) const {
    matmul_backward(dinp, nullptr, dout, nullptr, weight, N, C, OC);
  }
  // LoRA's low-rank path beside a linear layer (lora.h): forward out += scale (inp A^T) B^T;
  // backward dA, dB [+=] and dinp [+=] (null: none); scratch lora_scratch_floats(N, r).
  virtual void lora_forward(float* out, const float* inp, const float* A, const float* B, float* scratch, int N,
                            int C, int OC, int r, float scale) const = 0;
  virtual void lora_backward(float* dinp, float* dA, float* dB, const float* dout, const float* inp, const float* A,
                             const float* B, float* scratch, int N, int C, int OC, int r, float scale) const = 0;
  // LoRA dropout (lora.h): out (n) = in * mask / (1 - p), the mask a function of (seed, index);
  // out may alias in.
  virtual void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed) const = 0;
  virtual void bias_forward(float* out, const float* bias, int N, int OC) const = 0;
  virtual void bias_backward(float* dbias, const float* dout, int N, int OC) const = 0;
  virtual void sigmoid_gate_forward(float* out, const float* gate, const float* x, int N, int C) const = 0;
  virtual void sigmoid_gate_backward(float* dgate, float* dx, const float* dout, const float* gate,
                                     const float* x, int N, int C) const = 0;
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C) const = 0;
  virtual void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                  int C) const = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                               float eps) const = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int N, int C) const = 0;
  virtual void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD,
                            float theta) const = 0;
  virtual void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq,
                                     int N, int HD) const = 0;
  virtual void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int N, int NH,
                            int HD) const = 0;
  virtual void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int N,
                             int NH, int HD) const = 0;
  // Scratch floats attention_forward/backward need for sequences of up to max_seqlen tokens.
  virtual size_t attention_scratch_floats(int max_seqlen) const = 0;
  virtual void attention_forward(float* out, float* lse, float* scratch, size_t scratch_floats,
                                 const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                                 int S, int max_seqlen, int N, int NH, int NKV, int HD) const = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, float* scratch, size_t scratch_floats,
                                  const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const int32_t* cu_seqlens, int S,
                                  int max_seqlen, int N, int NH, int NKV, int HD) const = 0;
  virtual void attention_decode_forward(float* out, const float* q, const float* k_cache,
                                        const float* v_cache, const int32_t* kv_len, const int32_t* slot,
                                        int B, int cache_len, int NH, int NKV, int HD) const = 0;
  virtual void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v,
                              const int32_t* slot, const int32_t* pos, int T, int cache_len,
                              int KD) const = 0;
  virtual void add(float* out, const float* a, const float* b,
                   size_t n) const = 0;  // out = a + b (may alias)
  virtual void swiglu_forward(float* out, const float* gate, const float* up, int N) const = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, int N) const = 0;
  virtual void logprob_forward(float* logp, float* entropy, float* lse, const float* logits,
                               const int32_t* targets, float temperature, int N, int V) const = 0;
  virtual void logprob_backward(float* dlogits, const float* dlogp, const float* dentropy,
                                const float* logits, const float* lse, const int32_t* targets,
                                float temperature, int N, int V) const = 0;
  // The LM head and log-softmax over the vocabulary in chunks (chunked_logprob.h): no (N, V)
  // buffer; scratch holds chunked_logprob_scratch_floats(N, V, chunk) floats.
  virtual void chunked_logprob_forward(float* logp, float* entropy, float* lse, const float* h, const float* W,
                                       const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                       float* scratch) const = 0;
  virtual void chunked_logprob_backward(float* dh, float* dW, const float* dlogp, const float* dentropy,
                                        const float* h, const float* W, const float* lse, const float* entropy,
                                        const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                        float* scratch) const = 0;
  // Both in one pass for a loss of per-row terms (chunked_logprob_fused: three GEMMs over the
  // vocabulary, not four); scratch holds chunked_logprob_fused_scratch_floats(N, V, chunk) floats.
  // grad runs on the host between tiles, on the arrays it was handed. This default body is the two
  // calls above with grad(0, N) between them (the recompute path), for a backend without a fused one.
  virtual void chunked_logprob_fused(float* logp, float* entropy, float* lse, float* dh, float* dW,
                                     const float* dlogp, const float* dentropy, const RowLossGrad& grad,
                                     const float* h, const float* W, const int32_t* targets, float temperature, int N,
                                     int C, int V, int chunk, float* scratch) const;

  // ---- frozen quantized weights (quant_matrix.h) ---------------------------------------------------
  // W.data is device memory holding W.bytes() of blocks (copy a QuantMatrix's bytes in). The CPU
  // ops quant_matmul_forward / quant_matmul_backward_input are the specification.
  // y (T, W.rows) [assigned] = x (T, W.cols) . W^T, W dequantized on the fly.
  virtual void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) const = 0;
  // dx (T, W.cols) [+=] dy (T, W.rows) . W (W frozen: no weight gradient).
  virtual void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T) const = 0;
  // n projections of one input x (T, W.cols), each y = x W^T plus its low-rank path when A is set
  // (quant_matrix.h, QuantProjection; scratch in device memory). The default body is the
  // quant_matmul_forward and lora_forward calls in order; the CPU backend runs them in one region.
  virtual void quant_projections_forward(const QuantProjection* p, int n, const float* x, int T) const;

  // ---- MoE layer (moe.h) ---------------------------------------------------------------------------
  virtual size_t moe_saved_floats(const MoeConfig& cfg, int N) const = 0;
  virtual size_t moe_scratch_floats(const MoeConfig& cfg, int N) const = 0;
  // stats: host memory.
  // route (N, K) host or device, or null: routing replay (moe.h).
  virtual void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                           const MoeConfig& cfg, int N, float* scratch, const int32_t* route) const = 0;
  virtual void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                            const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                            float* scratch) const = 0;
  // The experts each of the N tokens went to in the moe_forward that filled `saved` (N, K),
  // ascending per token, copied into host_experts (host memory): the model's routing record.
  virtual void moe_experts_to_host(int32_t* host_experts, const float* saved, const MoeConfig& cfg, int N) const = 0;

  // ---- expert-parallel MoE layer (moe_expert_parallel.h) --------------------------------------------
  // moe_forward / moe_backward, and the passes of a rank with no tokens of its own, with the routed
  // experts split over an expert-parallel group; the CPU kernels::moe_ep_* are the specification.
  // Buffers are this backend's device memory, as moe_forward's (stats: host). group.exchange moves
  // buffers of the memory it says (MoeExchange::device_buffers): cuda needs a device exchange
  // (join_expert_exchange); cpu and cpu_fenced hand a host exchange host memory (cpu_fenced: the
  // translated blocks). group.state keeps what the backward needs; its `device` part is this
  // backend's own, made on first use. A failed exchange (a peer gone, counts that disagree) comes
  // back as the exchange's Status. The defaults return an error: no expert-parallel layer here.
  virtual Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                                const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                                const MoeExpertGroup& group) const;
  virtual Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                                 const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                                 const MoeExpertGroup& group) const;
  virtual Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) const;
  virtual Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                                       const MoeExpertGroup& group) const;

  // ---- packed-sequence metadata (host arrays) --------------------------------------------------------
  // ops.h packed_seq_layout: positions, sequence ids and bounds of every token; returns max_seqlen.
  virtual int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                                const int32_t* cu_seqlens, int S) const = 0;

  // ---- sampling (random.h) ---------------------------------------------------------------------------
  virtual size_t sample_scratch_bytes(int V) const = 0;
  // One token from a logits row (V); rng and logprob are host memory, scratch a buffer of
  // sample_scratch_bytes(V).
  virtual int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp,
                               uint64_t* rng, void* scratch) const = 0;
  // One token per row from the LM head over the vocabulary in chunks (chunked_sample.h): h (N, C)
  // and W (V, C) device memory; tokens, logprobs, sp, rng (N) host; scratch a buffer of
  // chunked_sample_scratch_bytes(N, V, chunk, max_top_k).
  virtual size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k) const = 0;
  virtual void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V,
                              int chunk, const SampleParams* sp, uint64_t* rng, int max_top_k,
                              void* scratch) const = 0;

  // ---- activation offload (checkpointed layer inputs, offload.h) ----------------------------------
  // The layer-input offload on this backend: x and the reload buffers are device memory, the store
  // is host memory. This default copies synchronously through the backend's own copies (offload
  // at offload_begin, reload at reload_wait; nothing overlaps); a device with copy engines
  // overrides it (cuda: pinned store, a copy stream, double-buffered reload). The cpu model runs
  // ActivationOffload over its CPU copy engine instead.
  virtual Result<std::unique_ptr<LayerOffload>> make_layer_offload(const OffloadOptions& options) const;

  // ---- collectives between ranks (optional) -------------------------------------------------------
  // The id rank 0 makes and sends every rank out of band (the learners' MPI communicator) to join
  // one collective; empty when this backend has no device collectives (cpu, cpu_fenced: the caller
  // reduces host copies over MPI instead).
  virtual std::vector<uint8_t> collective_id() const { return {}; }
  // Joins the collective of `nranks` ranks named by rank 0's collective_id() as `rank`.
  virtual Result<std::unique_ptr<DeviceCollective>> join_collective(const std::vector<uint8_t>& id, int nranks,
                                                                    int rank) const;
  // The all-to-all of an expert-parallel group over this backend's device buffers
  // (moe_expert_parallel.h), joined as `rank` of `nranks` with rank 0's collective_id() (cuda: an
  // NCCL communicator of the group's GPUs, on the backend's queue). Null, no error, where a host
  // exchange serves instead (cpu, cpu_fenced: their moe_ep_* hand the exchange host memory).
  virtual Result<std::unique_ptr<MoeExchange>> join_expert_exchange(const std::vector<uint8_t>& id, int nranks,
                                                                    int rank) const;

  // ---- recorded op sequences (CUDA graphs; optional) ------------------------------------------------
  // Whether this backend can record the ops of a step once and replay them (cuda: CUDA graphs;
  // the CPU backends: no, and the calls below return errors).
  virtual bool supports_graphs() const { return false; }
  // Records, without running them, the ops and device-to-device copies the calling thread queues
  // until graph_end; other threads' calls wait until then. Nothing in between may copy to or from
  // the host, synchronize or allocate (such a call fails the recording).
  virtual Status graph_begin() const;
  // Ends the recording and keeps it as graph `id` (replacing one of that id). The recorded ops
  // have NOT run: graph_launch runs them. An error, keeping nothing, when the recording failed
  // (an op that cannot be recorded): the caller then runs the ops again as usual.
  virtual Status graph_end(uint64_t id) const;
  // Queues graph `id`: the recorded ops with their recorded pointers and shapes. An error (nothing
  // queued) for an unknown id, or when a workspace of the backend's own that the recording used
  // has been reallocated since (the caller then runs the ops as usual).
  virtual Status graph_launch(uint64_t id) const;
  virtual void graph_drop(uint64_t id) const { (void)id; }

  // ---- the optimizer step (adamw.h) ----------------------------------------------------------------
  // The L2 norm of g[0, n) (returned to the host: the one value that comes down) and clip_grad_norm's
  // coefficient written to `scale`, one float in this backend's memory; g is not changed. The CPU
  // backends sum front to back (adamw.h's grad_norm_clip, bit for bit); cuda in per-chunk double
  // sums and a fixed tree (within 1e-14 relative of it).
  virtual double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale) const = 0;
  // acc plus the sum of squares of g[0, n) (returned to the host), adamw.h's add_squares: a sharded
  // learner's part of the global norm. The CPU backends bit for bit; cuda the square of its
  // grad_norm_clip's norm (within 1e-14 relative).
  virtual double add_squares(const float* g, size_t n, double acc) const = 0;
  // AdamW over [0, n) of p, m, v with gradient g times *scale (scale null: unscaled; scale in this
  // backend's memory), adamw.h's adamw_update.
  virtual void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k,
                            const float* scale) const = 0;

  // ---- fused GRPO per-token loss (grpo_loss.h) ------------------------------------------------------
  virtual GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& batch,
                                 const GrpoLossParams& params, const GrpoLossAggregation& agg) const = 0;

 protected:
  // Raw memory behind alloc(): zero-filled, nullptr when out of memory; free_bytes takes it back.
  virtual void* alloc_bytes(size_t bytes) const = 0;
  virtual void free_bytes(void* data, size_t bytes) const = 0;
  // Raw memory behind alloc_host(): zero-filled host memory, nullptr when out of memory (this
  // default: calloc / free).
  virtual void* alloc_host_bytes(size_t bytes) const;
  virtual void free_host_bytes(void* data, size_t bytes) const;
  // Addresses behind alloc_sparse(), nothing mapped; nullptr when refused (this default: always).
  // free_bytes takes them back with whatever is mapped.
  virtual void* reserve_sparse_bytes(size_t bytes) const {
    (void)bytes;
    return nullptr;
  }

 private:
  template <MemorySide>
  friend class BackendMemory;
};

// The CPU backend (kernels/cpu/): host memory, OpenMP + BLAS ops, synchronous queue.
const Backend& cpu_backend();
// The fenced CPU backend (kernels/cpu/fenced_backend.cpp, device name "cpu_fenced"): the CPU ops
// behind device addresses the host cannot dereference (a PROT_NONE range), so any host access to
// device memory faults and any host array passed where the table wants device memory aborts,
// naming the op. Not host_visible: it runs the model's device path (what a GPU backend runs) on
// the CPU, bit for bit the CPU backend's numbers, so tests can check that path without a GPU.
const Backend& cpu_fenced_backend();

// The backend a device name selects: "cpu", "cpu_fenced", or "cuda" (an error naming the reason
// when this build has no CUDA or the process sees no usable GPU); anything else is an error that
// lists the names.
Result<const Backend*> backend_for(std::string_view device);

// The devices by kind (YAML policy.device): the same backends, the names below.
enum class DeviceKind { cpu, cuda, cpu_fenced };
Result<const Backend*> backend_for(DeviceKind device);

// Whether this build can run a device, by name, without starting it: never touches a GPU or the
// CUDA runtime (troupe validate checks configs with it). cuda is fine in a build with CUDA, whether
// or not this machine has a GPU; backend_for says that when the model starts.
Status check_device_built(std::string_view device);

}  // namespace troupe::kernels

namespace troupe {
template <>
struct EnumNames<kernels::DeviceKind> {
  static constexpr std::pair<std::string_view, kernels::DeviceKind> table[] = {
      {"cpu", kernels::DeviceKind::cpu}, {"cuda", kernels::DeviceKind::cuda}, {"cpu_fenced", kernels::DeviceKind::cpu_fenced}};
};
}  // namespace troupe
