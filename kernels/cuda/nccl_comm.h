// NCCL between GPU ranks: all-reduce (sum) of the flat gradient buffer across learner ranks and
// broadcast of weights from a root (learners to GPU generators). Bootstrap: rank 0 makes a
// unique id (unique_id()), the ranks exchange it out of band (the learner's MPI communicator
// broadcasts the bytes), then every rank constructs an NcclComm with it. Calls are checked
// (TROUPE_NCCL_CHECK) and queued on the given stream. Without NCCL in the build, constructing one
// is an error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::kernels::cuda {

class NcclComm {
 public:
  static bool available();           // whether this build has NCCL
  static std::vector<uint8_t> unique_id();  // rank 0's id bytes (ncclGetUniqueId)
  // Joins the communicator of `nranks` ranks as `rank`, on the current CUDA device.
  NcclComm(const std::vector<uint8_t>& id, int nranks, int rank);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  void all_reduce_sum(float* buf, size_t n, cudaStream_t stream);
  void broadcast(float* buf, size_t n, int root, cudaStream_t stream);
  int rank() const { return rank_; }
  int size() const { return nranks_; }

 private:
  void* comm_ = nullptr;  // ncclComm_t
  int nranks_ = 0, rank_ = 0;
};

}  // namespace troupe::kernels::cuda
