// Expert parallelism of the learner ranks (policy.moe.expert_parallel = E; LearnerConfig::
// expert_parallel): learner rank r is expert-parallel rank r % E of group r / E, so consecutive
// ranks share a group and split each MoE layer's experts in contiguous blocks; the ranks r, r + E,
// r + 2E, ... hold the same block (the data-parallel group of those experts, `replicas()`). Each
// rank runs its block of experts for every rank of its group, the rows travelling by all-to-all
// (kernels/moe_expert_parallel.h). A learner whose model holds only its block
// (policy::Model::slice_experts, policy::ExpertShardLayout) sums, norms and gathers its gradients
// and weights with the functions below.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/learner/communicator.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

class ExpertParallel {
 public:
  // Splits comm into groups of `expert_parallel` consecutive ranks, and into the groups of ranks
  // holding the same block, and joins the group's exchange for the model's `backend` (collectives:
  // every rank calls it, with the same backend). An error names the key when E does not divide the
  // rank count, and the learner rank when the exchange cannot be joined.
  static Result<std::unique_ptr<ExpertParallel>> join(Communicator& comm, int expert_parallel,
                                                      const kernels::Backend& backend);
  ~ExpertParallel();
  // The MoE layer's all-to-all: the backend's device exchange where join_expert_exchange gives one
  // (cuda: NCCL over the group's GPUs, its id made by the group's rank 0 and broadcast over group()),
  // else MPI over group() on host memory (cpu; cpu_fenced, whose layer hands it host copies).
  kernels::MoeExchange& exchange();
  int size() const;  // E
  int rank() const;  // this rank's place in its group (its block of experts)
  Communicator& group();     // the E ranks of this rank's group
  Communicator& replicas();  // the ranks r' with r' % E == r % E, in rank order

 private:
  ExpertParallel() = default;
  std::unique_ptr<Communicator> group_, replicas_;
  std::unique_ptr<kernels::MoeExchange> exchange_;
};

// The gradient sum of learners whose models hold one block of experts each (`grads` is this rank's
// arena, laid out as `layout`): the pieces every rank holds over `all` (as the whole model's step
// sums them: MPI_Allreduce with two ranks, in rank order beyond), this rank's expert blocks over
// ep.replicas() the same way. Since the other ranks of a group hold zeros for an expert in the
// whole-model expert-parallel step, each value is the sum that step gives, bit for bit.
Status reduce_divided_grads(std::span<float> grads, const policy::ExpertShardLayout& layout, Communicator& all,
                            ExpertParallel& ep);
// The whole model's gradient norm after reduce_divided_grads: the squares summed front to back in
// double over the whole arena (global_grad_norm's bits), carried through the group's ranks
// (Communicator::chain) over each run of expert blocks. Every rank gets it.
Result<double> divided_grad_norm(std::span<const float> grads, const policy::ExpertShardLayout& layout,
                                 ExpertParallel& ep);
// The whole arena's values (layout.whole_size floats) into `whole` on the group's rank 0, from
// every group rank's `local` (weights or an AdamW moment); `whole` is not read on the other ranks.
// A collective of the group (one MPI_Alltoallv with one receiver per run of expert blocks).
Status gather_whole(std::span<const float> local, const policy::ExpertShardLayout& layout, ExpertParallel& ep,
                    std::span<float> whole);
// This rank's values of a whole arena (what slice_experts copies): every piece it holds.
void take_local(std::span<const float> whole, const policy::ExpertShardLayout& layout, std::span<float> local);
// The floats a rank holds of an arena so laid out (its model's params().size()).
size_t local_size(const policy::ExpertShardLayout& layout);

}  // namespace troupe::learner
