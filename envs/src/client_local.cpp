// In-process EnvClient (sessions over a pool of Env instances), env specs from YAML/JSON, and the
// client factory. Env instances are reused across episodes (setup() runs once per instance);
// a call that throws is turned into an env_error and the instance is dropped, never reused.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <mutex>
#include <set>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"
#include "troupe/envs/plugin.h"

#ifndef TROUPE_ENV_WORKER_DEFAULT
#define TROUPE_ENV_WORKER_DEFAULT ""
#endif

namespace troupe::envs {

std::unique_ptr<EnvClient> make_remote_client_impl(const EnvSpec& spec, Status& status);  // client_remote.cpp
Result<std::unique_ptr<EnvClient>> make_nemo_gym_client(const EnvSpec& spec);              // client_nemo_gym.cpp

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

Termination termination_for(const Error& error) {
  if (error.message.find(kProtocolErrorTag) != std::string::npos) return Termination::protocol_error;
  if (error.message.find(kInvalidRewardTag) != std::string::npos) return Termination::invalid_reward;
  switch (error.code) {
    case ErrorCode::timeout: return Termination::timeout;
    case ErrorCode::peer_failed: return Termination::worker_crash;
    default: return Termination::env_error;
  }
}

Status check_reward(const EnvSpec& spec, double reward, const std::string& what) {
  if (std::isfinite(reward) && reward >= spec.reward_min && reward <= spec.reward_max) return {};
  std::ostringstream os;
  os << "env " << spec.name << ": " << kInvalidRewardTag << what << " returned reward " << reward
     << " (allowed: finite, within reward_min " << spec.reward_min << " .. reward_max " << spec.reward_max << ")";
  return make_error(ErrorCode::internal, os.str());
}

Result<std::string> find_env_worker(const std::string& configured) {
  std::vector<std::string> tried;
  auto usable = [&](const std::string& p) {
    if (p.empty()) return false;
    tried.push_back(p);
    return ::access(p.c_str(), X_OK) == 0;
  };
  if (!configured.empty()) {
    if (usable(configured)) return configured;
    return invalid_input("env worker '" + configured + "' is not an executable file");
  }
  if (const char* e = std::getenv("TROUPE_ENV_WORKER"); e && usable(e)) return std::string(e);
  if (usable(TROUPE_ENV_WORKER_DEFAULT)) return std::string(TROUPE_ENV_WORKER_DEFAULT);
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto next = (self.parent_path() / "troupe-env-worker").string();
    if (usable(next)) return next;
  }
  std::string list;
  for (const auto& t : tried) list += " " + t;
  return invalid_input("cannot find the troupe-env-worker binary (tried:" + list + "); set TROUPE_ENV_WORKER");
}

// ---- specs ----

Result<EnvSpec> parse_env_spec(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": an env must be a mapping with at least 'name'");
  static const std::set<std::string> known = {"name", "type", "env", "weight", "config", "path", "command", "address",
                                              "isolate", "timeout_s", "startup_timeout_s", "max_restarts", "worker",
                                              "max_retries", "max_failure_frac", "reward_min", "reward_max", "url"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) return invalid_input(where + ": unknown key '" + it.key() + "'");
  }
  auto str = [&](const char* k, std::string& out) -> Status {
    if (!j.contains(k) || j[k].is_null()) return {};
    if (!j[k].is_string()) return invalid_input(where + ": '" + k + "' must be a string");
    out = j[k].get<std::string>();
    return {};
  };
  auto num = [&](const char* k, double& out, double lo) -> Status {
    if (!j.contains(k) || j[k].is_null()) return {};
    if (!j[k].is_number()) return invalid_input(where + ": '" + k + "' must be a number");
    out = j[k].get<double>();
    if (out < lo) return invalid_input(where + ": '" + k + "' must be >= " + std::to_string(lo));
    return {};
  };
  EnvSpec s;
  TROUPE_TRY(str("name", s.name));
  if (s.name.empty()) return invalid_input(where + ": env needs a 'name'");
  TROUPE_TRY(str("env", s.env));
  TROUPE_TRY(str("path", s.path));
  TROUPE_TRY(str("address", s.address));
  TROUPE_TRY(str("worker", s.worker));
  TROUPE_TRY(str("url", s.url));
  TROUPE_TRY(num("weight", s.weight, 0));
  TROUPE_TRY(num("timeout_s", s.timeout_s, 0.001));
  TROUPE_TRY(num("startup_timeout_s", s.startup_timeout_s, 0.001));
  double restarts = s.max_restarts;
  TROUPE_TRY(num("max_restarts", restarts, 0));
  s.max_restarts = static_cast<int>(restarts);
  double retries = s.max_retries;
  TROUPE_TRY(num("max_retries", retries, 0));
  s.max_retries = static_cast<int>(retries);
  TROUPE_TRY(num("max_failure_frac", s.max_failure_frac, 0));
  if (s.max_failure_frac > 1) return invalid_input(where + ": 'max_failure_frac' must be <= 1");
  if (j.contains("reward_min") && !j["reward_min"].is_null()) {
    if (!j["reward_min"].is_number()) return invalid_input(where + ": 'reward_min' must be a number");
    s.reward_min = j["reward_min"].get<double>();
  }
  if (j.contains("reward_max") && !j["reward_max"].is_null()) {
    if (!j["reward_max"].is_number()) return invalid_input(where + ": 'reward_max' must be a number");
    s.reward_max = j["reward_max"].get<double>();
  }
  if (!(s.reward_min <= s.reward_max))
    return invalid_input(where + ": 'reward_min' must not be above 'reward_max'");
  if (j.contains("config") && !j["config"].is_null()) {
    if (!j["config"].is_object()) return invalid_input(where + ": 'config' must be a mapping");
    s.config = j["config"];
  }
  if (j.contains("command") && !j["command"].is_null()) {
    const json& c = j["command"];
    if (c.is_string()) {  // "python my_env.py --flag": split on spaces
      std::string word;
      for (char ch : c.get<std::string>() + " ") {
        if (ch == ' ') {
          if (!word.empty()) s.command.push_back(word);
          word.clear();
        } else {
          word += ch;
        }
      }
    } else if (c.is_array()) {
      for (const auto& w : c) {
        if (!w.is_string()) return invalid_input(where + ": 'command' must be a list of strings");
        s.command.push_back(w.get<std::string>());
      }
    } else {
      return invalid_input(where + ": 'command' must be a list of strings or a string");
    }
    if (s.command.empty()) return invalid_input(where + ": 'command' is empty");
  }
  std::string type;
  TROUPE_TRY(str("type", type));
  if (type.empty()) type = !s.path.empty() ? "plugin" : (!s.command.empty() || !s.address.empty()) ? "remote" : "builtin";
  if (type == "builtin") {
    s.type = EnvType::builtin;
    if (s.env.empty()) s.env = s.name;
    if (!EnvRegistry::global().contains(s.env)) {
      std::string known_envs;
      for (const auto& n : EnvRegistry::global().names()) known_envs += (known_envs.empty() ? "" : ", ") + n;
      return invalid_input(where + ": unknown built-in env '" + s.env + "' (known: " + known_envs + ")");
    }
  } else if (type == "plugin") {
    s.type = EnvType::plugin;
    s.isolate = true;
    if (s.path.empty()) return invalid_input(where + ": a plugin env needs 'path' (the .so)");
  } else if (type == "remote") {
    s.type = EnvType::remote;
    if (s.command.empty() && s.address.empty())
      return invalid_input(where + ": a remote env needs 'command' (troupe starts it) or 'address' (already running)");
  } else if (type == "reasoning_gym") {
    // the SDK's reasoning-gym env as a remote process: config.python (default: troupe's Python)
    // runs envs/python/troupe_env/reasoning_gym_env.py; the rest of config goes to it
    s.type = EnvType::remote;
    if (!s.command.empty() || !s.address.empty())
      return invalid_input(where + ": a reasoning_gym env takes no 'command' or 'address' (troupe starts it)");
    std::string python = troupe::python_executable();
    if (auto it = s.config.find("python"); it != s.config.end()) {
      if (!it->is_string() || it->get<std::string>().empty())
        return invalid_input(where + ": config 'python' must be the path of a Python interpreter");
      python = it->get<std::string>();
      s.config.erase(it);
    }
    if (!s.config.contains("task") || !s.config["task"].is_string())
      return invalid_input(where + ": a reasoning_gym env needs config 'task' (a reasoning-gym dataset name, e.g. basic_arithmetic)");
    s.command = {python, std::string(TROUPE_SOURCE_DIR) + "/envs/python/troupe_env/reasoning_gym_env.py"};
  } else if (type == "nemo_gym") {
    s.type = EnvType::nemo_gym;
    if (s.command.empty() == s.url.empty())
      return invalid_input(where + ": a nemo_gym env needs exactly one of 'url' (a running resource server) or "
                                   "'command' (troupe starts it; {port} is the port it picks)");
  } else if (type == "verifiers") {
    s.type = EnvType::verifiers;
    if (s.address.empty())
      return invalid_input(where + ": a verifiers env needs 'address' (its env server, e.g. tcp://127.0.0.1:5000)");
  } else {
    return invalid_input(where + ": 'type' must be builtin, plugin or remote (or nemo_gym, reasoning_gym, verifiers; got '" + type + "')");
  }
  if (s.type != EnvType::nemo_gym && !s.url.empty())
    return invalid_input(where + ": 'url' is only for type: nemo_gym");
  if (j.contains("isolate") && !j["isolate"].is_null()) {
    if (!j["isolate"].is_boolean()) return invalid_input(where + ": 'isolate' must be true or false");
    s.isolate = j["isolate"].get<bool>();
  }
  return s;
}

Result<std::vector<EnvSpec>> parse_env_specs(const json& list, const std::string& where) {
  if (!list.is_array() || list.empty()) return invalid_input(where + ": 'envs' must be a non-empty list");
  std::vector<EnvSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto s, parse_env_spec(list[i], where + "[" + std::to_string(i) + "]"));
    if (!names.insert(s.name).second) return invalid_input(where + "[" + std::to_string(i) + "]: duplicate env name '" + s.name + "'");
    out.push_back(std::move(s));
  }
  return out;
}

json to_json(const EnvSpec& s) {
  const char* type = s.type == EnvType::builtin     ? "builtin"
                     : s.type == EnvType::plugin    ? "plugin"
                     : s.type == EnvType::remote    ? "remote"
                     : s.type == EnvType::nemo_gym  ? "nemo_gym"
                                                    : "verifiers";
  json j = {{"name", s.name}, {"type", type}, {"weight", s.weight}, {"config", s.config}, {"isolate", s.isolate},
            {"timeout_s", s.timeout_s}, {"startup_timeout_s", s.startup_timeout_s}, {"max_restarts", s.max_restarts},
            {"max_retries", s.max_retries}, {"max_failure_frac", s.max_failure_frac},
            {"reward_min", s.reward_min}, {"reward_max", s.reward_max}};
  if (!s.env.empty()) j["env"] = s.env;
  if (!s.path.empty()) j["path"] = s.path;
  if (!s.command.empty()) j["command"] = s.command;
  if (!s.address.empty()) j["address"] = s.address;
  if (!s.worker.empty()) j["worker"] = s.worker;
  if (!s.url.empty()) j["url"] = s.url;
  return j;
}

namespace {
Result<std::unique_ptr<EnvClient>> make_plain_env_client(const EnvSpec& spec) {
  if (spec.type == EnvType::verifiers) return make_verifiers_client(spec);
  if (spec.type == EnvType::builtin && !spec.isolate) {
    TROUPE_ASSIGN_OR_RETURN(EnvFactory f, EnvRegistry::global().factory(spec.env.empty() ? spec.name : spec.env));
    return make_local_client(std::move(f), spec.config);
  }
  if (spec.type == EnvType::plugin && !spec.isolate) {
    TROUPE_ASSIGN_OR_RETURN(EnvFactory f, plugin_factory(spec.path));
    return make_local_client(std::move(f), spec.config);
  }
  if (spec.type == EnvType::nemo_gym) return make_nemo_gym_client(spec);
  Status st;
  auto client = make_remote_client_impl(spec, st);
  if (!st.ok()) return st.error();
  return client;
}
}  // namespace

Result<std::unique_ptr<EnvClient>> make_env_client(const EnvSpec& spec) {
  TROUPE_ASSIGN_OR_RETURN(auto client, make_plain_env_client(spec));
  return with_injected_faults(std::move(client), spec.faults);
}

}  // namespace troupe::envs
