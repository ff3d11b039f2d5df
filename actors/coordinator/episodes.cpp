// Multi-turn episodes (rollout.max_turns > 1): every sample of a group is its own episode (same
// seed); each turn the generators continue the conversation, the env answers with feedback, until
// done or max_turns. Token in, token out: turn 0's prompt is the env's text or messages (templated
// and tokenized by the generator); every later turn's prompt is the previous context's tokens + the
// tokens sampled in that turn + the env's answer, so nothing sampled is ever re-tokenized. The
// answer: plain format, the tokenized "\n" + feedback + "\n" (a continued turn's EOS dropped);
// rollout.template chat, the chat template's own turns (troupe/actors/chat_turns.h has the rule).
// The training sample is the first prompt + every turn, the env's tokens masked out; it equals the
// last context token for token (unless max_prompt_length cut a context).
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

// The tokens that follow turn `turn`'s sampled ones in the next context (mask 0), and how many of
// the sampled ones stay (*kept).
static Result<std::vector<int32_t>> answer_tokens(Episode& e, const GenSample& s, const EnvObs& res,
                                                  const policy::io::Tokenizer& tok, size_t* kept) {
  if (e.chat) {
    TROUPE_ASSIGN_OR_RETURN(auto fb, feedback_messages(encodable(tok, res.text),
                                                       encodable_messages(tok, res.messages_json), res.info_json));
    TROUPE_ASSIGN_OR_RETURN(ChatTurn t, e.chat->add_turn(tok, s.tokens, fb));
    if (!t.rerendered) ++e.rerender_mismatches;
    *kept = t.kept;
    return std::move(t.appended);
  }
  // an EOS ending a turn that the env continues is not part of the next context: drop it
  *kept = s.tokens.size();
  if (*kept > 0 && s.tokens.back() == tok.eos_id()) --*kept;
  return tok.encode("\n" + encodable(tok, res.text) + "\n");
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
  if (!res.ok() || !res->error.empty()) {
    e.error = res.ok() ? res->error : res.error().message;
    e.reason = res.ok() ? res->reason : settled(res.error()).reason;
    e.done = true;
    return {};  // a failed episode is not trained on
  }
  e.reward += res->reward;
  e.components = res->components_json;
  e.done = res->done || turn + 1 == max_turns;
  if (e.done) e.solved = episode_solved(res->components_json, e.reward);
  size_t n_tok = s.tokens.size();
  std::vector<int32_t> fb;
  if (!e.done) {
    auto got = answer_tokens(e, s, *res, tok, &n_tok);
    if (!got.ok()) return invalid_input("env feedback: " + got.error().message);
    fb = std::move(got).value();
  }
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
  // the next turn sees this turn's tokens as sampled and the env's answer (mask 0 in training)
  e.context = s.prompt_tokens;
  e.context.insert(e.context.end(), s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(n_tok));
  e.context.insert(e.context.end(), fb.begin(), fb.end());
  if (e.exact) {
    for (int32_t id : fb) {
      e.merged.tokens.push_back(id);
      e.merged.logprobs.push_back(0.0f);
      e.merged.mask.push_back(0.0f);
    }
  }
  return {};
}

// A step that failed: the episode is reset on the next env worker (same seed), its earlier turns
// are replayed, and the step is tried again, up to envs[].max_retries times.
Task<EnvObs> step_retrying(RunState& s, Episode& e, const Rollout::Group& g, const std::string& action,
                           const EnvObs& failed, int* retries, int32_t split) {
  const int max_retries = env_spec(s, g.env).max_retries;
  const std::string base_id = e.id;
  EnvObs res = failed;
  for (int a = 1; a <= max_retries && !res.error.empty() && !res.fatal; ++a) {
    ++*retries;
    if (s.hooks.log) s.hooks.log("env '" + g.env + "': " + res.reason + ": " + res.error + "; replaying the episode");
    (void)s.here->send(s.env_worker(e.worker), EnvReleaseReq{g.env, e.id});
    e.worker += 1;
    e.id = base_id + "-s" + std::to_string(a);
    {
      EnvResetReq rq{g.env, e.id, g.seed, split, g.draw};
      Result<EnvObs> got = co_await request<EnvObs>(s.here, s.env_worker(e.worker), std::move(rq), kEnvTimeout);
      res = settled(std::move(got));
    }
    for (size_t t = 0; t <= e.actions.size() && res.error.empty(); ++t) {  // the earlier turns, then this one
      EnvStepReq sq{g.env, e.id, t < e.actions.size() ? e.actions[t] : action};
      Result<EnvObs> got = co_await request<EnvObs>(s.here, s.env_worker(e.worker), std::move(sq), kEnvTimeout);
      res = settled(std::move(got));
    }
  }
  co_return res;
}

namespace {

// rollout.template chat: each live episode's conversation, from the messages its first prompt renders.
Status start_chats(const RunState& s, std::vector<Episode>& eps) {
  TROUPE_ASSIGN_OR_RETURN(ChatFormat f, make_chat_format(*s.tokenizer, s.chat_template));
  for (auto& e : eps) {
    if (e.done) continue;
    TROUPE_ASSIGN_OR_RETURN(auto messages, first_messages(s.cfg.rollout.system_prompt, e.prompt_text, e.messages_json));
    TROUPE_ASSIGN_OR_RETURN(ChatConversation c, ChatConversation::start(f, *s.tokenizer, std::move(messages)));
    e.chat = std::make_shared<ChatConversation>(std::move(c));
  }
  return {};
}

// The episodes of a round's groups, G per group, each reset on its group's env worker (a retry
// elsewhere keeps the seed: every sample of a group is the same prompt); a group whose prompt
// could not be had gives failed episodes. The groups' per-sample lists are cleared for them.
Task<Result<std::vector<Episode>>> start_episodes(RunState& s, Rollout& r, int64_t step) {
  const int G = s.cfg.rollout.num_generations;
  std::vector<Episode> eps;
  double t_env = mono_seconds();
  std::vector<Reply<EnvObs>> resets;
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    for (int j = 0; j < G; ++j) {
      Episode e;
      e.group = gi;
      e.worker = gi;
      e.id = "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + static_cast<int64_t>(gi)) +
             "-" + std::to_string(j);
      e.prompt_text = r.groups[gi].prompt_text;
      e.messages_json = prompt_messages_of(s, r.groups[gi].messages_json);
      if (!r.groups[gi].errors.empty()) {  // the group's prompt could not be had
        e.error = r.groups[gi].errors[0];
        e.reason = r.groups[gi].reasons.empty() ? "env_error" : r.groups[gi].reasons[0];
        e.done = true;
      } else {
        resets.push_back(request<EnvObs>(
            s.here, s.env_worker(gi), EnvResetReq{r.groups[gi].env, e.id, r.groups[gi].seed, 0, r.groups[gi].draw},
            kEnvTimeout));
      }
      eps.push_back(std::move(e));
    }
  }
  for (size_t gi = 0, n = 0; gi < r.groups.size(); ++gi) {
    auto& g = r.groups[gi];
    const bool group_failed = !g.errors.empty();
    g.errors.clear();
    g.reasons.clear();
    g.samples.clear();
    g.rewards.clear();
    g.correct.clear();
    g.components.clear();
    if (group_failed) continue;
    for (int j = 0; j < G; ++j) {
      auto& e = eps[gi * static_cast<size_t>(G) + static_cast<size_t>(j)];
      // every sample of a group is the same prompt: a retry keeps the seed
      Result<EnvObs> first = co_await resets[n++];
      const EnvResetReq req{g.env, e.id, g.seed, 0, g.draw};
      ResetOutcome o = co_await reset_retrying(s, first, req, gi, false);
      r.retries += o.retries;
      e.id = o.episode_id;
      e.worker = o.worker;
      if (!o.obs.error.empty()) {
        e.error = o.obs.error;
        e.reason = o.obs.reason;
        e.done = true;
      }
    }
  }
  r.env_s += mono_seconds() - t_env;
  if (s.cfg.rollout.template_name == PromptTemplate::chat) TROUPE_CO_TRY(start_chats(s, eps));
  co_return eps;
}

// Turn `turn`'s completions of the active episodes (out[i] for episode i), spread over the generators.
Task<Result<std::vector<GenSample>>> generate_turn(RunState& s, Rollout& r, const std::vector<Episode>& eps,
                                                   const std::vector<size_t>& active, int turn, int64_t step,
                                                   int64_t k) {
  const auto& ro = s.cfg.rollout;
  size_t NG = s.peers.generators.size();
  std::vector<Reply<GenerateRep>> gens;
  std::vector<GenerateReq> reqs;  // what each generator was asked (to ask another if it died)
  std::vector<size_t> sent_to;
  std::vector<std::vector<size_t>> owned(NG);
  for (size_t n = 0; n < active.size(); ++n) owned[n % NG].push_back(active[n]);
  for (size_t g = 0; g < NG; ++g) {
    GenerateReq req;
    for (size_t i : owned[g]) {
      if (turn == 0) {
        req.prompts.push_back(eps[i].prompt_text);
        req.prompt_messages.push_back(eps[i].messages_json);
      } else {
        req.prompt_tokens.push_back(eps[i].context);
      }
    }
    req.sampling = {
        ro.temperature, ro.top_k, ro.top_p, ro.max_response_length,
        mix_seed(r.seed_base, seed_stream::turn_sampling, static_cast<uint64_t>(k), g * 1024 + static_cast<uint64_t>(turn)), {}};
    req.policy_version = r.sample_version;
    req.step = step;
    reqs.push_back(req);
    // (a dead generator's turn goes to a live one: the seed is in the request, so the samples are the same)
    const size_t to = s.live_generator_from(g).value_or(g);
    sent_to.push_back(to);
    gens.push_back(request<GenerateRep>(s.here, s.peers.generators[to], std::move(req), kLongTimeout));
  }
  std::vector<GenSample> out(eps.size());
  for (size_t g = 0; g < NG; ++g) {
    Result<GenerateRep> got = co_await gens[g];
    if (!got.ok()) got = co_await generation_failover(s, std::move(got), reqs[g], sent_to[g]);
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, std::move(got));
    if (turn == 0)
      r.policy_version = g == 0 ? rep.policy_version : std::min(r.policy_version, rep.policy_version);
    for (size_t n = 0; n < owned[g].size(); ++n) out[owned[g][n]] = std::move(rep.samples[n]);
  }
  co_return out;
}

// The env's side of turn `turn`: each active episode's completion out[i] stepped (a failed step
// retried on another worker), the turn recorded and its tokens added to the episode.
Task<Status> step_turn(RunState& s, Rollout& r, std::vector<Episode>& eps, const std::vector<size_t>& active,
                       std::vector<GenSample>& out, int turn, double generate_s) {
  const int max_turns = s.cfg.rollout.max_turns;
  std::vector<Reply<EnvObs>> steps;
  for (size_t i : active)
    steps.push_back(request<EnvObs>(s.here, s.env_worker(eps[i].worker),
                                    EnvStepReq{r.groups[eps[i].group].env, eps[i].id, out[i].text},
                                    kEnvTimeout));
  for (size_t n = 0; n < active.size(); ++n) {
    auto& e = eps[active[n]];
    const double t_step = mono_seconds();
    Result<EnvObs> got = co_await steps[n];
    EnvObs res = settled(std::move(got));
    if (!res.error.empty() && !res.fatal) {
      const EnvObs failed = res;
      res = co_await step_retrying(s, e, r.groups[e.group], out[active[n]].text, failed, &r.retries);
    }
    TurnInfo ti;
    ti.observation = turn == 0 ? e.prompt_text : e.feedback;
    ti.reward = res.reward;
    ti.info_json = res.info_json;
    ti.env_s = mono_seconds() - t_step;
    ti.generate_s = generate_s;
    e.feedback = res.text;
    e.actions.push_back(out[active[n]].text);
    TROUPE_CO_TRY(add_turn(e, out[active[n]], Result<EnvObs>(std::move(res)), turn, max_turns, *s.tokenizer));
    e.turns.push_back(std::move(ti));
  }
  co_return Status{};
}

// Finished episodes as their groups' samples (released on their env workers).
void close_episodes(RunState& s, Rollout& r, std::vector<Episode>& eps) {
  for (auto& e : eps) {
    (void)s.here->send(s.env_worker(e.worker), EnvReleaseReq{r.groups[e.group].env, e.id});
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
    g.reasons.push_back(e.error.empty() ? std::string() : e.reason.empty() ? "env_error" : e.reason);
    g.components.push_back(e.error.empty() ? e.components : std::string());
    g.turns.push_back(std::move(e.turns));
  }
}

}  // namespace

Task<Result<Rollout>> multi_turn(RunState& s, Rollout r, int64_t step, int64_t k) {
  TROUPE_CO_ASSIGN_OR_RETURN(std::vector<Episode> eps, co_await start_episodes(s, r, step));
  for (int turn = 0; turn < s.cfg.rollout.max_turns; ++turn) {
    std::vector<size_t> active;
    for (size_t i = 0; i < eps.size(); ++i)
      if (!eps[i].done) active.push_back(i);
    if (active.empty()) break;
    double t_gen = mono_seconds();
    TROUPE_CO_ASSIGN_OR_RETURN(auto out, co_await generate_turn(s, r, eps, active, turn, step, k));
    r.gen_s += mono_seconds() - t_gen;
    double t_env = mono_seconds();
    const double generate_s = mono_seconds() - t_gen;
    TROUPE_CO_TRY(co_await step_turn(s, r, eps, active, out, turn, generate_s));
    r.env_s += mono_seconds() - t_env;
  }
  int mismatches = 0, turns = 0;
  for (const auto& e : eps) {
    mismatches += e.rerender_mismatches;
    turns += static_cast<int>(e.turns.size());
  }
  if (mismatches > 0 && s.hooks.log)
    s.hooks.log("step " + std::to_string(step) + ": " + std::to_string(mismatches) + " of " + std::to_string(turns) +
                " chat turns: the chat template renders the earlier turns otherwise than they were sampled, so "
                "the env's answer followed the template's turn after an assistant message instead of a re-render "
                "(rule: actors/README.md, multi-turn chat)");
  close_episodes(s, r, eps);
  co_return r;
}

}  // namespace troupe::actors::coord
