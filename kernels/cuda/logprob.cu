// The log-softmax kernel family: log-prob of the target and entropy, whole-vocabulary rows and
// the chunked LM head (bodies/logprob.h, bodies/chunked_logprob.h): never a (tokens, vocab) buffer
// beyond one chunk.
#include "bodies/chunked_logprob.h"
#include "device_exec.cuh"

namespace troupe::kernels::cuda {

void launch_logprob_forward(const Queue& q, float* logp, float* entropy, float* lse, const float* logits,
                            const int32_t* targets, float temperature, int N, int V) {
  launch_rows(LogprobForwardBody{logp, entropy, lse, logits, targets, 1.0f / temperature, V}, N, q.stream);
}
void launch_logprob_backward(const Queue& q, float* dlogits, const float* dlogp, const float* dentropy,
                             const float* logits, const float* lse, const int32_t* targets, float temperature, int N,
                             int V) {
  launch_rows(LogprobBackwardBody{dlogits, dlogp, dentropy, logits, lse, targets, 1.0f / temperature, V}, N,
              q.stream);
}
void launch_chunked_logprob_forward(const Queue& q, float* logp, float* entropy, float* lse, const float* h,
                                    const float* W, const int32_t* targets, float temperature, int N, int C, int V,
                                    int chunk, float* scratch, float* sum) {
  DeviceExec ex{q};
  chunked_logprob_forward_on(ex, logp, entropy, lse, h, W, targets, temperature, N, C, V, chunk, scratch, sum);
}
void launch_chunked_logprob_backward(const Queue& q, float* dh, float* dW, const float* dlogp, const float* dentropy,
                                     const float* h, const float* W, const float* lse, const float* entropy,
                                     const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                     float* scratch) {
  DeviceExec ex{q};
  chunked_logprob_backward_on(ex, dh, dW, dlogp, dentropy, h, W, lse, entropy, targets, temperature, N, C, V, chunk,
                              scratch);
}

}  // namespace troupe::kernels::cuda
