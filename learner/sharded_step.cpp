// The optimizer step of sharded learners (learner.shard, ZeRO stages) and the sharded state's
// checkpoint views. Invariant: the step equals the unsharded one bit for bit on CPU: the gradient
// sum runs in rank order either way, the global norm adds the squares front to back through the
// ranks (Communicator::chain), and AdamW is element-wise.
#include <algorithm>
#include <cmath>

#include "troupe/learner/trainer.h"

namespace troupe::learner {

namespace {

// Parameters per block handed to a StepObserver (as AdamW::step's blocks).
constexpr size_t kObserverBlock = 4096;

// The observer sees the whole new parameter buffer after the gather, block by block (what it
// prepares then describes the same weights as in an unsharded step).
void show_observer(StepObserver& watch, std::span<const float> params) {
  const auto ranges = watch.begin_step(params.size());
  if (ranges.empty()) return;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (size_t b = ranges[r].first; b < ranges[r].second; b += kObserverBlock)
      watch.updated(r, b, std::min(ranges[r].second, b + kObserverBlock), params.data());
  watch.end_step();
}

// forward_from_shards' hook: each group gathered as in a step, then transformed; this rank's own part
// of it (its master values) kept in host memory meanwhile and put back when the group is done, or at
// the end for the head, which a forward holds to its end. The weights are the host params() (host
// shards) or a device model's sparse arena (DeviceParamShards: each range comes down, is
// transformed on the host and goes up again).
class TransformedGroups final : public policy::ParamHook {
 public:
  TransformedGroups(ParamShards& inner, PolicyModel& model, bool on_device,
                    const std::function<void(std::span<float>)>& transform)
      : inner_(inner), model_(model), on_device_(on_device), transform_(transform) {}
  Status need(int g) override {
    TROUPE_TRY(inner_.need(g));
    if (!transform_) return {};
    const auto [lo, hi] = inner_.shard();
    for (const auto& [b, e] : inner_.group_ranges(g)) {
      std::vector<float> scratch;
      std::span<float> w;
      if (on_device_) {
        scratch.resize(e - b);
        model_.backend().copy_device_to_host(scratch.data(), model_.device_train_arena().params + b,
                                             sizeof(float) * scratch.size());
        w = scratch;
      } else {
        w = model_.params().subspan(b, e - b);
      }
      const size_t ob = std::clamp(lo, b, e), oe = std::clamp(hi, b, e);
      kept_.push_back({g, ob, std::vector<float>(w.begin() + static_cast<std::ptrdiff_t>(ob - b),
                                                 w.begin() + static_cast<std::ptrdiff_t>(oe - b))});
      transform_(w);
      if (on_device_) write(b, w);
    }
    return {};
  }
  Status done(int g, bool backward) override {
    put_back(g);
    return inner_.done(g, backward);
  }
  void put_back(int g) {  // g = kPutBackAll: every group still transformed
    for (size_t i = kept_.size(); i-- > 0;) {
      if (g != kPutBackAll && kept_[i].group != g) continue;
      write(kept_[i].begin, kept_[i].values);
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  static constexpr int kPutBackAll = -1000;

 private:
  struct Kept {
    int group;
    size_t begin;
    std::vector<float> values;
  };
  void write(size_t at, std::span<const float> v) {
    if (v.empty()) return;
    if (on_device_)
      model_.backend().copy_host_to_device(model_.device_train_arena().params + at, v.data(), v.size_bytes());
    else
      std::copy(v.begin(), v.end(), model_.params().begin() + static_cast<std::ptrdiff_t>(at));
  }
  ParamShards& inner_;
  PolicyModel& model_;
  bool on_device_;
  const std::function<void(std::span<float>)>& transform_;
  std::vector<Kept> kept_;
};

}  // namespace

Status Trainer::forward_from_shards(const std::function<Status()>& fn,
                                    const std::function<void(std::span<float>)>& transform) {
  if (!forwards_from_shards())
    return make_error(ErrorCode::internal, "learner: a forward from the shards needs learner.shard parameters with "
                                           "each rank keeping its shard and the per-layer gathers");
  TransformedGroups hook(*zero3_, model_, zero3_on_device_, transform);
  model_.set_param_hook(&hook);
  zero3_->set_active(true);
  Status st = fn();
  hook.put_back(TransformedGroups::kPutBackAll);
  zero3_->set_active(false);
  model_.set_param_hook(zero3_.get());
  Status released = zero3_->release_all();  // (the head, and the gather prefetched for a backward)
  TROUPE_TRY(st);
  return released;
}

Status Trainer::sharded_optimizer_step(StepMetrics& out, double& norm_sum, bool last) {
  if (device_optimizer_on()) return sharded_device_step(out, norm_sum, last);  // (a device arena)
  auto grads = model_.grads();
  // ZeRO-1 sums the whole gradient on every rank; ZeRO-2 leaves each rank its shard of the sum;
  // ZeRO-3 too, for what the per-layer reduce-scatters of the backward have not summed yet.
  if (cfg_.shard == ShardStage::optimizer)
    TROUPE_TRY(comm_.ordered_allreduce_sum(grads, bounds_));
  else if (zero3_)
    TROUPE_TRY(zero3_->reduce_rest());
  else
    TROUPE_TRY(comm_.reduce_scatter_sum(grads, bounds_));
  const size_t lo = shard_begin(), n = shard_end() - shard_begin();
  auto g = grads.subspan(lo, n);
  TROUPE_ASSIGN_OR_RETURN(const double squares, comm_.chain([&](double acc) { return add_squares(g, acc); }));
  const double norm = std::sqrt(squares);
  clip_to_norm(g, norm, cfg_.optimizer.max_grad_norm);
  norm_sum += norm;
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  auto params = model_.params();
  TROUPE_TRY(opt_.step(params.subspan(lo, n), g, cfg_.optimizer, out.lr, nullptr));
  if (!zero3_) {  // ZeRO-3 gathers the new weights layer by layer when it next uses them (zero3_end)
    TROUPE_TRY(comm_.all_gather(params, bounds_));
    if (last && watch_) show_observer(*watch_, params);
  }
  dropout_micro_ = 0;  // (LoRA dropout's masks count the micro-batches of each optimizer step, as unsharded)
  ++out.optimizer_steps;
  return {};
}

// The gathers write the weights behind the model's back: host shards write params() (the
// mutable params() tells a model with a mirror that it changed), device shards write the device
// arena (its mirror is stale: the next host read brings down what is mapped).
void Trainer::params_gathered() {
  if (zero3_on_device_)
    model_.device_params_written();
  else
    (void)model_.params();
}

Status Trainer::zero3_begin(bool whole) {
  zero3_->set_active(false);
  if (whole || !zero3_->layered()) TROUPE_TRY(zero3_->gather_all());
  params_gathered();
  return {};
}

// The forwards of a step before its update (old log-probs, the mismatch) with the per-layer hook:
// each group gathered from the shards and dropped after, so no rank holds the whole weights.
// `passes`: this rank's forwards in fn; every rank runs as many as the one with the most (phantom
// forwards: the gathers are collectives).
Status Trainer::zero3_forwards(size_t passes, const std::function<Status()>& fn) {
  TROUPE_ASSIGN_OR_RETURN(const size_t most, most_micro_batches(passes));
  TROUPE_TRY(zero3_->release_all());
  zero3_->set_active(true);
  Status st = fn();
  for (size_t c = passes; c < most && st.ok(); ++c) st = zero3_->phantom_forward();
  zero3_->set_active(false);
  Status released = zero3_->release_all();  // (the head, held to each forward's end)
  TROUPE_TRY(st);
  return released;
}

Status Trainer::zero3_micro_batches(const std::vector<std::vector<const Sample*>>& mbs, const LossNorm& norm,
                                    bool score, MismatchSums& mismatch, LossMetrics& sums) {
  if (!zero3_->layered()) {  // the whole (small) buffer for this mini-batch: one all-gather
    TROUPE_TRY(zero3_->gather_all());
    params_gathered();
    return plain_micro_batches(mbs, norm, score, mismatch, sums);
  }
  // Every rank runs as many passes as the rank with the most micro-batches (the gathers and
  // reduce-scatters are collectives): the ranks with fewer run phantom passes (with expert
  // parallelism, idle passes whose experts serve the peers' rows between the same hook calls).
  TROUPE_ASSIGN_OR_RETURN(const size_t passes, most_micro_batches(mbs.size()));
  TROUPE_TRY(zero3_->release_all());
  if (ep_) TROUPE_TRY(model_.set_expert_exchange(&ep_->exchange()));
  zero3_->set_active(true);
  Status st;
  for (size_t c = 0; c < passes && st.ok(); ++c) {
    zero3_->set_last_micro_batch(c + 1 == passes);
    if (c >= mbs.size()) {
      st = ep_ ? model_.expert_parallel_idle_pass(true) : zero3_->phantom_pass();
      continue;
    }
    auto m = run_micro_batch(mbs[c], norm, score, mismatch);
    if (m.ok())
      sums.add(*m);
    else
      st = m.error();
  }
  zero3_->set_active(false);
  if (ep_) (void)model_.set_expert_exchange(nullptr);
  TROUPE_TRY(st);
  return zero3_->settle();
}

Status Trainer::zero3_end() {
  switch (params_at_rest_) {
    case ParamsAtRest::shard:  // (a step observer then sees nothing: it needs the whole weights)
      return zero3_->release_all();
    case ParamsAtRest::rank0:
      TROUPE_TRY(zero3_->gather_to(0));
      break;
    case ParamsAtRest::whole:
      TROUPE_TRY(zero3_->gather_all());
      break;
  }
  params_gathered();
  if (!watch_ || (params_at_rest_ != ParamsAtRest::whole && comm_.rank() != 0)) return {};
  if (zero3_on_device_)
    show_device_step();  // (the mirror comes down in pieces: the arena is whole here)
  else
    show_observer(*watch_, model_.params());
  return {};
}

Status Trainer::gather_params() {
  if (!zero3_) return {};
  TROUPE_TRY(zero3_->gather_all());
  params_gathered();
  return {};
}

Status Trainer::gather_params_to_rank0() {
  if (!zero3_ || params_at_rest_ != ParamsAtRest::shard) return {};
  TROUPE_TRY(zero3_->gather_to(0));
  params_gathered();
  return {};
}

Status Trainer::release_params() {
  if (!zero3_ || params_at_rest_ != ParamsAtRest::shard) return {};
  return zero3_->release_all();
}

Result<AdamW> Trainer::gathered_optimizer() {
  if (model_.expert_shards()) return gathered_divided_optimizer();
  if (dev_opt_) dev_opt_->pull(opt_);  // (the moments of a step on the device come down)
  if (!sharded_) return opt_;
  AdamW full(bounds_.back());
  const size_t lo = shard_begin();
  std::copy(opt_.exp_avg().begin(), opt_.exp_avg().end(), full.exp_avg().begin() + static_cast<std::ptrdiff_t>(lo));
  std::copy(opt_.exp_avg_sq().begin(), opt_.exp_avg_sq().end(),
            full.exp_avg_sq().begin() + static_cast<std::ptrdiff_t>(lo));
  TROUPE_TRY(comm_.all_gather(full.exp_avg(), bounds_));
  TROUPE_TRY(comm_.all_gather(full.exp_avg_sq(), bounds_));
  full.set_steps(opt_.steps());
  return full;
}

Status Trainer::load_optimizer(AdamW full) {
  if (model_.expert_shards()) return load_divided_optimizer(full);
  if (full.size() != bounds_.back())
    return invalid_input("learner: optimizer state of " + std::to_string(full.size()) + " values for a model of " +
                         std::to_string(bounds_.back()));
  if (dev_opt_) dev_opt_->host_written();  // (the next step on the device sends them up)
  if (!sharded_) {
    opt_ = std::move(full);
    return {};
  }
  const auto lo = static_cast<std::ptrdiff_t>(shard_begin()), hi = static_cast<std::ptrdiff_t>(shard_end());
  std::copy(full.exp_avg().begin() + lo, full.exp_avg().begin() + hi, opt_.exp_avg().begin());
  std::copy(full.exp_avg_sq().begin() + lo, full.exp_avg_sq().begin() + hi, opt_.exp_avg_sq().begin());
  opt_.set_steps(full.steps());
  return {};
}

Status Trainer::load_optimizer_share(AdamW share) {
  if (!sharded_ && !model_.expert_shards()) return load_optimizer(std::move(share));
  if (share.size() != shard_end() - shard_begin())  // (divided experts: this rank's arena, its blocks)
    return invalid_input("learner: an optimizer share of " + std::to_string(share.size()) + " values for a" +
                         (sharded_ ? " shard" : " model holding one block of experts") + " of " +
                         std::to_string(shard_end() - shard_begin()));
  opt_ = std::move(share);
  if (dev_opt_) dev_opt_->host_written();
  return {};
}

size_t Trainer::state_bytes() const {
  // ZeRO-3: the gradients a rank keeps between steps are its shard, and so are the parameters
  // unless it holds them whole between steps (ParamsAtRest); the gathered layers come and go.
  const size_t all = bounds_.back(), shard = shard_end() - shard_begin();
  const bool whole = !zero3_ || params_at_rest_ == ParamsAtRest::whole ||
                     (params_at_rest_ == ParamsAtRest::rank0 && comm_.rank() == 0);
  const size_t grads = zero3_ ? shard : all;
  return sizeof(float) * ((whole ? all : shard) + grads + 2 * opt_.size()) + model_.frozen_param_bytes();
}

}  // namespace troupe::learner
