// AdamW on the model's device: the fp32 moments live in the backend's memory beside the master
// weights (all of them, or a sharded learner's shard of them), the gradients are clipped and
// stepped there, and only the gradient norm (a sharded learner's sum of squares) comes down.
// Invariant: a step is clip_grad_norm + AdamW::step bit for bit (the backend ops' CPU
// specification, kernels/include/troupe/kernels/adamw.h); the host AdamW is a mirror of the
// moments, brought down only when read (a checkpoint) and sent up when the host replaced it (a resume).
#pragma once

#include <cstddef>
#include <memory>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"
#include "troupe/learner/config.h"
#include "troupe/learner/optimizer.h"
#include "troupe/learner/policy_model.h"

namespace troupe::learner {

class DeviceOptimizer {
 public:
  // The moments (2 x n floats) of [lo, lo + n) of the model's device arena and the clipping
  // coefficient, in the model's backend: the whole arena (n = npos) for a learner that holds every
  // moment, or a sharded learner's shard (learner.shard optimizer, gradients). Null when the model
  // has no device arena (a host-visible backend: the host AdamW is the device's).
  static constexpr size_t npos = static_cast<size_t>(-1);
  static Result<std::unique_ptr<DeviceOptimizer>> create(PolicyModel& model, size_t lo = 0, size_t n = npos);

  // One step over the range (its gradients already summed over the ranks): the norm and the
  // clipping coefficient, AdamW with learning rate lr at step host.steps() + 1, then
  // host.set_steps(+1). Uploads host's moments first when the host is newer. Returns the norm
  // before clipping (what clip_grad_norm returns).
  Result<double> step(PolicyModel& model, AdamW& host, const OptimizerConfig& cfg, double lr);
  // A sharded learner's part of the global norm: acc plus the squares of its range's gradients
  // (Backend::add_squares), which the ranks chain in rank order (Communicator::chain).
  double add_squares(PolicyModel& model, double acc) const;
  // The step of the range with the global norm given: the clipping coefficient from it (adamw.h's
  // clip_coefficient, uploaded), then AdamW as step() does.
  Status step_with_norm(PolicyModel& model, AdamW& host, const OptimizerConfig& cfg, double lr, double norm);
  // Brings the moments down into host when the device's are newer (a checkpoint reads them).
  void pull(AdamW& host);
  // The caller may write host's moments: the next step sends them up first.
  void host_written() { host_newer_ = true; }
  size_t size() const { return n_; }

 private:
  DeviceOptimizer(const kernels::Backend& be, size_t lo, size_t n) : be_(be), lo_(lo), n_(n) {}
  void push(const AdamW& host);
  // The model's arena, checked against the range and host's size, with host's moments sent up
  // first when they are newer.
  Result<policy::Model::DeviceArena> arena(PolicyModel& model, const AdamW& host);
  // AdamW over the range with the coefficient in scale_, the step counted in host.
  void update(PolicyModel& model, const policy::Model::DeviceArena& a, AdamW& host, const OptimizerConfig& cfg,
              double lr);
  const kernels::Backend& be_;
  size_t lo_, n_;
  kernels::Buffer m_, v_, scale_;
  bool device_newer_ = false;
  bool host_newer_ = true;           // the first step sends the host's moments (zeros, or a resume's) up
  const float* synced_ = nullptr;  // host.exp_avg().data() when last in step: another array = replaced
};

}  // namespace troupe::learner
