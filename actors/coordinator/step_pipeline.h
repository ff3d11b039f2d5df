// How the GRPO phase's steps are scheduled (internal to actors/coordinator/): one interface the
// coordinator drives, two strategies. SyncPipeline (sync_pipeline.cpp) rolls out step k, then trains
// on it; AsyncPipeline (async_pipeline.cpp, rollout.async) samples later steps while the learners
// train. Both finish a step the same way (training_step.h), which calls back into the pipeline only
// through these hooks; the sync strategy's hooks do nothing, so its path has no async branch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "step_data.h"
#include "troupe/actors/messages.h"
#include "troupe/base/result.h"
#include "troupe/runtime/coroutine.h"

namespace troupe::actors::coord {

struct RunState;
struct PipelineState;

class StepPipeline {
 public:
  virtual ~StepPipeline() = default;
  // GRPO steps [first_k, grpo.max_steps): each rolled out, trained, synced and finished (evals,
  // checkpoints, planned stops).
  virtual runtime::Task<Status> run(RunState& s, int64_t first_k) = 0;
  // GRPO step k is trained and its weights synced (s.version: the version it ended with).
  virtual void step_synced(RunState& s, int64_t k) = 0;
  // Before an eval or a checkpoint after GRPO step k: every rollout that must not meet newer
  // weights (or that the checkpoint keeps) is finished.
  virtual runtime::Task<Status> drain(RunState& s, int64_t k) = 0;
  // What a checkpoint after GRPO step k keeps of the pipeline; none when nothing runs ahead.
  virtual std::optional<PipelineState> snapshot(const RunState& s, int64_t k) const = 0;
  // Step k's generation request: the versions it moves to while it decodes (in-flight updates).
  virtual void name_in_flight(const RunState& s, int64_t k, GenerateReq& req) const = 0;
  // Whether a rollout may be sampled with older weights than the learners' (prepare() then drops
  // or weighs samples past rollout.max_staleness).
  virtual bool rollouts_may_lag() const = 0;
  // The generators' idle time in step row (gen_idle: what the rollout waited before it started).
  virtual double generator_idle_s(const Rollout& r, double gen_idle, double step_s) const = 0;
};

std::unique_ptr<StepPipeline> make_sync_pipeline();
std::unique_ptr<StepPipeline> make_async_pipeline();

}  // namespace troupe::actors::coord
