// Every random stream a run's seed is split into, in one table, and the mixer that splits it.
// A stream's tag is part of every number a run produces: changing one changes every metric of
// every run, and bit-identical --resume depends on them staying as they are.
#pragma once

#include <cstdint>

namespace troupe {

// splitmix64 applied to seed, then folded with a, b and c in turn: independent streams from one
// seed (a is the stream's tag below; b and c index within it, e.g. step and prompt).
constexpr std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0) {
  auto sm = [](std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  return sm(sm(sm(sm(seed) ^ a) ^ b) ^ c);
}

namespace seed_stream {
// --- a training run (actors/coordinator) ---
inline constexpr std::uint64_t grpo_prompt = 1;      // (step, prompt): which env, then its reset seed
inline constexpr std::uint64_t env_reset = 2;        // a prompt's stream -> the seed its env resets with
inline constexpr std::uint64_t sampling = 3;         // (step, chunk): a generator request's sampling seed
inline constexpr std::uint64_t turn_sampling = 4;    // (step, group*1024 + turn): a multi-turn step's sampling
inline constexpr std::uint64_t served_sampling = 5;  // (step, prompt*4096 + sample): served (verifiers) episodes
inline constexpr std::uint64_t rollout_round = 7;    // (round): the seed base of async rollout round > 0
inline constexpr std::uint64_t sft_prompt = 11;      // (step, prompt): an SFT batch's env and reset seed
inline constexpr std::uint64_t env_retry = 13;       // (retry): a fresh reset seed after a failed reset
inline constexpr std::uint64_t lora_init = 17;       // the LoRA adapters' A matrices (policy::Model::enable_lora)
inline constexpr std::uint64_t lora_dropout = 19;    // (optimizer step, rank << 32 | micro-batch): LoRA dropout masks

// --- the scale simulator's simulated roles (launch/bench), never in a training run ---
inline constexpr std::uint64_t sim_env_prompt = 11;   // third argument: (seed, reset seed, tag)
inline constexpr std::uint64_t sim_env_verify = 12;   // (seed, metadata hash, tag, call)
inline constexpr std::uint64_t sim_latency_u1 = 21;   // (h, tag, role index): Box-Muller's two uniforms
inline constexpr std::uint64_t sim_latency_u2 = 22;
inline constexpr std::uint64_t sim_response_length = 31;  // (sampling seed, stream, tag)
}  // namespace seed_stream

}  // namespace troupe
