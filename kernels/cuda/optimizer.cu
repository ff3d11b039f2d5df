// The device optimizer's launchers (bodies/adamw.h): the global gradient norm and clipping
// coefficient, then the fused multi-tensor AdamW step, all on the queue's stream with no host
// wait, so gradients stay on the GPU. One block per chunk of the tensor table.
#include "bodies/adamw.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_grad_norm(const Queue& q, const AdamWTensor* tensors, const AdamWChunk* chunks, int n_chunks,
                      double* partial, double max_norm, double* norm, float* scale) {
  launch_rows(GradSumSqBody{tensors, chunks, partial}, n_chunks, q.stream);
  launch_rows(ClipBody{partial, n_chunks, max_norm, norm, scale}, 1, q.stream);
}

void launch_adamw(const Queue& q, const AdamWTensor* tensors, const AdamWChunk* chunks, int n_chunks,
                  const AdamWCoefficients& k, const float* scale) {
  launch_rows(AdamWBody{tensors, chunks, k, scale}, n_chunks, q.stream);
}

}  // namespace troupe::kernels::cuda
