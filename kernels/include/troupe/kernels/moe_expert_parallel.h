// Expert parallelism for the MoE layer (moe.h): a layer's E routed experts split over the P ranks of
// an expert-parallel group, rank p holding the contiguous block [p E/P, (p+1) E/P). Every rank
// routes its own N tokens (router, shared expert and combine as moe_forward), the grouped plan
// puts each peer's rows next to each other, and two all-to-alls carry them: the rows' inputs to the
// experts' owner and the experts' outputs back (forward); the rows' output gradients and combine
// weights to the owner and the inputs' gradients and d weights back (backward).
//
// Equality with the unsplit layer: the owner runs one expert's rows from each source rank as the
// GEMMs that rank's unsplit grouped path runs on them (the same rows in the same order), so every
// output, dinp and router gradient is the unsplit layer's on the rank's own tokens, bit for bit.
// An owned expert's weight gradient accumulates the source ranks' blocks in rank order
// (((g + d_0) + d_1) + ...), which is what summing the ranks' unsplit gradients in rank order
// gives; experts this rank does not own get no gradient here (their owner has it).
// These functions are the CPU specification; Backend::moe_ep_* (backend.h) run the layer on a
// backend's own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/moe.h"

namespace troupe::kernels {

// The all-to-all of one expert-parallel group (the learners' MPI communicator split by
// policy.moe.expert_parallel). Every rank of the group calls the same exchanges in the same order.
class MoeExchange {
 public:
  virtual ~MoeExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // n ints to every rank: send[p n .. (p+1) n) goes to rank p, recv[p n ..) comes from rank p.
  virtual Status alltoall_ints(const int32_t* send, int32_t* recv, int n) = 0;
  // send_counts[p] floats to rank p, contiguous in rank order from send; recv_counts[p] from rank p
  // land contiguous in rank order in recv.
  virtual Status alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts) = 0;
  // Whether alltoallv's buffers are a device's memory (an NCCL exchange) rather than the host's (MPI).
  // alltoall_ints moves host ints either way.
  virtual bool device_buffers() const { return false; }
};

// A backend's own part of a layer's expert-parallel state (cuda: the device buffers the forward
// keeps for the backward), made by that backend on first use.
struct MoeEpDeviceState {
  virtual ~MoeEpDeviceState() = default;
};

// What one layer's expert-parallel forward keeps for its backward on the experts' owner, and the
// exchange buffers (host vectors, grown as needed). One per MoE layer.
struct MoeEpState {
  std::vector<int32_t> recv_rows;  // (P, E/P): rows from source p for local expert i
  std::vector<float> x, g, u;      // the received rows' inputs (M, C), gate and up pre-activations (M, H)
  std::vector<float> buf, h, dg;   // exchange and expert scratch
  std::vector<float> rows;         // the source's packed rows (backward)
  std::unique_ptr<MoeEpDeviceState> device;  // Backend::moe_ep_* on a device (backend.h)
};

// The group's peers and this layer's state.
struct MoeExpertGroup {
  MoeExchange* exchange = nullptr;
  MoeEpState* state = nullptr;
  // The global id of the expert at the start of the weights' and gradients' expert blocks: 0 when
  // they hold every expert (expert e at e H C), rank E/P when they hold only this rank's block
  // (a learner whose experts are divided: expert e at (e - weights_first_expert) H C).
  int weights_first_expert = 0;
};

// moe_forward / moe_backward (same arguments, same saved and scratch sizes) with the experts
// split over the group. Always the grouped routing (cfg.grouped is ignored). cfg.E must be a
// multiple of the group's size. N may be 0: the rank still serves its experts to its peers.
Status moe_ep_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                      const MoeConfig& cfg, int N, float* scratch, const int32_t* route, const MoeExpertGroup& group);
Status moe_ep_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                       const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch,
                       const MoeExpertGroup& group);

// A rank with no tokens of its own for this pass (its peers run a micro-batch it has not): its
// experts serve the peers' rows, forward and backward, as moe_ep_forward/backward with N = 0.
Status moe_ep_serve_forward(const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group);
Status moe_ep_serve_backward(const MoeGrads& g, const MoeWeights& w, const MoeConfig& cfg, const MoeExpertGroup& group);

}  // namespace troupe::kernels
