// Random GRPO samples shared by the MPI learner tests: prompts and completions of 1-7 tokens with
// old and reference log-probs and an advantage, all drawn from one seeded mt19937_64.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "troupe/learner/trainer.h"

namespace troupe::learner::test {

inline std::vector<Sample> make_batch(uint64_t seed, int n, int V) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1), len(1, 7);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(n);
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) {
      s.completion.push_back(tok(rng));
      s.old_logprobs.push_back(-3.0f + 0.3f * nd(rng));
      s.ref_logprobs.push_back(-3.0f + 0.3f * nd(rng));
    }
    s.advantage = nd(rng);
  }
  return out;
}

// make_batch(seed, 12, 32); with several mini-batches its samples carry no old log-probs (the
// trainer recomputes them, with the expert-parallel group where there is one), their recorded ones
// becoming the sampler's, and the first quarter's samples (all on rank 0 of two) are scored for the
// sampler mismatch.
inline std::vector<Sample> recomputed_batch(uint64_t seed, int mini_batches) {
  auto b = make_batch(seed, 12, 32);
  if (mini_batches > 1)
    for (size_t i = 0; i < b.size(); ++i) {
      b[i].behavior_logprobs = b[i].old_logprobs;
      b[i].old_logprobs.clear();
      b[i].score_mismatch = i < 3;
    }
  return b;
}

}  // namespace troupe::learner::test
