// Data-parallel collectives of the learner ranks behind one small interface, so NCCL can slot in
// beside MPI. Every rank calls the same collectives in the same order; buffers are reduced in place.
// LocalCommunicator (one rank) makes every call a no-op, so single-process training needs no MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"

namespace troupe::learner {

// A collective started by Communicator::start_*: it runs while the caller computes; wait() returns
// once it is complete (its buffer then holds the blocking call's result, bit for bit). Until then the
// buffer must not be read or written. Destroying an unfinished one waits for it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual Status wait() = 0;
  // Lets the library move the transfer on (MPI progresses non-blocking collectives only inside MPI
  // calls); true once complete. Never blocks.
  virtual Result<bool> test() = 0;
};

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

  // Sharded learners (learner.shard). `bounds` (size() + 1 ascending offsets from 0 to buf.size(),
  // the same on every rank) cuts buf into one contiguous shard per rank.
  // reduce_scatter_sum: this rank's shard [bounds[r], bounds[r+1]) becomes the element-wise sum of
  // every rank's, added in rank order ((b0 + b1) + b2) + ... whatever the library's algorithm; the
  // rest of buf is left unspecified. ordered_allreduce_sum: every shard so (reduce-scatter, then
  // all_gather), so it equals reduce_scatter_sum's values bit for bit.
  virtual Status reduce_scatter_sum(std::span<float> buf, std::span<const size_t> bounds);
  Status ordered_allreduce_sum(std::span<float> buf, std::span<const size_t> bounds);
  // Every rank's shard of buf from that rank, in place.
  virtual Status all_gather(std::span<float> buf, std::span<const size_t> bounds);
  // The same two, started without waiting (non-blocking MPI): every rank starts the same collectives
  // in the same order; several may be in flight at once, on disjoint buffers. The defaults run the
  // blocking call and return a finished handle.
  virtual Result<std::unique_ptr<PendingCollective>> start_all_gather(std::span<float> buf,
                                                                      std::span<const size_t> bounds);
  virtual Result<std::unique_ptr<PendingCollective>> start_reduce_scatter_sum(std::span<float> buf,
                                                                              std::span<const size_t> bounds);
  // Every rank's shard of buf to rank `root` only (the other ranks' buf is left as it was).
  virtual Status gather(std::span<float> buf, std::span<const size_t> bounds, int root);
  // A sum carried through the ranks in order: rank 0 runs step(0), rank r step(what rank r-1's
  // returned); every rank gets the last rank's value. A sequential sum over a buffer split in
  // rank-ordered shards, each rank adding its own, equals the sum over the whole buffer bit for bit.
  virtual Result<double> chain(const std::function<double(double)>& step);

  // Expert parallelism (policy.moe.expert_parallel). split: the ranks that pass the same `color`
  // as a communicator of their own, ranked by `key` (every rank calls it). alltoallv:
  // send_counts[p] floats to rank p, contiguous in rank order from send; recv_counts[p] floats from
  // rank p, contiguous in rank order in recv. alltoall_ints: n ints to and from every rank. The
  // defaults serve one rank (a copy).
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key);
  virtual Status alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts);
  virtual Status alltoall_ints(const int32_t* send, int32_t* recv, int n);
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status allreduce_sum(std::span<float>) override { return {}; }
  Status allreduce_sum(std::span<double>) override { return {}; }
  Status barrier() override { return {}; }
  Status broadcast(std::span<float>, int) override { return {}; }
  Status reduce_scatter_sum(std::span<float>, std::span<const size_t>) override { return {}; }
  Status all_gather(std::span<float>, std::span<const size_t>) override { return {}; }
  Result<double> chain(const std::function<double(double)>& step) override { return step(0.0); }
};

// Cuts n values into `ranks` contiguous shards (size ranks + 1 offsets; shards of equal length,
// multiples of 16 values, the last one shorter).
std::vector<size_t> shard_bounds(size_t n, int ranks);

// Rank 0's Backend::collective_id(), broadcast over comm: every rank gets the same bytes (empty
// where the backend has no device collectives: cpu, cpu_fenced). A collective of comm. The
// bootstrap of every device collective of the learners (below; expert_parallel.h's exchange).
// A rank 0 that fails to make it fails there, and every other rank gets an error naming rank 0
// (no rank waits for an id that never comes).
Result<std::vector<uint8_t>> broadcast_collective_id(const kernels::Backend& backend, Communicator& comm);
// Its broadcast: `made` is rank 0's id or error (the other ranks' `made` is not read).
Result<std::vector<uint8_t>> share_collective_id(const Result<std::vector<uint8_t>>& made, Communicator& comm);

// The learner ranks' collective on their model's device (NCCL on cuda): rank 0 makes the id
// (Backend::collective_id), comm broadcasts it (broadcast_collective_id), every rank joins. Null (no error) with one rank or
// a backend without device collectives (cpu): the trainer then all-reduces over comm on the host.
// Every rank must call it, with the same backend.
Result<std::unique_ptr<kernels::DeviceCollective>> join_device_collective(const kernels::Backend& backend,
                                                                          Communicator& comm);

// A DeviceCollective over comm for a backend without collectives of its own (cpu_fenced): each call
// copies the device buffer (or this rank's shard of it) down, runs comm's collective on the host
// copy (the same sums in the same order as on a host buffer) and copies the result up. A failure
// throws (std::runtime_error with comm's message). comm must outlive it.
std::unique_ptr<kernels::DeviceCollective> staged_device_collective(const kernels::Backend& backend, Communicator& comm);

// MPI over a duplicate of *mpi_comm (a pointer to an MPI_Comm, void* so this header needs no mpi.h;
// nullptr = MPI_COMM_WORLD). MPI must be initialised. Errors are returned, never aborted on.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(void* mpi_comm = nullptr);

}  // namespace troupe::learner
