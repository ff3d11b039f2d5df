// The precision of the GEMMs (YAML policy.compute_dtype, policy.allow_tf32): fp32, or bf16 -- every
// GEMM reads its two operands rounded to bf16 (nearest, ties to even) and accumulates in fp32 into
// an fp32 output: mixed precision over fp32 master weights, activations and gradients (the
// elementwise ops, norms, softmaxes and attention stay fp32). `auto` (the YAML default) is bf16 on
// a backend with bf16 GEMMs (cuda) and fp32 elsewhere (cpu, cpu_fenced: their numbers never
// change); resolve_compute_dtype decides, and the thread setting only ever holds fp32 or bf16.
// A per-thread setting, like batch-invariant mode: the model turns it on around its ops
// (ComputeDtypeScope) and a backend's GEMM reads it on the calling thread. allow_tf32 lets a
// backend's fp32 GEMMs use TF32 tensor cores (cuda: cuBLAS TF32 math mode); the CPU ignores it.
#pragma once

#include <string_view>
#include <utility>

#include "troupe/base/enum_names.h"

namespace troupe::kernels {

enum class ComputeDtype { fp32, bf16, auto_ };

// What `auto_` means on a backend: bf16 where it has bf16 GEMMs, unless batch-invariant mode asks
// for exact fp32 GEMMs; fp32 and bf16 stay as asked.
constexpr ComputeDtype resolve_compute_dtype(ComputeDtype asked, bool backend_has_bf16, bool batch_invariant) {
  if (asked != ComputeDtype::auto_) return asked;
  return backend_has_bf16 && !batch_invariant ? ComputeDtype::bf16 : ComputeDtype::fp32;
}

// The calling thread's GEMM precision (fp32 or bf16, never auto_) and whether its fp32 GEMMs may
// use TF32 (default: fp32 without TF32).
ComputeDtype compute_dtype();
bool allow_tf32();

// Sets the calling thread's GEMM precision (auto_ counts as fp32: resolve it first) and the TF32
// switch for the scope's lifetime (then back).
class ComputeDtypeScope {
 public:
  explicit ComputeDtypeScope(ComputeDtype d, bool tf32 = false);
  ~ComputeDtypeScope();
  ComputeDtypeScope(const ComputeDtypeScope&) = delete;
  ComputeDtypeScope& operator=(const ComputeDtypeScope&) = delete;

 private:
  ComputeDtype prev_;
  bool prev_tf32_;
};

}  // namespace troupe::kernels

namespace troupe {
template <>
struct EnumNames<kernels::ComputeDtype> {
  static constexpr std::pair<std::string_view, kernels::ComputeDtype> table[] = {
      {"auto", kernels::ComputeDtype::auto_},
      {"fp32", kernels::ComputeDtype::fp32},
      {"bf16", kernels::ComputeDtype::bf16}};
};
}  // namespace troupe
