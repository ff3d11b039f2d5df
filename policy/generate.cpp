// Model::generate: KV-cache sampling of a batch of prompts, driven through DecodeSlots (troupe's one
// decode loop, decode_slots.cpp): every prompt in its own slot, all prefilled in one packed pass,
// then one decode step per token until each sequence stops or reaches max_new_tokens.
// Invariant: what it samples depends only on the model, the prompts and the SamplingParams.
#include <algorithm>
#include <cmath>
#include <string>

#include "model_impl.h"
#include "sampling_checks.h"
#include "troupe/policy/decode_slots.h"

namespace troupe::policy {

namespace {

// The checks of generate's inputs (sampling parameters, streams, prompts), in the order they are
// reported; the longest prompt when they pass.
Result<int> check_generate_inputs(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sp, int V) {
  TROUPE_TRY(check_sampling(sp.temperature, sp.top_k, sp.top_p));
  if (sp.max_new_tokens < 0)
    return invalid_input("sampling: max_new_tokens must be >= 0, got " + std::to_string(sp.max_new_tokens));
  if (!sp.streams.empty() && sp.streams.size() != prompts.size())
    return invalid_input("sampling: " + std::to_string(sp.streams.size()) + " streams for " +
                         std::to_string(prompts.size()) + " prompts");
  for (int32_t s : sp.streams)
    if (s < 0) return invalid_input("sampling: a stream must be >= 0, got " + std::to_string(s));
  int max_prompt = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) return invalid_input("sampling: prompt " + std::to_string(b) + " is empty");
    for (size_t i = 0; i < prompts[b].size(); ++i)
      if (prompts[b][i] < 0 || prompts[b][i] >= V)
        return invalid_input("sampling: prompt " + std::to_string(b) + " token " + std::to_string(i) + " = " +
                             std::to_string(prompts[b][i]) + " is outside the vocabulary [0, " + std::to_string(V) +
                             ")");
    max_prompt = std::max(max_prompt, static_cast<int>(prompts[b].size()));
  }
  return max_prompt;
}

}  // namespace

Result<std::vector<Generation>> Model::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                const SamplingParams& sp) {
  const OpScopes scopes(impl_->cfg);
  if (impl_->sliced()) return invalid_input("policy.moe.expert_parallel: a model holding one block of the experts does not generate");
  TROUPE_ASSIGN_OR_RETURN(const int max_prompt, check_generate_inputs(prompts, sp, impl_->V));
  const int B = static_cast<int>(prompts.size());
  std::vector<Generation> out(B);
  if (B == 0 || sp.max_new_tokens == 0) return out;
  int prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int>(p.size());
  // Every prompt prefilled at once; one activation layout for the whole call (as many rows as the
  // prefill or the batch, the longest prompt); the learner's log-probs under batch_invariant.
  DecodeOptions o;
  o.prefill_tokens = prompt_tokens;
  o.record_experts = true;
  o.learner_logprobs = true;
  o.arena_rows = std::max(prompt_tokens, B);
  o.arena_seqlen = max_prompt;
  TROUPE_ASSIGN_OR_RETURN(auto slots, DecodeSlots::create(*this, B, max_prompt + sp.max_new_tokens, o));
  std::vector<int> prompt_of(B);  // slot -> prompt
  for (int b = 0; b < B; ++b) {
    SlotSampling ss;
    ss.temperature = sp.temperature;
    ss.top_k = sp.top_k;
    ss.top_p = sp.top_p;
    ss.seed = sp.seed;
    ss.stream = sp.streams.empty() ? b : sp.streams[b];
    TROUPE_ASSIGN_OR_RETURN(const int slot, slots->add(prompts[b], ss));
    prompt_of[slot] = b;
    out[b].tokens.reserve(sp.max_new_tokens);
    out[b].logprobs.reserve(sp.max_new_tokens);
  }
  for (int step = 0;; ++step) {
    if (step > 0 && sp.before_decode_step) TROUPE_TRY(sp.before_decode_step(step));
    TROUPE_ASSIGN_OR_RETURN(std::vector<SlotToken> tokens, slots->step());
    for (SlotToken& t : tokens) {
      Generation& g = out[prompt_of[t.slot]];
      g.tokens.push_back(t.token);
      g.logprobs.push_back(t.logprob);
      g.experts.insert(g.experts.end(), t.experts.begin(), t.experts.end());
      g.stopped = std::find(sp.stop_tokens.begin(), sp.stop_tokens.end(), t.token) != sp.stop_tokens.end();
      if (g.stopped || static_cast<int>(g.tokens.size()) >= sp.max_new_tokens) slots->remove(t.slot);
    }
    if (slots->occupied() == 0) break;
  }
  return out;
}

}  // namespace troupe::policy
