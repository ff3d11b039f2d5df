// The in-process EnvClient: sessions over a pool of Env instances. Env instances are reused across
// episodes (setup() runs once per instance); a call that throws is turned into an env_error and the
// instance is dropped, never reused.
#include <map>
#include <mutex>

#include "troupe/envs/client.h"

namespace troupe::envs {

namespace {

template <class T, class Fn>
Result<T> guarded(const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, where + ": threw: " + e.what());
  } catch (...) {
    return make_error(ErrorCode::internal, where + ": threw a non-standard exception");
  }
}

class LocalEnvClient final : public EnvClient {
 public:
  LocalEnvClient(EnvFactory factory, json config, EnvInfo info)
      : factory_(std::move(factory)), config_(std::move(config)), info_(std::move(info)) {}

  ~LocalEnvClient() override {
    for (auto& [id, env] : sessions_) teardown(*env);
    for (auto& env : pool_) teardown(*env);
    if (verifier_) teardown(*verifier_);
  }

  const EnvInfo& info() const override { return info_; }

  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override {
    std::lock_guard lock(mu_);
    std::unique_ptr<Env> env;
    if (auto it = sessions_.find(episode_id); it != sessions_.end()) {
      env = std::move(it->second);
      sessions_.erase(it);
      env->release();
    } else {
      TROUPE_ASSIGN_OR_RETURN(env, acquire());
    }
    auto obs = guarded<Observation>(where("reset"), [&] { return env->reset(seed, options); });
    if (!obs.ok()) {
      recycle(std::move(env), obs.error());
      return obs.error();
    }
    sessions_[episode_id] = std::move(env);
    return obs;
  }

  Result<StepResult> step(const std::string& episode_id, const std::string& action) override {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(episode_id);
    if (it == sessions_.end()) return invalid_input(where("step") + ": unknown episode '" + episode_id + "' (reset it first)");
    auto r = guarded<StepResult>(where("step"), [&] { return it->second->step(action); });
    if (!r.ok() && r.error().code == ErrorCode::internal) {  // threw: the instance is suspect
      sessions_.erase(it);
    }
    return r;
  }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    std::lock_guard lock(mu_);
    if (!verifier_) {
      TROUPE_ASSIGN_OR_RETURN(verifier_, acquire());
    }
    auto r = guarded<VerifyResult>(where("verify"), [&] { return verifier_->verify(metadata, completion); });
    if (!r.ok() && r.error().code == ErrorCode::internal) verifier_.reset();
    return r;
  }

  void release(const std::string& episode_id) override {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(episode_id);
    if (it == sessions_.end()) return;
    std::unique_ptr<Env> env = std::move(it->second);
    sessions_.erase(it);
    try {
      env->release();
      pool_.push_back(std::move(env));
    } catch (...) {  // a release that throws: drop the instance
    }
  }

 private:
  std::string where(const char* op) const { return "env " + info_.name + ": " + op; }

  Result<std::unique_ptr<Env>> acquire() {
    if (!pool_.empty()) {
      auto env = std::move(pool_.back());
      pool_.pop_back();
      return env;
    }
    TROUPE_ASSIGN_OR_RETURN(auto env, guarded<std::unique_ptr<Env>>(where("create"), [&] { return factory_(config_); }));
    auto st = guarded<bool>(where("setup"), [&]() -> Result<bool> {
      Status s = env->setup();
      if (!s.ok()) return s.error();
      return true;
    });
    if (!st.ok()) return st.error();
    return env;
  }
  void recycle(std::unique_ptr<Env> env, const Error& why) {
    if (why.code == ErrorCode::internal) {
      teardown(*env);
      return;
    }
    try {
      env->release();
      pool_.push_back(std::move(env));
    } catch (...) {
    }
  }
  static void teardown(Env& env) {
    try {
      env.teardown();
    } catch (...) {
    }
  }

  EnvFactory factory_;
  json config_;
  EnvInfo info_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Env>> sessions_;
  std::vector<std::unique_ptr<Env>> pool_;
  std::unique_ptr<Env> verifier_;
};

}  // namespace

std::unique_ptr<EnvClient> make_local_client(EnvFactory factory, json config, EnvInfo info) {
  return std::make_unique<LocalEnvClient>(std::move(factory), std::move(config), std::move(info));
}

Result<std::unique_ptr<EnvClient>> make_local_client(EnvFactory factory, json config) {
  // One instance up front: validates the config now and gives the env's info.
  TROUPE_ASSIGN_OR_RETURN(auto probe, guarded<std::unique_ptr<Env>>("env create", [&] { return factory(config); }));
  EnvInfo info = probe->info();
  return make_local_client(std::move(factory), std::move(config), std::move(info));
}

}  // namespace troupe::envs
