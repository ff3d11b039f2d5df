// Batch-invariant mode of the CPU ops (policy.batch_invariant): while a thread has it on, every op
// the model's forward uses gives each row (token) bits that depend only on that row's inputs,
// never on how many or which other rows share the call, nor on whether the row is a KV-cache
// decode step or part of a packed training forward:
//   - matmul_forward (every C = A B^T GEMM of gemm_blocked, MoE experts and router included) runs
//     one fixed per-element chain for any M (small_gemm.h; no M-dependent kernel choice);
//   - attention_forward runs, for each query row, the exact loop attention_decode_forward runs
//     over its keys (same score chain, same online softmax in key order);
//   - the row-wise ops (norms, RoPE, SwiGLU, log-softmax, MoE routing and combine) already are.
// Backward ops are unchanged (they only need to be the gradient of the forward). The mode is a
// per-thread setting read by each op on its calling thread; ops that fan out to OpenMP threads
// carry it with them.
#pragma once

namespace troupe::kernels {

// Whether batch-invariant mode is on for the calling thread.
bool batch_invariant();

// Turns the calling thread's mode to `on` for the scope's lifetime (then back).
class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(bool on);
  ~BatchInvariantScope();
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  bool prev_;
};

}  // namespace troupe::kernels
