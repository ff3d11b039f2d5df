// The coordinator actor and its run: the phases (eval at start, SFT steps, then the GRPO phase
// through a StepPipeline: sync_pipeline.cpp or, with rollout.async, async_pipeline.cpp), the first
// full weight sync, resume, and the save after a failure. Every wait for a role is a co_await
// (runtime/coroutine.h): the actor's thread is never blocked, the loop goes on in the reply
// continuations.
#include "troupe/actors/coordinator.h"

#include <filesystem>
#include <fstream>
#include <future>

#include "coordinator_internal.h"
#include "troupe/actors/roles.h"
#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/model_dir.h"

namespace troupe::actors {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace coord {

namespace {

Task<Status> run_sft(RunState& s, int64_t first_step) {
  const int64_t S = s.steps().sft_steps;  // (this phase runs only with sft.enabled)
  for (int64_t k = first_step; k < S; ++k) {
    double t = mono_seconds();
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
    TROUPE_CO_TRY(s.emit(sft_step_row(s, m, tokens, s.cfg.sft.batch_size, sync_s, mono_seconds() - t)));
    s.done_step = s.step;
    s.learner_dirty = false;
    const bool last = s.step == S;
    if (eval_due(s.cfg, s.step, last)) TROUPE_CO_TRY(co_await eval_and_log(s, "sft"));
    if (!last) TROUPE_CO_TRY(co_await checkpoint(s, "sft", false));
    if (Status out = planned_stop_if_out_of_time(s, last); !out.ok()) {
      TROUPE_CO_TRY(co_await checkpoint(s, "sft", true));
      co_return out;
    }
  }
  if (S > 0 && first_step < S) TROUPE_CO_TRY(co_await checkpoint(s, "sft", true));
  co_return Status{};
}

// The GRPO phase from GRPO step first_k, through the pipeline the config asks for.
Task<Status> run_grpo(RunState& s, int64_t first_k) {
  std::unique_ptr<StepPipeline> pipeline = s.cfg.rollout.async ? make_async_pipeline() : make_sync_pipeline();
  s.pipeline = pipeline.get();
  Status st = co_await pipeline->run(s, first_k);
  s.pipeline = nullptr;
  co_return st;
}

// rollout.template chat: the coordinator renders the later turns of an episode, so its tokenizer
// takes the special ids the generators sample with (config.json's, as make_policy gives them).
void use_model_special_ids(const std::string& dir, policy::io::Tokenizer& tok) {
  std::ifstream in(fs::path(dir) / "config.json");
  json c = in ? json::parse(in, nullptr, false) : json();
  if (!c.is_object()) return;
  auto id = [&](const char* key, int32_t fallback) {
    const json v = c.value(key, json());
    if (v.is_number_integer()) return v.get<int32_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
    return fallback;
  };
  tok.set_special_ids(id("bos_token_id", tok.bos_id()), id("eos_token_id", tok.eos_id()), id("pad_token_id", tok.pad_id()));
}

Status load_tokenizer(RunState& s) {
  const auto& pol = s.cfg.policy;
  if (!pol.path.empty() && (pol.tokenizer == TokenizerKind::from_model || fs::exists(pol.path))) {
    // a .gguf policy.path is its cached import, as the generators and learners load it
    TROUPE_ASSIGN_OR_RETURN(const std::string dir, policy::io::model_dir_for(pol.path));
    auto t = policy::io::load_tokenizer_dir(dir);
    if (t.ok()) s.tokenizer = std::move(t).value();
    if (fs::is_directory(dir)) {
      TROUPE_ASSIGN_OR_RETURN(s.chat_template, policy::io::load_chat_template_dir(dir));
      if (s.tokenizer && s.cfg.rollout.template_name == PromptTemplate::chat) use_model_special_ids(dir, *s.tokenizer);
    }
  }
  if (!s.tokenizer) {
    TROUPE_ASSIGN_OR_RETURN(s.tokenizer,
                            make_builtin_tokenizer(enum_string(pol.tokenizer == TokenizerKind::from_model ? TokenizerKind::char_level : pol.tokenizer)));
  }
  return {};
}

Task<Status> run_phases(RunState& s, int64_t start) {
  const StepCounter steps = s.steps();
  if (s.cfg.eval.at_start && start == 0)
    TROUPE_CO_TRY(co_await eval_and_log(s, s.cfg.sft.enabled ? "sft" : "grpo"));
  if (s.cfg.sft.enabled && start < steps.sft_steps) TROUPE_CO_TRY(co_await run_sft(s, start));
  if (s.cfg.grpo.enabled) TROUPE_CO_TRY(co_await run_grpo(s, steps.first_grpo_from(start)));
  co_return Status{};
}

// The whole run. resume: continue from run_dir/checkpoints/latest. A failure (not a planned
// run.max_wall_s or signal stop) saves the steps that are done first.
Task<Status> run(RunState& s, bool resume) {
  s.t0 = mono_seconds();
  TROUPE_CO_TRY(load_tokenizer(s));
  TROUPE_CO_TRY(co_await check_teacher(s));
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
  // members joining and leaving (troupe join) and troupe status, between the steps' awaits
  coord::RunState& s = impl_->s;
  handle<JoinReq>([&s](runtime::Context& ctx, const JoinReq& r) { return coord::on_join(s, ctx, r); });
  handle<LeaveReq>([&s](runtime::Context& ctx, const LeaveReq& r) { return coord::on_leave(s, ctx, r); });
  handle<MembersReq>([&s](runtime::Context& ctx, const MembersReq& r) { return coord::on_members(s, ctx, r); });
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
