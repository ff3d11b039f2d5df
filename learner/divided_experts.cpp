// Expert parallelism whose learners hold one block of experts each (policy::Model::slice_experts):
// the optimizer step over the divided arena, the forwards outside the loss micro-batches run with
// the group (the weight sync's probe too), and the whole moments gathered or cut (gathered_optimizer,
// load_optimizer).
#include <string>

#include "troupe/learner/expert_parallel.h"
#include "troupe/learner/trainer.h"

namespace troupe::learner {

Status Trainer::join_expert_parallel() {
  const policy::ExpertShardLayout* layout = model_.expert_shards();
  if (ep_ || (cfg_.expert_parallel <= 1 && !layout)) return {};
  if (cfg_.expert_parallel <= 1)
    return invalid_input("learner: the model holds expert block " + std::to_string(layout->shard) + " of " +
                         std::to_string(layout->shards) + " but policy.moe.expert_parallel is 1");
  TROUPE_ASSIGN_OR_RETURN(auto ep, ExpertParallel::join(comm_, cfg_.expert_parallel, model_.backend()));
  if (layout && (layout->shards != ep->size() || layout->shard != ep->rank()))
    return invalid_input("policy.moe.expert_parallel: learner " + std::to_string(comm_.rank()) +
                         " holds expert block " + std::to_string(layout->shard) + " of " +
                         std::to_string(layout->shards) + " but is expert-parallel rank " + std::to_string(ep->rank()) +
                         " of " + std::to_string(ep->size()));
  if (layout && sharded_)
    return invalid_input("policy.moe.expert_parallel: a model holding one block of experts with learner.shard: " +
                         std::string(enum_string(cfg_.shard)) +
                         " (the experts' memory is divided with learner.shard: none only)");
  ep_ = std::move(ep);
  return {};
}

Status Trainer::divided_optimizer_step(StepMetrics& out, double& norm_sum) {
  TROUPE_TRY(join_expert_parallel());
  const policy::ExpertShardLayout& layout = *model_.expert_shards();
  auto grads = model_.grads();
  TROUPE_TRY(reduce_divided_grads(grads, layout, comm_, *ep_));
  TROUPE_ASSIGN_OR_RETURN(const double norm, divided_grad_norm(grads, layout, *ep_));
  clip_to_norm(grads, norm, cfg_.optimizer.max_grad_norm);
  norm_sum += norm;
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  // (no step observer: what it would see is this rank's blocks, not the weights the sync sends)
  TROUPE_TRY(opt_.step(model_.params(), grads, cfg_.optimizer, out.lr, nullptr));
  dropout_micro_ = 0;
  ++out.optimizer_steps;
  return {};
}

Result<std::vector<std::vector<float>>> Trainer::group_logprobs(PolicyModel& model, const std::vector<Sample>& batch) {
  if (!model.expert_shards()) return compute_completion_logprobs(model, batch, cfg_.batch.temperature);
  // Every rank computes the whole batch: the same forwards, so no idle pass is needed.
  TROUPE_TRY(join_expert_parallel());
  if (!ep_) return invalid_input("learner: a model holding one block of experts with policy.moe.expert_parallel 1");
  TROUPE_TRY(model.set_expert_exchange(&ep_->exchange()));
  auto logprobs = compute_completion_logprobs(model, batch, cfg_.batch.temperature);
  (void)model.set_expert_exchange(nullptr);
  return logprobs;
}

Result<std::vector<std::vector<float>>> Trainer::old_logprobs(const std::vector<Sample>& batch) {
  return group_logprobs(model_, batch);
}

Result<std::vector<std::vector<float>>> Trainer::reference_logprobs(PolicyModel& ref, const std::vector<Sample>& batch) {
  return group_logprobs(ref, batch);
}

Status Trainer::forward_with_expert_group(const std::function<Status()>& fn) {
  if (!model_.expert_shards()) return invalid_input("learner: forward_with_expert_group of a model that holds every expert");
  TROUPE_TRY(join_expert_parallel());
  TROUPE_TRY(model_.set_expert_exchange(&ep_->exchange()));
  Status st = fn();
  (void)model_.set_expert_exchange(nullptr);
  return st;
}

Result<MismatchSums> Trainer::mismatch_before_update(const std::vector<const Sample*>& mine) {
  if (!model_.expert_shards()) return score_mismatch(model_, mine, cfg_.batch.temperature);
  const size_t passes = score_mismatch_passes(mine);
  TROUPE_ASSIGN_OR_RETURN(const size_t most, most_micro_batches(passes));
  TROUPE_TRY(model_.set_expert_exchange(&ep_->exchange()));
  auto sums = score_mismatch(model_, mine, cfg_.batch.temperature);
  for (size_t c = passes; c < most && sums.ok(); ++c) {
    Status st = model_.expert_parallel_idle_pass(false);
    if (!st.ok()) sums = st.error();
  }
  (void)model_.set_expert_exchange(nullptr);
  return sums;
}

Result<AdamW> Trainer::gathered_divided_optimizer() {
  const policy::ExpertShardLayout& layout = *model_.expert_shards();
  TROUPE_TRY(join_expert_parallel());
  if (comm_.rank() >= ep_->size()) return AdamW{};  // (only the first group's gather reaches learner 0)
  AdamW whole(comm_.rank() == 0 ? layout.whole_size : 0);
  TROUPE_TRY(gather_whole(opt_.exp_avg(), layout, *ep_, whole.exp_avg()));
  TROUPE_TRY(gather_whole(opt_.exp_avg_sq(), layout, *ep_, whole.exp_avg_sq()));
  whole.set_steps(opt_.steps());
  return whole;
}

Status Trainer::load_divided_optimizer(const AdamW& whole) {
  const policy::ExpertShardLayout& layout = *model_.expert_shards();
  if (whole.size() != layout.whole_size)
    return invalid_input("learner: optimizer state of " + std::to_string(whole.size()) + " values for a model of " +
                         std::to_string(layout.whole_size));
  take_local(whole.exp_avg(), layout, opt_.exp_avg());
  take_local(whole.exp_avg_sq(), layout, opt_.exp_avg_sq());
  opt_.set_steps(whole.steps());
  return {};
}

}  // namespace troupe::learner
