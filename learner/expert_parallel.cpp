// The learner ranks' expert-parallel groups (expert_parallel.h): a communicator per group, split
// from the learners' own, the MoE layer's all-to-all over it, and the sums, norm and gathers of
// learners whose models hold one block of experts each.
#include "troupe/learner/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "troupe/learner/optimizer.h"

namespace troupe::learner {

namespace {

using policy::ArenaPiece;
using policy::ExpertShardLayout;

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

// The sum over comm's ranks as the whole model's step takes it (trainer.cpp optimizer_step).
Status sum_like_the_step(std::span<float> buf, Communicator& comm) {
  if (comm.size() == 1 || buf.empty()) return {};
  if (comm.size() == 2) return comm.allreduce_sum(buf);
  const auto bounds = shard_bounds(buf.size(), comm.size());
  return comm.ordered_allreduce_sum(buf, bounds);
}

// The group's exchange for the model's backend, joined as learner rank `learner`.
Result<std::unique_ptr<kernels::MoeExchange>> join_exchange(Communicator& group, const kernels::Backend& backend,
                                                            int learner) {
  // The device exchange where the backend has one (rank 0 of the group makes the id, the group's
  // communicator carries it); else the group's MPI all-to-all on host memory.
  auto where = [&](const std::string& what) {
    return "policy.moe.expert_parallel: learner " + std::to_string(learner) + " (expert-parallel rank " +
           std::to_string(group.rank()) + " of " + std::to_string(group.size()) + ", policy.device: " +
           std::string(backend.name()) + "): " + what;
  };
  auto id = broadcast_collective_id(backend, group);
  if (!id.ok()) return make_error(id.error().code, where("the exchange's id: " + id.error().message));
  if (!id->empty()) {
    auto joined = backend.join_expert_exchange(*id, group.size(), group.rank());
    if (!joined.ok()) return make_error(joined.error().code, where("joining the exchange: " + joined.error().message));
    if (*joined) return std::move(*joined);
  }
  return std::unique_ptr<kernels::MoeExchange>(std::make_unique<GroupExchange>(group));
}

}  // namespace

Result<std::unique_ptr<ExpertParallel>> ExpertParallel::join(Communicator& comm, int expert_parallel,
                                                              const kernels::Backend& backend) {
  if (expert_parallel < 1 || comm.size() % expert_parallel != 0)
    return invalid_input("policy.moe.expert_parallel: " + std::to_string(expert_parallel) +
                         " does not divide the learner rank count " + std::to_string(comm.size()) +
                         " (cluster.learners = data-parallel x expert-parallel)");
  std::unique_ptr<ExpertParallel> ep(new ExpertParallel);
  TROUPE_ASSIGN_OR_RETURN(ep->group_, comm.split(comm.rank() / expert_parallel, comm.rank() % expert_parallel));
  TROUPE_ASSIGN_OR_RETURN(ep->replicas_, comm.split(comm.rank() % expert_parallel, comm.rank() / expert_parallel));
  TROUPE_ASSIGN_OR_RETURN(ep->exchange_, join_exchange(*ep->group_, backend, comm.rank()));
  return ep;
}

ExpertParallel::~ExpertParallel() = default;
kernels::MoeExchange& ExpertParallel::exchange() { return *exchange_; }
int ExpertParallel::size() const { return group_->size(); }
int ExpertParallel::rank() const { return group_->rank(); }
Communicator& ExpertParallel::group() { return *group_; }
Communicator& ExpertParallel::replicas() { return *replicas_; }

Status reduce_divided_grads(std::span<float> grads, const ExpertShardLayout& layout, Communicator& all,
                            ExpertParallel& ep) {
  for (const ArenaPiece& p : layout.pieces) {
    if (p.owner < 0)
      TROUPE_TRY(sum_like_the_step(grads.subspan(p.local, p.size), all));
    else if (p.owner == layout.shard)
      TROUPE_TRY(sum_like_the_step(grads.subspan(p.local, p.size), ep.replicas()));
  }
  return {};
}

Result<double> divided_grad_norm(std::span<const float> grads, const ExpertShardLayout& layout, ExpertParallel& ep) {
  double acc = 0.0;
  const auto& pieces = layout.pieces;
  for (size_t i = 0; i < pieces.size();) {
    if (pieces[i].owner < 0) {  // the same values on every rank: each adds them itself
      acc = add_squares(grads.subspan(pieces[i].local, pieces[i].size), acc);
      ++i;
      continue;
    }
    // A run of blocks owned by ranks 0, 1, ..., shards-1 in turn: rank q adds its own.
    const ArenaPiece& mine = pieces[i + static_cast<size_t>(layout.shard)];
    const double start = acc;
    TROUPE_ASSIGN_OR_RETURN(acc, ep.group().chain([&](double in) {
      return add_squares(grads.subspan(mine.local, mine.size), layout.shard == 0 ? start : in);
    }));
    i += static_cast<size_t>(layout.shards);
  }
  return std::sqrt(acc);
}

Status gather_whole(std::span<const float> local, const ExpertShardLayout& layout, ExpertParallel& ep,
                    std::span<float> whole) {
  Communicator& g = ep.group();
  const auto P = static_cast<size_t>(layout.shards);
  const bool root = g.rank() == 0;
  if (root && whole.size() != layout.whole_size)
    return make_error(ErrorCode::internal, "gather_whole: " + std::to_string(whole.size()) + " floats for an arena of " +
                                               std::to_string(layout.whole_size));
  const auto& pieces = layout.pieces;
  for (size_t i = 0; i < pieces.size();) {
    if (pieces[i].owner < 0) {
      if (root) std::copy_n(local.data() + pieces[i].local, pieces[i].size, whole.data() + pieces[i].whole);
      ++i;
      continue;
    }
    // A run of blocks of ranks 0 .. P-1, one after another in the whole arena: each rank's own
    // block straight into its place on rank 0.
    const ArenaPiece& mine = pieces[i + static_cast<size_t>(layout.shard)];
    std::vector<size_t> send_n(P, 0), recv_n(P, 0);
    send_n[0] = mine.size;
    if (root)
      for (size_t q = 0; q < P; ++q) recv_n[q] = pieces[i + q].size;
    TROUPE_TRY(g.alltoallv(local.data() + mine.local, send_n.data(), root ? whole.data() + pieces[i].whole : nullptr,
                           recv_n.data()));
    i += P;
  }
  return {};
}

void take_local(std::span<const float> whole, const ExpertShardLayout& layout, std::span<float> local) {
  for (const ArenaPiece& p : layout.pieces)
    if (p.local != ArenaPiece::npos) std::copy_n(whole.data() + p.whole, p.size, local.data() + p.local);
}

size_t local_size(const ExpertShardLayout& layout) {
  size_t n = 0;
  for (const ArenaPiece& p : layout.pieces)
    if (p.local != ArenaPiece::npos) n += p.size;
  return n;
}

}  // namespace troupe::learner
