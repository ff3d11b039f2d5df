// The host planning of the expert-parallel MoE layer (moe_expert_parallel.h), shared by the CPU
// specification (cpu/moe.cpp) and the CUDA layer (cuda/bodies/moe_ep_layer.h) so both cut the
// exchanges and the experts' blocks alike: the group's checks, the per-expert row counts every
// rank sends its peers, and where each exchange's rows go.
//
// The rows a rank sends are its expert-major permuted rows (the grouped plan's segments): peer p's
// experts [p E/P, (p+1) E/P) are one contiguous run. The rows an owner receives are source-major:
// every row from rank 0 (its local experts one after the other), then rank 1's, ... so the block
// of (source s, local expert i) is contiguous, and holds the rows in the order s's unsplit
// grouped path runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::kernels {

// An exchange and a state, E split evenly over the group, and weights that hold every expert or
// start at this rank's block.
inline Status moe_ep_check_group(const MoeConfig& c, const MoeExpertGroup& grp) {
  if (!grp.exchange || !grp.state) return make_error(ErrorCode::internal, "moe_ep: no exchange or state");
  if (grp.exchange->size() < 1 || c.E % grp.exchange->size() != 0)
    return invalid_input("moe_ep: " + std::to_string(c.E) + " experts do not split over " +
                         std::to_string(grp.exchange->size()) + " ranks");
  const int block = grp.exchange->rank() * (c.E / grp.exchange->size());
  if (grp.weights_first_expert != 0 && grp.weights_first_expert != block)
    return invalid_input("moe_ep: weights starting at expert " + std::to_string(grp.weights_first_expert) +
                         " on the rank that owns experts from " + std::to_string(block));
  return {};
}

// The per-expert row counts (offsets: the grouped plan's exclusive scan, E + 1) to every rank:
// recv_rows (P, E/P) gets, for each source p, how many rows p sends this rank's local expert i.
inline Status moe_ep_exchange_counts(MoeExchange& ex, const int32_t* offsets, int E, std::vector<int32_t>& recv_rows) {
  std::vector<int32_t> sent(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) sent[static_cast<size_t>(e)] = offsets[e + 1] - offsets[e];
  recv_rows.assign(static_cast<size_t>(E), 0);
  return ex.alltoall_ints(sent.data(), recv_rows.data(), E / ex.size());
}

// Where one exchange's rows go: send_n[p] / recv_n[p] floats to / from rank p (rows of `width`
// floats), and block[s Epr + i] the first received row of source s for local expert i (block[P Epr]
// = M, the rows received in all).
struct MoeEpBlocks {
  int P = 0, Epr = 0, M = 0;
  std::vector<size_t> send_n, recv_n;
  std::vector<int32_t> block;
  int rows(int s, int i) const {
    const size_t k = static_cast<size_t>(s) * Epr + i;
    return block[k + 1] - block[k];
  }
};
inline MoeEpBlocks moe_ep_blocks(const int32_t* offsets, const std::vector<int32_t>& recv_rows, int P, int Epr,
                                 int width) {
  MoeEpBlocks b;
  b.P = P, b.Epr = Epr;
  b.send_n.resize(static_cast<size_t>(P)), b.recv_n.assign(static_cast<size_t>(P), 0);
  b.block.resize(static_cast<size_t>(P) * Epr + 1);
  int at = 0;
  for (int p = 0; p < P; ++p) {
    b.send_n[static_cast<size_t>(p)] = static_cast<size_t>(offsets[(p + 1) * Epr] - offsets[p * Epr]) * width;
    for (int i = 0; i < Epr; ++i) {
      b.block[static_cast<size_t>(p) * Epr + i] = at;
      at += recv_rows[static_cast<size_t>(p) * Epr + i];
    }
    b.recv_n[static_cast<size_t>(p)] = static_cast<size_t>(at - b.block[static_cast<size_t>(p) * Epr]) * width;
  }
  b.block.back() = at;
  b.M = at;
  return b;
}

}  // namespace troupe::kernels
