// The precision of the GEMMs (YAML policy.compute_dtype): fp32, or bf16 -- every GEMM reads its two
// operands rounded to bf16 (nearest, ties to even) and accumulates in fp32 into an fp32 output:
// mixed precision over fp32 master weights, activations and gradients (the elementwise ops, norms,
// softmaxes and attention stay fp32). A per-thread setting, like batch-invariant mode: the model
// turns it on around its ops (ComputeDtypeScope) and a backend's GEMM reads it on the calling
// thread. Only a backend whose supports_bf16_compute() is true runs bf16 GEMMs (cuda: cuBLAS
// GemmEx on tensor cores); the model refuses bf16 on any other.
#pragma once

#include <string_view>
#include <utility>

#include "troupe/base/enum_names.h"

namespace troupe::kernels {

enum class ComputeDtype { fp32, bf16 };

// The calling thread's GEMM precision.
ComputeDtype compute_dtype();

// Sets the calling thread's GEMM precision for the scope's lifetime (then back).
class ComputeDtypeScope {
 public:
  explicit ComputeDtypeScope(ComputeDtype d);
  ~ComputeDtypeScope();
  ComputeDtypeScope(const ComputeDtypeScope&) = delete;
  ComputeDtypeScope& operator=(const ComputeDtypeScope&) = delete;

 private:
  ComputeDtype prev_;
};

}  // namespace troupe::kernels

namespace troupe {
template <>
struct EnumNames<kernels::ComputeDtype> {
  static constexpr std::pair<std::string_view, kernels::ComputeDtype> table[] = {{"fp32", kernels::ComputeDtype::fp32},
                                                                                 {"bf16", kernels::ComputeDtype::bf16}};
};
}  // namespace troupe
