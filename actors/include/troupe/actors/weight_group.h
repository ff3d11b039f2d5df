// The weight group (weight_sync.transport nccl): learner 0 and the generators joined in one
// collective on their model's device, over which learner 0 broadcasts the generators' weights
// (docs/weight_sync.md). On a backend with device collectives (cuda: an NCCL communicator on the
// backend's stream) the values go device to device; on one without (cpu_fenced) the group is the
// in-process collective of kernels/local_collective.h, which needs every member in one process.
// The Weights message then carries only the version, checksums and probe (encoding device).
// Invariant: the broadcast is staged in the generators' dtype (bf16: 2-byte words, half the bytes
// of fp32 on the device and on the wire), and what a receiver gets is the sent values bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "troupe/actors/weight_dtype.h"
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

  // Learner 0: `values` (host memory, already in the generators' dtype: bf16 values are fp32
  // floats whose low 16 bits are zero, round_to_dtype's) up to the device in `dtype` (bf16: the
  // top 16 bits of each) and broadcast to every member. Queued: it does not wait for the receivers.
  Status send(std::span<const float> values, WeightDtype dtype);
  // A generator: the next broadcast into `out` (host memory; its size and dtype must be the
  // sender's), widened back to fp32.
  Status receive(std::span<float> out, WeightDtype dtype);
  int nranks() const { return nranks_; }
  // The device bytes a broadcast of n values in dtype stages (fp32: 4 n; bf16: 2 n, rounded up to
  // whole floats: the collective moves floats), and what this member's staging buffer holds now.
  static size_t staged_bytes(size_t n, WeightDtype dtype);
  size_t staging_bytes() const { return staging_.bytes(); }

 private:
  WeightGroup(const kernels::Backend& b, std::unique_ptr<kernels::DeviceCollective> c, int nranks, int rank)
      : backend_(b), collective_(std::move(c)), nranks_(nranks), rank_(rank) {}
  Result<float*> staging(size_t floats);
  const kernels::Backend& backend_;
  std::unique_ptr<kernels::DeviceCollective> collective_;
  kernels::Buffer staging_;     // the broadcast's device buffer (grown, never shrunk)
  std::vector<std::uint16_t> words_;  // bf16: the host side of the staging (packed / unpacked words)
  int nranks_, rank_;
};

}  // namespace troupe::actors
