// The async pipeline's part of a checkpoint (internal to actors/). In async mode the rollouts of
// the next max_staleness steps are sampled with versions older than the checkpoint's weights; the
// learners no longer hold those versions, so the rollouts themselves are saved, finished and
// scored, with the episode ledger that says which episodes were dispatched, finished and trained.
// A resumed run trains them where the uninterrupted run would have: it is bit-identical.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator_internal.h"

namespace troupe::actors::coord {

struct PipelineState {
  static constexpr const char* type_name = "actors.PipelineState";
  // 2: samples carry per-token versions (GenSample::version_starts); 3: and each group's verify
  // infos and scorer requests (Rollout::Group::infos, judge_scorer, reward_model_scorer)
  int32_t format = 3;
  // the pipeline's shape when it was saved: a resume with another one cannot use the rollouts
  int32_t max_staleness = 0;
  int32_t async_chunks = 1;
  int32_t in_flight_every = 0;    // rollout.in_flight_every with in_flight_updates on, else 0
  int32_t in_flight_min_lag = 0;  // rollout.in_flight_min_lag with in_flight_updates on, else 0
  int64_t trained_steps = 0;     // GRPO steps [0, trained_steps) are trained
  int64_t trained_episodes = 0;  // their episodes (groups x samples, every round)
  // Rollouts finished and scored but not trained, in the order they train: (GRPO step k, the
  // rollout or one streamed part of it). Nothing is in flight when it is saved (the pipeline is
  // drained to the last step whose version the checkpoint lacks).
  std::vector<std::pair<int64_t, Rollout>> finished;
};

// Bytes for CheckpointReq::pipeline, and back (an error names `where` and what is wrong).
std::string encode_pipeline(const PipelineState& p);
Result<PipelineState> decode_pipeline(const std::string& bytes, const std::string& where);

// The ledger as it goes into the checkpoint's state.json (extra.ledger): steps and episodes
// trained, and per finished rollout its step, part, policy version and prompts (index, env, seed).
json ledger_json(const PipelineState& p, int num_generations);

// (What a checkpoint after GRPO step k keeps of the running pipeline: StepPipeline::snapshot.)

// Episodes of a rollout: groups x samples.
int64_t episodes_of(const Rollout& r);

}  // namespace troupe::actors::coord
