// kernels::MoeExchange (moe_expert_parallel.h) over NCCL: an expert-parallel group's all-to-alls
// between the group's GPUs, each a group of ncclSend / ncclRecv per peer (NcclComm::all_to_all_v,
// alltoallv_plan.h), queued on the exchange's stream and finished (the NCCL watchdog's wait) before
// the call returns, so what the caller reads next is complete. alltoallv moves device buffers (a
// device MoE layer's rows); alltoall_ints moves host ints (the per-expert row counts the layer plans
// its exchange with on the host), staged through a device scratch of the exchange's own. A failed
// call or a peer past TROUPE_NCCL_TIMEOUT_S comes back as a Status naming the rank.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "nccl_comm.h"
#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::kernels::cuda {

class NcclMoeExchange final : public MoeExchange {
 public:
  // comm: the group's communicator (its ranks are the group's); both must outlive the exchange.
  NcclMoeExchange(NcclComm& comm, cudaStream_t stream) : comm_(comm), stream_(stream) {}
  // The same over a communicator the exchange owns (Backend::join_expert_exchange's).
  NcclMoeExchange(std::unique_ptr<NcclComm> comm, cudaStream_t stream)
      : owned_(std::move(comm)), comm_(*owned_), stream_(stream) {}
  ~NcclMoeExchange() override;
  NcclMoeExchange(const NcclMoeExchange&) = delete;
  NcclMoeExchange& operator=(const NcclMoeExchange&) = delete;

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  Status alltoall_ints(const int32_t* send, int32_t* recv, int n) override;
  Status alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts) override;
  bool device_buffers() const override { return true; }

 private:
  std::unique_ptr<NcclComm> owned_;  // null when the caller owns the communicator
  NcclComm& comm_;
  cudaStream_t stream_;
  int32_t* scratch_ = nullptr;  // (2 size n) device ints: alltoall_ints' send half, then its receive half
  size_t scratch_bytes_ = 0;
};

}  // namespace troupe::kernels::cuda
