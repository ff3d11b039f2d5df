// The optimizer step on the model's device (device_optimizer.h) and the trainer's use of it:
// reduce (device collective, or the host all-reduce where the backend has none), clip and AdamW on
// the device (sharded learners: reduce-scatter, the chained norm, their shard's AdamW, all-gather),
// the host AdamW kept as a lazily refreshed mirror of the moments, the weights' host mirror brought
// down on the copy queue for learner 0's step observer. Invariant: the
// trainer's metrics and weights are those of the host optimizer bit for bit on the CPU backends.
#include "troupe/learner/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "troupe/kernels/adamw.h"
#include "troupe/learner/trainer.h"

namespace troupe::learner {

Result<std::unique_ptr<DeviceOptimizer>> DeviceOptimizer::create(PolicyModel& model, size_t lo, size_t n) {
  const auto arena = model.device_train_arena();
  if (arena.n == 0 || !arena.params) return std::unique_ptr<DeviceOptimizer>();
  if (n == npos) n = arena.n - std::min(lo, arena.n);
  if (lo > arena.n || n > arena.n - lo)
    return invalid_input("device adamw: the range [" + std::to_string(lo) + ", " + std::to_string(lo + n) +
                         ") of a device arena of " + std::to_string(arena.n) + " floats");
  const kernels::Backend& be = model.backend();
  std::unique_ptr<DeviceOptimizer> o(new DeviceOptimizer(be, lo, n));
  const std::string floats = std::to_string(n) + " floats";
  TROUPE_ASSIGN_OR_RETURN(o->m_, be.alloc(sizeof(float) * std::max<size_t>(n, 1), "the AdamW first moment (" + floats + ")"));
  TROUPE_ASSIGN_OR_RETURN(o->v_, be.alloc(sizeof(float) * std::max<size_t>(n, 1), "the AdamW second moment (" + floats + ")"));
  TROUPE_ASSIGN_OR_RETURN(o->scale_, be.alloc(sizeof(float), "the gradient clipping coefficient"));
  return o;
}

void DeviceOptimizer::push(const AdamW& host) {
  be_.copy_host_to_device(m_.data(), host.exp_avg().data(), sizeof(float) * n_);
  be_.copy_host_to_device(v_.data(), host.exp_avg_sq().data(), sizeof(float) * n_);
  host_newer_ = device_newer_ = false;
  synced_ = host.exp_avg().data();
}

void DeviceOptimizer::pull(AdamW& host) {
  if (!device_newer_ || host.size() != n_) return;
  be_.copy_device_to_host(host.exp_avg().data(), m_.data(), sizeof(float) * n_);
  be_.copy_device_to_host(host.exp_avg_sq().data(), v_.data(), sizeof(float) * n_);
  device_newer_ = false;
  synced_ = host.exp_avg().data();
}

Result<policy::Model::DeviceArena> DeviceOptimizer::arena(PolicyModel& model, const AdamW& host) {
  if (host.size() != n_)
    return invalid_input("device adamw: an optimizer state of " + std::to_string(host.size()) +
                         " values for a device range of " + std::to_string(n_));
  if (host_newer_ || host.exp_avg().data() != synced_) push(host);
  const auto a = model.device_train_arena();  // (what the host wrote to the gradients goes up first)
  if (!a.params || a.n < lo_ + n_)
    return invalid_input("device adamw: the model's device arena has " + std::to_string(a.n) +
                         " floats, the optimizer's range ends at " + std::to_string(lo_ + n_));
  return a;
}

void DeviceOptimizer::update(PolicyModel& model, const policy::Model::DeviceArena& a, AdamW& host,
                             const OptimizerConfig& cfg, double lr) {
  const int64_t t = host.steps() + 1;
  const kernels::AdamWStep k = kernels::adamw_step_scalars(cfg.beta1, cfg.beta2, lr, cfg.weight_decay, cfg.eps, t);
  if (n_ > 0) be_.adamw_update(a.params + lo_, a.grads + lo_, m_.floats(), v_.floats(), n_, k, scale_.floats());
  model.device_params_written();
  host.set_steps(t);
  device_newer_ = true;
}

Result<double> DeviceOptimizer::step(PolicyModel& model, AdamW& host, const OptimizerConfig& cfg, double lr) {
  TROUPE_ASSIGN_OR_RETURN(const auto a, arena(model, host));
  const double norm = be_.grad_norm_clip(a.grads + lo_, n_, cfg.max_grad_norm, scale_.floats());
  update(model, a, host, cfg, lr);
  return norm;
}

double DeviceOptimizer::add_squares(PolicyModel& model, double acc) const {
  const auto a = model.device_train_arena();
  return n_ > 0 ? be_.add_squares(a.grads + lo_, n_, acc) : acc;
}

Status DeviceOptimizer::step_with_norm(PolicyModel& model, AdamW& host, const OptimizerConfig& cfg, double lr,
                                       double norm) {
  TROUPE_ASSIGN_OR_RETURN(const auto a, arena(model, host));
  const float coef = kernels::clip_coefficient(norm, cfg.max_grad_norm);
  be_.copy_host_to_device(scale_.data(), &coef, sizeof coef);
  update(model, a, host, cfg, lr);
  return {};
}

namespace {
// Parameters per block handed to a StepObserver (as AdamW::step's blocks).
constexpr size_t kObserverBlock = 4096;
}  // namespace

bool Trainer::device_optimizer_on() {
  // Sharded learners step their shard on the device (ZeRO-3 on a device model too: its device
  // shards, or its arena whole where it could not be made sparse); ZeRO-3's host shards and
  // divided experts stay with the host AdamW.
  if (cfg_.optimizer_offload || (zero3_ && !zero3_on_device_) || model_.expert_shards()) return false;
  if (!dev_opt_checked_) {
    dev_opt_checked_ = true;
    auto made = sharded_ ? DeviceOptimizer::create(model_, shard_begin(), shard_end() - shard_begin())
                         : DeviceOptimizer::create(model_);
    if (!made.ok()) {
      dev_opt_error_ = made.error().message;
      return true;  // device_optimizer_step reports it
    }
    dev_opt_ = std::move(*made);
  }
  return dev_opt_ != nullptr || !dev_opt_error_.empty();
}

Status Trainer::device_optimizer_missing() const {
  return make_error(ErrorCode::internal, "learner: the optimizer on the device: " + dev_opt_error_ +
                                             " (learner.optimizer_offload: true keeps it on the host)");
}

Status Trainer::device_optimizer_step(StepMetrics& out, double& norm_sum, bool last) {
  if (!dev_opt_) return device_optimizer_missing();
  // Without a device collective the sum runs over comm on the host copy (as the host step does),
  // and what the host wrote goes up before the device step reads the gradients.
  if (!device_ && comm_.size() > 1) {
    auto grads = model_.grads();
    TROUPE_TRY(comm_.size() > 2 ? comm_.ordered_allreduce_sum(grads, bounds_) : comm_.allreduce_sum(grads));
  }
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  TROUPE_ASSIGN_OR_RETURN(const double norm, dev_opt_->step(model_, opt_, cfg_.optimizer, out.lr));
  norm_sum += norm;
  if (last && watch_) show_device_step();
  dropout_micro_ = 0;
  ++out.optimizer_steps;
  return {};
}

// learner.shard with the trainable arena on a device: the gradients are summed on the device (the
// device collective; without one, staged through host copies over comm), ZeRO-1 whole on every
// rank, ZeRO-2 this rank's shard only, ZeRO-3 (device shards) the ranges its backward has not
// reduce-scattered yet; the norm is chained through the ranks from each shard's squares; AdamW
// steps this rank's shard with its shard of the moments; the shards are all-gathered on the device
// (ZeRO-3: layer by layer when next used, zero3_end). The host step's sums, in the same order.
Status Trainer::sharded_device_step(StepMetrics& out, double& norm_sum, bool last) {
  if (!dev_opt_) return device_optimizer_missing();
  if (!device_ && !staged_) staged_ = staged_device_collective(model_.backend(), comm_);
  kernels::DeviceCollective& c = device_ ? *device_ : *staged_;
  const auto arena = model_.device_train_arena();
  if (arena.n != bounds_.back())
    return make_error(ErrorCode::internal, "learner: the device arena has " + std::to_string(arena.n) +
                                               " floats, the shards cut " + std::to_string(bounds_.back()));
  if (zero3_) {
    TROUPE_TRY(zero3_->reduce_rest());
  } else {
    try {
      c.reduce_scatter_sum(arena.grads, bounds_);
      if (cfg_.shard == ShardStage::optimizer) c.all_gather(arena.grads, bounds_);  // (ZeRO-1: the whole sum)
    } catch (const std::exception& e) {
      return make_error(ErrorCode::internal, std::string("learner: the gradients' reduce-scatter on the device: ") + e.what());
    }
  }
  TROUPE_ASSIGN_OR_RETURN(const double squares,
                          comm_.chain([&](double acc) { return dev_opt_->add_squares(model_, acc); }));
  const double norm = std::sqrt(squares);
  norm_sum += norm;
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  TROUPE_TRY(dev_opt_->step_with_norm(model_, opt_, cfg_.optimizer, out.lr, norm));
  if (!zero3_) {
    try {
      c.all_gather(arena.params, bounds_);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::internal, std::string("learner: the weights' all-gather on the device: ") + e.what());
    }
  }
  model_.device_params_written();
  if (last && watch_ && !zero3_) show_device_step();  // (ZeRO-3 shows it once gathered, zero3_end)
  dropout_micro_ = 0;
  ++out.optimizer_steps;
  return {};
}

// The observer sees the new weights block by block, as AdamW::step shows them: the mirror comes
// down on the copy queue in pieces, and each block waits only for the pieces it reads, so the
// observer's work on one piece overlaps the copy of the next.
void Trainer::show_device_step() {
  const auto ranges = watch_->begin_step(bounds_.back());
  if (ranges.empty()) return;  // (a step the observer skips leaves the mirror for whoever reads it next)
  model_.refresh_host_mirror();
  for (size_t r = 0; r < ranges.size(); ++r)
    for (size_t b = ranges[r].first; b < ranges[r].second; b += kObserverBlock) {
      const size_t e = std::min(ranges[r].second, b + kObserverBlock);
      watch_->updated(r, b, e, model_.host_params_until(e));
    }
  watch_->end_step();
}

AdamW& Trainer::optimizer() {
  if (dev_opt_) {
    dev_opt_->pull(opt_);
    dev_opt_->host_written();  // the caller may write: the next step sends the moments up
  }
  return opt_;
}

const AdamW& Trainer::optimizer() const {
  if (dev_opt_) dev_opt_->pull(opt_);
  return opt_;
}

}  // namespace troupe::learner
