// What client.h declares beyond any one client: make_env_client (the client a spec's type asks
// for, behind the fault injector), the env worker's lookup, the reward bounds check and the
// termination an error stands for. The clients themselves live in client_<kind>.cpp.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "troupe/envs/client.h"
#include "troupe/envs/env_pool.h"
#include "troupe/envs/plugin.h"

#ifndef TROUPE_ENV_WORKER_DEFAULT
#define TROUPE_ENV_WORKER_DEFAULT ""
#endif

namespace troupe::envs {

std::unique_ptr<EnvClient> make_remote_client_impl(const EnvSpec& spec, Status& status);  // client_remote.cpp
Result<std::unique_ptr<EnvClient>> make_nemo_gym_client(const EnvSpec& spec);              // client_nemo_gym.cpp

Termination termination_for(const Error& error) {
  if (error.message.find(kProtocolErrorTag) != std::string::npos) return Termination::protocol_error;
  if (error.message.find(kInvalidRewardTag) != std::string::npos) return Termination::invalid_reward;
  // a reward hook's or judge's failure (builtin/reward_hook.h, builtin/judge.h) leads its message with its reason
  for (auto t : {Termination::reward_timeout, Termination::reward_crash, Termination::reward_error,
                 Termination::reward_bad_return, Termination::judge_http, Termination::judge_timeout,
                 Termination::judge_parse})
    if (error.message.find(std::string(termination_name(t)) + ": ") != std::string::npos) return t;
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

// One server or in-process env (a pool's members are made so, one address each).
Result<std::unique_ptr<EnvClient>> make_single_env_client(const EnvSpec& spec) {
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

Result<std::unique_ptr<EnvClient>> make_env_client(const EnvSpec& spec) {
  TROUPE_ASSIGN_OR_RETURN(auto client, spec.addresses.empty() ? make_single_env_client(spec) : make_pool_client(spec));
  return with_injected_faults(std::move(client), spec.faults);
}

}  // namespace troupe::envs
