// The actors tests' experiment and SFT batch: the quickstart's MoE shrunk to one layer of width 32, the
// arithmetic env, short prompts and completions (fast enough for every role test).
#pragma once

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"

namespace troupe::actors::test_support {

inline ExperimentConfig tiny_config() {
  ExperimentConfig c;
  auto& m = c.policy.model;
  m.vocab_size = 100;
  m.hidden_size = 32;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 16;
  m.intermediate_size = 32;
  m.num_experts = 2;
  m.num_experts_per_tok = 1;
  m.moe_intermediate_size = 16;
  m.max_position_embeddings = 64;
  c.rollout.max_prompt_length = 8;
  c.rollout.max_response_length = 4;
  EnvSpec e;
  e.name = "arithmetic";
  c.envs.push_back(e);
  return c;
}

// An SFT step of two identical short samples (enough to move every weight a little).
inline TrainReq tiny_sft_batch() {
  TrainReq req;
  req.phase = learner::Phase::sft;
  TrainSample s;
  s.prompt = {1, 10, 11};
  s.completion = {12, 2};
  req.samples = {s, s};
  return req;
}

}  // namespace troupe::actors::test_support
