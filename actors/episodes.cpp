// Multi-turn episodes (rollout.max_turns > 1): every sample of a group is its own episode (same
// seed); each turn the generators continue the conversation, the env answers with feedback, until
// done or max_turns. Token in, token out: turn 0's prompt is the env's text (templated and
// tokenized by the generator); every later turn's prompt is the previous context's tokens + the
// tokens sampled in that turn + the tokenized feedback ("\n" + feedback + "\n"), so nothing sampled
// is ever re-tokenized. The training sample is the first prompt + every turn, feedback masked out;
// it equals the last context token for token (unless max_prompt_length cut a context).
#include <algorithm>

#include "coordinator_internal.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

// A finished multi-turn episode is solved when its last step says so ("solved" or "correct"
// component, as guess_number and calculator report), else when its total reward reaches 1.
bool episode_solved(const std::string& components_json, double total_reward) {
  json c = json::parse(components_json, nullptr, false);
  for (const char* key : {"solved", "correct"})
    if (c.is_object() && c.contains(key) && c[key].is_number()) return c[key].get<double>() >= 1.0;
  return total_reward >= 1.0;
}

Status add_turn(Episode& e, const GenSample& s, const Result<EnvObs>& res, int turn, int max_turns,
                const policy::io::Tokenizer& tok) {
  if (turn == 0) {
    e.merged.prompt_tokens = s.prompt_tokens;
    e.first_prompt_len = s.prompt_tokens.size();
  } else if (s.prompt_tokens != e.context) {
    e.exact = false;  // max_prompt_length cut the context: keep only the complete turns
  }
  e.merged.text = s.text;
  e.merged.truncated = s.truncated;
  if (!res.ok()) {
    e.error = res.error().message;
    e.done = true;
    return {};  // a failed episode is not trained on
  }
  e.reward += res->reward;
  e.done = res->done || turn + 1 == max_turns;
  if (e.done) e.solved = episode_solved(res->components_json, e.reward);
  // an EOS ending a turn that the env continues is not part of the next context: drop it
  size_t n_tok = s.tokens.size();
  if (!e.done && n_tok > 0 && s.tokens.back() == tok.eos_id()) --n_tok;
  if (e.exact) {
    e.merged.turn_starts.push_back(static_cast<uint32_t>(e.merged.tokens.size()));
    e.merged.turn_texts.push_back(s.text);
    for (size_t t = 0; t < n_tok; ++t) {
      e.merged.tokens.push_back(s.tokens[t]);
      e.merged.logprobs.push_back(s.logprobs[t]);
      e.merged.mask.push_back(1.0f);
    }
  }
  if (e.done) return {};
  // the next turn sees this turn's tokens as sampled and the env's feedback (mask 0 in training)
  auto fb = tok.encode("\n" + res->text + "\n");
  if (!fb.ok()) return invalid_input("env feedback: " + fb.error().message);
  e.context = s.prompt_tokens;
  e.context.insert(e.context.end(), s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(n_tok));
  e.context.insert(e.context.end(), fb->begin(), fb->end());
  if (e.exact) {
    for (int32_t id : *fb) {
      e.merged.tokens.push_back(id);
      e.merged.logprobs.push_back(0.0f);
      e.merged.mask.push_back(0.0f);
    }
  }
  return {};
}

Task<Result<Rollout>> multi_turn(RunState& s, Rollout r, int64_t step, int64_t k) {
  const auto& ro = s.cfg.rollout;
  int G = ro.num_generations;
  std::vector<Episode> eps;
  double t_env = mono_s();
  std::vector<Reply<EnvObs>> resets;
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    for (int j = 0; j < G; ++j) {
      Episode e;
      e.group = gi;
      e.id = "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + static_cast<int64_t>(gi)) +
             "-" + std::to_string(j);
      e.prompt_text = r.groups[gi].prompt_text;
      resets.push_back(request<EnvObs>(
          s.here, s.env_worker(gi), EnvResetReq{r.groups[gi].env, e.id, r.groups[gi].seed, 0}, kEnvTimeout));
      eps.push_back(std::move(e));
    }
  }
  for (auto& f : resets) TROUPE_CO_TRY(co_await f);
  r.env_s += mono_s() - t_env;
  size_t NG = s.peers.generators.size();
  for (int turn = 0; turn < ro.max_turns; ++turn) {
    std::vector<size_t> active;
    for (size_t i = 0; i < eps.size(); ++i)
      if (!eps[i].done) active.push_back(i);
    if (active.empty()) break;
    double t_gen = mono_s();
    std::vector<Reply<GenerateRep>> gens;
    std::vector<std::vector<size_t>> owned(NG);
    for (size_t n = 0; n < active.size(); ++n) owned[n % NG].push_back(active[n]);
    for (size_t g = 0; g < NG; ++g) {
      GenerateReq req;
      for (size_t i : owned[g]) {
        if (turn == 0) req.prompts.push_back(eps[i].prompt_text);
        else req.prompt_tokens.push_back(eps[i].context);
      }
      req.sampling = {
          ro.temperature, ro.top_k, ro.top_p, ro.max_response_length,
          mix_seed(r.seed_base, 4, static_cast<uint64_t>(k), g * 1024 + static_cast<uint64_t>(turn))};
      gens.push_back(request<GenerateRep>(s.here, s.peers.generators[g], std::move(req), kLongTimeout));
    }
    std::vector<GenSample> out(eps.size());
    for (size_t g = 0; g < NG; ++g) {
      TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await gens[g]);
      if (turn == 0)
        r.policy_version = g == 0 ? rep.policy_version : std::min(r.policy_version, rep.policy_version);
      for (size_t n = 0; n < owned[g].size(); ++n) out[owned[g][n]] = std::move(rep.samples[n]);
    }
    r.gen_s += mono_s() - t_gen;
    t_env = mono_s();
    std::vector<Reply<EnvObs>> steps;
    for (size_t i : active)
      steps.push_back(request<EnvObs>(s.here, s.env_worker(eps[i].group),
                                      EnvStepReq{r.groups[eps[i].group].env, eps[i].id, out[i].text},
                                      kEnvTimeout));
    for (size_t n = 0; n < active.size(); ++n) {
      Result<EnvObs> res = co_await steps[n];
      TROUPE_CO_TRY(add_turn(eps[active[n]], out[active[n]], res, turn, ro.max_turns, *s.tokenizer));
    }
    r.env_s += mono_s() - t_env;
  }
  for (auto& e : eps) {
    (void)s.here->send(s.env_worker(e.group), EnvReleaseReq{r.groups[e.group].env, e.id});
    // a sample must end on a sampled token: drop trailing feedback
    while (!e.merged.mask.empty() && e.merged.mask.back() == 0.0f) {
      e.merged.mask.pop_back();
      e.merged.tokens.pop_back();
      e.merged.logprobs.pop_back();
    }
    auto& g = r.groups[e.group];
    g.samples.push_back(std::move(e.merged));
    g.rewards.push_back(e.error.empty() ? e.reward : 0.0);
    g.correct.push_back(e.error.empty() && e.solved ? 1.0 : 0.0);
    g.errors.push_back(e.error);
  }
  co_return r;
}

}  // namespace troupe::actors::coord
