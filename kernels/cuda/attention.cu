// The attention kernel family: causal GQA over packed sequences (forward, dq, dk/dv), one-token
// decode against the KV cache and the cache write (bodies/attention.h).
#include "bodies/attention.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_attention_forward(const Queue& q, float* out, float* lse, const float* qv, const float* k, const float* v,
                              const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD) {
  const AttnShape sh{cu_seqlens, S, NH, NKV, HD};
  launch_elements(AttnForwardBody{out, lse, qv, k, v, sh}, static_cast<size_t>(N) * NH, q.stream);
}
void launch_attention_backward(const Queue& q, float* dq, float* dk, float* dv, const float* dout, const float* qv,
                               const float* k, const float* v, const float* out, const float* lse,
                               const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD) {
  const AttnShape sh{cu_seqlens, S, NH, NKV, HD};
  const AttnGrads in{dout, qv, k, v, out, lse};
  launch_elements(AttnBackwardDqBody{dq, in, sh}, static_cast<size_t>(N) * NH, q.stream);
  launch_elements(AttnBackwardDkDvBody{dk, dv, in, sh}, static_cast<size_t>(N) * NKV, q.stream);
}
void launch_attention_decode(const Queue& q, float* out, const float* qv, const float* k_cache, const float* v_cache,
                             const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH, int NKV,
                             int HD) {
  launch_elements(AttnDecodeBody{out, qv, k_cache, v_cache, kv_len, slot, cache_len, NH, NKV, HD},
                  static_cast<size_t>(B) * NH, q.stream);
}
void launch_kv_cache_write(const Queue& q, float* k_cache, float* v_cache, const float* k, const float* v,
                           const int32_t* slot, const int32_t* pos, int T, int cache_len, int KD) {
  launch_elements(KvWriteBody{k_cache, v_cache, k, v, slot, pos, cache_len, KD}, static_cast<size_t>(T) * KD,
                  q.stream);
}

}  // namespace troupe::kernels::cuda
