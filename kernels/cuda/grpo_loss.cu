// The fused GRPO per-token loss kernel: one thread per sequence (bodies/grpo_loss.h), the metric
// rows added on the host in sequence order.
#include <vector>

#include "bodies/grpo_loss.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

GrpoLossSums launch_grpo_loss(const Queue& q, float* dlogp, float* dentropy, double* sums, const GrpoLossBatch& b,
                              const GrpoLossParams& p, const GrpoLossAggregation& agg) {
  if (b.S <= 0) return GrpoLossSums{};
  launch_elements(GrpoSequenceBody{dlogp, dentropy, sums, b, p, agg}, static_cast<size_t>(b.S), q.stream);
  std::vector<double> host(static_cast<size_t>(b.S) * kGrpoSums);
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host.data(), sums, sizeof(double) * host.size(), cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  return grpo_add_sums(host.data(), b.S);
}

}  // namespace troupe::kernels::cuda
