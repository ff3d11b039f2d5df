// rollout.in_flight_updates on a generator (internal to actors/): the decoded versions a running
// generation may still move to, and the coordinator's word (StepVersion) on which version each
// GRPO step ended with. Thread-safe: the actor's thread adds (Weights, StepVersion) while the
// generation, on the actor's compute thread, takes versions and waits for steps.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::actors {

class InFlightVersions {
 public:
  // A decoded, checked version (in the generator's dtype).
  void add(int64_t version, std::vector<float> params);
  // Copies `version`'s parameters into out. Errors name the versions it has.
  Status copy(int64_t version, std::vector<float>& out) const;
  // Forgets the versions older than `version` (no later request samples with them).
  void drop_before(int64_t version);
  int64_t newest(int64_t fallback) const;  // the newest version added, else fallback
  // GRPO step `grpo_step` is done; the learners then hold `version`.
  void step_done(int64_t grpo_step, int64_t version);
  // No further step will be done (the GRPO phase ended, or the actor stops): every wait, now and
  // later, returns none.
  void release();
  // The version after `grpo_step`, once step_done says it; none after release().
  std::optional<int64_t> wait_step(int64_t grpo_step);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::vector<float>> versions_;
  std::map<int64_t, int64_t> after_step_;
  bool released_ = false;
};

}  // namespace troupe::actors
