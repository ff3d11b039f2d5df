// NCCL between GPU ranks: all-reduce (sum) of the flat gradient buffer across learner ranks, the
// sharded learners' reduce-scatter and all-gather, broadcast of weights from a root (learners to GPU generators), and the all-to-all with counts of
// an expert-parallel group (nccl_moe_exchange.h). Bootstrap: rank 0 makes a
// unique id (unique_id()), the ranks exchange it out of band (the learner's MPI communicator
// broadcasts the bytes), then every rank constructs an NcclComm with it. The communicator is
// non-blocking (ncclCommInitRankConfig, blocking = 0): the join and every collective are polled
// (ncclCommGetAsyncError, the collective's completion event) against a deadline
// (TROUPE_NCCL_TIMEOUT_S, default 600 s; nccl_watch.h), and an async error or a missed deadline
// aborts the communicator (ncclCommAbort) and throws a CudaError naming the rank: a dead peer fails
// loudly instead of hanging. Without NCCL in the build, constructing one is an error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace troupe::kernels::cuda {

class NcclComm {
 public:
  static bool available();           // whether this build has NCCL
  static std::vector<uint8_t> unique_id();  // rank 0's id bytes (ncclGetUniqueId)
  // Joins the communicator of `nranks` ranks as `rank`, on the current CUDA device, within the
  // deadline (throws CudaError naming the rank otherwise).
  NcclComm(const std::vector<uint8_t>& id, int nranks, int rank);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Queued on `stream`; each returns once the collective has finished on the device (the host
  // polls its completion event and the communicator's async error until the deadline).
  void all_reduce_sum(float* buf, size_t n, cudaStream_t stream);
  void broadcast(float* buf, size_t n, int root, cudaStream_t stream);
  // Sharded learners, in place over the shards `bounds` cuts (size() + 1 ascending offsets from 0):
  // reduce_scatter_sum leaves rank r's shard the sum of every rank's (one ncclReduce to each rank
  // r of its shard, grouped: the shards may differ in length); all_gather sends each rank's shard
  // to every rank (one ncclBroadcast from each rank, grouped).
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds, cudaStream_t stream);
  void all_gather(float* buf, std::span<const size_t> bounds, cudaStream_t stream);
  // The all-to-all with counts (MPI_Alltoallv's layout, alltoallv_plan.h) of 4-byte elements
  // (float, or int32 when `ints`) between device buffers: one ncclSend and one ncclRecv per peer
  // that moves something, in one group (ncclGroupStart / ncclGroupEnd), and a device copy to itself.
  void all_to_all_v(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts, bool ints,
                    cudaStream_t stream);
  int rank() const { return rank_; }
  int size() const { return nranks_; }

 private:
  void wait(const std::string& what, cudaStream_t stream);  // the watchdog (nccl_watch.h)
  size_t check_bounds(std::span<const size_t> bounds, const char* what) const;  // throws; returns the length
  void* comm_ = nullptr;  // ncclComm_t
  cudaEvent_t done_ = nullptr;
  double timeout_s_ = 600;
  int nranks_ = 0, rank_ = 0;
  bool aborted_ = false;
};

}  // namespace troupe::kernels::cuda
