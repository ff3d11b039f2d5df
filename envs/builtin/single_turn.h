// Private base for single-turn built-ins: reset() remembers the prompt's metadata so step(action)
// is verify(metadata, action) with done=true. Subclasses implement make_instance() and verify().
#pragma once

#include "troupe/envs/env.h"

namespace troupe::envs::detail {

class SingleTurnEnv : public Env {
 public:
  Result<Observation> reset(uint64_t seed, const ResetOptions& options) override {
    auto obs = make_instance(seed, options);
    if (obs.ok()) current_ = obs->metadata;
    return obs;
  }
  Result<StepResult> step(const std::string& action) override {
    if (current_.is_null()) return make_error(ErrorCode::invalid_input, info().name + ": step() before reset()");
    TROUPE_ASSIGN_OR_RETURN(VerifyResult v, verify(current_, action));
    StepResult s;
    s.reward = v.reward;
    s.components = std::move(v.components);
    s.info = std::move(v.info);
    s.info["termination"] = "done";
    s.done = true;
    return s;
  }
  void release() override { current_ = nullptr; }

 protected:
  virtual Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) = 0;

 private:
  json current_;
};

inline Observation text_observation(std::string prompt, json metadata) {
  Observation o;
  o.text = prompt;
  o.messages.push_back({"user", std::move(prompt)});
  o.metadata = std::move(metadata);
  return o;
}

}  // namespace troupe::envs::detail
