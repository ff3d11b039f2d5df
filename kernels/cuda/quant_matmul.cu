// The quant kernel family: y = x W^T and dx += dy W with W in ggml blocks, dequantized on the fly,
// one block per output element (bodies/quant_matmul.h). Correct, not fast: no shared-memory tiles.
#include "bodies/quant_matmul.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_quant_matmul_forward(const Queue& q, float* y, const float* x, const QuantWeights& W, int T) {
  if (T <= 0 || W.rows <= 0) return;
  launch_rows(QuantMatmulForwardBody{y, x, static_cast<const uint8_t*>(W.data), W.row_bytes(), W.format, W.rows, W.cols},
              T * W.rows, q.stream);
}
void launch_quant_matmul_backward_input(const Queue& q, float* dx, const float* dy, const QuantWeights& W, int T) {
  if (T <= 0 || W.cols <= 0) return;
  launch_rows(QuantMatmulBackwardInputBody{dx, dy, static_cast<const uint8_t*>(W.data), W.row_bytes(), W.format, W.rows,
                                           W.cols},
              T * W.cols, q.stream);
}

}  // namespace troupe::kernels::cuda
