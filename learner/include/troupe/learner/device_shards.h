// learner.shard parameters on a device model (ZeRO-3 on GPUs): ParamShards' schedule over the
// model's sparse trainable arena (policy::Model::make_train_arena_sparse) and the learners' device
// collective (NCCL on cuda; host-staged over MPI for cpu_fenced). Each range's part outside this
// rank's shard is mapped just before its gather (weights) or before the backward writes it
// (gradients) and unmapped after; only whole granules come and go, so a granule a range shares
// with its neighbour or with the shard stays mapped (the range's floats there NaN once dropped).
// Between steps a rank's device holds its shard of the weights and gradients and those edges;
// during a step also the group in use, its gradient, and the embedding's gradient (its backward
// runs after the layers', outside the hook calls) until the step's end.
// Invariant: the sums and gathers are the host schedule's (rank-ordered sums, the same ranges in
// the same order), so a step equals the host ZeRO-3 step and the unsharded one bit for bit on
// cpu_fenced; an op never reads an unmapped granule (cpu_fenced faults if it does). The device
// collective has no started form: every gather and reduce-scatter blocks (no prefetch).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/learner/param_shards.h"
#include "troupe/learner/policy_model.h"

namespace troupe::learner {

class DeviceParamShards final : public ParamShards {
 public:
  // Makes the model's arena sparse (refused: the model's error) and drops nothing yet (the first
  // release_all or zero_grads does). `collective` must outlive this.
  static Result<std::unique_ptr<DeviceParamShards>> create(PolicyModel& model, std::vector<size_t> bounds,
                                                           Communicator& comm, kernels::DeviceCollective& collective);
  Status grads_whole() override;

 private:
  DeviceParamShards(PolicyModel& model, std::vector<size_t> bounds, Communicator& comm,
                    kernels::DeviceCollective& collective);
  Status bring_in(size_t k) override;
  Status drop_params(size_t k) override;
  Status grads_range_in(size_t k) override;
  Status drop_grads(size_t k) override;
  Status zero_grad_memory() override;
  Status gather_range(size_t k) override;
  Result<std::unique_ptr<PendingCollective>> start_gather_range(size_t k) override;
  Status reduce_range(size_t k) override;
  Result<std::unique_ptr<PendingCollective>> start_reduce_range(size_t k) override;
  Status gather_whole() override;
  Status gather_whole_to(int root) override;

  // Range k's parts outside the shard ([begin, end) floats), and the whole granules inside them.
  std::vector<std::pair<size_t, size_t>> outside(size_t k) const;
  std::pair<size_t, size_t> inner(std::pair<size_t, size_t> part) const;
  Status map(bool grads, size_t k, bool on);           // range k's inner granules
  void fill_edges(bool grads, size_t k, float value);  // range k's floats outside the shard left mapped
  policy::Model::DeviceArena arena();                  // the host's writes go up first
  // Runs a device collective, its throw an error naming what ran.
  template <class F>
  Status collective(const char* what, F&& f);

  PolicyModel& model_;
  const kernels::Backend& be_;
  kernels::DeviceCollective& dc_;
  size_t granule_ = 0;  // floats
  size_t n_ = 0;
};

}  // namespace troupe::learner
