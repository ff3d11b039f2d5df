// The step loop, as an actor. Sync mode: reset envs -> generate G per prompt -> verify ->
// advantages -> train -> weight sync, one after the other. Async mode (async_pipeline.cpp): a
// rollout coroutine produces step k+1 with version v while the learners train step k. Every wait
// for a role is a co_await (runtime/coroutine.h): the actor's thread is never blocked, the loop
// goes on in the reply continuations.
#include "troupe/actors/coordinator.h"

#include <filesystem>
#include <future>

#include "coordinator_internal.h"
#include "pipeline_state.h"
#include "troupe/actors/roles.h"
#include "troupe/policy/io/model_dir.h"

namespace troupe::actors {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace coord {

using runtime::Reply;
using runtime::request;

double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<Reply<TrainRep>> send_train(RunState& s, TrainReq req) {
  // one batch object for every learner of this process (each reads its slice), not a copy each
  auto shared = std::make_shared<const TrainReq>(std::move(req));
  std::vector<Reply<TrainRep>> reps;
  for (auto l : s.peers.learners) reps.push_back(request<TrainRep>(s.here, l, shared, kLongTimeout));
  return reps;
}

bool eval_due(const RunState& s, bool last_of_phase) {
  return last_of_phase || (s.cfg.eval.every > 0 && s.step % s.cfg.eval.every == 0);
}

namespace {

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

Task<Status> run_sft(RunState& s, int64_t first_step) {
  const int S = s.cfg.sft.max_steps;
  for (int64_t k = first_step; k < S; ++k) {
    double t = mono_s();
    double tokens = 0;
    TROUPE_CO_ASSIGN_OR_RETURN(auto req, co_await sft_batch(s, k, &tokens));
    s.learner_dirty = true;  // the learners update now: until the step is done, their state is no step's
    auto reps = send_train(s, std::move(req));
    json m;
    for (size_t i = 0; i < reps.size(); ++i) {
      TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await reps[i]);
      if (i == 0) m = json::parse(rep.metrics_json, nullptr, false);
    }
    double sync_s = 0;
    TROUPE_CO_TRY(co_await sync_weights(s, &sync_s));
    s.step = k + 1;
    TROUPE_CO_TRY(s.emit(sft_step_row(s, m, tokens, s.cfg.sft.batch_size, sync_s, mono_s() - t)));
    s.done_step = s.step;
    s.learner_dirty = false;
    const bool last = s.step == S;
    if (eval_due(s, last)) TROUPE_CO_TRY(co_await eval_and_log(s, "sft"));
    if (!last) TROUPE_CO_TRY(co_await checkpoint(s, "sft", false));
    if (Status out = planned_stop_if_out_of_time(s, last); !out.ok()) {
      TROUPE_CO_TRY(co_await checkpoint(s, "sft", true));
      co_return out;
    }
  }
  if (S > 0 && first_step < S) TROUPE_CO_TRY(co_await checkpoint(s, "sft", true));
  co_return Status{};
}

}  // namespace

Task<Status> finish_grpo_step(RunState& s, const Rollout& r, const Prepared& p, const Trained& tr,
                              int64_t step, double step_start, double gen_idle) {
  json row = grpo_step_row(s, r, p, tr, step);
  double sync_s = 0;
  if (tr.updated) TROUPE_CO_TRY(co_await sync_weights(s, &sync_s));
  add_grpo_timings(s, row, r, tr, sync_s, mono_s() - step_start, gen_idle);
  s.trained_episodes += episodes_of(r);
  if (s.async) {  // the version (new, or the same when nothing trained) later rollouts sample with
    const int64_t S = s.cfg.sft.enabled ? s.cfg.sft.max_steps : 0;
    s.async->version_after[step - S - 1] = s.version;
    s.async->changed.notify_all();
    if (s.cfg.rollout.in_flight_updates)  // after its Weights, so a generator holds the version it names
      for (size_t g = 0; g < s.peers.generators.size(); ++g)
        if (s.generator_alive(g)) (void)s.here->send(s.peers.generators[g], StepVersion{step - S - 1, s.version, false});
  }
  write_trajectories(s, r, p.adv, step);
  co_return s.emit(row);
}

Task<Status> train_on(RunState& s, Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle) {
  TROUPE_CO_ASSIGN_OR_RETURN(auto p, prepare(s, r));
  Trained t;
  if (!p.samples.empty()) {
    TrainReq req;
    req.phase = learner::Phase::grpo;
    req.step = k;
    req.samples = std::move(p.samples);
    double t0 = mono_s();
    s.learner_dirty = true;  // the learners update now: until the step is done, their state is no step's
    auto reps = send_train(s, std::move(req));
    for (size_t i = 0; i < reps.size(); ++i) {
      TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await reps[i]);
      if (i == 0) t.metrics = json::parse(rep.metrics_json, nullptr, false);
    }
    t.learner_s = mono_s() - t0;
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
  // async: an eval or a checkpoint waits for the rollouts sampled with older versions (their
  // generation requests must not meet newer weights; the checkpoint keeps them). (A checkpoint
  // for a best eval comes after an eval.)
  const bool may_save = s.cfg.checkpointing.enabled && (last || !out.ok() || periodic_checkpoint_due(s));
  if (s.async && (eval_due(s, last) || may_save)) TROUPE_CO_TRY(co_await drain_pipeline(s, k));
  if (eval_due(s, last)) TROUPE_CO_TRY(co_await eval_and_log(s, "grpo"));
  if (!out.ok()) {
    TROUPE_CO_TRY(co_await checkpoint(s, "grpo", true));
    co_return out;
  }
  co_return co_await checkpoint(s, "grpo", last);
}

namespace {

Task<Status> run_grpo(RunState& s, int64_t first_k) {
  if (s.cfg.rollout.async) co_return co_await run_grpo_async(s, first_k);
  const int64_t S = s.cfg.sft.enabled ? s.cfg.sft.max_steps : 0;
  for (int64_t k = first_k; k < s.cfg.grpo.max_steps; ++k) {
    double t = mono_s();
    TROUPE_CO_ASSIGN_OR_RETURN(auto r, co_await make_rollout(s, S + k + 1, k));
    s.step = S + k + 1;
    TROUPE_CO_TRY(co_await train_on(s, r, s.step, k, t, 0));
    TROUPE_CO_TRY(co_await finish_step(s, k));
  }
  co_return Status{};
}

Status load_tokenizer(RunState& s) {
  const auto& pol = s.cfg.policy;
  if (!pol.path.empty() && (pol.tokenizer == TokenizerKind::from_model || fs::exists(pol.path))) {
    auto t = policy::io::load_tokenizer_dir(pol.path);
    if (t.ok()) s.tokenizer = std::move(t).value();
    if (fs::is_directory(pol.path)) {
      TROUPE_ASSIGN_OR_RETURN(s.chat_template, policy::io::load_chat_template_dir(pol.path));
    }
  }
  if (!s.tokenizer) {
    TROUPE_ASSIGN_OR_RETURN(s.tokenizer,
                            make_builtin_tokenizer(pol.tokenizer == TokenizerKind::from_model ? "char" : enum_string(pol.tokenizer)));
  }
  return {};
}

Task<Status> run_phases(RunState& s, int64_t start) {
  const int64_t S = s.cfg.sft.enabled ? s.cfg.sft.max_steps : 0;
  if (s.cfg.eval.at_start && start == 0)
    TROUPE_CO_TRY(co_await eval_and_log(s, s.cfg.sft.enabled ? "sft" : "grpo"));
  if (s.cfg.sft.enabled && start < S) TROUPE_CO_TRY(co_await run_sft(s, start));
  if (s.cfg.grpo.enabled) TROUPE_CO_TRY(co_await run_grpo(s, std::max<int64_t>(0, start - S)));
  co_return Status{};
}

// The whole run. resume: continue from run_dir/checkpoints/latest. A failure (not a planned
// run.max_wall_s or signal stop) saves the steps that are done first.
Task<Status> run(RunState& s, bool resume) {
  s.t0 = mono_s();
  TROUPE_CO_TRY(load_tokenizer(s));
  int64_t start = 0;
  if (resume) {
    TROUPE_CO_ASSIGN_OR_RETURN(start, co_await resume_from_latest(s));
  }
  s.step = start;
  s.done_step = s.saved_step = start;
  // A fresh run starts with a full sync (a resume had one already): every generator then holds a
  // version learner 0 has checksummed (and probed) before it samples, and later syncs are deltas.
  Status st = resume ? Status{} : co_await sync_weights(s, nullptr);
  if (st.ok()) st = co_await run_phases(s, start);
  if (st.ok()) co_return st;
  if (is_planned_stop(st.error())) co_return st;
  co_return co_await save_what_is_done(s, st.error());
}

}  // namespace
}  // namespace coord

struct Coordinator::Impl {
  coord::RunState s;  // (declared before the driver: its frames use s.here)
  Job job;
  OnEnd on_end;
  runtime::Task<Status> driver;

  runtime::Task<Status> drive() {
    Result<json> out = json::object();
    try {
      if (job == Job::evaluate) {
        if (Status st = coord::load_tokenizer(s); !st.ok())  // prompts are mapped to what it encodes
          out = st.error();
        else
          out = co_await coord::evaluate(s);
      } else {
        Status st = co_await coord::run(s, job == Job::resume);
        if (st.ok())
          out = json{{"step", s.step}};
        else
          out = st.error();
      }
    } catch (const std::exception& e) {
      out = make_error(ErrorCode::internal, std::string("coordinator threw: ") + e.what());
    }
    s.here->stop();
    OnEnd done = std::move(on_end);
    if (done) done(std::move(out));
    co_return Status{};
  }
};

Coordinator::Coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir,
                         Job job, OnEnd on_end)
    : impl_(std::make_unique<Impl>()) {
  impl_->s.cfg = std::move(cfg);
  impl_->s.peers = std::move(peers);
  impl_->s.hooks = std::move(hooks);
  impl_->s.run_dir = std::move(run_dir);
  impl_->job = job;
  impl_->on_end = std::move(on_end);
}

Coordinator::~Coordinator() = default;

void Coordinator::on_start(runtime::Context& ctx) {
  runtime::ActorContext::Scope scope(impl_->s.here, ctx);
  impl_->driver = impl_->drive();
  impl_->driver.start();
}

namespace {
Result<json> run_job(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir,
                     Coordinator::Job job) {
  if (!peers.system) return make_error(ErrorCode::internal, "coordinator: RolePeers.system is not set");
  auto done = std::make_shared<std::promise<Result<json>>>();
  auto result = done->get_future();
  auto args = std::make_shared<std::tuple<ExperimentConfig, RolePeers, CoordinatorHooks, std::string>>(
      std::move(cfg), peers, std::move(hooks), std::move(run_dir));
  auto id = peers.system->spawn(
      [args, job, done]() -> std::unique_ptr<runtime::Actor> {
        auto& [c, p, h, d] = *args;
        return std::make_unique<Coordinator>(c, p, h, d, job,
                                             [done](Result<json> r) { done->set_value(std::move(r)); });
      },
      runtime::SpawnOptions().named("coordinator"));
  if (!id.ok()) return id.error();
  try {
    return result.get();
  } catch (const std::future_error&) {
    return make_error(ErrorCode::internal, "coordinator: the actor stopped before its job ended");
  }
}
}  // namespace

Status run_coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir,
                       bool resume) {
  auto r = run_job(std::move(cfg), std::move(peers), std::move(hooks), std::move(run_dir),
                   resume ? Coordinator::Job::resume : Coordinator::Job::train);
  if (!r.ok()) return r.error();
  return {};
}

Result<json> evaluate_policy(ExperimentConfig cfg, RolePeers peers) {
  return run_job(std::move(cfg), std::move(peers), {}, "", Coordinator::Job::evaluate);
}

}  // namespace troupe::actors
