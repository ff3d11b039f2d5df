// The optimizer step on the model's device (device_optimizer.h) and the trainer's use of it:
// reduce (device collective, or the host all-reduce where the backend has none), clip and AdamW on
// the device, the host AdamW kept as a lazily refreshed mirror of the moments, the weights' host
// mirror brought down on the copy queue for learner 0's step observer. Invariant: the
// trainer's metrics and weights are those of the host optimizer bit for bit on the CPU backends.
#include "troupe/learner/device_optimizer.h"

#include <algorithm>
#include <string>

#include "troupe/kernels/adamw.h"
#include "troupe/learner/trainer.h"

namespace troupe::learner {

Result<std::unique_ptr<DeviceOptimizer>> DeviceOptimizer::create(PolicyModel& model) {
  const auto arena = model.device_train_arena();
  if (arena.n == 0 || !arena.params) return std::unique_ptr<DeviceOptimizer>();
  const kernels::Backend& be = model.backend();
  std::unique_ptr<DeviceOptimizer> o(new DeviceOptimizer(be, arena.n));
  const std::string floats = std::to_string(arena.n) + " floats";
  TROUPE_ASSIGN_OR_RETURN(o->m_, be.alloc(sizeof(float) * arena.n, "the AdamW first moment (" + floats + ")"));
  TROUPE_ASSIGN_OR_RETURN(o->v_, be.alloc(sizeof(float) * arena.n, "the AdamW second moment (" + floats + ")"));
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

Result<double> DeviceOptimizer::step(PolicyModel& model, AdamW& host, const OptimizerConfig& cfg, double lr) {
  if (host.size() != n_)
    return invalid_input("device adamw: an optimizer state of " + std::to_string(host.size()) +
                         " values for a device arena of " + std::to_string(n_));
  if (host_newer_ || host.exp_avg().data() != synced_) push(host);
  const auto arena = model.device_train_arena();  // (what the host wrote to the gradients goes up first)
  if (arena.n != n_ || !arena.params)
    return invalid_input("device adamw: the model's device arena has " + std::to_string(arena.n) +
                         " floats, the optimizer " + std::to_string(n_));
  const double norm = be_.grad_norm_clip(arena.grads, n_, cfg.max_grad_norm, scale_.floats());
  const int64_t t = host.steps() + 1;
  const kernels::AdamWStep k = kernels::adamw_step_scalars(cfg.beta1, cfg.beta2, lr, cfg.weight_decay, cfg.eps, t);
  be_.adamw_update(arena.params, arena.grads, m_.floats(), v_.floats(), n_, k, scale_.floats());
  model.device_params_written();
  host.set_steps(t);
  device_newer_ = true;
  return norm;
}

namespace {
// Parameters per block handed to a StepObserver (as AdamW::step's blocks).
constexpr size_t kObserverBlock = 4096;
}  // namespace

bool Trainer::device_optimizer_on() {
  if (sharded_ || cfg_.optimizer_offload) return false;
  if (!dev_opt_checked_) {
    dev_opt_checked_ = true;
    auto made = DeviceOptimizer::create(model_);
    if (!made.ok()) {
      dev_opt_error_ = made.error().message;
      return true;  // device_optimizer_step reports it
    }
    dev_opt_ = std::move(*made);
  }
  return dev_opt_ != nullptr || !dev_opt_error_.empty();
}

Status Trainer::device_optimizer_step(StepMetrics& out, double& norm_sum, bool last) {
  if (!dev_opt_)
    return make_error(ErrorCode::internal, "learner: the optimizer on the device: " + dev_opt_error_ +
                                               " (learner.optimizer_offload: true keeps it on the host)");
  // Without a device collective the sum runs over comm on the host copy (as the host step does),
  // and what the host wrote goes up before the device step reads the gradients.
  if (!device_ && comm_.size() > 1) {
    auto grads = model_.grads();
    TROUPE_TRY(comm_.size() > 2 ? comm_.ordered_allreduce_sum(grads, bounds_) : comm_.allreduce_sum(grads));
  }
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  TROUPE_ASSIGN_OR_RETURN(const double norm, dev_opt_->step(model_, opt_, cfg_.optimizer, out.lr));
  norm_sum += norm;
  if (last && watch_) {
    // The observer sees the new weights block by block, as AdamW::step shows them: the mirror
    // comes down on the copy queue in pieces, and each block waits only for the pieces it reads,
    // so the observer's work on one piece overlaps the copy of the next.
    const auto ranges = watch_->begin_step(dev_opt_->size());
    if (!ranges.empty()) {  // (a step the observer skips leaves the mirror for whoever reads it next)
      model_.refresh_host_mirror();
      for (size_t r = 0; r < ranges.size(); ++r)
        for (size_t b = ranges[r].first; b < ranges[r].second; b += kObserverBlock) {
          const size_t e = std::min(ranges[r].second, b + kObserverBlock);
          watch_->updated(r, b, e, model_.host_params_until(e));
        }
      watch_->end_step();
    }
  }
  dropout_micro_ = 0;
  ++out.optimizer_steps;
  return {};
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
