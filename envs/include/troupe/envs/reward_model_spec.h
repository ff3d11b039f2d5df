// A `type: reward_model` env entry's own settings: the scoring model's directory (envs[].path), how
// (prompt, response) is rendered for it (config.score_template) and the centering (config.center).
// Invariant: a spec that reads is complete (a path, known values); errors name the entry and key.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"
#include "troupe/envs/reward_center.h"

namespace troupe::envs {

// chat: [{user: prompt}, {assistant: response}] through the reward model's chat template (its
// chat_template.jinja or tokenizer_config.json), no generation prompt; plain: prompt + response as
// one text. Either is tokenized with the reward model's tokenizer, adding no BOS/EOS.
enum class ScoreTemplate { chat, plain };

struct RewardModelSpec {
  std::string path;                           // the Hugging Face sequence-classification directory
  ScoreTemplate score_template = ScoreTemplate::chat;
  RewardCenter center = RewardCenter::none;
};

// The dataset env config key that says its episodes are scored outside it (by the reward model):
// `verifier: none` is then allowed without a judge, and the rendered prompt is in each episode's
// metadata under "prompt".
inline constexpr const char* kScoredExternallyKey = "scored_externally";

// Reads `center` and `score_template` out of `config` (removing them: the dataset env does not
// know them), with `path` the entry's path; marks config as scored externally and defaults its
// verifier to none. Errors start with `where` and name the key and value.
Result<RewardModelSpec> take_reward_model_config(nlohmann::json& config, const std::string& path,
                                                 const std::string& where);

// The entry's settings written back into config (inverse of take_reward_model_config's removal).
void put_reward_model_config(nlohmann::json& config, const RewardModelSpec& spec);

}  // namespace troupe::envs

namespace troupe {
template <>
struct EnumNames<envs::ScoreTemplate> {
  using E = envs::ScoreTemplate;
  static constexpr std::pair<std::string_view, E> table[] = {{"chat", E::chat}, {"plain", E::plain}};
};
}  // namespace troupe
