// The executor the shared launch sequences (bodies/moe_layer.h, bodies/moe_ep_layer.h,
// bodies/chunked_logprob.h) run on the device with: cuBLAS GEMMs, the generic element/row kernels,
// CUB's expert route plan, and device buffers the expert-parallel layer keeps (grow, release).
#pragma once

#include <memory>

#include "bodies/moe_ep_buffers.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

// Expert histogram, exclusive scan and stable sort of the slots by expert (CUB), moe_route.cu.
void moe_route_plan_device(const Queue& q, int32_t* offsets, int32_t* row_slot, const int32_t* experts, int NK, int E,
                           void* tmp, size_t tmp_bytes);

struct DeviceExec {
  explicit DeviceExec(const Queue& queue) : q(queue) {}
  const Queue& q;
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    cuda::gemm(q, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_batch(const std::vector<RowMajorGemm>& calls) { cuda::gemm_batch(q, calls); }
  template <class Body>
  void each(const Body& b, size_t n) { launch_elements(b, n, q.stream); }
  template <class Body>
  void rows(const Body& b, int n) { launch_rows(b, n, q.stream); }
  void zero(void* p, size_t bytes) {
    if (bytes) TROUPE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, q.stream));
  }
  void to_host(void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, q.stream));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  }
  // The expert-parallel layer's buffers: device memory (its exchange must move device buffers);
  // grown after the queue drains (the old block may still be read), zero-filled.
  static constexpr bool device_memory = true;
  void grow(void*& data, size_t& bytes, size_t need) { TROUPE_DEVICE_GROW(data, bytes, need, q.stream); }
  static void release(void* data) { TROUPE_CUDA_REPORT(cudaFree(data)); }
  // The owner's scratch: the queue's (shared by the layers), else one of this call's own.
  MoeEpScratch& ep_scratch() {
    if (q.moe_ep) return *q.moe_ep;
    if (!own_ep) own_ep = std::make_unique<MoeEpScratch>();
    own_ep->release = &release;
    return *own_ep;
  }
  std::unique_ptr<MoeEpScratch> own_ep;
  size_t plan_tmp_bytes(int NK, int E) { return moe_plan_tmp_bytes(NK, E); }
  void route_plan(int32_t* offsets, int32_t* row_slot, const int32_t* experts, int NK, int E, void* tmp,
                  size_t tmp_bytes) {
    moe_route_plan_device(q, offsets, row_slot, experts, NK, E, tmp, tmp_bytes);
  }
};

}  // namespace troupe::kernels::cuda
