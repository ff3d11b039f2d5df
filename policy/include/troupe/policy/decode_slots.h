// Continuous-batching KV-cache sampling (policy/decode_slots.cpp): a fixed number of sequence
// slots over one KV cache. Sequences join (their prompt is prefilled) and leave between steps;
// each step() samples one token for every sequence in a slot, all of them in one batched pass.
// Not thread-safe: one caller (the serving engine's compute thread) at a time, and nothing else
// may use the Model while a DecodeSlots over it is stepping.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::policy {

// Constrained decoding of one sequence: before each of its tokens is drawn, mask() sets the logits
// of the tokens it disallows to -inf (a host copy of the whole vocabulary's logits row); accept()
// is then told the token drawn. It must leave at least one token allowed. Called on the stepping
// thread only.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void mask(float* logits, int vocab) = 0;
  virtual void accept(int32_t token) = 0;
};

// How one sequence is sampled. The RNG stream is the one Model::generate gives prompt `stream` of
// a batch sampled with `seed`, so a sequence alone in the slots samples what generate samples.
struct SlotSampling {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  int stream = 0;
  int top_logprobs = 0;      // how many of the most likely tokens to report with each sampled one
  // Null: unconstrained. Else every token is drawn from the masked logits (its log-prob is that of
  // the masked distribution); the other sequences of the step sample exactly as without it.
  std::shared_ptr<TokenConstraint> constraint = nullptr;
  // The served adapter (Model::add_served_adapter) the sequence runs with; 0 = the base alone.
  int adapter = 0;
};

// One sampled token of the sequence in `slot`.
struct SlotToken {
  int slot = -1;
  int32_t token = -1;
  float logprob = 0;  // log softmax(logits / temperature) of the token (temperature 1 when greedy)
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs most likely (id, logprob), best first
  // With DecodeOptions::record_experts on a MoE model: (Model::routing_width()) the top-k expert ids
  // of every MoE layer at the position whose output sampled the token (as Generation::experts).
  std::vector<int32_t> experts;
};

// How the slots run beyond their number and context. The serving engine keeps the defaults;
// Model::generate (policy/generate.cpp) sets the rest, which is how it has always sampled.
struct DecodeOptions {
  int prefill_tokens = 4096;      // most prompt tokens prefilled in one step (at least one prompt always is)
  bool record_experts = false;    // fill SlotToken::experts
  // Under batch_invariant, SlotToken::logprob is the learner's log-softmax of the token (the chunked
  // head forward_train runs) instead of the sampler's double-precision one.
  bool learner_logprobs = false;
  // Every pass lays its activation arena out for at least arena_rows rows and arena_seqlen-token
  // prompts (one layout for all steps); 0 = each pass's own rows and longest prompt.
  int arena_rows = 0, arena_seqlen = 0;
};

class DecodeSlots {
 public:
  // slots sequences of up to `context` tokens (prompt + completion) each; the KV cache is
  // allocated here, once. prefill_tokens: most prompt tokens prefilled in one step (at least one
  // prompt always is).
  static Result<std::unique_ptr<DecodeSlots>> create(Model& model, int slots, int context, int prefill_tokens = 4096);
  static Result<std::unique_ptr<DecodeSlots>> create(Model& model, int slots, int context, const DecodeOptions& options);
  ~DecodeSlots();

  int slots() const;
  int context() const;
  int free_slots() const;
  int occupied() const;  // sequences in slots (prefilled or waiting for their prefill)

  // Claims a free slot for a prompt (1 .. context-1 tokens, each in the vocabulary); its prefill
  // runs in a later step(). Errors: no free slot, bad prompt, bad sampling parameters.
  Result<int> add(const std::vector<int32_t>& prompt, const SlotSampling& sampling);
  // Frees a slot (its sequence is dropped; the token last sampled for it is never fed).
  void remove(int slot);
  // Remaining tokens the slot's sequence may still sample before its context is full.
  int room(int slot) const;

  // Prefills the waiting prompts (up to prefill_tokens), feeds every other sequence the token
  // sampled for it last, and samples one new token per sequence that ran. A sequence whose context
  // is full is not run (the caller removes it; room() is 0).
  Result<std::vector<SlotToken>> step();

  struct State;

 private:
  explicit DecodeSlots(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace troupe::policy
