// The run's step numbering in one place. A run counts one global step over both phases: SFT steps
// 1..S, then GRPO steps S+1..S+K, where S is sft.max_steps when SFT is enabled (else 0). The GRPO
// phase numbers its own steps k = 0..K-1 (TrainReq::step, the async pipeline): global = S + k + 1.
#pragma once

#include <algorithm>
#include <cstdint>

#include "troupe/actors/experiment_config.h"

namespace troupe::actors {

struct StepCounter {
  std::int64_t sft_steps = 0;  // S: global steps the SFT phase takes

  static StepCounter of(const ExperimentConfig& cfg) { return {cfg.sft.enabled ? cfg.sft.max_steps : 0}; }

  // GRPO step k (0-based) -> its global step, and back.
  std::int64_t global_of_grpo(std::int64_t k) const { return sft_steps + k + 1; }
  std::int64_t grpo_of_global(std::int64_t step) const { return step - sft_steps - 1; }
  // The first GRPO step a run that resumes at global step `start` trains.
  std::int64_t first_grpo_from(std::int64_t start) const { return std::max<std::int64_t>(0, start - sft_steps); }
  // Whether global step `step` (a finished one) belongs to the SFT phase.
  bool in_sft(std::int64_t step) const { return step <= sft_steps; }
};

}  // namespace troupe::actors
