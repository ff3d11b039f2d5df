// The embedding kernel family: token lookup and its deterministic scatter-add backward
// (bodies/embedding.h).
#include "bodies/embedding.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_embedding_forward(const Queue& q, float* out, const int32_t* tokens, const float* wte, int N, int C) {
  launch_elements(EmbeddingForwardBody{out, tokens, wte, C}, static_cast<size_t>(N) * C, q.stream);
}
void launch_embedding_backward(const Queue& q, float* dwte, const float* dout, const int32_t* tokens, int N, int C) {
  launch_elements(EmbeddingBackwardBody{dwte, dout, tokens, N, C}, static_cast<size_t>(C), q.stream);
}

}  // namespace troupe::kernels::cuda
