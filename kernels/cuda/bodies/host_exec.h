// The executor of the shared launch sequences (moe_layer.h, moe_ep_layer.h, chunked_logprob.h)
// on the host, for the tests that run them against the CPU ops: host GEMMs (ops.h gemm_blocked,
// the CPU layer's), host_grid.h's element and row runners, the expert counting sort CUB does on
// the device (histogram, exclusive scan, stable scatter), and host memory for the buffers the
// expert-parallel layer keeps. Plain C++: never compiled by nvcc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm_args.h"
#include "moe_ep_buffers.h"
#include "host_grid.h"
#include "troupe/kernels/ops.h"

namespace troupe::kernels::cuda {

struct HostExec {
  int lanes = 5;
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
    gemm_blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  // In reverse order: a phase's GEMMs must not depend on each other's order.
  void gemm_batch(const std::vector<RowMajorGemm>& calls) {
    for (auto it = calls.rbegin(); it != calls.rend(); ++it)
      gemm(it->trans_a, it->trans_b, it->M, it->N, it->K, it->alpha, it->A, it->lda, it->B, it->ldb, it->beta, it->C,
           it->ldc);
  }
  template <class Body>
  void each(const Body& b, size_t n) { host_for_each(b, n); }
  template <class Body>
  void rows(const Body& b, int n) { host_for_rows(b, n, lanes); }
  void zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  size_t plan_tmp_bytes(int, int E) { return sizeof(int32_t) * static_cast<size_t>(E); }
  void route_plan(int32_t* offsets, int32_t* row_slot, const int32_t* experts, int NK, int E, void* tmp, size_t) {
    int32_t* counts = static_cast<int32_t*>(tmp);
    std::fill(counts, counts + E, 0);
    for (int s = 0; s < NK; ++s) counts[experts[s]]++;
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
    for (int e = 0; e < E; ++e) counts[e] = offsets[e];
    for (int s = 0; s < NK; ++s) row_slot[counts[experts[s]]++] = s;
  }
  // The expert-parallel layer's kept buffers: host memory, zero-filled, contents not kept on growth.
  static constexpr bool device_memory = false;
  void grow(void*& data, size_t& bytes, size_t need) {
    std::free(data);
    data = std::calloc(need, 1);
    bytes = data ? need : 0;
  }
  static void release(void* data) { std::free(data); }
  MoeEpScratch& ep_scratch() {
    ep.release = &release;
    return ep;
  }
  MoeEpScratch ep;
};

}  // namespace troupe::kernels::cuda
