// The reward model of a `type: reward_model` env as its env worker uses it (actors link policy; envs/
// never does): renders (prompt, response) as the env's score_template says, tokenizes with the
// model's tokenizer, and has every response of a group scored at once: by the run's scorers
// (ScoreReq sequence_score) when it has any, else by the model loaded in this process.
// Invariant: a response's score depends only on its prompt and text, and is the same both ways
// (batch-invariant fp32 forwards, policy/reward_model.h).
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
  // With scorers (scorer_peers()): reads spec.path's tokenizer and chat template only, and each
  // score() is one ScoreReq (deadline timeout_s per try, then the next scorer). Without: loads the
  // whole model (policy::io::load_reward_model). It needs a tokenizer, and a chat template for
  // score_template chat. Errors name the env, the directory and what is wrong.
  static Result<std::unique_ptr<RewardModelScorer>> load(const envs::RewardModelSpec& spec, const std::string& env,
                                                         double timeout_s);
  ~RewardModelScorer();
  // The raw score (label 0) of each response to `prompt`; an error names the response.
  Result<std::vector<double>> score(const std::string& prompt, const std::vector<std::string>& responses);
  bool on_scorers() const;  // scores come from the run's scorers (a reply awaited), not this process
  struct State;

 private:
  explicit RewardModelScorer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
  std::mutex mu_;  // the model runs one call at a time
};

}  // namespace troupe::actors
