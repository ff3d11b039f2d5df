// Expert parallelism of the learner ranks (policy.moe.expert_parallel = E; LearnerConfig::
// expert_parallel): learner rank r is expert-parallel rank r % E of group r / E, so consecutive
// ranks share a group and split each MoE layer's experts in contiguous blocks; the ranks r, r + E,
// r + 2E, ... hold the same block (the data-parallel group of those experts). The model keeps every
// expert's weights; what is split is the experts' compute: each rank runs its block of experts for
// every rank of its group, the rows travelling by all-to-all (kernels/moe_expert_parallel.h).
#pragma once

#include <memory>

#include "troupe/base/result.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/learner/communicator.h"

namespace troupe::learner {

class ExpertParallel {
 public:
  // Splits comm into groups of `expert_parallel` consecutive ranks (a collective: every rank calls
  // it). An error names the key when E does not divide the rank count.
  static Result<std::unique_ptr<ExpertParallel>> join(Communicator& comm, int expert_parallel);
  ~ExpertParallel();
  kernels::MoeExchange& exchange();
  int size() const;  // E
  int rank() const;  // this rank's place in its group (its block of experts)

 private:
  ExpertParallel() = default;
  std::unique_ptr<Communicator> group_;
  std::unique_ptr<kernels::MoeExchange> exchange_;
};

}  // namespace troupe::learner
