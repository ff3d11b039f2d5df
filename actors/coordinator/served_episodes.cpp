// Episodes an env runs itself (envs of type verifiers): every sample of a group is one episode,
// sent to an env worker as EnvRunReq with the base URL of a generator's rollout.serve endpoint and
// the model name "episodes/EPISODE_ID", which ties each request to the episode (one endpoint
// config for all episodes: the env server keeps an HTTP client per distinct config). The env
// calls the model there for every turn; the
// generator records each request token for token, and once the env answers with the reward the
// coordinator takes the episode's recorded turns (ServedTurnsReq) and builds its training samples.
// A turn whose prompt extends the previous context token for token continues the same sample (the
// tokens in between, the env's side, get mask 0 and log-prob 0); any other turn starts a sample of
// its own, trained with the episode's advantage. A failed run is retried on the next env worker
// (new episode id; what the failed attempt served is dropped).
#include <algorithm>
#include <optional>
#include <utility>

#include "coordinator_internal.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

bool runs_episodes(const RunState& s, const std::string& env) { return env_spec(s, env).type == EnvType::verifiers; }

namespace {

// Each generator's endpoint, asked once per run.
Task<Status> ensure_serve_urls(RunState& s) {
  if (s.serve_urls.size() == s.peers.generators.size()) co_return Status{};
  std::vector<Reply<ServeAddressRep>> asks;
  for (const auto& g : s.peers.generators)
    asks.push_back(request<ServeAddressRep>(s.here, g, ServeAddressReq{}, kEnvTimeout));
  std::vector<std::string> urls;
  for (size_t g = 0; g < asks.size(); ++g) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await asks[g]);
    if (rep.url.empty())
      co_return invalid_input("generator" + std::to_string(g) +
                              " serves no endpoint: envs of type verifiers need rollout.serve (e.g. 127.0.0.1:0)");
    urls.push_back(rep.url);
  }
  s.serve_urls = std::move(urls);
  co_return Status{};
}

}  // namespace

std::vector<GenSample> samples_of_turns(const std::vector<ServedTurn>& turns, int64_t* version) {
  std::vector<GenSample> out;
  std::vector<int32_t> context;  // the current sample's prompt + everything after it
  for (const auto& t : turns) {
    if (t.tokens.empty()) continue;
    *version = *version < 0 ? t.policy_version : std::min(*version, t.policy_version);
    const bool extends = !out.empty() && t.prompt_tokens.size() >= context.size() &&
                         std::equal(context.begin(), context.end(), t.prompt_tokens.begin());
    if (!extends) {
      GenSample x;
      x.prompt_tokens = t.prompt_tokens;
      out.push_back(std::move(x));
      context = t.prompt_tokens;
    }
    GenSample& x = out.back();
    if (extends) {
      x.mask.resize(x.tokens.size(), 1.0f);
      for (size_t p = context.size(); p < t.prompt_tokens.size(); ++p) {  // the env's side: not trained
        x.tokens.push_back(t.prompt_tokens[p]);
        x.logprobs.push_back(0.0f);
        x.mask.push_back(0.0f);
      }
    }
    x.turn_starts.push_back(static_cast<uint32_t>(x.tokens.size()));
    x.turn_texts.push_back(t.text);
    x.tokens.insert(x.tokens.end(), t.tokens.begin(), t.tokens.end());
    x.logprobs.insert(x.logprobs.end(), t.logprobs.begin(), t.logprobs.end());
    if (!x.mask.empty()) x.mask.resize(x.tokens.size(), 1.0f);
    x.text = t.text;
    x.truncated = t.finish == "length";
    context = t.prompt_tokens;
    context.insert(context.end(), t.tokens.begin(), t.tokens.end());
  }
  for (auto& x : out)
    if (x.turn_starts.size() <= 1) {  // a single turn is a plain completion
      x.turn_starts.clear();
      x.turn_texts.clear();
    }
  return out;
}

namespace {

struct Attempt {
  std::string id;
  size_t worker = 0, generator = 0;
};

// What an episode's runs ask: the env, the prompt's metadata and the sampling parameters.
struct ServedCall {
  std::string env, metadata_json;
  json sampling;
};

EnvRunReq run_req(const RunState& s, const ServedCall& c, const Attempt& a) {
  return EnvRunReq{c.env, a.id, c.metadata_json, s.serve_urls[a.generator] + "/v1", "episodes/" + a.id,
                   c.sampling.dump()};
}

// An episode's last run and the attempt that made it.
struct ServedTry {
  EnvObs res;
  Attempt a;
  int retries = 0;
};

// One episode: its run as attempt `first`, a failed one retried on the next env workers up to
// envs[].max_retries (new episode id; what the failed attempt served is dropped). Started
// (Task::start) for every episode before any is awaited, so the runs and their retries of all
// episodes overlap: a hung run costs one timeout per retry, not one per episode.
Task<ServedTry> served_episode(RunState& s, const ServedCall& c, const Attempt& first) {
  ServedTry t;
  t.a = first;
  const int max_retries = env_spec(s, c.env).max_retries;
  for (int retry = 0;; ++retry) {
    // (requests are named before they are awaited: GCC 12 mishandles temporaries in co_await)
    auto run = request<EnvObs>(s.here, s.env_worker(t.a.worker), run_req(s, c, t.a), kLongTimeout);
    Result<EnvObs> got = co_await run;
    t.res = settled(std::move(got));
    if (t.res.error.empty() || t.res.fatal || retry >= max_retries) break;
    ++t.retries;
    if (s.hooks.log) s.hooks.log("env '" + c.env + "': " + t.res.reason + ": " + t.res.error + "; retrying");
    auto dropped = request<ServedTurnsRep>(s.here, s.peers.generators[t.a.generator], ServedTurnsReq{t.a.id}, kEnvTimeout);
    (void)co_await dropped;
    t.a.id = first.id + "-r" + std::to_string(retry + 1);
    t.a.worker += 1;
  }
  co_return t;
}

}  // namespace

Task<Status> run_served(RunState& s, Rollout& r, const std::vector<int>& groups, int64_t step, int64_t k,
                        int64_t* oldest) {
  if (groups.empty()) co_return Status{};
  TROUPE_CO_TRY(co_await ensure_serve_urls(s));
  if (r.sample_version >= 0) {  // async mode: the endpoints serve this step with its version
    GenerateReq take;
    take.policy_version = r.sample_version;
    std::vector<runtime::Reply<GenerateRep>> took;
    for (size_t g = 0; g < s.peers.generators.size(); ++g)
      if (s.generator_alive(g)) took.push_back(request<GenerateRep>(s.here, s.peers.generators[g], take, kLongTimeout));
    for (auto& t : took) TROUPE_CO_TRY(co_await t);
  }
  const auto& ro = s.cfg.rollout;
  const int G = ro.num_generations;
  const size_t NG = s.peers.generators.size();
  const double t0 = mono_seconds();
  std::vector<ServedCall> calls;
  std::vector<Attempt> attempts;
  calls.reserve(groups.size() * static_cast<size_t>(G));  // (the runs hold references into both)
  attempts.reserve(groups.size() * static_cast<size_t>(G));
  std::vector<Task<ServedTry>> runs;
  for (int i : groups) {
    for (int j = 0; j < G; ++j) {
      Attempt a;
      a.id = "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + i) + "-" + std::to_string(j);
      a.worker = static_cast<size_t>(i);
      a.generator = (static_cast<size_t>(i) * static_cast<size_t>(G) + static_cast<size_t>(j)) % NG;
      json sp = {{"temperature", ro.temperature},
                 {"top_p", ro.top_p},
                 {"max_tokens", ro.max_response_length},
                 {"seed", mix_seed(r.seed_base, seed_stream::served_sampling, static_cast<uint64_t>(k),
                                   static_cast<uint64_t>(i) * 4096 + static_cast<uint64_t>(j))}};
      if (ro.top_k > 0) sp["top_k"] = ro.top_k;
      if (!ro.stop.empty()) sp["stop"] = ro.stop;
      const auto& g = r.groups[i];
      calls.push_back(ServedCall{g.env, g.metadata.dump(-1, ' ', false, json::error_handler_t::replace), std::move(sp)});
      attempts.push_back(std::move(a));
      runs.push_back(served_episode(s, calls.back(), attempts.back()));
      runs.back().start();
    }
  }
  for (size_t n = 0; n < runs.size(); ++n) {
    const int i = groups[n / static_cast<size_t>(G)];
    auto& g = r.groups[i];
    ServedTry t = co_await runs[n];
    r.retries += t.retries;
    const Attempt& a = t.a;
    EnvObs& res = t.res;
    auto take = request<ServedTurnsRep>(s.here, s.peers.generators[a.generator], ServedTurnsReq{a.id}, kEnvTimeout);
    TROUPE_CO_ASSIGN_OR_RETURN(auto served, co_await take);
    int64_t version = -1;
    std::vector<GenSample> xs = samples_of_turns(served.turns, &version);
    if (res.error.empty() && xs.empty()) {
      res.error = "env '" + g.env + "' episode '" + a.id + "' made no model call through troupe's endpoint (" +
                  s.serve_urls[a.generator] + "/v1, model episodes/" + a.id + ")";
      res.reason = "env_error";
    }
    if (version >= 0) *oldest = *oldest < 0 ? version : std::min(*oldest, version);
    GenSample first = xs.empty() ? GenSample{} : std::move(xs.front());
    if (!xs.empty()) xs.erase(xs.begin());
    g.samples.push_back(std::move(first));
    g.more_samples.push_back(std::move(xs));
    const bool ok = res.error.empty();
    g.rewards.push_back(ok ? res.reward : 0.0);
    json comp = json::parse(res.components_json, nullptr, false);
    double correct = ok && res.reward >= 1.0 ? 1.0 : 0.0;
    if (ok && comp.is_object() && comp.contains("correct") && comp["correct"].is_number())
      correct = comp["correct"].get<double>();
    g.correct.push_back(correct);
    g.errors.push_back(res.error);
    g.reasons.push_back(ok ? std::string() : res.reason.empty() ? "env_error" : res.reason);
    g.components.push_back(ok ? res.components_json : std::string());
  }
  r.gen_s += mono_seconds() - t0;
  co_return Status{};
}

Task<Result<EvalScore>> served_eval(RunState& s, const std::string& env, const std::vector<ResetOutcome>& got) {
  TROUPE_CO_TRY(co_await ensure_serve_urls(s));
  const json greedy = {{"temperature", 0.0}, {"max_tokens", s.cfg.rollout.max_response_length}, {"seed", 0}};
  std::vector<ServedCall> calls;
  std::vector<Attempt> attempts;
  calls.reserve(got.size());  // (the runs hold references into both)
  attempts.reserve(got.size());
  std::vector<Task<ServedTry>> runs(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].obs.error.empty()) continue;  // its reset failed on every try
    calls.push_back(ServedCall{env, got[i].obs.metadata_json, greedy});
    attempts.push_back(Attempt{got[i].episode_id, got[i].worker, 0});
    runs[i] = served_episode(s, calls.back(), attempts.back());
    runs[i].start();
  }
  EvalScore out;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!runs[i].valid()) {
      out.fails.add(got[i].obs.error, got[i].obs.reason);
      continue;
    }
    ServedTry t = co_await runs[i];
    out.retries += t.retries;
    auto dropped = request<ServedTurnsRep>(s.here, s.peers.generators[0], ServedTurnsReq{t.a.id}, kEnvTimeout);
    (void)co_await dropped;
    out.fails.add(t.res.error, t.res.reason);
    if (!t.res.error.empty()) continue;  // it failed on every try: left out of the means
    out.acc += episode_solved(t.res.components_json, t.res.reward) ? 1.0 : 0.0;
    out.reward += t.res.reward;
  }
  co_return out;
}

}  // namespace troupe::actors::coord
