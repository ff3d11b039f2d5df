// The env worker (env clients by name: reset, step, verify, release) and the actor that hosts it.
#include <chrono>

#include "role_support.h"
#include "troupe/actors/roles.h"

namespace troupe::actors {
using json = nlohmann::json;

Result<std::unique_ptr<EnvWorker>> EnvWorker::create(const std::vector<envs::EnvSpec>& specs) {
  auto w = std::make_unique<EnvWorker>();
  for (const auto& s : specs) {
    auto c = envs::make_env_client(s);
    if (!c.ok()) return Error{c.error().code, "env '" + s.name + "': " + c.error().message};
    w->clients_[s.name] = std::move(c).value();
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

Result<EnvObs> EnvWorker::reset(const EnvResetReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  envs::ResetOptions opt;
  opt.split = r.split == 1 ? envs::Split::eval : envs::Split::train;
  auto obs = c->reset(r.episode_id, r.seed, opt);
  if (!obs.ok()) return Error{obs.error().code, "env '" + r.env + "' reset: " + obs.error().message};
  EnvObs out;
  out.text = obs->text;
  out.metadata_json = obs->metadata.dump();
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvObs> EnvWorker::step(const EnvStepReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  auto s = c->step(r.episode_id, r.action);
  if (!s.ok()) return Error{s.error().code, "env '" + r.env + "' step: " + s.error().message};
  EnvObs out;
  out.text = s->observation.text;
  out.metadata_json = s->observation.metadata.dump();
  out.reward = s->reward;
  out.done = s->done;
  out.components_json = json(s->components).dump();
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvVerifyRep> EnvWorker::verify(const EnvVerifyReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  json meta = json::parse(r.metadata_json, nullptr, false);
  if (meta.is_discarded()) return invalid_input("EnvVerifyReq: metadata is not JSON");
  EnvVerifyRep out;
  for (const auto& completion : r.completions) {
    auto v = c->verify(meta, completion);
    if (!v.ok()) {
      out.rewards.push_back(0);
      out.correct.push_back(0);
      out.errors.push_back(v.error().message);
      continue;
    }
    out.rewards.push_back(v->reward);
    auto it = v->components.find("correct");
    out.correct.push_back(it != v->components.end() ? it->second : (v->reward >= 1.0 ? 1.0 : 0.0));
    out.errors.emplace_back();
  }
  out.env_s = seconds_since(t0);
  return out;
}

void EnvWorker::release(const EnvReleaseReq& r) {
  auto it = clients_.find(r.env);
  if (it != clients_.end()) it->second->release(r.episode_id);
}

EnvActor::EnvActor(std::shared_ptr<EnvWorker> worker) : worker_(std::move(worker)) {
  handle<EnvResetReq>([this](runtime::Context& ctx, const EnvResetReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->reset(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvStepReq>([this](runtime::Context& ctx, const EnvStepReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->step(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvVerifyReq>([this](runtime::Context& ctx, const EnvVerifyReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->verify(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvReleaseReq>([this](runtime::Context&, const EnvReleaseReq& r) { worker_->release(r); });
}

}  // namespace troupe::actors
