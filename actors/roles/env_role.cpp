// The env worker (env clients by name: reset, step, verify, release) and the actor that hosts it.
// A failed env call is a reply, never an error status: it carries the error, its kind (timeout,
// worker_crash, protocol_error, env_error, invalid_reward) and whether the env is past its bounds,
// and the coordinator decides (retry elsewhere, count, or stop). Every reward is checked finite and
// within the env's reward_min/reward_max.
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "reward_model_scoring.h"
#include "role_support.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/scorer.h"
#include "troupe/envs/env_pool.h"

namespace troupe::actors {
using json = nlohmann::json;

EnvWorker::EnvWorker() = default;
EnvWorker::~EnvWorker() = default;

Result<std::unique_ptr<EnvWorker>> EnvWorker::create(const std::vector<envs::EnvSpec>& specs,
                                                     const std::string& role) {
  auto w = std::make_unique<EnvWorker>();
  for (auto s : specs) {
    s.faults.salt = role;
    auto c = envs::make_env_client(s);
    if (!c.ok()) return Error{c.error().code, "env '" + s.name + "': " + c.error().message};
    w->clients_[s.name] = std::move(c).value();
    if (s.reward_model) {
      TROUPE_ASSIGN_OR_RETURN(w->reward_models_[s.name], RewardModelScorer::load(*s.reward_model, s.name, s.timeout_s));
    }
    w->specs_[s.name] = s;
  }
  return w;
}

Result<envs::EnvClient*> EnvWorker::client(const std::string& env) {
  auto it = clients_.find(env);
  if (it == clients_.end()) return invalid_input("env worker has no env named '" + env + "'");
  return it->second.get();
}

const envs::EnvInfo* EnvWorker::info(const std::string& env) const {
  auto it = clients_.find(env);
  return it == clients_.end() ? nullptr : &it->second->info();
}

bool EnvWorker::concurrent(const std::string& env) const {
  auto it = clients_.find(env);
  if (it != clients_.end() && it->second->concurrent()) return true;
  // a judge with a local model, or a reward model on the scorers, waits for a scorer's reply: never
  // on a runtime worker thread, which the scorer's own mail may need
  if (auto rm = reward_models_.find(env); rm != reward_models_.end() && rm->second->on_scorers()) return true;
  auto spec = specs_.find(env);
  if (spec == specs_.end() || !spec->second.config.is_object()) return false;
  const auto& j = spec->second.config.value("judge", json::object());
  return j.is_object() && j.value("url", std::string()).empty() && j.contains("model");
}

void EnvWorker::fail(EnvObs& out, const std::string& env, const Error& e) const {
  out.error = e.message;
  out.reason = envs::termination_name(envs::termination_for(e));
  auto it = clients_.find(env);
  out.fatal = it != clients_.end() && it->second->gave_up();
}

// An observation's chat messages as EnvObs carries them ("[]" when it has none).
static std::string messages_json_of(const envs::Observation& o) {
  if (o.messages.empty()) return "[]";
  json m = json::array();
  for (const auto& msg : o.messages) m.push_back({{"role", msg.role}, {"content", msg.content}});
  return m.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<EnvObs> EnvWorker::reset(const EnvResetReq& r) {
  auto t0 = MonoClock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  envs::ResetOptions opt;
  opt.split = r.split == 1 ? envs::Split::eval : envs::Split::train;
  if (r.draw >= 0) opt.extra["draw"] = static_cast<uint64_t>(r.draw);
  auto obs = c->reset(r.episode_id, r.seed, opt);
  EnvObs out;
  out.env_version = c->info().version;
  if (!obs.ok()) {
    fail(out, r.env, Error{obs.error().code, "env '" + r.env + "' reset of episode '" + r.episode_id +
                                                 "': " + obs.error().message});
  } else {
    out.text = obs->text;
    out.metadata_json = obs->metadata.dump(-1, ' ', false, json::error_handler_t::replace);
    out.messages_json = messages_json_of(*obs);
  }
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvObs> EnvWorker::step(const EnvStepReq& r) {
  auto t0 = MonoClock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  auto s = c->step(r.episode_id, r.action);
  EnvObs out;
  out.env_version = c->info().version;
  const std::string what = "step of episode '" + r.episode_id + "'";
  if (s.ok()) {
    if (auto bad = envs::check_reward(specs_.at(r.env), s->reward, what); !bad.ok()) s = bad.error();
  }
  if (!s.ok()) {
    fail(out, r.env, Error{s.error().code, "env '" + r.env + "' " + what + ": " + s.error().message});
  } else {
    out.text = s->observation.text;
    out.metadata_json = s->observation.metadata.dump(-1, ' ', false, json::error_handler_t::replace);
    out.reward = s->reward;
    out.done = s->done;
    out.components_json = json(s->components).dump();
    out.info_json = s->info.dump(-1, ' ', false, json::error_handler_t::replace);
    out.messages_json = messages_json_of(s->observation);
  }
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvVerifyRep> EnvWorker::verify(const EnvVerifyReq& r) {
  auto t0 = MonoClock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  json meta = json::parse(r.metadata_json, nullptr, false);
  if (meta.is_discarded()) return invalid_input("EnvVerifyReq: metadata is not JSON");
  const auto& spec = specs_.at(r.env);
  EnvVerifyRep out;
  // a concurrent env scores the completions at once, each call with its own deadline
  // (each completion's scorer requests, a judge's local model, counted on the thread that verifies it)
  std::vector<ScorerStats> judged(r.completions.size());
  auto verify_one = [c, &meta, &r, &judged](size_t j) {
    CountScorerCalls count(judged[j]);
    return c->verify(meta, r.completions[j]);
  };
  std::vector<std::future<Result<envs::VerifyResult>>> pending;
  if (c->concurrent())
    for (size_t j = 0; j < r.completions.size(); ++j) pending.push_back(std::async(std::launch::async, verify_one, j));
  for (size_t j = 0; j < r.completions.size(); ++j) {
    auto v = pending.empty() ? verify_one(j) : pending[j].get();
    out.judge_scorer.add(judged[j]);
    if (v.ok()) {
      if (auto bad = envs::check_reward(spec, v->reward, "verify of completion " + std::to_string(j)); !bad.ok())
        v = bad.error();
    }
    if (!v.ok()) {
      out.rewards.push_back(0);
      out.correct.push_back(0);
      out.errors.push_back(v.error().message);
      out.reasons.emplace_back(envs::termination_name(envs::termination_for(v.error())));
      out.components_json.emplace_back("{}");
      out.infos_json.emplace_back("{}");
      out.fatal = out.fatal || c->gave_up();
      continue;
    }
    out.rewards.push_back(v->reward);
    auto it = v->components.find("correct");
    out.correct.push_back(it != v->components.end() ? it->second : (v->reward >= 1.0 ? 1.0 : 0.0));
    out.errors.emplace_back();
    out.reasons.emplace_back();
    out.components_json.push_back(json(v->components).dump());
    out.infos_json.push_back(v->info.is_object() ? v->info.dump(-1, ' ', false, json::error_handler_t::replace) : "{}");
  }
  if (reward_models_.count(r.env)) TROUPE_TRY(score_with_reward_model(r.env, meta, r.completions, out));
  out.env_s = seconds_since(t0);
  return out;
}

namespace {
// A reward_model env's config.reward_weights.reward_model (1 when reward_weights names other
// components only); none without reward_weights: the score alone is the reward.
std::optional<double> reward_model_weight(const json& config) {
  if (!config.is_object() || !config.contains("reward_weights") || !config["reward_weights"].is_object()) return std::nullopt;
  const auto& w = config["reward_weights"];
  return w.contains("reward_model") && w["reward_model"].is_number() ? w["reward_model"].get<double>() : 1.0;
}
}  // namespace

// The reward model's raw score becomes each scored completion's reward (component `reward_model`;
// a verifier's `correct` stays for accuracy), or with config.reward_weights its weighted part (the
// env gave the weighted sum of the others); a scoring error or a score outside the env's reward
// bounds fails the completion, as a failed verify does. Centering (config.center) is the coordinator's.
Status EnvWorker::score_with_reward_model(const std::string& env, const json& meta,
                                          const std::vector<std::string>& completions, EnvVerifyRep& out) {
  const auto& spec = specs_.at(env);
  const std::optional<double> weight = reward_model_weight(spec.config);
  std::vector<size_t> ok;
  std::vector<std::string> texts;
  for (size_t j = 0; j < completions.size(); ++j)
    if (out.errors[j].empty()) {
      ok.push_back(j);
      texts.push_back(completions[j]);
    }
  if (ok.empty()) return {};
  if (!meta.contains("prompt") || !meta["prompt"].is_string())
    return invalid_input("env '" + env + "': the episode's metadata has no 'prompt' for the reward model");
  auto scores = [&] {
    CountScorerCalls count(out.reward_model_scorer);  // on the scorers: what its request cost
    return reward_models_.at(env)->score(meta["prompt"].get<std::string>(), texts);
  }();
  for (size_t n = 0; n < ok.size(); ++n) {
    const size_t j = ok[n];
    // with reward_weights the env's weighted sum of its other components, plus the weighted score
    const double reward = !scores.ok() ? 0.0 : weight ? out.rewards[j] + *weight * (*scores)[n] : (*scores)[n];
    Status bad = scores.ok() ? envs::check_reward(spec, reward, (weight ? "reward (with the reward model's score) of completion "
                                                                        : "reward model score of completion ") +
                                                                    std::to_string(j))
                             : Status(Error{scores.error().code, "env '" + env + "': " + scores.error().message});
    if (!bad.ok()) {
      out.rewards[j] = 0;
      out.correct[j] = 0;
      out.errors[j] = bad.error().message;
      out.reasons[j] = std::string(envs::termination_name(envs::termination_for(bad.error())));
      out.components_json[j] = "{}";
      continue;
    }
    json comps = json::parse(out.components_json[j], nullptr, false);
    if (!comps.is_object()) comps = json::object();
    comps["reward_model"] = (*scores)[n];
    if (!comps.contains("correct")) out.correct[j] = 0;  // no verifier: no accuracy
    out.rewards[j] = reward;
    out.components_json[j] = comps.dump();
  }
  return {};
}

Result<EnvObs> EnvWorker::run(const EnvRunReq& r) {
  auto t0 = MonoClock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  envs::RunRequest q;
  q.metadata = json::parse(r.metadata_json, nullptr, false);
  q.sampling = json::parse(r.sampling_json, nullptr, false);
  if (q.metadata.is_discarded() || q.sampling.is_discarded()) return invalid_input("EnvRunReq: metadata or sampling is not JSON");
  q.base_url = r.base_url;
  q.model = r.model;
  auto res = c->run(r.episode_id, q);
  const std::string what = "run of episode '" + r.episode_id + "'";
  if (res.ok()) {
    if (auto bad = envs::check_reward(specs_.at(r.env), res->reward, what); !bad.ok()) res = bad.error();
  }
  EnvObs out;
  out.env_version = c->info().version;
  if (!res.ok()) {
    fail(out, r.env, Error{res.error().code, "env '" + r.env + "' " + what + ": " + res.error().message});
  } else {
    out.reward = res->reward;
    out.done = true;
    out.components_json = json(res->components).dump();
    out.info_json = res->info.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  out.env_s = seconds_since(t0);
  return out;
}

void EnvWorker::release(const EnvReleaseReq& r) {
  auto it = clients_.find(r.env);
  if (it != clients_.end()) it->second->release(r.episode_id);
}

EnvAggregateRep EnvWorker::aggregate(const EnvAggregateReq& r) {
  EnvAggregateRep out;
  auto c = client(r.env);
  if (!c.ok()) {
    out.error = c.error().message;
    return out;
  }
  auto m = (*c)->aggregate_eval();
  if (m.ok()) out.metrics_json = m->dump(-1, ' ', false, json::error_handler_t::replace);
  else out.error = "env '" + r.env + "' aggregate: " + m.error().message;
  return out;
}

// Calls of a concurrent env run on threads of their own and reply from there; once the actor
// stops, a late call's reply is dropped (the request has ended by then or fails on its own).
struct EnvActor::Inflight {
  std::mutex mu;
  bool closed = false;
};

namespace {

template <class Rep, class Req, class Fn>
Status answer(runtime::Context& ctx, const std::shared_ptr<EnvWorker>& worker,
              const std::shared_ptr<EnvActor::Inflight>& inflight, const std::string& env, const Req& r, Fn fn) {
  if (!worker->concurrent(env)) {
    TROUPE_ASSIGN_OR_RETURN(auto rep, fn(*worker, r));
    return ctx.reply(std::move(rep));
  }
  runtime::ReplyTo reply = ctx.reply_later();
  if (!reply) return {};
  std::thread([worker, inflight, r, fn, reply]() {
    Result<Rep> rep = fn(*worker, r);
    std::lock_guard lock(inflight->mu);
    if (inflight->closed) return;
    (void)(rep.ok() ? reply.send(std::move(rep).value()) : reply.send_error(rep.error()));
  }).detach();
  return {};
}

// EnvPoolMember: an env server that joined the job (troupe join --role env) into this process's
// pools of its env, or one that left out of them. Every env worker of the process gets the message
// and they share the pools, so a change already made is skipped. On a thread of its own: adding
// waits up to the env's startup_timeout_s for the server's hello.
void change_pool_member(const EnvPoolMember& m) {
  std::thread([m] {
    static std::mutex one_at_a_time;
    std::lock_guard lock(one_at_a_time);
    const char* what = m.add ? "joined the pool" : "left the pool";
    auto pools = envs::find_env_pools(m.env);
    if (pools.empty())
      std::fprintf(stderr, "troupe: env '%s': server %s %s, but this process has no pool of the env's servers "
                   "(envs[].addresses)\n", m.env.c_str(), m.address.c_str(), what);
    for (const auto& pool : pools) {
      bool in_pool = false;
      for (const auto& member : pool->members()) in_pool = in_pool || member.address == m.address;
      if (in_pool == m.add) continue;
      Status st = m.add ? pool->add_member(m.address) : pool->remove_member(m.address);
      if (st.ok())
        std::fprintf(stderr, "troupe: env '%s': server %s %s\n", m.env.c_str(), m.address.c_str(), what);
      else
        std::fprintf(stderr, "troupe: env '%s': server %s: %s\n", m.env.c_str(), m.address.c_str(),
                     st.error().message.c_str());
    }
  }).detach();
}

}  // namespace

EnvActor::EnvActor(std::shared_ptr<EnvWorker> worker)
    : worker_(std::move(worker)), inflight_(std::make_shared<Inflight>()) {
  handle<EnvResetReq>([this](runtime::Context& ctx, const EnvResetReq& r) -> Status {
    return answer<EnvObs>(ctx, worker_, inflight_, r.env, r, [](EnvWorker& w, const EnvResetReq& q) { return w.reset(q); });
  });
  handle<EnvStepReq>([this](runtime::Context& ctx, const EnvStepReq& r) -> Status {
    return answer<EnvObs>(ctx, worker_, inflight_, r.env, r, [](EnvWorker& w, const EnvStepReq& q) { return w.step(q); });
  });
  handle<EnvVerifyReq>([this](runtime::Context& ctx, const EnvVerifyReq& r) -> Status {
    return answer<EnvVerifyRep>(ctx, worker_, inflight_, r.env, r,
                                [](EnvWorker& w, const EnvVerifyReq& q) { return w.verify(q); });
  });
  handle<EnvAggregateReq>([this](runtime::Context& ctx, const EnvAggregateReq& r) -> Status {
    return answer<EnvAggregateRep>(ctx, worker_, inflight_, r.env, r,
                                   [](EnvWorker& w, const EnvAggregateReq& q) -> Result<EnvAggregateRep> { return w.aggregate(q); });
  });
  handle<EnvRunReq>([this](runtime::Context& ctx, const EnvRunReq& r) -> Status {
    return answer<EnvObs>(ctx, worker_, inflight_, r.env, r, [](EnvWorker& w, const EnvRunReq& q) { return w.run(q); });
  });
  handle<EnvReleaseReq>([this](runtime::Context&, const EnvReleaseReq& r) {
    if (!worker_->concurrent(r.env)) return worker_->release(r);
    std::thread([worker = worker_, r] { worker->release(r); }).detach();  // never waits on a hung server
  });
  handle<EnvPoolMember>([](runtime::Context&, const EnvPoolMember& m) { change_pool_member(m); });
}

void EnvActor::on_stop(runtime::Context&) {
  std::lock_guard lock(inflight_->mu);
  inflight_->closed = true;
}

EnvActor::~EnvActor() {
  std::lock_guard lock(inflight_->mu);
  inflight_->closed = true;
}

}  // namespace troupe::actors
