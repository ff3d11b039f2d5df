// Held-out evaluation with the generators' current weights (greedy, generator 0): per env
// eval.num_prompts prompts of its eval split (seed = index); eval_accuracy, eval_reward_mean, and
// the same per env ("eval_accuracy/<env>"). With rollout.max_turns > 1 each prompt is a full greedy
// episode, as in training: eval_accuracy = episodes solved, eval_reward_mean = episode reward,
// eval_turns_mean = env steps per episode. A failed reset, step or verify is retried on the next
// env workers as in training (envs[].max_retries); an episode that still fails is counted per reason
// (eval_env_failures/<reason>, eval_env_retries) and left out of the means' denominators; more than
// envs[].max_failure_frac of an env's eval episodes failing stops the run (exit 3), as in training.
#include <algorithm>
#include <map>

#include "coordinator_internal.h"
#include "troupe/envs/eval_metrics_mean.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

namespace {

GenSampling greedy(const ExperimentConfig& cfg) {
  return {0.0f, 0, 1.0f, cfg.rollout.max_response_length, 0, {}};
}

std::string eval_id(const std::string& env, int i) { return "eval-" + env + "-" + std::to_string(i); }

// req's prompts completed greedily by generator 0 (the next live one when it is down).
Task<Result<GenerateRep>> generate_greedy(RunState& s, GenerateReq& req) {
  req.sampling = greedy(s.cfg);
  const size_t g = s.live_generator_from(0).value_or(0);
  Result<GenerateRep> gen = co_await request<GenerateRep>(s.here, s.peers.generators[g], req, kLongTimeout);
  if (!gen.ok()) gen = co_await generation_failover(s, std::move(gen), req, g);
  co_return gen;
}

// Each eval prompt's reset on env worker i, a failed one retried on the next workers (same seed:
// the same prompt), all at once.
Task<std::vector<ResetOutcome>> eval_resets(RunState& s, std::string env, int n) {
  std::vector<EnvResetReq> reqs;
  std::vector<Reply<EnvObs>> obs;
  for (int i = 0; i < n; ++i) {
    reqs.push_back(EnvResetReq{env, eval_id(env, i), static_cast<uint64_t>(i), 1});
    obs.push_back(request<EnvObs>(s.here, s.env_worker(i), reqs.back(), kEnvTimeout));
  }
  std::vector<Result<EnvObs>> first;
  first.reserve(static_cast<size_t>(n));  // (the retries hold references into reqs and first)
  for (int i = 0; i < n; ++i) first.push_back(co_await obs[i]);
  std::vector<Task<ResetOutcome>> tries;
  for (int i = 0; i < n; ++i) {
    tries.push_back(reset_retrying(s, first[i], reqs[i], static_cast<size_t>(i), false));
    tries.back().start();
  }
  std::vector<ResetOutcome> out;
  for (auto& t : tries) out.push_back(co_await t);
  co_return out;
}

// One verify call per prompt of one greedy completion each (a failed one retried, all at once).
Task<Result<EvalScore>> single_turn(RunState& s, std::string env, std::vector<ResetOutcome> got) {
  const int n = static_cast<int>(got.size());
  GenerateReq req;
  std::vector<int> live;  // prompts whose reset worked
  EvalScore out;
  for (int i = 0; i < n; ++i)
    if (got[i].obs.error.empty()) {
      live.push_back(i);
      req.prompts.push_back(encodable(*s.tokenizer, got[i].obs.text));
      req.prompt_messages.push_back(prompt_messages_of(s, got[i].obs.messages_json));
    } else {
      out.fails.add(got[i].obs.error, got[i].obs.reason);
    }
  if (live.empty()) co_return out;
  TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await generate_greedy(s, req));
  std::vector<EnvVerifyReq> vreqs;
  std::vector<Reply<EnvVerifyRep>> ver;
  for (size_t a = 0; a < live.size(); ++a) {
    const auto& g = got[live[a]];
    vreqs.push_back(EnvVerifyReq{env, g.obs.metadata_json, {rep.samples[a].text}});
    ver.push_back(request<EnvVerifyRep>(s.here, s.env_worker(g.worker), vreqs.back(), kEnvTimeout));
  }
  std::vector<Result<EnvVerifyRep>> first;
  first.reserve(live.size());  // (the retries hold references into vreqs and first)
  for (auto& v : ver) {
    Result<EnvVerifyRep> r = co_await v;
    if (r.ok() && (r->rewards.size() != 1 || r->correct.size() != 1 || r->errors.size() != 1))
      r = Error{ErrorCode::internal, "verify reply has the wrong size"};
    first.push_back(std::move(r));
  }
  std::vector<int> retries(live.size(), 0);
  std::vector<Task<EnvVerifyRep>> tries;
  for (size_t a = 0; a < live.size(); ++a) {
    tries.push_back(verify_retrying(s, first[a], vreqs[a], got[live[a]].worker, &retries[a]));
    tries.back().start();
  }
  for (size_t a = 0; a < live.size(); ++a) {
    EnvVerifyRep v = co_await tries[a];
    out.retries += retries[a];
    if (!v.errors[0].empty()) {
      out.fails.add(v.errors[0], v.reasons[0]);
      continue;
    }
    out.fails.add("", "");
    out.acc += v.correct[0] >= 1.0 ? 1.0 : 0.0;
    out.reward += v.rewards[0];
  }
  co_return out;
}

// The prompts of an eval turn: the episodes' texts (plain: the whole conversation as text, as
// before token-in/token-out training existed) or, with rollout.template chat, their first prompts'
// messages, then their contexts' tokens (training's rule, chat_turns.h).
struct EvalChats {
  std::vector<std::shared_ptr<ChatConversation>> chats;  // empty under plain
  std::vector<std::vector<int32_t>> ctx;
};

Result<EvalChats> start_eval_chats(const RunState& s, const std::vector<EnvObs>& got) {
  EvalChats c;
  if (s.cfg.rollout.template_name != PromptTemplate::chat) return c;
  TROUPE_ASSIGN_OR_RETURN(ChatFormat f, make_chat_format(*s.tokenizer, s.chat_template));
  for (const auto& o : got) {
    TROUPE_ASSIGN_OR_RETURN(auto m, first_messages(s.cfg.rollout.system_prompt, encodable(*s.tokenizer, o.text),
                                                   prompt_messages_of(s, o.messages_json)));
    TROUPE_ASSIGN_OR_RETURN(ChatConversation conv, ChatConversation::start(f, *s.tokenizer, std::move(m)));
    c.chats.push_back(std::make_shared<ChatConversation>(std::move(conv)));
  }
  c.ctx.resize(got.size());
  return c;
}

// Episode i's next context after its greedy turn `sample` and the env's answer `res`.
Status next_eval_context(const RunState& s, EvalChats& c, std::vector<std::string>& ctx, int i, const GenSample& sample,
                         const EnvObs& res) {
  const auto& tok = *s.tokenizer;
  if (c.chats.empty()) {
    ctx[i] += sample.text + "\n" + encodable(tok, res.text) + "\n";
    return {};
  }
  TROUPE_ASSIGN_OR_RETURN(auto fb, feedback_messages(encodable(tok, res.text), encodable_messages(tok, res.messages_json),
                                                     res.info_json));
  TROUPE_ASSIGN_OR_RETURN(ChatTurn t, c.chats[i]->add_turn(tok, sample.tokens, fb));
  c.ctx[i] = sample.prompt_tokens;
  c.ctx[i].insert(c.ctx[i].end(), sample.tokens.begin(), sample.tokens.begin() + static_cast<std::ptrdiff_t>(t.kept));
  c.ctx[i].insert(c.ctx[i].end(), t.appended.begin(), t.appended.end());
  return {};
}

// Eval turn `turn`'s env side: each active episode's completion stepped, a failed step retried as
// training does (the episode reset on the next env worker, its turns replayed), one replay after
// another as in training: a replay that crashes a worker must not take other episodes' replays with it.
Task<std::vector<EnvObs>> eval_steps(RunState& s, const std::string& env, std::vector<Episode>& eps,
                                     const std::vector<Rollout::Group>& groups, const std::vector<int>& active,
                                     const GenerateRep& rep, int* retries) {
  std::vector<Reply<EnvObs>> steps;
  for (size_t a = 0; a < active.size(); ++a) {
    const auto& e = eps[static_cast<size_t>(active[a])];
    steps.push_back(request<EnvObs>(s.here, s.env_worker(e.worker), EnvStepReq{env, e.id, rep.samples[a].text},
                                    kEnvTimeout));
  }
  std::vector<EnvObs> res;
  for (auto& st : steps) {
    Result<EnvObs> got = co_await st;
    res.push_back(settled(std::move(got)));
  }
  for (size_t a = 0; a < active.size(); ++a) {
    const auto i = static_cast<size_t>(active[a]);
    if (!res[a].error.empty() && !res[a].fatal) {
      const EnvObs failed = res[a];
      res[a] = co_await step_retrying(s, eps[i], groups[i], rep.samples[a].text, failed, retries, 1);
    }
    eps[i].actions.push_back(rep.samples[a].text);
  }
  co_return res;
}

// Full episodes, greedy, as training runs them: the context grows by completion + feedback.
Task<Result<EvalScore>> episodes(RunState& s, std::string env, std::vector<ResetOutcome> got) {
  const int n = static_cast<int>(got.size());
  const int max_turns = s.cfg.rollout.max_turns;
  std::vector<std::string> ctx(n);
  std::vector<double> ep_reward(n, 0.0), ep_turns(n, 0.0);
  std::vector<char> done(n, 0), solved(n, 0);
  std::vector<Episode> eps(static_cast<size_t>(n));
  std::vector<Rollout::Group> groups(static_cast<size_t>(n));  // what a retry resets: env, seed, draw
  std::vector<EnvObs> first;
  EvalScore out;  // out.turns: env steps taken, all scored episodes
  for (int i = 0; i < n; ++i) {
    ctx[i] = encodable(*s.tokenizer, got[i].obs.text);
    eps[i].id = got[i].episode_id;
    eps[i].worker = got[i].worker;
    groups[i].env = env;
    groups[i].seed = got[i].seed;
    groups[i].draw = got[i].draw;
    if (!got[i].obs.error.empty()) {  // its reset failed on every try
      done[i] = 1;
      eps[i].error = got[i].obs.error;
      eps[i].reason = got[i].obs.reason;
    }
    first.push_back(got[i].obs);
  }
  TROUPE_CO_ASSIGN_OR_RETURN(EvalChats chats, start_eval_chats(s, first));
  for (int turn = 0; turn < max_turns; ++turn) {
    std::vector<int> active;
    for (int i = 0; i < n; ++i)
      if (!done[i]) active.push_back(i);
    if (active.empty()) break;
    GenerateReq req;
    for (int i : active) {
      if (chats.chats.empty() || turn == 0) req.prompts.push_back(ctx[i]);
      if (!chats.chats.empty() && turn == 0) req.prompt_messages.push_back(prompt_messages_of(s, first[i].messages_json));
      if (!chats.chats.empty() && turn > 0) req.prompt_tokens.push_back(chats.ctx[i]);
    }
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await generate_greedy(s, req));
    std::vector<EnvObs> res = co_await eval_steps(s, env, eps, groups, active, rep, &out.retries);
    for (size_t a = 0; a < active.size(); ++a) {
      int i = active[a];
      if (!res[a].error.empty()) {  // it failed on every try
        done[i] = 1;
        eps[i].error = res[a].error;
        eps[i].reason = res[a].reason;
        continue;
      }
      ep_reward[i] += res[a].reward;
      ep_turns[i] += 1;
      done[i] = res[a].done || turn + 1 == max_turns;
      if (done[i]) solved[i] = episode_solved(res[a].components_json, ep_reward[i]) ? 1 : 0;
      else {
        TROUPE_CO_TRY(next_eval_context(s, chats, ctx, i, rep.samples[a], res[a]));
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    (void)s.here->send(s.env_worker(eps[i].worker), EnvReleaseReq{env, eps[i].id});
    out.fails.add(eps[i].error, eps[i].reason);
    if (!eps[i].error.empty()) continue;
    out.acc += solved[i] ? 1.0 : 0.0;
    out.reward += ep_reward[i];
    out.turns += ep_turns[i];
  }
  co_return out;
}

// The env's own eval metrics from every env worker (a NeMo Gym server's /aggregate_metrics over
// the episodes just evaluated), as eval_env/<env>/<name>; with several workers, each name is the
// mean of theirs weighted by the episodes each one scored. A worker that cannot aggregate is logged.
Task<Status> server_metrics(RunState& s, std::string env, json& out) {
  std::vector<Reply<EnvAggregateRep>> asks;
  for (size_t w = 0; w < s.peers.env_workers.size(); ++w)
    asks.push_back(request<EnvAggregateRep>(s.here, s.peers.env_workers[w], EnvAggregateReq{env}, kEnvTimeout));
  envs::EvalMetricsMean mean;
  for (auto& a : asks) {
    Result<EnvAggregateRep> rep = co_await a;
    std::string error = rep.ok() ? rep->error : rep.error().message;
    json m = rep.ok() ? json::parse(rep->metrics_json, nullptr, false) : json();
    if (error.empty() && !m.is_object()) error = "its metrics are not a JSON object";
    if (!error.empty()) {
      if (s.hooks.log) s.hooks.log("env '" + env + "': eval metrics: " + error);
      continue;
    }
    mean.add(m);
  }
  mean.write(out, "eval_env/" + env + "/");
  co_return Status{};
}

}  // namespace

namespace {

// The eval row's failure keys (only when non-zero, so a run without faults has none of them).
void put_failures(json& out, const EnvFailureCount& fails, int retries) {
  if (fails.failed > 0) out["eval_env_failures"] = fails.failed;
  for (const auto& [reason, k] : fails.reasons) out["eval_env_failures/" + reason] = k;
  if (retries > 0) out["eval_env_retries"] = retries;
}

}  // namespace

Task<Result<json>> evaluate(RunState& s) {
  const int n = s.cfg.eval.num_prompts;
  const bool multi = s.cfg.rollout.max_turns > 1;
  json out = json::object();
  double acc_sum = 0, rew_sum = 0, turns_sum = 0;
  int total = 0, scored_all = 0, retries = 0;
  EnvFailureCount fails;  // all envs
  for (const auto& e : s.cfg.envs) {
    std::vector<ResetOutcome> got = co_await eval_resets(s, e.name, n);
    int reset_retries = 0;
    for (const auto& o : got) {
      reset_retries += o.retries;
      if (!multi) (void)s.here->send(s.env_worker(o.worker), EnvReleaseReq{e.name, o.episode_id});
    }
    Result<EvalScore> score = EvalScore{};
    if (runs_episodes(s, e.name))  // a verifiers env runs its own greedy episodes
      score = co_await served_eval(s, e.name, got);
    else if (multi)
      score = co_await episodes(s, e.name, std::move(got));
    else
      score = co_await single_turn(s, e.name, std::move(got));
    if (!score.ok()) co_return score.error();
    score->retries += reset_retries;
    TROUPE_CO_TRY(check_failure_bound(s, e.name, score->fails, "the eval at step " + std::to_string(s.step)));
    if (e.type == EnvType::nemo_gym) TROUPE_CO_TRY(co_await server_metrics(s, e.name, out));
    const int scored = std::max(1, score->fails.total - score->fails.failed);  // failed episodes are left out
    out["eval_accuracy/" + e.name] = score->acc / scored;
    out["eval_reward_mean/" + e.name] = score->reward / scored;
    if (multi) out["eval_turns_mean/" + e.name] = score->turns / scored;
    acc_sum += score->acc;
    rew_sum += score->reward;
    turns_sum += score->turns;
    total += n;
    scored_all += score->fails.total - score->fails.failed;
    retries += score->retries;
    fails.failed += score->fails.failed;
    for (const auto& [reason, k] : score->fails.reasons) fails.reasons[reason] += k;
  }
  out["eval_accuracy"] = acc_sum / std::max(1, scored_all);
  out["eval_reward_mean"] = rew_sum / std::max(1, scored_all);
  out["eval_prompts"] = total;
  if (multi) out["eval_turns_mean"] = turns_sum / std::max(1, scored_all);
  put_failures(out, fails, retries);
  co_return out;
}

Task<Status> eval_and_log(RunState& s, std::string phase) {
  TROUPE_CO_ASSIGN_OR_RETURN(auto ev, co_await evaluate(s));
  ev["step"] = s.step;
  ev["phase"] = phase;
  ev["policy_version"] = s.version;
  ev["wall_s"] = s.now_s();
  s.last_eval = ev;
  s.last_eval_step = s.step;
  co_return s.emit(ev);
}

}  // namespace troupe::actors::coord
