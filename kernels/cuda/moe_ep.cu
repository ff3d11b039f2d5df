// The expert-parallel MoE layer on the device: bodies/moe_ep_layer.h's launch sequence with
// DeviceExec (cuBLAS, the generic kernels, CUB's route plan), its rows moved by the group's NCCL
// exchange on the same stream. Each launcher turns a thrown CudaError (a failing CUDA or cuBLAS
// call, a device buffer that could not grow) into a Status naming the rank; the exchange's own
// failures already come back as Statuses naming it (nccl_moe_exchange.h).
#include <string>

#include "bodies/moe_ep_layer.h"
#include "device_exec.cuh"

namespace troupe::kernels::cuda {
namespace {

template <class Fn>
Status on_rank(const MoeExpertGroup& group, Fn fn) {
  try {
    return fn();
  } catch (const CudaError& e) {
    const std::string who = group.exchange ? "rank " + std::to_string(group.exchange->rank()) + " of " +
                                                 std::to_string(group.exchange->size())
                                           : std::string("a rank without an exchange");
    return make_error(ErrorCode::internal, "cuda backend: the expert-parallel MoE layer on " + who + ": " + e.what());
  }
}

}  // namespace

Status launch_moe_ep_forward(const Queue& q, float* out, float* saved, MoeStats* host_stats, const float* inp,
                             const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch, const int32_t* route,
                             const MoeExpertGroup& group) {
  return on_rank(group, [&] {
    DeviceExec ex{q};
    return moe_layer_ep_forward(ex, out, saved, host_stats, inp, w, cfg, N, scratch, route, group);
  });
}

Status launch_moe_ep_backward(const Queue& q, float* dinp, const MoeGrads& g, const float* dout, float daux,
                              const float* inp, const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N,
                              float* scratch, const MoeExpertGroup& group) {
  return on_rank(group, [&] {
    DeviceExec ex{q};
    return moe_layer_ep_backward(ex, dinp, g, dout, daux, inp, saved, w, cfg, N, scratch, group);
  });
}

Status launch_moe_ep_serve_forward(const Queue& q, const MoeWeights& w, const MoeConfig& cfg,
                                   const MoeExpertGroup& group) {
  return on_rank(group, [&] {
    DeviceExec ex{q};
    return moe_layer_ep_serve_forward(ex, w, cfg, group);
  });
}

Status launch_moe_ep_serve_backward(const Queue& q, const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg,
                                    const MoeExpertGroup& group) {
  return on_rank(group, [&] {
    DeviceExec ex{q};
    return moe_layer_ep_serve_backward(ex, g, w, cfg, group);
  });
}

}  // namespace troupe::kernels::cuda
