// One GRPO step's data as it goes through the coordinator (internal to actors/coordinator/): the
// rollout (groups of G scored samples, or one streamed part of a step's groups), what it gives the
// learners, and what they gave back. Plain values: a rollout can be queued, saved and resumed.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/scorer.h"

namespace troupe::actors::coord {

using json = nlohmann::json;

// The env side of one model turn of a multi-turn episode.
struct TurnInfo {
  std::string observation;  // what the env showed before the turn (turn 0: the prompt)
  double reward = 0;
  std::string info_json = "{}";
  double env_s = 0, generate_s = 0;
};

// One GRPO step's worth of data (or one streamed part of it): groups of G samples, scored.
struct Rollout {
  struct Group {
    int64_t index = 0;  // the prompt's index in its step's sequence (round * prompts_per_step + i)
    std::string env;
    std::string prompt_text;
    json metadata;
    uint64_t seed = 0;
    int64_t draw = -1;  // the env's draw number (EnvResetReq::draw; not saved with the rollout)
    std::vector<GenSample> samples;
    std::vector<double> rewards, correct;
    std::vector<std::string> errors;
    std::vector<std::string> reasons;  // per sample: "" or why it failed (a trajectory termination)
    std::vector<std::string> components;  // per sample: the reward's parts (JSON), "" when unknown
    // single-turn: per sample, the verify's info (JSON, e.g. {"fields": {...}})
    std::vector<std::string> infos;
    // its verify's scorer requests (a judge's local model, a reward model on the scorers; metrics
    // scorer/judge/*, scorer/reward_model/*)
    ScorerStats judge_scorer, reward_model_scorer;
    std::string env_version;
    std::string messages_json = "[]";  // the first observation's chat messages
    std::vector<std::vector<TurnInfo>> turns;  // multi-turn: per sample, the env side of each turn
    // envs that run their episodes (served_episodes.cpp): per sample, the episode's further
    // training samples (turns that did not extend the first sample's context), same advantage
    std::vector<std::vector<GenSample>> more_samples;
  };
  std::vector<Group> groups;
  int64_t policy_version = 0;
  int64_t sample_version = -1;  // the version every generation request named (-1: the newest)
  // dynamic sampling: generation round of these groups, its seed base and first group index
  int round = 0, rounds = 1;
  uint64_t seed_base = 0;
  int64_t index0 = 0;
  int part = 0, parts = 1;  // streamed (rollout.async_chunks): which part of the step's groups
  double gen_s = 0, env_s = 0, idle_s = 0;
  double version_wait_s = 0;  // in-flight updates: generation time spent waiting for versions (slowest generator)
  int retries = 0;  // env calls retried on another env worker
};

struct Prepared {  // what a rollout gives the learners
  std::vector<TrainSample> samples;
  ScorerStats scorer;  // distill: the teacher requests that scored the samples
  std::vector<float> adv;  // per sample of the rollout's groups (0 where not kept)
  int groups_kept = 0, stale_dropped = 0;
};

struct Trained {  // what the learners gave back
  bool updated = false;
  json metrics = json::object();
  double learner_s = 0;
};

}  // namespace troupe::actors::coord
