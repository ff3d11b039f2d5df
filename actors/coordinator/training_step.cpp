// What every step ends with, for the SFT loop and both GRPO pipelines: the TrainReq to every
// learner (one shared object), the GRPO step's metric row, weight sync and trajectories, then evals,
// checkpoints and planned stops. The pipeline is told about a step only through its hooks
// (step_pipeline.h): nothing here depends on which strategy runs.
#include <memory>

#include "coordinator_internal.h"
#include "pipeline_state.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

std::vector<Reply<TrainRep>> send_train(RunState& s, TrainReq req) {
  // one batch object for every learner of this process (each reads its slice), not a copy each
  auto shared = std::make_shared<const TrainReq>(std::move(req));
  std::vector<Reply<TrainRep>> reps;
  for (auto l : s.peers.learners) reps.push_back(request<TrainRep>(s.here, l, shared, kLongTimeout));
  return reps;
}

bool eval_due(const ExperimentConfig& cfg, int64_t step, bool last_of_phase) {
  return last_of_phase || (cfg.eval.every > 0 && step % cfg.eval.every == 0);
}

Status planned_stop_if_out_of_time(const RunState& s, bool last) {
  if (last) return {};
  if (s.hooks.stop_requested && s.hooks.stop_requested())
    return make_error(ErrorCode::timeout, std::string(kStoppedBySignal) + " after step " + std::to_string(s.step) +
                                              (s.cfg.checkpointing.enabled ? ", which is checkpointed" : "") +
                                              " (continue with --resume " + s.run_dir + ")");
  if (s.cfg.run.max_wall_s <= 0 || s.now_s() <= s.cfg.run.max_wall_s) return {};
  return make_error(ErrorCode::timeout, std::string(kStoppedByWallClock) + " reached at step " +
                                            std::to_string(s.step) + " (continue with --resume " + s.run_dir + ")");
}

Task<Status> finish_grpo_step(RunState& s, const Rollout& r, const Prepared& p, const Trained& tr,
                              int64_t step, double step_start, double gen_idle) {
  json row = grpo_step_row(s, r, p, tr, step);
  double sync_s = 0;
  // members waiting to join are admitted by a sync, also after a step that trained nothing
  if (tr.updated || members_pending(s))
    TROUPE_CO_TRY(co_await sync_weights(s, &sync_s));
  else
    settle_members(s, s.version);  // leaves and dead members are noted every step
  add_grpo_timings(s, row, r, tr, sync_s, mono_seconds() - step_start, gen_idle);
  s.trained_episodes += episodes_of(r);
  // the version (new, or the same when nothing trained) later rollouts sample with
  s.pipeline->step_synced(s, s.steps().grpo_of_global(step));
  write_trajectories(s, r, p.adv, step);
  co_return s.emit(row);
}

Task<Status> train_on(RunState& s, Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle) {
  TROUPE_CO_ASSIGN_OR_RETURN(auto p, prepare(s, r));
  TROUPE_CO_TRY(co_await score_teacher(s, p));
  Trained t;
  if (!p.samples.empty()) {
    TrainReq req;
    req.phase = learner::Phase::grpo;
    req.step = k;
    req.samples = std::move(p.samples);
    double t0 = mono_seconds();
    s.learner_dirty = true;  // the learners update now: until the step is done, their state is no step's
    auto reps = send_train(s, std::move(req));
    for (size_t i = 0; i < reps.size(); ++i) {
      TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await reps[i]);
      if (i == 0) t.metrics = json::parse(rep.metrics_json, nullptr, false);
    }
    t.learner_s = mono_seconds() - t0;
    t.updated = true;
  }
  co_return co_await finish_grpo_step(s, r, p, t, step, step_start, gen_idle);
}

// After GRPO step k (global s.step) is trained and logged: evals, checkpoints, planned stops.
Task<Status> finish_step(RunState& s, int64_t k) {
  s.done_step = s.step;
  s.learner_dirty = false;
  const bool last = k + 1 == s.cfg.grpo.max_steps;
  Status out = planned_stop_if_out_of_time(s, last);
  // An eval or a checkpoint first drains the pipeline (async: the rollouts sampled with older
  // versions must not meet newer weights; the checkpoint keeps them). (A checkpoint for a best
  // eval comes after an eval.)
  const bool eval = eval_due(s.cfg, s.step, last);
  const bool may_save = s.cfg.checkpointing.enabled && (last || !out.ok() || periodic_checkpoint_due(s.cfg, s.step));
  if (eval || may_save) TROUPE_CO_TRY(co_await s.pipeline->drain(s, k));
  if (eval) TROUPE_CO_TRY(co_await eval_and_log(s, "grpo"));
  if (!out.ok()) {
    TROUPE_CO_TRY(co_await checkpoint(s, "grpo", true));
    co_return out;
  }
  co_return co_await checkpoint(s, "grpo", last);
}

}  // namespace troupe::actors::coord
