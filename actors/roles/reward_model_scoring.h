// The reward model of a `type: reward_model` env, loaded in the env worker's process (actors link
// policy; envs/ never does): renders (prompt, response) as the env's score_template says, tokenizes
// with the model's tokenizer and scores every response of a group in one forward pass.
// Invariant: a response's score depends only on its prompt and text (policy/reward_model.h).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/envs/reward_model_spec.h"

namespace troupe::actors {

class RewardModelScorer {
 public:
  // Loads spec.path (policy::io::load_reward_model; it needs a tokenizer, and a chat template for
  // score_template chat). Errors name the env, the directory and what is wrong.
  static Result<std::unique_ptr<RewardModelScorer>> load(const envs::RewardModelSpec& spec, const std::string& env);
  ~RewardModelScorer();
  // The raw score (label 0) of each response to `prompt`; an error names the response.
  Result<std::vector<double>> score(const std::string& prompt, const std::vector<std::string>& responses);

 private:
  struct State;
  explicit RewardModelScorer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
  std::mutex mu_;  // the model runs one call at a time
};

}  // namespace troupe::actors
