// When the run is checkpointed and from what it continues: every checkpointing.every steps, at
// the end of each phase, and whenever an eval beats the best keep_best_by value so far (learner 0
// writes; the others hold the same state, or with learner.shard each writes its shard); --resume
// loads checkpoints/latest into every learner; a run that fails for a reason other than a learner saves its last finished step first.
#include <algorithm>
#include <filesystem>

#include "coordinator_internal.h"
#include "pipeline_state.h"
#include "troupe/learner/checkpoint.h"

namespace troupe::actors::coord {

namespace fs = std::filesystem;
using runtime::request;

namespace {
bool improves_best(RunState& s, double value) {
  if (!s.best_known) {
    s.best_known = true;
    if (fs::exists(s.run_dir + "/checkpoints/best"))  // (a resumed run's; reading state.json is enough)
      s.best_value = learner::checkpoint_metric(s.run_dir + "/checkpoints/best");
  }
  if (!s.best_value) return true;
  return s.cfg.checkpointing.higher_is_better ? value > *s.best_value : value < *s.best_value;
}

// The envs' draw counts that go with what a checkpoint after GRPO step k (-1: in SFT) keeps: the
// counts once the last rollout it holds was made (a resumed run draws on from there).
// The last GRPO step whose rollout the checkpoint holds: k, or a finished rollout kept for later.
int64_t saved_through(int64_t k, const PipelineState& ledger) {
  int64_t through = k;
  for (const auto& f : ledger.finished) through = std::max(through, f.first);
  return through;
}

const std::map<std::string, int64_t>& saved_draws(const RunState& s, int64_t k, const PipelineState& ledger) {
  if (k < 0) return s.draws;
  return s.draws_after(saved_through(k, ledger));
}
}  // namespace

bool periodic_checkpoint_due(const ExperimentConfig& cfg, int64_t step) {
  return cfg.checkpointing.every > 0 && step % cfg.checkpointing.every == 0;
}

Task<Status> checkpoint(RunState& s, std::string phase, bool force, runtime::Duration timeout) {
  if (!s.cfg.checkpointing.enabled) co_return Status{};
  const auto& best = s.cfg.checkpointing.keep_best_by;
  const bool scored = !best.empty() && s.last_eval_step == s.step && s.last_eval.contains(best) &&
                      s.last_eval[best].is_number();
  const bool better = scored && improves_best(s, s.last_eval[best].get<double>());
  bool due = periodic_checkpoint_due(s.cfg, s.step);
  // an eval that beats the best so far is kept even between regular checkpoints
  if (!due && !force && !better) co_return Status{};
  CheckpointReq req;
  req.dir = s.run_dir + "/checkpoints";
  req.step = s.step;
  // the episode ledger; async: the pipeline's finished rollouts (pipeline_state.h)
  const int64_t k = s.steps().grpo_of_global(s.step);  // the GRPO step just done (meaningful in the GRPO phase)
  PipelineState ledger;
  ledger.trained_steps = phase == "grpo" ? k + 1 : 0;
  ledger.trained_episodes = s.trained_episodes;
  if (phase == "grpo")
    if (auto p = s.pipeline ? s.pipeline->snapshot(s, k) : std::nullopt) {
      ledger = std::move(*p);
      req.pipeline = encode_pipeline(ledger);
    }
  json extra = {{"global_step", s.step},
                {"coordinator_phase", phase},
                {"wall_s", s.now_s()},
                {"ledger", ledger_json(ledger, s.cfg.rollout.num_generations)}};
  extra["draws"] = json(saved_draws(s, phase == "grpo" ? k : -1, ledger));
  if (json c = centering_json(s, phase == "grpo" ? saved_through(k, ledger) : -1); !c.empty()) extra["reward_centering"] = c;
  req.extra_json = extra.dump();
  if (scored) {
    req.has_metric = true;
    req.metric = s.last_eval[best].get<double>();
  }
  // only learner 0 writes; the others hold identical state, or (learner.shard) each writes its own
  // shard of the weights and AdamW moments, and learner 0 commits the step once every shard is in,
  // or (divided experts) the others send learner 0 their experts' moments
  const bool sharded = s.cfg.learner.shard != learner::ShardStage::none && s.peers.learners.size() > 1;
  const bool every = sharded || learners_divide_experts(s.cfg);
  std::vector<runtime::Reply<CheckpointRep>> reps;
  for (size_t i = 0; i < (every ? s.peers.learners.size() : 1); ++i)
    reps.push_back(request<CheckpointRep>(s.here, s.peers.learners[i], req, timeout));
  CheckpointRep rep;
  for (size_t i = 0; i < reps.size(); ++i) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto one, co_await reps[i]);
    if (i == 0) rep = std::move(one);
  }
  if (better) s.best_value = req.metric;
  s.saved_step = s.step;
  if (s.hooks.log) s.hooks.log("checkpoint " + rep.path + (better ? " (best " + best + " so far)" : ""));
  co_return Status{};
}

Task<Result<int64_t>> resume_from_latest(RunState& s) {
  TROUPE_CO_ASSIGN_OR_RETURN(auto dir, learner::latest_checkpoint(s.run_dir + "/checkpoints"));
  CheckpointReq req;
  req.load = true;
  req.dir = dir;
  int64_t start = 0;
  for (auto l : s.peers.learners) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await request<CheckpointRep>(s.here, l, req, kLongTimeout));
    json extra = json::parse(rep.extra_json, nullptr, false);
    start = extra.value("global_step", rep.step);
    s.wall_offset = extra.value("wall_s", 0.0);
    if (extra.contains("ledger") && extra["ledger"].is_object())
      s.trained_episodes = extra["ledger"].value("trained_episodes", int64_t{0});
    s.draws.clear();
    if (auto d = extra.find("draws"); d != extra.end() && d->is_object())
      for (auto it = d->begin(); it != d->end(); ++it)
        if (it->is_number_integer()) s.draws[it.key()] = it->get<int64_t>();
    TROUPE_CO_TRY(restore_centering(s, extra.value("reward_centering", json::object())));
    if (l == s.peers.learners.front()) s.resumed_pipeline = std::move(rep.pipeline);
  }
  TROUPE_CO_TRY(co_await sync_weights(s, nullptr));
  if (s.hooks.log) s.hooks.log("resumed from " + dir + " at step " + std::to_string(start));
  co_return start;
}

Task<Status> save_what_is_done(RunState& s, Error cause) {
  // Nothing new or no checkpoints: as it was. The learners updated for a step that did not finish
  // (their state is no step's), or they are what failed: nothing is saved, and the error says so.
  if (!s.cfg.checkpointing.enabled || s.done_step <= s.saved_step) co_return cause;
  const bool learner_failed = cause.message.find("learner") != std::string::npos;
  if (s.learner_dirty || learner_failed)
    co_return make_error(
        cause.code,
        cause.message + " (not saved: " +
            (s.learner_dirty ? "the learners had already updated for step " + std::to_string(s.done_step + 1)
                             : std::string("a learner failed")) +
            "; the last checkpoint is step_" + std::to_string(s.saved_step) + ")");
  s.step = s.done_step;  // the learners' state is that of the last finished step
  // the save may take longer than the grace a peer failure leaves this process
  constexpr auto kSaveTimeout = std::chrono::seconds(300);
  if (s.hooks.hold_exit) s.hooks.hold_exit(kSaveTimeout);
  Status saved = co_await checkpoint(s, s.steps().in_sft(s.done_step) ? "sft" : "grpo", true, kSaveTimeout);
  if (!saved.ok())
    co_return make_error(cause.code, cause.message + " (saving step " + std::to_string(s.done_step) +
                                         " failed too: " + saved.error().message + ")");
  co_return make_error(cause.code, cause.message + "; steps up to " + std::to_string(s.done_step) +
                                       " are saved in checkpoints/step_" + std::to_string(s.done_step) +
                                       ": remove the cause and continue with --resume " + s.run_dir);
}

}  // namespace troupe::actors::coord
