// A GRPO step's rollout: prompts drawn by env weight (seeds a pure function of run.seed, step and
// index), G samples per prompt spread over the generators, one verify call per group; with
// grpo.dynamic_sampling more rounds until enough groups have distinct rewards. Every request of a
// stage is sent before the first reply is awaited, so the roles work in parallel.
#include <algorithm>
#include <optional>

#include "coordinator_internal.h"
#include "troupe/learner/advantages.h"

namespace troupe::actors {

namespace coord {

using runtime::Reply;
using runtime::request;

size_t pick_env(const ExperimentConfig& cfg, uint64_t r) {
  double total = 0;
  for (const auto& e : cfg.envs) total += e.weight;
  double x = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * total;
  for (size_t i = 0; i < cfg.envs.size(); ++i) {
    if (x < cfg.envs[i].weight) return i;
    x -= cfg.envs[i].weight;
  }
  return cfg.envs.size() - 1;
}

// Without dynamic sampling: one round of prompts_per_step groups. With it: more rounds (new
// prompts, seeds from (run.seed, round)) until prompts_per_step groups with distinct rewards are
// collected or grpo.max_generation_rounds is reached; every generated group is kept in the
// rollout (for metrics), prepare() picks the first prompts_per_step kept ones.
Task<Result<Rollout>> make_rollout(RunState& s, int64_t step, int64_t k, int64_t version) {
  TROUPE_CO_ASSIGN_OR_RETURN(auto r, co_await make_round(s, step, k, 0, nullptr, version));
  if (!s.cfg.grpo.dynamic_sampling) co_return r;
  int G = s.cfg.rollout.num_generations, P = s.cfg.rollout.prompts_per_step;
  auto kept_of = [&](const Rollout& x) {
    std::vector<float> rw;
    for (auto& g : x.groups)
      for (double v : g.rewards) rw.push_back(static_cast<float>(v));
    std::vector<char> keep(x.groups.size(), 1);
    return learner::dapo_filter_groups(keep, rw, G);
  };
  int kept = kept_of(r);
  while (kept < P && r.rounds < s.cfg.grpo.max_generation_rounds) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto more, co_await make_round(s, step, k, r.rounds, nullptr, version));
    kept += kept_of(more);
    r.rounds += 1;
    r.gen_s += more.gen_s;
    r.env_s += more.env_s;
    r.retries += more.retries;
    r.version_wait_s += more.version_wait_s;
    r.policy_version = std::min(r.policy_version, more.policy_version);
    for (auto& g : more.groups) r.groups.push_back(std::move(g));
  }
  co_return r;
}

namespace {

// The step's prompts: one env reset per group (retried on other env workers; single-turn with a
// fresh seed, so the step's batch stays full), each group's env, seed and prompt. Returns, per
// group, whether its reset failed on every try (the group is lost: its samples score 0).
Task<std::vector<char>> reset_prompts(RunState& s, Rollout& r, int64_t step, int64_t k) {
  const auto& ro = s.cfg.rollout;
  double t_env = mono_seconds();
  int P = ro.prompts_per_step;
  r.groups.resize(P);
  auto episode_id = [&](int i) {
    return "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + i);
  };
  std::vector<Reply<EnvObs>> obs;
  for (int i = 0; i < P; ++i) {
    uint64_t rs = mix_seed(r.seed_base, seed_stream::grpo_prompt, static_cast<uint64_t>(k), static_cast<uint64_t>(i));
    auto& g = r.groups[i];
    g.index = r.index0 + i;
    g.env = s.cfg.envs[pick_env(s.cfg, rs)].name;
    g.seed = mix_seed(rs, seed_stream::env_reset);
    g.draw = s.next_draw(g.env);
    obs.push_back(request<EnvObs>(s.here, s.env_worker(i), EnvResetReq{g.env, episode_id(i), g.seed, 0, g.draw},
                                  kEnvTimeout));
  }
  const int G = ro.num_generations;
  std::vector<char> failed(P, 0);  // no prompt: its reset failed on every try (the group is lost)
  for (int i = 0; i < P; ++i) {
    auto& g = r.groups[i];
    // single-turn: a retry draws a new seed (another prompt), so the step's batch stays full
    const bool fresh_seed = ro.max_turns <= 1;
    Result<EnvObs> first = co_await obs[i];
    const EnvResetReq req{g.env, episode_id(i), g.seed, 0, g.draw};
    ResetOutcome o = co_await reset_retrying(s, first, req, static_cast<size_t>(i), fresh_seed);
    g.draw = o.draw;
    r.retries += o.retries;
    (void)s.here->send(s.env_worker(o.worker), EnvReleaseReq{g.env, o.episode_id});
    g.env_version = o.obs.env_version;
    if (!o.obs.error.empty()) {
      failed[i] = 1;
      g.samples.assign(G, GenSample{});
      g.rewards.assign(G, 0.0);
      g.correct.assign(G, 0.0);
      g.errors.assign(G, o.obs.error);
      g.reasons.assign(G, o.obs.reason);
      g.components.assign(G, "");
      g.metadata = json::object();
      continue;
    }
    g.seed = o.seed;
    g.prompt_text = encodable(*s.tokenizer, o.obs.text);
    g.metadata = json::parse(o.obs.metadata_json, nullptr, false);
    g.messages_json = o.obs.messages_json;
  }
  r.env_s += mono_seconds() - t_env;
  co_return failed;
}

// One part of a round's generation: groups [g0, g1), spread over the generators.
struct Part {
  int g0 = 0, g1 = 0;
  std::vector<std::vector<int>> owned;
  std::vector<std::optional<Reply<GenerateRep>>> gens;  // none where a generator got no group
  std::vector<GenerateReq> reqs;                         // what each was asked (to ask again)
};

// C parts of consecutive groups, each spread over the generators, G copies of each prompt; every
// part is requested at once. Groups with skip[i] set (no prompt, or served) are not generated.
std::vector<Part> request_parts(RunState& s, const Rollout& r, int64_t step, int64_t k, int C,
                                const std::vector<char>& skip, int64_t version) {
  const auto& ro = s.cfg.rollout;
  const int P = ro.prompts_per_step;
  size_t NG = s.peers.generators.size();
  std::vector<Part> parts(C);
  for (int c = 0; c < C; ++c) {
    auto& part = parts[c];
    part.g0 = P * c / C;
    part.g1 = P * (c + 1) / C;
    part.owned.resize(NG);
    // members leaving the job get no more work, nor do members asked for a version older than theirs
    std::vector<size_t> takers;
    for (size_t g = 0; g < NG; ++g)
      if (s.membership.takes(g, version)) takers.push_back(g);
    if (takers.empty()) takers.push_back(0);
    for (int i = part.g0; i < part.g1; ++i)
      if (!skip[i]) part.owned[takers[static_cast<size_t>(i - part.g0) % takers.size()]].push_back(i);
    for (size_t g = 0; g < NG; ++g) {
      part.gens.emplace_back();
      if (part.owned[g].empty()) continue;
      GenerateReq req;
      // One seed per part and a stream per sample numbered across the part: a sample's randoms do
      // not depend on the generator count (with one generator the streams are the prompt indices).
      std::vector<std::int32_t> streams;
      for (int i : part.owned[g]) {
        const std::string messages = prompt_messages_of(s, r.groups[i].messages_json);
        for (int j = 0; j < ro.num_generations; ++j) {
          req.prompts.push_back(r.groups[i].prompt_text);
          req.prompt_messages.push_back(messages);
          streams.push_back((i - part.g0) * ro.num_generations + j);
        }
      }
      req.sampling = {ro.temperature, ro.top_k, ro.top_p, ro.max_response_length,
                      mix_seed(r.seed_base, seed_stream::sampling, static_cast<uint64_t>(k), 1024 * static_cast<uint64_t>(c)),
                      std::move(streams)};
      req.policy_version = version;
      req.step = step;
      s.membership.step = std::max(s.membership.step, step);
      s.pipeline->name_in_flight(s, k, req);
      part.reqs.resize(NG);
      part.reqs[g] = req;
      part.gens.back().emplace(
          request<GenerateRep>(s.here, s.peers.generators[g], std::move(req), kLongTimeout));
    }
  }
  return parts;
}

struct PartSampled {
  int64_t sampled_by = -1;  // the oldest policy version that sampled any of the part's groups (-1: none)
  double version_wait = 0;  // in-flight updates: the slowest generator's wait for versions
};

// A part's samples into its groups, a generator that died replaced by the next live one.
Task<Result<PartSampled>> collect_part(RunState& s, Rollout& r, Part& part) {
  const int G = s.cfg.rollout.num_generations;
  PartSampled out;
  for (size_t g = 0; g < part.gens.size(); ++g) {
    if (!part.gens[g]) continue;
    Result<GenerateRep> got = co_await *part.gens[g];
    if (got.ok()) {
      note_sampled(s, g, got->samples.size(), part.reqs[g].step);
    } else {
      note_failed(s, g);
      got = co_await generation_failover(s, std::move(got), part.reqs[g], g);
    }
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, std::move(got));
    out.sampled_by = out.sampled_by < 0 ? rep.policy_version : std::min(out.sampled_by, rep.policy_version);
    out.version_wait = std::max(out.version_wait, rep.version_wait_s);
    size_t n = 0;
    for (int i : part.owned[g]) {
      r.groups[i].samples.reserve(static_cast<size_t>(G));
      for (int j = 0; j < G; ++j) r.groups[i].samples.push_back(std::move(rep.samples[n++]));
    }
  }
  co_return out;
}

// Scoring: one verify call per group of the part (retried on other env workers).
Task<Status> score_part(RunState& s, Rollout& r, const Part& part, const std::vector<char>& skip) {
  std::vector<std::optional<Reply<EnvVerifyRep>>> ver;
  std::vector<EnvVerifyReq> vreq;
  for (int i = part.g0; i < part.g1; ++i) {
    EnvVerifyReq req{r.groups[i].env, r.groups[i].metadata.dump(), {}};
    for (const auto& x : r.groups[i].samples) req.completions.push_back(x.text);
    vreq.push_back(req);
    ver.emplace_back();
    if (!skip[i]) ver.back().emplace(request<EnvVerifyRep>(s.here, s.env_worker(i), std::move(req), kEnvTimeout));
  }
  // every group's retries start before any is awaited: failed verifies cost one timeout per try, not per group
  std::vector<Result<EnvVerifyRep>> first;
  first.reserve(ver.size());  // (the retries hold references into first and vreq)
  for (int i = part.g0; i < part.g1; ++i) {
    if (skip[i]) {
      first.push_back(Result<EnvVerifyRep>(EnvVerifyRep{}));
      continue;
    }
    Result<EnvVerifyRep> got = co_await *ver[i - part.g0];
    first.push_back(std::move(got));
  }
  std::vector<int> retries(ver.size(), 0);
  std::vector<Task<EnvVerifyRep>> tries(ver.size());
  for (int i = part.g0; i < part.g1; ++i) {
    if (skip[i]) continue;
    const size_t n = static_cast<size_t>(i - part.g0);
    tries[n] = verify_retrying(s, first[n], vreq[n], static_cast<size_t>(i), &retries[n]);
    tries[n].start();
  }
  for (int i = part.g0; i < part.g1; ++i) {
    if (skip[i]) continue;
    const size_t n = static_cast<size_t>(i - part.g0);
    EnvVerifyRep v = co_await tries[n];
    r.retries += retries[n];
    r.groups[i].rewards = std::move(v.rewards);
    r.groups[i].correct = std::move(v.correct);
    r.groups[i].errors = std::move(v.errors);
    r.groups[i].reasons = std::move(v.reasons);
    r.groups[i].components = std::move(v.components_json);
    r.groups[i].infos = std::move(v.infos_json);
    r.groups[i].judge_scorer = v.judge_scorer;
    r.groups[i].reward_model_scorer = v.reward_model_scorer;
  }
  center_reward_model_scores(s, r, part.g0, part.g1, skip);
  co_return Status{};
}

// Part c of C of round r as a rollout of its own (its groups move out of r).
Rollout take_part(Rollout& r, const Part& part, int c, int C, int64_t sampled_by) {
  Rollout out;
  out.policy_version = sampled_by;
  out.sample_version = r.sample_version;
  out.round = r.round;
  out.seed_base = r.seed_base;
  out.index0 = r.index0 + part.g0;
  out.part = c;
  out.parts = C;
  for (int i = part.g0; i < part.g1; ++i) out.groups.push_back(std::move(r.groups[i]));
  return out;
}

}  // namespace

Task<Result<Rollout>> make_round(RunState& s, int64_t step, int64_t k, int round, const PartSink* sink,
                                 int64_t version) {
  const auto& ro = s.cfg.rollout;
  Rollout r;
  r.round = round;
  r.sample_version = version;
  r.seed_base = round == 0 ? static_cast<uint64_t>(s.cfg.run.seed)
                           : mix_seed(static_cast<uint64_t>(s.cfg.run.seed), seed_stream::rollout_round, static_cast<uint64_t>(round));
  r.index0 = static_cast<int64_t>(round) * ro.prompts_per_step;
  if (round == 0) s.note_draws_before(k);
  int P = ro.prompts_per_step;
  // skip: groups not generated below (their prompt failed, or their env runs its episodes)
  std::vector<char> skip = co_await reset_prompts(s, r, step, k);
  // groups whose env runs its episodes itself (type verifiers): done here, skipped below
  std::vector<int> served_groups;
  for (int i = 0; i < P; ++i)
    if (!skip[i] && runs_episodes(s, r.groups[i].env)) {
      skip[i] = 1;
      served_groups.push_back(i);
    }
  int64_t served_version = -1;
  TROUPE_CO_TRY(co_await run_served(s, r, served_groups, step, k, &served_version));
  if (ro.max_turns > 1) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto m, co_await multi_turn(s, std::move(r), step, k));
    TROUPE_CO_TRY(check_env_failures(s, m, step));
    co_return m;
  }
  // generation: C parts (rollout.async_chunks when streaming to a sink, else one), every part
  // requested at once and scored as soon as it is back (the generators go on with the next one)
  const int C = sink ? std::min(ro.async_chunks, P) : 1;
  std::vector<Part> parts = request_parts(s, r, step, k, C, skip, version);
  r.policy_version = served_version;
  const bool any_served = !served_groups.empty();
  const double reset_s = r.env_s;
  int retries_sent = 0;  // streamed: retries already counted in an earlier part
  double t_gen = mono_seconds();
  for (int c = 0; c < C; ++c) {
    TROUPE_CO_ASSIGN_OR_RETURN(const PartSampled got, co_await collect_part(s, r, parts[c]));
    int64_t sampled_by = got.sampled_by;
    if (any_served && sampled_by < 0) sampled_by = served_version;  // a part of served groups only
    if (!any_served || sampled_by >= 0)
      r.policy_version = r.policy_version < 0 ? sampled_by : std::min(r.policy_version, sampled_by);
    const double gen_s = mono_seconds() - t_gen;
    const double t_env = mono_seconds();
    TROUPE_CO_TRY(co_await score_part(s, r, parts[c], skip));
    const double env_s = mono_seconds() - t_env;
    r.gen_s += gen_s;
    r.env_s += env_s;
    r.version_wait_s += got.version_wait;
    t_gen = mono_seconds();
    if (sink) {  // this part's groups move to the learner's side now
      Rollout out = take_part(r, parts[c], c, C, sampled_by);
      out.gen_s = gen_s;
      out.env_s = env_s + (c == 0 ? reset_s : 0.0);  // the resets count with the first part
      out.retries = r.retries - retries_sent;
      retries_sent = r.retries;
      if (auto st = check_env_failures(s, out, step); !st.ok()) co_return st.error();
      (*sink)(std::move(out));
    }
  }
  if (!sink) TROUPE_CO_TRY(check_env_failures(s, r, step));
  co_return r;
}

Task<Result<GenerateRep>> generation_failover(RunState& s, Result<GenerateRep> got, const GenerateReq& req,
                                              size_t g) {
  auto dead = [&] {
    if (got.error().code == ErrorCode::peer_failed && s.generator_alive(g)) {  // its actor stopped
      s.mark_generator_down(g);
    }
    return !s.generator_alive(g);
  };
  while (!got.ok() && dead()) {
    auto next = s.live_generator_from(g + 1);
    for (size_t n = 0; next && !s.membership.takes(*next, req.policy_version) && n < s.peers.generators.size(); ++n)
      next = s.live_generator_from(*next + 1);  // a member that joined after this version cannot sample it
    if (!next) co_return make_error(ErrorCode::peer_failed, got.error().message + "; no generator is left");
    if (s.hooks.log)
      s.hooks.log("generator " + std::to_string(g) + " is down (" + got.error().message + "): its " +
                  std::to_string(std::max(req.prompts.size(), req.prompt_tokens.size())) + " prompts go to generator " +
                  std::to_string(*next));
    g = *next;
    got = co_await request<GenerateRep>(s.here, s.peers.generators[g], req, kLongTimeout);
  }
  co_return got;
}

}  // namespace coord
}  // namespace troupe::actors
