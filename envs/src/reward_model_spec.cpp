// take_reward_model_config / put_reward_model_config (reward_model_spec.h): a reward_model entry's
// keys moved between the YAML's config mapping and RewardModelSpec.
// Invariant: put(take(config)) gives back the keys the user wrote (plus the verifier default and the marker).
#include "troupe/envs/reward_model_spec.h"

namespace troupe::envs {

namespace {

template <class E>
Status read_enum(nlohmann::json& config, const char* key, E* out, const std::string& where, const char* values) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (it != config.end()) config.erase(it);
    return {};
  }
  const auto v = it->is_string() ? enum_from_name<E>(it->get<std::string>()) : std::nullopt;
  if (!v) return invalid_input(where + ": config." + key + " must be " + values + " (got " + it->dump() + ")");
  *out = *v;
  config.erase(it);
  return {};
}

}  // namespace

Result<RewardModelSpec> take_reward_model_config(nlohmann::json& config, const std::string& path,
                                                 const std::string& where) {
  if (path.empty())
    return invalid_input(where + ": a reward_model env needs 'path' (a Hugging Face *ForSequenceClassification directory)");
  if (!config.is_object()) return invalid_input(where + ": 'config' must be a mapping");
  RewardModelSpec s;
  s.path = path;
  TROUPE_TRY(read_enum(config, "center", &s.center, where, "none, batch or running"));
  TROUPE_TRY(read_enum(config, "score_template", &s.score_template, where, "chat or plain"));
  // with reward_weights the reward is the weighted sum of the env's components (the dataset env's
  // verifier and judge, the env worker's reward_model); without, the score alone
  const bool weighted = config.contains("reward_weights");
  const char* alone = " is not for a reward_model env without config.reward_weights (its reward is then the reward "
                      "model's score)";
  if (config.contains("judge") && !weighted) return invalid_input(where + ": config.judge" + alone);
  if (!config.contains("verifier")) config["verifier"] = "none";
  if (config.contains("verifier") && config["verifier"] == "python" && !weighted)
    return invalid_input(where + ": config.verifier python" + alone);
  config[kScoredExternallyKey] = true;
  return s;
}

void put_reward_model_config(nlohmann::json& config, const RewardModelSpec& spec) {
  config["center"] = enum_string(spec.center);
  config["score_template"] = enum_string(spec.score_template);
  config.erase(kScoredExternallyKey);
}

}  // namespace troupe::envs
