// A DeviceCollective (backend.h) among ranks that are threads of one process, on any backend: the
// ranks' buffers are moved with that backend's own copies through host memory. It stands in for
// NCCL where a backend has no device collectives of its own (cpu_fenced) and every rank lives in
// one process, so the protocol above it (weight_sync.transport nccl) runs in ordinary tests.
//   broadcast: the root's k-th call copies its buffer out and returns (as a queued NCCL call, it
//     does not wait for the receivers); a receiver's k-th call waits for the root's k-th and
//     copies it in. Sizes must agree (a mismatch throws, naming both).
//   all_reduce_sum: every rank's k-th call waits for all ranks' k-th; each then writes the sum of
//     the ranks' buffers taken in rank order (the same bits on every rank, whatever the timing).
//   reduce_scatter_sum / all_gather: the same hand-in (one sequence with all_reduce_sum); each rank
//     then writes its shard's rank-ordered sum / every rank's shard from that rank. Bounds that are
//     not ranks + 1 ascending offsets from 0 throw.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"

namespace troupe::kernels {

// A fresh id (unique in this process) that join_local_collective's ranks share.
std::vector<uint8_t> local_collective_id();

// Joins the group `id` of `nranks` ranks as `rank` (0 <= rank < nranks; each rank once). Does not
// wait for the other ranks. An id that is not local_collective_id()'s, or another nranks for the
// same id, is an error.
Result<std::unique_ptr<DeviceCollective>> join_local_collective(const Backend& backend, const std::vector<uint8_t>& id,
                                                                int nranks, int rank);

}  // namespace troupe::kernels
