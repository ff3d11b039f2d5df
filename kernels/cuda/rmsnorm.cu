// The RMSNorm kernel family: forward and input gradient one block per row, weight gradient one
// thread per channel (bodies/rmsnorm.h).
#include "bodies/rmsnorm.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_rmsnorm_forward(const Queue& q, float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps) {
  launch_rows(RmsnormForwardBody{out, rstd, inp, weight, C, eps}, N, q.stream);
}
void launch_rmsnorm_backward(const Queue& q, float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C) {
  launch_rows(RmsnormBackwardBody{dinp, dout, inp, weight, rstd, C}, N, q.stream);
  if (dweight) launch_elements(RmsnormDweightBody{dweight, dout, inp, rstd, N, C}, static_cast<size_t>(C), q.stream);
}

}  // namespace troupe::kernels::cuda
