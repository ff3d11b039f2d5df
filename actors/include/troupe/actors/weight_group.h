// The weight group (weight_sync.transport nccl): learner 0 and the generators joined in one
// collective on their model's device, over which learner 0 broadcasts the generators' weights
// (docs/weight_sync.md). On a backend with device collectives (cuda: an NCCL communicator on the
// backend's stream) the values go device to device; on one without (cpu_fenced) the group is the
// in-process collective of kernels/local_collective.h, which needs every member in one process.
// The Weights message then carries only the version, checksums and probe (encoding device).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"

namespace troupe::actors {

class WeightGroup {
 public:
  // Learner 0: a new group's id ('N' + NCCL's unique id, or 'L' + an in-process id).
  static Result<std::vector<std::uint8_t>> make_id(const kernels::Backend& backend);
  // Joins the group `id` as `rank` of `nranks` (learner 0: rank 0). With NCCL this returns once
  // every rank has joined.
  static Result<std::unique_ptr<WeightGroup>> join(const kernels::Backend& backend, const std::vector<std::uint8_t>& id,
                                                   int nranks, int rank);
  ~WeightGroup();

  // Learner 0: `values` (host memory, the generators' dtype) up to the device and broadcast to
  // every member. Queued: it does not wait for the receivers.
  Status send(std::span<const float> values);
  // A generator: the next broadcast into `out` (host memory; its size must be the sender's).
  Status receive(std::span<float> out);
  int nranks() const { return nranks_; }

 private:
  WeightGroup(const kernels::Backend& b, std::unique_ptr<kernels::DeviceCollective> c, int nranks, int rank)
      : backend_(b), collective_(std::move(c)), nranks_(nranks), rank_(rank) {}
  Result<float*> staging(size_t n);
  const kernels::Backend& backend_;
  std::unique_ptr<kernels::DeviceCollective> collective_;
  kernels::Buffer staging_;  // the broadcast's device buffer (grown, never shrunk)
  int nranks_, rank_;
};

}  // namespace troupe::actors
