// The attention kernel family: FlashAttention-2 forward and backward (dK/dV, then dQ) over tiles in
// dynamic shared memory, split-K decode against the KV cache with its combine kernel, and the cache
// write (bodies/flash_attention.h, bodies/attention.h). Every launch asks for the shared memory
// its tile needs (at most kFlashMaxSharedBytes, which sm_80 and sm_90 allow).
#include "bodies/attention.h"
#include "bodies/flash_attention.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {
namespace {

template <class Body>
__global__ void flash_kernel(Body body, int blocks) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceLanes lanes(smem);
  for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
    body.block(lanes, b, smem);
    __syncthreads();
  }
}

template <class Body>
void launch_blocks(const Body& body, size_t shared_floats, cudaStream_t stream) {
  const int blocks = body.blocks();
  if (blocks <= 0) return;
  const int bytes = static_cast<int>(shared_floats * sizeof(float));
  TROUPE_CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<Body>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 16 ? blocks : 65536 * 16);
  flash_kernel<<<grid, kFlashThreads, static_cast<size_t>(bytes), stream>>>(body, blocks);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_attention_forward(const Queue& q, float* out, float* lse, const float* qv, const float* k, const float* v,
                              const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD) {
  const FlashShape sh{cu_seqlens, S, N, NH, NKV, HD, flash_tile(HD)};
  launch_blocks(FlashForwardBody{out, lse, qv, k, v, sh}, flash_forward_floats(sh.tile, HD), q.stream);
}
void launch_attention_backward(const Queue& q, float* dq, float* dk, float* dv, const float* dout, const float* qv,
                               const float* k, const float* v, const float* out, const float* lse,
                               const int32_t* cu_seqlens, int S, int N, int NH, int NKV, int HD) {
  const FlashShape sh{cu_seqlens, S, N, NH, NKV, HD, flash_tile(HD)};
  const AttnGrads in{dout, qv, k, v, out, lse};
  const size_t floats = flash_backward_floats(sh.tile, HD);
  launch_blocks(FlashBackwardDkDvBody{dk, dv, in, sh}, floats, q.stream);
  launch_blocks(FlashBackwardDqBody{dq, in, sh}, floats, q.stream);
}
// Split-K (kDecodeSplit keys per split) into q.decode's partials, then the combine; without a
// workspace (a Queue built by hand) the one-thread-per-(sequence, head) body of attention.h.
void launch_attention_decode(const Queue& q, float* out, const float* qv, const float* k_cache, const float* v_cache,
                             const int32_t* kv_len, const int32_t* slot, int B, int cache_len, int NH, int NKV,
                             int HD) {
  if (!q.decode) {
    launch_elements(AttnDecodeBody{out, qv, k_cache, v_cache, kv_len, slot, cache_len, NH, NKV, HD},
                    static_cast<size_t>(B) * NH, q.stream);
    return;
  }
  const int splits = cache_len > kDecodeSplit ? (cache_len + kDecodeSplit - 1) / kDecodeSplit : 1;
  const size_t parts = static_cast<size_t>(B) * NH * splits;
  if (parts == 0 || HD <= 0) return;
  TROUPE_DEVICE_GROW(q.decode->data, q.decode->bytes, parts * (HD + 2) * sizeof(float), q.stream);
  float* base = static_cast<float*>(q.decode->data);
  const DecodePartials part{base, base + parts * HD, base + parts * (HD + 1)};
  launch_elements(DecodeSplitBody{part, qv, k_cache, v_cache, kv_len, slot, cache_len, NH, NKV, HD, kDecodeSplit,
                                  splits},
                  parts, q.stream);
  launch_elements(DecodeCombineBody{out, part, HD, splits}, static_cast<size_t>(B) * NH * HD, q.stream);
}
void launch_kv_cache_write(const Queue& q, float* k_cache, float* v_cache, const float* k, const float* v,
                           const int32_t* slot, const int32_t* pos, int T, int cache_len, int KD) {
  launch_elements(KvWriteBody{k_cache, v_cache, k, v, slot, pos, cache_len, KD}, static_cast<size_t>(T) * KD,
                  q.stream);
}

}  // namespace troupe::kernels::cuda
