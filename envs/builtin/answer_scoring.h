// Private helper of the scored built-ins (arithmetic, calculator, countdown, dataset, guess_number):
// the reference answer read from the prompt's metadata, the one reward rule of the text verifiers
// (1 when correct, format_reward when only well formed, 0 otherwise), and countdown scoring over
// the metadata's numbers and target.
#pragma once

#include <string>

#include "troupe/envs/env.h"

namespace troupe::envs::detail {

// metadata["answer"]; an error naming `env` when it is missing or not a string.
inline Result<std::string> reference_answer(const json& metadata, const std::string& env) {
  if (!metadata.contains("answer") || !metadata["answer"].is_string())
    return invalid_input(env + ": verify metadata has no string 'answer'");
  return metadata["answer"].get<std::string>();
}

// Components "correct" and "format" (1 or 0) and the reward they earn.
inline VerifyResult answer_score(bool correct, bool well_formed, double format_reward) {
  VerifyResult v;
  v.components["correct"] = correct ? 1.0 : 0.0;
  v.components["format"] = well_formed ? 1.0 : 0.0;
  v.reward = correct ? 1.0 : (well_formed ? format_reward : 0.0);
  return v;
}

// countdown_score over metadata "numbers" (integers) and "target" (an integer); an error naming
// `env` when they are missing or not integers. Defined in countdown.cpp.
Result<VerifyResult> countdown_score_of(const json& metadata, const std::string& completion, bool use_all,
                                        double format_reward, const std::string& env);

}  // namespace troupe::envs::detail
