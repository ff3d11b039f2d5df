// The MoE routing kernel family: router softmax/top-k, the expert histogram, exclusive scan and
// stable sort by expert through CUB, permute / unpermute+combine and the experts' per-row backward
// pieces (bodies/moe.h), run in the layer's launch sequence (bodies/moe_layer.h) with one cuBLAS
// GEMM per expert segment.
#include <cub/device/device_histogram.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "bodies/moe_layer.h"
#include "device_exec.cuh"

namespace troupe::kernels::cuda {
namespace {

// tmp: keys_out (NK), iota (NK), counts (E+1) ints, then CUB's temporary storage.
struct PlanTmp {
  size_t keys_out, iota, counts, cub, total;
};
int bits_for(int E) {
  int b = 1;
  while ((1 << b) < E) ++b;
  return b;
}
size_t cub_bytes(int NK, int E) {
  size_t hist = 0, scan = 0, sort = 0;
  TROUPE_CUDA_CHECK(cub::DeviceHistogram::HistogramEven(nullptr, hist, static_cast<const int32_t*>(nullptr),
                                                        static_cast<int32_t*>(nullptr), E + 1, 0, E, NK));
  TROUPE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), E + 1));
  TROUPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const int32_t*>(nullptr),
                                                    static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                    static_cast<int32_t*>(nullptr), NK, 0, bits_for(E)));
  return std::max(hist, std::max(scan, sort));
}
PlanTmp plan_tmp(int NK, int E) {
  PlanTmp t{};
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  t.keys_out = 0;
  t.iota = round(sizeof(int32_t) * NK);
  t.counts = t.iota + round(sizeof(int32_t) * NK);
  t.cub = t.counts + round(sizeof(int32_t) * (E + 1));
  t.total = t.cub + round(cub_bytes(NK, E));
  return t;
}

}  // namespace

size_t moe_plan_tmp_bytes(int NK, int E) { return plan_tmp(NK, E).total; }

void moe_route_plan_device(const Queue& q, int32_t* offsets, int32_t* row_slot, const int32_t* experts, int NK, int E,
                           void* tmp, size_t tmp_bytes) {
  const PlanTmp t = plan_tmp(NK, E);
  if (tmp_bytes < t.total) throw CudaError("moe route plan: scratch of " + std::to_string(tmp_bytes) +
                                           " bytes, needs " + std::to_string(t.total));
  char* base = static_cast<char*>(tmp);
  int32_t* keys_out = reinterpret_cast<int32_t*>(base + t.keys_out);
  int32_t* iota = reinterpret_cast<int32_t*>(base + t.iota);
  int32_t* counts = reinterpret_cast<int32_t*>(base + t.counts);
  void* cub_tmp = base + t.cub;
  size_t cub_size = t.total - t.cub;
  TROUPE_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (E + 1), q.stream));
  TROUPE_CUDA_CHECK(cub::DeviceHistogram::HistogramEven(cub_tmp, cub_size, experts, counts, E + 1, 0, E, NK, q.stream));
  cub_size = t.total - t.cub;
  TROUPE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(cub_tmp, cub_size, counts, offsets, E + 1, q.stream));
  launch_elements(IotaBody{iota}, static_cast<size_t>(NK), q.stream);
  cub_size = t.total - t.cub;
  TROUPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_size, experts, keys_out, iota, row_slot, NK, 0,
                                                    bits_for(E), q.stream));
}

size_t moe_device_saved_floats(const MoeConfig& cfg, int N) { return moe_saved_layout(cfg, N).total; }
size_t moe_device_scratch_floats(const MoeConfig& cfg, int N) {
  return moe_scratch_layout(cfg, N, moe_plan_tmp_bytes(N * cfg.K, cfg.E)).total;
}

void launch_moe_forward(const Queue& q, float* out, float* saved, MoeStats* host_stats, const float* inp,
                        const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch) {
  DeviceExec ex{q};
  moe_layer_forward(ex, out, saved, host_stats, inp, w, cfg, N, scratch);
}

void copy_moe_experts_to_host(const Queue& q, int32_t* host_experts, const float* saved, const MoeConfig& cfg,
                              int N) {
  if (N <= 0 || cfg.K <= 0) return;
  const int32_t* experts = reinterpret_cast<const int32_t*>(saved + moe_saved_layout(cfg, N).experts);
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host_experts, experts, sizeof(int32_t) * static_cast<size_t>(N) * cfg.K,
                                    cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
}

void launch_moe_backward(const Queue& q, float* dinp, const MoeGrads& g, const float* dout, float daux,
                         const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                         float* scratch) {
  DeviceExec ex{q};
  moe_layer_backward(ex, dinp, g, dout, daux, inp, saved, w, cfg, N, scratch);
}

void launch_moe_round_trip(const Queue& q, float* out, float* back, int32_t* offsets, int32_t* row_slot,
                           int32_t* slot_row, const int32_t* experts, const float* weights, const float* inp, int N,
                           int K, int E, int C, float* xp, void* plan_tmp_buf) {
  DeviceExec ex{q};
  moe_dispatch_round_trip(ex, out, back, offsets, row_slot, slot_row, experts, weights, inp, N, K, E, C, xp,
                          plan_tmp_buf);
}

}  // namespace troupe::kernels::cuda
