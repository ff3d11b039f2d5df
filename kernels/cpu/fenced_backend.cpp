// The fenced CPU backend ("cpu_fenced", backend.h): the CPU backend's ops behind a fence. Its
// buffers have device addresses in a reserved PROT_NONE range of the address space, each backed by
// a host block the host code never sees: every op translates the device addresses it is handed
// into their blocks and calls the CPU backend. So the host cannot read or write device memory (it
// faults), and a host array passed where the table wants device memory (or the reverse) aborts
// with the op's name. It is what makes the model's device path -- the one a GPU backend runs --
// testable on a machine without a GPU; its numbers are the CPU backend's, bit for bit. Its copy
// queue (copy_to_host_async) models a GPU's copy stream: the copy is taken at the call and lands at
// wait_copy, the pages it lands in fenced (PROT_NONE) until then, and an op that writes the source of a
// copy nobody ordered after aborts, so the ordering a GPU needs is checked on the CPU. Its sparse
// buffers (alloc_sparse) map and unmap host pages one by one: an op on an unmapped page faults.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <type_traits>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/sparse_ranges.h"

namespace troupe::kernels {
namespace {

class FencedBackend final : public Backend {
 public:
  FencedBackend() {
    // Address space only (PROT_NONE, no memory behind it): 1 TiB, or less where that is refused.
    for (size_t bytes = size_t{1} << 40; bytes >= (size_t{1} << 32) && !base_; bytes >>= 2) {
      void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) base_ = static_cast<char*>(p), size_ = bytes;
    }
    next_ = base_;
  }
  // Process-wide and never destroyed (like the CUDA backend): models may outlive static destructors.

  std::string_view name() const override { return "cpu_fenced"; }
  bool host_visible() const override { return false; }

  void copy_host_to_device(void* dst, const void* src, size_t bytes) const override {
    writes(dst, bytes, __func__);
    if (bytes) cpu().copy_host_to_device(dev(dst, __func__), host(src, __func__), bytes);
  }
  void copy_device_to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) cpu().copy_device_to_host(host(dst, __func__), dev(src, __func__), bytes);
  }
  void copy_device_to_device(void* dst, const void* src, size_t bytes) const override {
    writes(dst, bytes, __func__);
    if (bytes) cpu().copy_device_to_device(dev(dst, __func__), dev(src, __func__), bytes);
  }
  void synchronize() const override {}

  // The copy queue: the copy is taken now (the ops before it have run: it holds their results)
  // and kept until wait_copy lands it; the destination's HostBuffer is fenced meanwhile.
  CopyTicket copy_to_host_async(void* host_dst, const void* src, size_t bytes) const override {
    const char* f = __func__;
    char* dst = static_cast<char*>(host(host_dst, f));
    const char* from = dev(static_cast<const char*>(src), f);
    if (bytes && dev(static_cast<const char*>(src) + bytes - 1, f) != from + bytes - 1)
      fail(f, src, "is the start of a copy that runs past the end of its buffer");
    std::lock_guard lock(copies_mu_);
    auto block = host_blocks_.upper_bound(reinterpret_cast<uintptr_t>(dst));
    if (block == host_blocks_.begin()) fail(f, dst, "is not inside a HostBuffer of this backend (alloc_host)");
    --block;
    if (reinterpret_cast<uintptr_t>(dst) + bytes > block->first + block->second)
      fail(f, dst, "is not inside a HostBuffer of this backend (alloc_host)");
    Pending p{++next_ticket_, dst, block->first, static_cast<const char*>(src), bytes, {}, false};
    p.data.assign(from, from + bytes);
    if (!fence(p, PROT_NONE)) fail(f, dst, "could not be fenced (mprotect)");
    pending_.push_back(std::move(p));
    return CopyTicket{next_ticket_};
  }
  void wait_copy(CopyTicket t) const override {
    std::lock_guard lock(copies_mu_);
    while (!pending_.empty() && pending_.front().id <= t.id) {
      Pending p = std::move(pending_.front());
      pending_.erase(pending_.begin());
      fence(p, PROT_READ | PROT_WRITE);
      std::memcpy(p.dst, p.data.data(), p.bytes);
      for (const Pending& q : pending_)  // a later copy into the same pages keeps them fenced
        if (q.block == p.block) fence(q, PROT_NONE);
    }
  }
  void order_after_copy(CopyTicket t) const override {
    std::lock_guard lock(copies_mu_);
    for (Pending& p : pending_)
      if (p.id <= t.id) p.ordered = true;
  }

  // Sparse buffers: one page per granule (so the small models of the tests have whole granules to
  // give back); a mapped page is filled with NaN, an unmapped one is PROT_NONE and its memory gone.
  size_t sparse_granularity() const override { return granule(); }
  Status map_sparse(const Buffer& buf, size_t offset, size_t bytes) const override {
    std::unique_lock lock(mu_);
    Sparse& sp = sparse_of(buf, offset, bytes, __func__);
    for (size_t g = offset / granule(); g < (offset + bytes + granule() - 1) / granule(); ++g) {
      if (sp.mapped[g]) continue;
      char* page = sp.host + g * granule();
      if (::mprotect(page, granule(), PROT_READ | PROT_WRITE) != 0)
        return make_error(ErrorCode::internal, "cpu_fenced backend: map_sparse: mprotect refused a page");
      std::fill_n(reinterpret_cast<float*>(page), granule() / sizeof(float), std::numeric_limits<float>::quiet_NaN());
      sp.mapped[g] = 1;
      mapped_bytes_ += granule();
    }
    mapped_peak_ = std::max(mapped_peak_, mapped_bytes_);
    return {};
  }
  Status unmap_sparse(const Buffer& buf, size_t offset, size_t bytes) const override {
    std::unique_lock lock(mu_);
    Sparse& sp = sparse_of(buf, offset, bytes, __func__);
    for (size_t g = offset / granule(); g < (offset + bytes + granule() - 1) / granule(); ++g) {
      if (!sp.mapped[g]) continue;
      char* page = sp.host + g * granule();
      ::madvise(page, granule(), MADV_DONTNEED);
      ::mprotect(page, granule(), PROT_NONE);
      sp.mapped[g] = 0;
      mapped_bytes_ -= granule();
    }
    return {};
  }
  std::vector<std::pair<size_t, size_t>> mapped_ranges(const Buffer& buf) const override {
    std::shared_lock lock(mu_);
    const auto sp = sparse_.find(reinterpret_cast<uintptr_t>(buf.data()));
    if (sp == sparse_.end()) return Backend::mapped_ranges(buf);
    return mapped_granule_ranges(sp->second.mapped, granule(), buf.bytes());
  }
  size_t sparse_mapped_bytes() const override {
    std::shared_lock lock(mu_);
    return mapped_bytes_;
  }
  size_t sparse_mapped_peak() const override {
    std::shared_lock lock(mu_);
    return mapped_peak_;
  }
  void reset_sparse_peak() const override {
    std::unique_lock lock(mu_);
    mapped_peak_ = mapped_bytes_;
  }

  void zero(float* x, size_t n) const override {
    writes(x, n * sizeof(float), __func__);
    cpu().zero(dev(x, __func__), n);
  }
  void fill(float* x, size_t n, float value) const override {
    writes(x, n * sizeof(float), __func__);
    cpu().fill(dev(x, __func__), n, value);
  }
  void scale(float* x, size_t n, double s) const override {
    writes(x, n * sizeof(float), __func__);
    cpu().scale(dev(x, __func__), n, s);
  }
  void fill_normal(float* x, size_t n, double stddev, uint64_t* rng) const override {
    writes(x, n * sizeof(float), __func__);
    cpu().fill_normal(dev(x, __func__), n, stddev, host(rng, __func__));
  }

  void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC) const override {
    const char* f = __func__;
    cpu().matmul_forward(dev(out, f), dev(inp, f), dev(weight, f), N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, int N,
                       int C, int OC) const override {
    const char* f = __func__;
    cpu().matmul_backward(dev(dinp, f), dev(dweight, f), dev(dout, f), dev(inp, f), dev(weight, f), N, C, OC);
  }
  void quant_matmul_forward(float* y, const float* x, const QuantWeights& W, int T) const override {
    const char* f = __func__;
    cpu().quant_matmul_forward(dev(y, f), dev(x, f), blocks(W, f), T);
  }
  void quant_matmul_backward_input(float* dx, const float* dy, const QuantWeights& W, int T) const override {
    const char* f = __func__;
    cpu().quant_matmul_backward_input(dev(dx, f), dev(dy, f), blocks(W, f), T);
  }
  void lora_forward(float* out, const float* inp, const float* A, const float* B, float* scratch, int N, int C, int OC,
                    int r, float scale) const override {
    const char* f = __func__;
    cpu().lora_forward(dev(out, f), dev(inp, f), dev(A, f), dev(B, f), dev(scratch, f), N, C, OC, r, scale);
  }
  void lora_backward(float* dinp, float* dA, float* dB, const float* dout, const float* inp, const float* A,
                     const float* B, float* scratch, int N, int C, int OC, int r, float scale) const override {
    const char* f = __func__;
    cpu().lora_backward(dev(dinp, f), dev(dA, f), dev(dB, f), dev(dout, f), dev(inp, f), dev(A, f), dev(B, f),
                        dev(scratch, f), N, C, OC, r, scale);
  }
  void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed) const override {
    cpu().lora_dropout(dev(out, __func__), dev(in, __func__), n, p, seed);
  }
  void bias_forward(float* out, const float* bias, int N, int OC) const override {
    cpu().bias_forward(dev(out, __func__), dev(bias, __func__), N, OC);
  }
  void bias_backward(float* dbias, const float* dout, int N, int OC) const override {
    cpu().bias_backward(dev(dbias, __func__), dev(dout, __func__), N, OC);
  }
  void sigmoid_gate_forward(float* out, const float* gate, const float* x, int N, int C) const override {
    const char* f = __func__;
    cpu().sigmoid_gate_forward(dev(out, f), dev(gate, f), dev(x, f), N, C);
  }
  void sigmoid_gate_backward(float* dgate, float* dx, const float* dout, const float* gate, const float* x, int N,
                             int C) const override {
    const char* f = __func__;
    cpu().sigmoid_gate_backward(dev(dgate, f), dev(dx, f), dev(dout, f), dev(gate, f), dev(x, f), N, C);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C) const override {
    const char* f = __func__;
    cpu().embedding_forward(dev(out, f), dev(tokens, f), dev(wte, f), N, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C) const override {
    const char* f = __func__;
    cpu().embedding_backward(dev(dwte, f), dev(dout, f), dev(tokens, f), N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) const override {
    const char* f = __func__;
    cpu().rmsnorm_forward(dev(out, f), dev(rstd, f), dev(inp, f), dev(weight, f), N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) const override {
    const char* f = __func__;
    cpu().rmsnorm_backward(dev(dinp, f), dev(dweight, f), dev(dout, f), dev(inp, f), dev(weight, f), dev(rstd, f), N,
                           C);
  }
  void rope_cos_sin(float* cos, float* sin, const int32_t* positions, int N, int HD, float theta) const override {
    const char* f = __func__;
    cpu().rope_cos_sin(dev(cos, f), dev(sin, f), dev(positions, f), N, HD, theta);
  }
  void rope_cos_sin_inv_freq(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int N,
                             int HD) const override {
    const char* f = __func__;
    cpu().rope_cos_sin_inv_freq(dev(cos, f), dev(sin, f), dev(positions, f), dev(inv_freq, f), N, HD);
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int N, int NH,
                    int HD) const override {
    const char* f = __func__;
    cpu().rope_forward(dev(out, f), dev(inp, f), dev(cos, f), dev(sin, f), N, NH, HD);
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int N, int NH,
                     int HD) const override {
    const char* f = __func__;
    cpu().rope_backward(dev(dinp, f), dev(dout, f), dev(cos, f), dev(sin, f), N, NH, HD);
  }
  size_t attention_scratch_floats(int max_seqlen) const override { return cpu().attention_scratch_floats(max_seqlen); }
  void attention_forward(float* out, float* lse, float* scratch, size_t scratch_floats, const float* q, const float* k,
                         const float* v, const int32_t* cu_seqlens, int S, int max_seqlen, int N, int NH, int NKV,
                         int HD) const override {
    const char* f = __func__;
    cpu().attention_forward(dev(out, f), dev(lse, f), dev(scratch, f), scratch_floats, dev(q, f), dev(k, f), dev(v, f),
                            dev(cu_seqlens, f), S, max_seqlen, N, NH, NKV, HD);
  }
  void attention_backward(float* dq, float* dk, float* dv, float* scratch, size_t scratch_floats, const float* dout,
                          const float* q, const float* k, const float* v, const float* out, const float* lse,
                          const int32_t* cu_seqlens, int S, int max_seqlen, int N, int NH, int NKV,
                          int HD) const override {
    const char* f = __func__;
    cpu().attention_backward(dev(dq, f), dev(dk, f), dev(dv, f), dev(scratch, f), scratch_floats, dev(dout, f),
                             dev(q, f), dev(k, f), dev(v, f), dev(out, f), dev(lse, f), dev(cu_seqlens, f), S,
                             max_seqlen, N, NH, NKV, HD);
  }
  void attention_decode_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH, int NKV,
                                int HD) const override {
    const char* f = __func__;
    cpu().attention_decode_forward(dev(out, f), dev(q, f), dev(k_cache, f), dev(v_cache, f), dev(kv_len, f),
                                   dev(slot, f), B, cache_len, NH, NKV, HD);
  }
  void kv_cache_write(float* k_cache, float* v_cache, const float* k, const float* v, const int32_t* slot,
                      const int32_t* pos, int T, int cache_len, int KD) const override {
    const char* f = __func__;
    cpu().kv_cache_write(dev(k_cache, f), dev(v_cache, f), dev(k, f), dev(v, f), dev(slot, f), dev(pos, f), T,
                         cache_len, KD);
  }
  void add(float* out, const float* a, const float* b, size_t n) const override {
    cpu().add(dev(out, __func__), dev(a, __func__), dev(b, __func__), n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int N) const override {
    cpu().swiglu_forward(dev(out, __func__), dev(gate, __func__), dev(up, __func__), N);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       int N) const override {
    const char* f = __func__;
    cpu().swiglu_backward(dev(dgate, f), dev(dup, f), dev(dout, f), dev(gate, f), dev(up, f), N);
  }
  void logprob_forward(float* logp, float* entropy, float* lse, const float* logits, const int32_t* targets,
                       float temperature, int N, int V) const override {
    const char* f = __func__;
    cpu().logprob_forward(dev(logp, f), dev(entropy, f), dev(lse, f), dev(logits, f), dev(targets, f), temperature, N,
                          V);
  }
  void logprob_backward(float* dlogits, const float* dlogp, const float* dentropy, const float* logits,
                        const float* lse, const int32_t* targets, float temperature, int N, int V) const override {
    const char* f = __func__;
    cpu().logprob_backward(dev(dlogits, f), dev(dlogp, f), dev(dentropy, f), dev(logits, f), dev(lse, f),
                           dev(targets, f), temperature, N, V);
  }
  void chunked_logprob_forward(float* logp, float* entropy, float* lse, const float* h, const float* W,
                               const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                               float* scratch) const override {
    const char* f = __func__;
    cpu().chunked_logprob_forward(dev(logp, f), dev(entropy, f), dev(lse, f), dev(h, f), dev(W, f), dev(targets, f),
                                  temperature, N, C, V, chunk, dev(scratch, f));
  }
  void chunked_logprob_backward(float* dh, float* dW, const float* dlogp, const float* dentropy, const float* h,
                                const float* W, const float* lse, const float* entropy, const int32_t* targets,
                                float temperature, int N, int C, int V, int chunk, float* scratch) const override {
    const char* f = __func__;
    cpu().chunked_logprob_backward(dev(dh, f), dev(dW, f), dev(dlogp, f), dev(dentropy, f), dev(h, f), dev(W, f),
                                   dev(lse, f), dev(entropy, f), dev(targets, f), temperature, N, C, V, chunk,
                                   dev(scratch, f));
  }

  size_t moe_saved_floats(const MoeConfig& cfg, int N) const override { return cpu().moe_saved_floats(cfg, N); }
  size_t moe_scratch_floats(const MoeConfig& cfg, int N) const override { return cpu().moe_scratch_floats(cfg, N); }
  void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                   const MoeConfig& cfg, int N, float* scratch, const int32_t* route) const override {
    const char* f = __func__;
    cpu().moe_forward(dev(out, f), dev(saved, f), host(stats, f), dev(inp, f), weights(w, f), cfg, N, dev(scratch, f),
                      either(route));
  }
  void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp, const float* saved,
                    const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch) const override {
    const char* f = __func__;
    cpu().moe_backward(dev(dinp, f), grads(g, f), dev(dout, f), daux, dev(inp, f), dev(saved, f), weights(w, f), cfg,
                       N, dev(scratch, f));
  }
  void moe_experts_to_host(int32_t* host_experts, const float* saved, const MoeConfig& cfg, int N) const override {
    cpu().moe_experts_to_host(host(host_experts, __func__), dev(saved, __func__), cfg, N);
  }
  // The exchange is the caller's host exchange: it moves the translated blocks.
  Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                        const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                        const MoeExpertGroup& group) const override {
    const char* f = __func__;
    return cpu().moe_ep_forward(dev(out, f), dev(saved, f), host(stats, f), dev(inp, f), weights(w, f), cfg, N,
                                dev(scratch, f), either(route), group);
  }
  Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                         const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                         const MoeExpertGroup& group) const override {
    const char* f = __func__;
    return cpu().moe_ep_backward(dev(dinp, f), grads(g, f), dev(dout, f), daux, dev(inp, f), dev(saved, f),
                                 weights(w, f), cfg, N, dev(scratch, f), group);
  }
  Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group) const override {
    return cpu().moe_ep_serve_forward(weights(w, __func__), cfg, group);
  }
  Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                               const MoeExpertGroup& group) const override {
    const char* f = __func__;
    return cpu().moe_ep_serve_backward(grads(g, f), weights(w, f), cfg, group);
  }

  int packed_seq_layout(int32_t* positions, int32_t* seq_ids, int32_t* seq_start, int32_t* seq_end,
                        const int32_t* cu_seqlens, int S) const override {
    const char* f = __func__;  // host arrays by the table's contract
    return cpu().packed_seq_layout(host(positions, f), host(seq_ids, f), host(seq_start, f), host(seq_end, f),
                                   host(cu_seqlens, f), S);
  }

  size_t sample_scratch_bytes(int V) const override { return cpu().sample_scratch_bytes(V); }
  int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp, uint64_t* rng,
                       void* scratch) const override {
    const char* f = __func__;
    return cpu().sample_token(host(logprob, f), dev(logits, f), V, sp, host(rng, f), dev(scratch, f));
  }
  size_t chunked_sample_scratch_bytes(int N, int V, int chunk, int max_top_k) const override {
    return cpu().chunked_sample_scratch_bytes(N, V, chunk, max_top_k);
  }
  void chunked_sample(int32_t* tokens, float* logprobs, const float* h, const float* W, int N, int C, int V, int chunk,
                      const SampleParams* sp, uint64_t* rng, int max_top_k, void* scratch) const override {
    const char* f = __func__;
    cpu().chunked_sample(host(tokens, f), host(logprobs, f), dev(h, f), dev(W, f), N, C, V, chunk, host(sp, f),
                         host(rng, f), max_top_k, dev(scratch, f));
  }

  double grad_norm_clip(const float* g, size_t n, double max_norm, float* scale) const override {
    const char* f = __func__;
    return cpu().grad_norm_clip(dev(g, f), n, max_norm, dev(scale, f));
  }
  double add_squares(const float* g, size_t n, double acc) const override {
    return cpu().add_squares(dev(g, __func__), n, acc);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& k,
                    const float* scale) const override {
    const char* f = __func__;
    writes(p, n * sizeof(float), f);
    writes(m, n * sizeof(float), f);
    writes(v, n * sizeof(float), f);
    cpu().adamw_update(dev(p, f), dev(g, f), dev(m, f), dev(v, f), n, k, scale ? dev(scale, f) : nullptr);
  }

  GrpoLossSums grpo_loss(float* dlogp, float* dentropy, const GrpoLossBatch& b, const GrpoLossParams& params,
                         const GrpoLossAggregation& agg) const override {
    const char* f = __func__;
    const GrpoLossBatch db{b.T,           b.S,           dev(b.cu_seqlens, f), dev(b.mask, f),     dev(b.advantages, f),
                           dev(b.logp, f), dev(b.logp_old, f), dev(b.logp_ref, f), dev(b.is_weight, f), dev(b.entropy, f),
                           dev(b.seq_tokens, f)};
    return cpu().grpo_loss(dev(dlogp, f), dev(dentropy, f), db, params, agg);
  }

 protected:
  void* alloc_bytes(size_t bytes) const override {
    void* block = std::calloc(bytes, 1);
    if (!block) return nullptr;
    std::unique_lock lock(mu_);
    const size_t span = (bytes + 255) / 256 * 256 + 256;  // a gap after each buffer: overruns fault too
    if (!base_ || static_cast<size_t>(next_ - base_) + span > size_) {
      std::free(block);
      return nullptr;
    }
    char* at = next_;
    next_ += span;  // device addresses are never reused, so a stale pointer faults or aborts
    blocks_.emplace(reinterpret_cast<uintptr_t>(at), Block{static_cast<char*>(block), bytes});
    return at;
  }
  void free_bytes(void* data, size_t) const override {
    std::unique_lock lock(mu_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(data));
    if (it == blocks_.end()) fail("free", data, "is not a live buffer of this backend");
    if (const auto sp = sparse_.find(it->first); sp != sparse_.end()) {  // (its mapped pages go with it)
      for (char m : sp->second.mapped) mapped_bytes_ -= m ? granule() : 0;
      ::munmap(sp->second.host, sp->second.span);
      sparse_.erase(sp);
    } else {
      std::free(it->second.host);
    }
    blocks_.erase(it);
  }
  // A sparse buffer: a device address as alloc_bytes gives, over a host range reserved PROT_NONE
  // (MAP_NORESERVE: no memory until a page is mapped).
  void* reserve_sparse_bytes(size_t bytes) const override {
    const size_t span = (bytes + granule() - 1) / granule() * granule();
    void* region = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) return nullptr;
    std::unique_lock lock(mu_);
    const size_t gap = (span + 255) / 256 * 256 + 256;
    if (!base_ || static_cast<size_t>(next_ - base_) + gap > size_) {
      ::munmap(region, span);
      return nullptr;
    }
    char* at = next_;
    next_ += gap;
    blocks_.emplace(reinterpret_cast<uintptr_t>(at), Block{static_cast<char*>(region), bytes});
    sparse_.emplace(reinterpret_cast<uintptr_t>(at), Sparse{static_cast<char*>(region), span, std::vector<char>(span / granule(), 0)});
    return at;
  }
  // Page-aligned (mprotect fences whole pages), zero-filled.
  void* alloc_host_bytes(size_t bytes) const override {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t span = (bytes + page - 1) / page * page;
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard lock(copies_mu_);
    host_blocks_.emplace(reinterpret_cast<uintptr_t>(p), span);
    return p;
  }
  void free_host_bytes(void* data, size_t) const override {
    std::lock_guard lock(copies_mu_);
    const auto it = host_blocks_.find(reinterpret_cast<uintptr_t>(data));
    if (it == host_blocks_.end()) fail("free_host", data, "is not a live HostBuffer of this backend");
    std::erase_if(pending_, [&](const Pending& p) { return p.block == it->first; });  // copies into it go
    ::munmap(data, it->second);
    host_blocks_.erase(it);
  }

 private:
  struct Block {
    char* host;
    size_t bytes;
  };

  static const Backend& cpu() { return cpu_backend(); }
  static size_t granule() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

  // A sparse buffer's host range (span bytes, whole pages) and which of its pages are mapped.
  struct Sparse {
    char* host;
    size_t span;
    std::vector<char> mapped;
  };
  // The sparse buffer `buf` (mu_ held), after checking [offset, offset + bytes) is whole granules
  // inside it; aborts naming the op otherwise (a caller's bug, as every other fenced check).
  Sparse& sparse_of(const Buffer& buf, size_t offset, size_t bytes, const char* op) const {
    const auto sp = sparse_.find(reinterpret_cast<uintptr_t>(buf.data()));
    if (sp == sparse_.end()) fail(op, buf.data(), "is not a sparse buffer of this backend (alloc_sparse)");
    const size_t end = offset + bytes;
    if (offset % granule() != 0 || (end % granule() != 0 && end != buf.bytes()) || end > buf.bytes())
      fail(op, buf.data(), "was given a range that is not whole granules inside the buffer");
    return sp->second;
  }

  // A copy to the host queued and not yet landed (copy_to_host_async): its bytes as they were at
  // the call, its destination, and whether ops were ordered after it (order_after_copy).
  struct Pending {
    uint64_t id;
    char* dst;
    uintptr_t block;  // the HostBuffer holding dst (host_blocks_ key)
    const char* src;  // device address
    size_t bytes;
    std::vector<char> data;
    bool ordered;
  };
  // The pages under a pending copy's destination, protected as `prot` (HostBuffers are page-aligned).
  static bool fence(const Pending& p, int prot) {
    if (!p.bytes) return true;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = reinterpret_cast<uintptr_t>(p.dst) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p.dst) + p.bytes + page - 1) / page * page;
    return ::mprotect(reinterpret_cast<void*>(a), e - a, prot) == 0;
  }
  // An op about to write device memory [x, x + bytes): aborts when a copy still in flight reads it
  // and nothing ordered the ops after that copy (on a GPU the op would overwrite what the copy
  // engine is reading).
  void writes(const void* x, size_t bytes, const char* op) const {
    std::lock_guard lock(copies_mu_);
    const char* a = static_cast<const char*>(x);
    for (const Pending& p : pending_)
      if (!p.ordered && a < p.src + p.bytes && p.src < a + bytes)
        fail(op, x, "writes the source of a copy to the host still in flight (order_after_copy or wait_copy first)");
  }

  bool fenced(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + size_;
  }
  [[noreturn]] static void fail(const char* op, const void* p, const char* why) {
    std::fprintf(stderr, "troupe: cpu_fenced backend: %s: pointer %p %s\n", op, p, why);
    std::fflush(stderr);
    std::abort();
  }
  // W with its blocks translated; its last byte must lie in the same live buffer as its first.
  QuantWeights blocks(const QuantWeights& W, const char* op) const {
    QuantWeights h = W;
    h.data = dev(static_cast<const char*>(W.data), op);
    if (W.bytes() && dev(static_cast<const char*>(W.data) + W.bytes() - 1, op) != static_cast<const char*>(h.data) + W.bytes() - 1)
      fail(op, W.data, "holds blocks that run past the end of their buffer");
    return h;
  }
  // The host block behind a device address (null stays null); aborts on a host pointer or an
  // address outside every live buffer.
  template <class T>
  T* dev(T* p, const char* op) const {
    if (!p) return nullptr;
    if (!fenced(p)) fail(op, p, "is host memory where the backend table wants device memory");
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::shared_lock lock(mu_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) fail(op, p, "is not inside a live buffer");
    --it;
    const size_t off = a - it->first;
    if (off > it->second.bytes) fail(op, p, "is not inside a live buffer");
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T*>(static_cast<Byte*>(it->second.host) + off);
  }
  template <class T>
  T* host(T* p, const char* op) const {
    if (p && fenced(p)) fail(op, p, "is device memory where the backend table wants host memory");
    return p;
  }
  template <class T>
  T* either(T* p) const {  // parameters the table lets be host or device memory
    return p && fenced(p) ? dev(p, "moe_forward") : p;
  }
  MoeGrads grads(const MoeGrads& g, const char* f) const {
    const MoeLoraGrads& l = g.lora;
    return MoeGrads{dev(g.w_router, f), dev(g.w_gate, f), dev(g.w_up, f),  dev(g.w_down, f),
                    dev(g.ws_gate, f),  dev(g.ws_up, f),  dev(g.ws_down, f),
                    MoeLoraGrads{dev(l.a_gate, f), dev(l.b_gate, f), dev(l.a_up, f), dev(l.b_up, f),
                                 dev(l.a_down, f), dev(l.b_down, f)}};
  }
  MoeWeights weights(const MoeWeights& w, const char* f) const {
    const MoeLoraWeights& l = w.lora;
    return MoeWeights{dev(w.w_router, f), dev(w.w_gate, f), dev(w.w_up, f),  dev(w.w_down, f),
                      dev(w.ws_gate, f),  dev(w.ws_up, f),  dev(w.ws_down, f),
                      MoeLoraWeights{dev(l.a_gate, f), dev(l.b_gate, f), dev(l.a_up, f), dev(l.b_up, f),
                                     dev(l.a_down, f), dev(l.b_down, f), l.stride, l.r, l.scale}};
  }

  char* base_ = nullptr;
  size_t size_ = 0;
  mutable char* next_ = nullptr;
  mutable std::shared_mutex mu_;
  mutable std::map<uintptr_t, Block> blocks_;
  mutable std::map<uintptr_t, Sparse> sparse_;  // the sparse ones among blocks_ (same keys)
  mutable size_t mapped_bytes_ = 0, mapped_peak_ = 0;
  mutable std::mutex copies_mu_;                 // the copy queue and the HostBuffers below
  mutable std::map<uintptr_t, size_t> host_blocks_;  // HostBuffers: address -> mapped bytes
  mutable std::vector<Pending> pending_;         // in ticket order
  mutable uint64_t next_ticket_ = 0;
};

}  // namespace

const Backend& cpu_fenced_backend() {
  static const FencedBackend* backend = new FencedBackend();
  return *backend;
}

}  // namespace troupe::kernels
