// The per-peer transfers of one all-to-all with counts (MPI_Alltoallv's layout) as point-to-point
// calls: what NcclComm::all_to_all_v queues between ncclGroupStart and ncclGroupEnd (an ncclSend and
// an ncclRecv per peer), and the copy a rank makes to itself. Plain C++ (no CUDA), so the host
// tests check the counts and offsets without a GPU.
//   send_counts[p]: elements this rank sends rank p, contiguous in rank order from the send buffer
//   recv_counts[p]: elements it receives from rank p, contiguous in rank order in the receive buffer
// A peer with nothing either way gets no transfer (both sides skip the pair: the counts of a pair
// agree, this rank's send_counts[p] being p's recv_counts[rank]). The self transfer must send what
// it receives.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

struct PeerTransfer {
  int peer = 0;
  size_t send_offset = 0, send_count = 0;  // elements from the send buffer to `peer`
  size_t recv_offset = 0, recv_count = 0;  // elements from `peer` into the receive buffer
};

inline Result<std::vector<PeerTransfer>> alltoallv_plan(const size_t* send_counts, const size_t* recv_counts,
                                                        int nranks, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return invalid_input("all-to-all: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  const auto me = static_cast<size_t>(rank);
  if (send_counts[me] != recv_counts[me])
    return invalid_input("all-to-all: rank " + std::to_string(rank) + " sends itself " + std::to_string(send_counts[me]) +
                         " elements but expects " + std::to_string(recv_counts[me]));
  std::vector<PeerTransfer> plan;
  size_t send_at = 0, recv_at = 0;
  for (int p = 0; p < nranks; ++p) {
    const auto q = static_cast<size_t>(p);
    if (send_counts[q] > 0 || recv_counts[q] > 0)
      plan.push_back({p, send_at, send_counts[q], recv_at, recv_counts[q]});
    send_at += send_counts[q];
    recv_at += recv_counts[q];
  }
  return plan;
}

}  // namespace troupe::kernels::cuda
