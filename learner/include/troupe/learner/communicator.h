// Data-parallel collectives of the learner ranks behind one small interface, so NCCL can slot in
// beside MPI. Every rank calls the same collectives in the same order; buffers are reduced in place.
// LocalCommunicator (one rank) makes every call a no-op, so single-process training needs no MPI.
#pragma once

#include <memory>
#include <span>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"

namespace troupe::learner {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise sum over ranks, in place.
  virtual Status allreduce_sum(std::span<float> buf) = 0;
  virtual Status allreduce_sum(std::span<double> buf) = 0;
  virtual Status barrier() = 0;
  // Rank `root`'s bytes to every rank (for checkpoints, RNG seeds).
  virtual Status broadcast(std::span<float> buf, int root) = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status allreduce_sum(std::span<float>) override { return {}; }
  Status allreduce_sum(std::span<double>) override { return {}; }
  Status barrier() override { return {}; }
  Status broadcast(std::span<float>, int) override { return {}; }
};

// The learner ranks' collective on their model's device (NCCL on cuda): rank 0 makes the id
// (Backend::collective_id), comm broadcasts it, every rank joins. Null (no error) with one rank or
// a backend without device collectives (cpu): the trainer then all-reduces over comm on the host.
// Every rank must call it, with the same backend.
Result<std::unique_ptr<kernels::DeviceCollective>> join_device_collective(const kernels::Backend& backend,
                                                                          Communicator& comm);

// MPI over a duplicate of *mpi_comm (a pointer to an MPI_Comm, void* so this header needs no mpi.h;
// nullptr = MPI_COMM_WORLD). MPI must be initialised. Errors are returned, never aborted on.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(void* mpi_comm = nullptr);

}  // namespace troupe::learner
