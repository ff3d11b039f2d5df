// The learner ranks' expert-parallel groups (expert_parallel.h): a communicator per group, split
// from the learners' own, and the MoE layer's all-to-all over it.
#include "troupe/learner/expert_parallel.h"

#include <string>

namespace troupe::learner {

namespace {

// kernels::MoeExchange over a Communicator (MPI_Alltoall / MPI_Alltoallv on the group).
class GroupExchange final : public kernels::MoeExchange {
 public:
  explicit GroupExchange(Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Status alltoall_ints(const int32_t* send, int32_t* recv, int n) override {
    return group_.alltoall_ints(send, recv, n);
  }
  Status alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts) override {
    return group_.alltoallv(send, send_counts, recv, recv_counts);
  }

 private:
  Communicator& group_;
};

}  // namespace

Result<std::unique_ptr<ExpertParallel>> ExpertParallel::join(Communicator& comm, int expert_parallel) {
  if (expert_parallel < 1 || comm.size() % expert_parallel != 0)
    return invalid_input("policy.moe.expert_parallel: " + std::to_string(expert_parallel) +
                         " does not divide the learner rank count " + std::to_string(comm.size()) +
                         " (cluster.learners = data-parallel x expert-parallel)");
  std::unique_ptr<ExpertParallel> ep(new ExpertParallel);
  TROUPE_ASSIGN_OR_RETURN(ep->group_, comm.split(comm.rank() / expert_parallel, comm.rank() % expert_parallel));
  ep->exchange_ = std::make_unique<GroupExchange>(*ep->group_);
  return ep;
}

ExpertParallel::~ExpertParallel() = default;
kernels::MoeExchange& ExpertParallel::exchange() { return *exchange_; }
int ExpertParallel::size() const { return group_->size(); }
int ExpertParallel::rank() const { return group_->rank(); }

}  // namespace troupe::learner
