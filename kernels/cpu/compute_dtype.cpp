// The per-thread GEMM precision (troupe/kernels/compute_dtype.h).
#include "troupe/kernels/compute_dtype.h"

namespace troupe::kernels {

namespace {
thread_local ComputeDtype gemm_dtype = ComputeDtype::fp32;
}  // namespace

ComputeDtype compute_dtype() { return gemm_dtype; }

ComputeDtypeScope::ComputeDtypeScope(ComputeDtype d) : prev_(gemm_dtype) { gemm_dtype = d; }
ComputeDtypeScope::~ComputeDtypeScope() { gemm_dtype = prev_; }

}  // namespace troupe::kernels
