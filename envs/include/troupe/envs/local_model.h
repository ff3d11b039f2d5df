// How an env reaches a model troupe serves in its own run (a judge's `model:` path, served by a
// scorer) without linking any model code: the role hosting the env installs a caller that sends
// the request as a message (actors/scorer.h, ScoreReq kind generate) and waits for the reply.
// Invariant: without an installed caller (an env in an isolated worker process, a test) a call is
// an error saying so, never a silent default.
#pragma once

#include <functional>
#include <string>

#include "troupe/base/result.h"

namespace troupe::envs {

struct LocalModelRequest {
  std::string model;      // the model's path as the config names it
  std::string prompt;     // the text the model continues (after its BOS)
  int max_tokens = 256;
  double temperature = 0;  // 0 = greedy
  double timeout_s = 60;   // one try's deadline
};
using LocalModelCaller = std::function<Result<std::string>(const LocalModelRequest&)>;

// Process-wide; an empty caller uninstalls it. Thread-safe.
void set_local_model_caller(LocalModelCaller caller);
// The installed caller's answer, or an error when none is installed.
Result<std::string> call_local_model(const LocalModelRequest& r);

}  // namespace troupe::envs
