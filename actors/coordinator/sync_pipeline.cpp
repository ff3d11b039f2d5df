// The GRPO phase in sync mode: step k's rollout is generated with the newest weights, then the
// learners train on it and the new weights are synced before step k+1 samples. Nothing runs
// ahead, so there is nothing to drain, to keep in a checkpoint, or to name in a request.
#include <optional>

#include "coordinator_internal.h"
#include "pipeline_state.h"

namespace troupe::actors::coord {

namespace {

class SyncPipeline final : public StepPipeline {
 public:
  Task<Status> run(RunState& s, int64_t first_k) override {
    const StepCounter steps = s.steps();
    for (int64_t k = first_k; k < s.cfg.grpo.max_steps; ++k) {
      double t = mono_seconds();
      TROUPE_CO_ASSIGN_OR_RETURN(auto r, co_await make_rollout(s, steps.global_of_grpo(k), k));
      s.step = steps.global_of_grpo(k);
      TROUPE_CO_TRY(co_await train_on(s, r, s.step, k, t, 0));
      TROUPE_CO_TRY(co_await finish_step(s, k));
    }
    co_return Status{};
  }
  void step_synced(RunState&, int64_t) override {}
  Task<Status> drain(RunState&, int64_t) override { co_return Status{}; }
  std::optional<PipelineState> snapshot(const RunState&, int64_t) const override { return std::nullopt; }
  void name_in_flight(const RunState&, int64_t, GenerateReq&) const override {}
  bool rollouts_may_lag() const override { return false; }
  // the step's time the generators had no sampling to do
  double generator_idle_s(const Rollout& r, double, double step_s) const override {
    return std::max(0.0, step_s - r.gen_s - r.env_s);
  }
};

}  // namespace

std::unique_ptr<StepPipeline> make_sync_pipeline() { return std::make_unique<SyncPipeline>(); }

}  // namespace troupe::actors::coord
