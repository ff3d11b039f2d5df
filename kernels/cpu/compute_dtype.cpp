// The per-thread GEMM precision and TF32 switch (troupe/kernels/compute_dtype.h). Invariant: the
// thread's setting is fp32 or bf16, never auto_.
#include "troupe/kernels/compute_dtype.h"

namespace troupe::kernels {

namespace {
thread_local ComputeDtype gemm_dtype = ComputeDtype::fp32;
thread_local bool gemm_tf32 = false;
}  // namespace

ComputeDtype compute_dtype() { return gemm_dtype; }
bool allow_tf32() { return gemm_tf32; }

ComputeDtypeScope::ComputeDtypeScope(ComputeDtype d, bool tf32) : prev_(gemm_dtype), prev_tf32_(gemm_tf32) {
  gemm_dtype = d == ComputeDtype::auto_ ? ComputeDtype::fp32 : d;
  gemm_tf32 = tf32;
}
ComputeDtypeScope::~ComputeDtypeScope() {
  gemm_dtype = prev_;
  gemm_tf32 = prev_tf32_;
}

}  // namespace troupe::kernels
