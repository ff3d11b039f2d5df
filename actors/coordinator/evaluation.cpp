// Held-out evaluation with the generators' current weights (greedy, generator 0): per env
// eval.num_prompts prompts of its eval split (seed = index); eval_accuracy, eval_reward_mean, and
// the same per env ("eval_accuracy/<env>"). With rollout.max_turns > 1 each prompt is a full greedy
// episode, as in training: eval_accuracy = episodes solved, eval_reward_mean = episode reward,
// eval_turns_mean = env steps per episode.
#include <algorithm>
#include <map>

#include "coordinator_internal.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

namespace {

struct EnvScore {
  double acc = 0, reward = 0, turns = 0;
};

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

// One verify call per prompt of one greedy completion each.
Task<Result<EnvScore>> single_turn(RunState& s, std::string env, std::vector<EnvObs> got) {
  const int n = static_cast<int>(got.size());
  GenerateReq req;
  std::vector<int> live;  // prompts whose reset worked (a failed one scores 0)
  for (int i = 0; i < n; ++i)
    if (got[i].error.empty()) {
      live.push_back(i);
      req.prompts.push_back(encodable(*s.tokenizer, got[i].text));
      req.prompt_messages.push_back(prompt_messages_of(s, got[i].messages_json));
    }
  EnvScore out;
  if (live.empty()) co_return out;
  TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await generate_greedy(s, req));
  std::vector<Reply<EnvVerifyRep>> ver;
  for (size_t a = 0; a < live.size(); ++a)
    ver.push_back(request<EnvVerifyRep>(s.here, s.env_worker(live[a]),
                                        EnvVerifyReq{env, got[live[a]].metadata_json, {rep.samples[a].text}},
                                        kEnvTimeout));
  for (size_t a = 0; a < live.size(); ++a) {
    auto v = co_await ver[a];
    if (!v.ok() || v->rewards.empty() || !v->errors[0].empty()) continue;  // a failed verify scores 0
    out.acc += v->correct[0] >= 1.0 ? 1.0 : 0.0;
    out.reward += v->rewards[0];
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

// Full episodes, greedy, as training runs them: the context grows by completion + feedback.
Task<Result<EnvScore>> episodes(RunState& s, std::string env, std::vector<EnvObs> got) {
  const int n = static_cast<int>(got.size());
  const int max_turns = s.cfg.rollout.max_turns;
  std::vector<std::string> ctx(n);
  std::vector<double> ep_reward(n, 0.0);
  std::vector<char> done(n, 0), solved(n, 0);
  EnvScore out;  // out.turns: env steps taken, all episodes
  for (int i = 0; i < n; ++i) {
    ctx[i] = encodable(*s.tokenizer, got[i].text);
    if (!got[i].error.empty()) done[i] = 1;  // its reset failed: it scores 0
  }
  TROUPE_CO_ASSIGN_OR_RETURN(EvalChats chats, start_eval_chats(s, got));
  for (int turn = 0; turn < max_turns; ++turn) {
    std::vector<int> active;
    for (int i = 0; i < n; ++i)
      if (!done[i]) active.push_back(i);
    if (active.empty()) break;
    GenerateReq req;
    for (int i : active) {
      if (chats.chats.empty() || turn == 0) req.prompts.push_back(ctx[i]);
      if (!chats.chats.empty() && turn == 0) req.prompt_messages.push_back(prompt_messages_of(s, got[i].messages_json));
      if (!chats.chats.empty() && turn > 0) req.prompt_tokens.push_back(chats.ctx[i]);
    }
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await generate_greedy(s, req));
    std::vector<Reply<EnvObs>> steps;
    for (size_t a = 0; a < active.size(); ++a)
      steps.push_back(request<EnvObs>(s.here, s.env_worker(active[a]),
                                      EnvStepReq{env, eval_id(env, active[a]), rep.samples[a].text},
                                      kEnvTimeout));
    for (size_t a = 0; a < active.size(); ++a) {
      int i = active[a];
      Result<EnvObs> res = co_await steps[a];
      if (!res.ok() || !res->error.empty()) {  // a failed episode scores 0
        done[i] = 1;
        ep_reward[i] = 0;
        continue;
      }
      ep_reward[i] += res->reward;
      out.turns += 1;
      done[i] = res->done || turn + 1 == max_turns;
      if (done[i]) solved[i] = episode_solved(res->components_json, ep_reward[i]) ? 1 : 0;
      else {
        TROUPE_CO_TRY(next_eval_context(s, chats, ctx, i, rep.samples[a], *res));
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    (void)s.here->send(s.env_worker(i), EnvReleaseReq{env, eval_id(env, i)});
    out.acc += solved[i] ? 1.0 : 0.0;
    out.reward += ep_reward[i];
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
  std::map<std::string, std::pair<double, double>> sums;  // name -> (weighted sum, weight)
  for (auto& a : asks) {
    Result<EnvAggregateRep> rep = co_await a;
    std::string error = rep.ok() ? rep->error : rep.error().message;
    json m = rep.ok() ? json::parse(rep->metrics_json, nullptr, false) : json();
    if (error.empty() && !m.is_object()) error = "its metrics are not a JSON object";
    if (!error.empty()) {
      if (s.hooks.log) s.hooks.log("env '" + env + "': eval metrics: " + error);
      continue;
    }
    const double weight = m.value("episodes", 0.0);
    if (weight <= 0) continue;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it->is_number() && it.key() != "episodes") {
        sums[it.key()].first += weight * it->get<double>();
        sums[it.key()].second += weight;
      }
    sums["episodes"].first += weight;
    sums["episodes"].second = 1;
  }
  for (const auto& [name, v] : sums) out["eval_env/" + env + "/" + name] = v.first / v.second;
  co_return Status{};
}

}  // namespace

Task<Result<json>> evaluate(RunState& s) {
  const int n = s.cfg.eval.num_prompts;
  const bool multi = s.cfg.rollout.max_turns > 1;
  json out = json::object();
  double acc_sum = 0, rew_sum = 0, turns_sum = 0;
  int total = 0;
  for (const auto& e : s.cfg.envs) {
    std::vector<Reply<EnvObs>> obs;
    for (int i = 0; i < n; ++i)
      obs.push_back(request<EnvObs>(s.here, s.env_worker(i),
                                    EnvResetReq{e.name, eval_id(e.name, i), static_cast<uint64_t>(i), 1},
                                    kEnvTimeout));
    std::vector<EnvObs> got;
    for (int i = 0; i < n; ++i) {
      Result<EnvObs> got_i = co_await obs[i];
      EnvObs o = settled(std::move(got_i));
      if (!multi) (void)s.here->send(s.env_worker(i), EnvReleaseReq{e.name, eval_id(e.name, i)});
      got.push_back(std::move(o));
    }
    Result<EnvScore> score = EnvScore{};
    if (runs_episodes(s, e.name)) {  // a verifiers env runs its own greedy episodes
      auto sums = co_await served_eval(s, e.name, got);
      if (!sums.ok()) co_return sums.error();
      score = EnvScore{sums->first, sums->second, 0};
    } else if (multi)
      score = co_await episodes(s, e.name, std::move(got));
    else
      score = co_await single_turn(s, e.name, std::move(got));
    if (!score.ok()) co_return score.error();
    if (e.type == EnvType::nemo_gym) TROUPE_CO_TRY(co_await server_metrics(s, e.name, out));
    out["eval_accuracy/" + e.name] = score->acc / n;
    out["eval_reward_mean/" + e.name] = score->reward / n;
    if (multi) out["eval_turns_mean/" + e.name] = score->turns / n;
    acc_sum += score->acc;
    rew_sum += score->reward;
    turns_sum += score->turns;
    total += n;
  }
  out["eval_accuracy"] = acc_sum / std::max(1, total);
  out["eval_reward_mean"] = rew_sum / std::max(1, total);
  out["eval_prompts"] = total;
  if (multi) out["eval_turns_mean"] = turns_sum / std::max(1, total);
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
