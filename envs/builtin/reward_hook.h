// Private: the dataset env's reward hook (`verifier: python`), a user's Python `module:function`
// scoring each completion in a small pool of worker processes (envs/python/troupe_env/reward_worker.py).
// Invariants: one request at a time per worker, each with a deadline; a worker that crashes, hangs
// or answers garbage is killed and restarted, and only that call fails, with its reason
// (reward_timeout, reward_crash, reward_error, reward_bad_return) leading its error message.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/config_util.h"
#include "troupe/envs/env.h"

namespace troupe::envs::detail {

struct RewardHookConfig {
  std::string reward;      // MODULE:FUNCTION or FILE.py:FUNCTION ("" = no hook)
  std::string python;      // the interpreter (default: troupe's Python, $TROUPE_PYTHON)
  std::string base_dir;    // the experiment YAML's folder: a file or module beside it is found
  double timeout_s = 10;   // one call's deadline
  int workers = 2;         // worker processes (one call at a time each)
  std::string where = "env dataset";  // names the env in errors
};

// Reads the hook's keys from an env's config: `reward`, `reward_timeout_s`, `reward_workers`,
// `python` (base_dir is the caller's).
Result<RewardHookConfig> read_reward_hook_config(ConfigReader& r);

class RewardHook {
 public:
  // Starts the workers, each importing the function, or joins the pool an earlier call in this
  // process started with the same config (so pooled env instances share one). A module, file or
  // function that cannot be loaded is an invalid_input error naming them and the worker's stderr.
  static Result<std::shared_ptr<RewardHook>> open(const RewardHookConfig& config);

  // function(prompt, response, reference, row) -> its reward and components; a failed call is an
  // invalid_input error whose message starts with its reason ("reward_timeout: ...").
  Result<VerifyResult> score(const std::string& prompt, const std::string& response, const json& reference,
                             const json& row);

  explicit RewardHook(RewardHookConfig config);
  ~RewardHook();
  RewardHook(const RewardHook&) = delete;
  RewardHook& operator=(const RewardHook&) = delete;

 private:
  struct Worker;
  Status start(Worker& w);
  Result<json> read_line(Worker& w, double deadline, const char* what);
  Result<VerifyResult> call(Worker& w, const json& request);
  std::string name() const;

  RewardHookConfig config_;
  std::string script_;  // reward_worker.py
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;  // which workers are busy
  std::condition_variable idle_;
};

}  // namespace troupe::envs::detail
