// Centering of type: reward_model envs' scores (envs[].config.center), applied by the coordinator to
// each scored part of a rollout, and its checkpointed state. Invariant: scores are centered in group
// order then sample order, once each, so equal rollouts and state give bit-identical rewards.
#include "coordinator_internal.h"

namespace troupe::actors::coord {

namespace {

envs::RewardCenter center_of(const RunState& s, const std::string& env) {
  for (const auto& e : s.cfg.envs) {
    if (e.name != env || e.type != EnvType::reward_model || !e.config.is_object()) continue;
    auto it = e.config.find("center");
    if (it == e.config.end() || !it->is_string()) return envs::RewardCenter::none;
    return enum_from_name<envs::RewardCenter>(it->get<std::string>()).value_or(envs::RewardCenter::none);
  }
  return envs::RewardCenter::none;
}

}  // namespace

void center_reward_model_scores(RunState& s, Rollout& r, int g0, int g1, const std::vector<char>& skip) {
  std::map<std::string, std::vector<std::pair<int, size_t>>> by_env;  // env -> (group, sample) scored
  for (int i = g0; i < g1; ++i) {
    if (skip[static_cast<size_t>(i)]) continue;
    const auto& g = r.groups[static_cast<size_t>(i)];
    for (size_t j = 0; j < g.rewards.size(); ++j)
      if (j >= g.errors.size() || g.errors[j].empty()) by_env[g.env].emplace_back(i, j);
  }
  for (auto& [env, where] : by_env) {
    const envs::RewardCenter how = center_of(s, env);
    if (how == envs::RewardCenter::none) continue;
    auto it = s.centering.try_emplace(env, how).first;
    std::vector<double> x;
    for (auto [i, j] : where) x.push_back(r.groups[static_cast<size_t>(i)].rewards[j]);
    it->second.apply(x, std::vector<char>(x.size(), 1));
    for (size_t n = 0; n < where.size(); ++n) r.groups[static_cast<size_t>(where[n].first)].rewards[where[n].second] = x[n];
  }
}

json centering_json(const RunState& s, int64_t through) {
  const auto* at = &s.centering;
  if (through >= 0)
    if (auto it = s.centering_before_rollout.find(through + 1); it != s.centering_before_rollout.end()) at = &it->second;
  json out = json::object();
  for (const auto& [env, c] : *at)
    if (c.how() == envs::RewardCenter::running) out[env] = c.state();
  return out;
}

Status restore_centering(RunState& s, const json& saved) {
  s.centering.clear();
  if (!saved.is_object()) return {};
  for (auto it = saved.begin(); it != saved.end(); ++it) {
    envs::RewardCentering c(envs::RewardCenter::running);
    if (auto st = c.restore(it.value()); !st.ok())
      return invalid_input("state.json: reward_centering." + it.key() + ": " + st.error().message);
    s.centering.insert_or_assign(it.key(), c);
  }
  return {};
}

}  // namespace troupe::actors::coord
