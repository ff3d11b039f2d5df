// The step loop. Sync mode: reset envs -> generate G per prompt -> verify -> advantages -> train ->
// weight sync, one after the other. Async mode: a rollout thread produces step k+1 with version v
// while the learner trains step k; step k may use weights no older than base + k - max_staleness.
#include "troupe/actors/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "troupe/actors/messages.h"
#include "troupe/actors/roles.h"
#include "troupe/envs/trajectory.h"
#include "troupe/learner/advantages.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/policy/io/model_dir.h"

namespace troupe::actors {
namespace fs = std::filesystem;
using json = nlohmann::json;
using runtime::ActorId;

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  auto sm = [](uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  return sm(sm(sm(sm(seed) ^ a) ^ b) ^ c);
}

namespace {

constexpr auto kEnvTimeout = std::chrono::seconds(120);
constexpr auto kLongTimeout = std::chrono::hours(2);

template <class Rep, class Req>
Result<Rep> ask(runtime::ActorSystem& sys, ActorId to, Req req, runtime::Duration timeout) {
  auto f = sys.ask<Rep>(to, std::move(req), timeout);
  return f.get();
}

// A finished multi-turn episode is solved when its last step says so ("solved" or "correct"
// component, as guess_number and calculator report), else when its total reward reaches 1.
bool episode_solved(const std::string& components_json, double total_reward) {
  json c = json::parse(components_json, nullptr, false);
  for (const char* key : {"solved", "correct"})
    if (c.is_object() && c.contains(key) && c[key].is_number()) return c[key].get<double>() >= 1.0;
  return total_reward >= 1.0;
}

double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// One GRPO step's worth of data: groups of G samples, scored.
struct Coordinator::Rollout {
  struct Group {
    std::string env;
    std::string prompt_text;
    json metadata;
    uint64_t seed = 0;
    std::vector<GenSample> samples;
    std::vector<double> rewards, correct;
    std::vector<std::string> errors;
  };
  std::vector<Group> groups;
  int64_t policy_version = 0;
  // dynamic sampling: generation round of these groups, its seed base and first group index
  int round = 0, rounds = 1;
  uint64_t seed_base = 0;
  int64_t index0 = 0;
  int part = 0, parts = 1;  // streamed (rollout.async_chunks): which part of the step's groups
  double gen_s = 0, env_s = 0, idle_s = 0;
};

struct Coordinator::Async {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int64_t, Result<Rollout>>> queue;  // (k, rollout)
  int64_t weights_sent = 0;  // newest version the generators have been sent
  int64_t skipped = 0;       // steps that trained on nothing (no new version): not waited for
  bool stop = false;
  // The oldest queued (k, rollout), waiting for one; wakes the rollout thread (the queue shrank).
  std::pair<int64_t, Result<Rollout>> pop() {
    std::pair<int64_t, Result<Rollout>> item{0, Error{}};
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return !queue.empty(); });
      item = std::move(queue.front());
      queue.pop_front();
    }
    cv.notify_all();
    return item;
  }
};

Coordinator::Coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir)
    : cfg_(std::move(cfg)), peers_(std::move(peers)), hooks_(std::move(hooks)), run_dir_(std::move(run_dir)) {}

Coordinator::~Coordinator() {
  if (async_ && async_->thread.joinable()) {
    {
      std::lock_guard lk(async_->mu);
      async_->stop = true;
    }
    async_->cv.notify_all();
    async_->thread.join();
  }
}

namespace {
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

double Coordinator::now_s() const { return wall_offset_ + mono_s() - t0_; }

size_t Coordinator::pick_env(uint64_t r) const {
  double total = 0;
  for (const auto& e : cfg_.envs) total += e.weight;
  double x = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * total;
  for (size_t i = 0; i < cfg_.envs.size(); ++i) {
    if (x < cfg_.envs[i].weight) return i;
    x -= cfg_.envs[i].weight;
  }
  return cfg_.envs.size() - 1;
}

Status Coordinator::emit(json row) {
  if (hooks_.metrics) return hooks_.metrics(row);
  return {};
}

Status Coordinator::sync_weights(double* seconds) {
  double t = mono_s();
  auto& sys = *peers_.system;
  TROUPE_ASSIGN_OR_RETURN(auto w, ask<Weights>(sys, peers_.learners[0], GetWeightsReq{}, kLongTimeout));
  version_ = w.version;
  if (async_) {
    // generators may be busy sampling: queue the weights behind the current request, don't wait
    TROUPE_TRY(sys.broadcast(std::span<const ActorId>(peers_.generators), w));
    {
      std::lock_guard lk(async_->mu);
      async_->weights_sent = w.version;
    }
    async_->cv.notify_all();
  } else {
    std::vector<std::future<Result<Ack>>> acks;
    for (auto g : peers_.generators) acks.push_back(sys.ask<Ack>(g, w, kLongTimeout));
    for (auto& a : acks) TROUPE_TRY(a.get());
  }
  if (seconds) *seconds = mono_s() - t;
  return {};
}

// Without dynamic sampling: one round of prompts_per_step groups. With it: more rounds (new
// prompts, seeds from (run.seed, round)) until prompts_per_step groups with distinct rewards are
// collected or grpo.max_generation_rounds is reached; every generated group is kept in the
// rollout (for metrics), train_on picks the first prompts_per_step kept ones.
Result<Coordinator::Rollout> Coordinator::make_rollout(int64_t step, int64_t k) {
  TROUPE_ASSIGN_OR_RETURN(auto r, make_round(step, k, 0));
  if (!cfg_.grpo.dynamic_sampling) return r;
  int G = cfg_.rollout.num_generations, P = cfg_.rollout.prompts_per_step;
  auto kept_of = [&](const Rollout& x) {
    std::vector<float> rw;
    for (auto& g : x.groups)
      for (double v : g.rewards) rw.push_back(static_cast<float>(v));
    std::vector<char> keep(x.groups.size(), 1);
    return learner::dapo_filter_groups(keep, rw, G);
  };
  int kept = kept_of(r);
  while (kept < P && r.rounds < cfg_.grpo.max_generation_rounds) {
    TROUPE_ASSIGN_OR_RETURN(auto more, make_round(step, k, r.rounds));
    kept += kept_of(more);
    r.rounds += 1;
    r.gen_s += more.gen_s;
    r.env_s += more.env_s;
    r.policy_version = std::min(r.policy_version, more.policy_version);
    for (auto& g : more.groups) r.groups.push_back(std::move(g));
  }
  return r;
}

Result<Coordinator::Rollout> Coordinator::make_round(int64_t step, int64_t k, int round,
                                                     const PartSink* sink) {
  auto& sys = *peers_.system;
  const auto& ro = cfg_.rollout;
  Rollout r;
  r.round = round;
  r.seed_base = round == 0 ? static_cast<uint64_t>(cfg_.run.seed)
                           : mix_seed(static_cast<uint64_t>(cfg_.run.seed), 7, static_cast<uint64_t>(round));
  r.index0 = static_cast<int64_t>(round) * ro.prompts_per_step;
  double t_env = mono_s();
  int P = ro.prompts_per_step;
  r.groups.resize(P);
  std::vector<std::future<Result<EnvObs>>> obs;
  for (int i = 0; i < P; ++i) {
    uint64_t rs = mix_seed(r.seed_base, 1, static_cast<uint64_t>(k), static_cast<uint64_t>(i));
    auto& g = r.groups[i];
    g.env = cfg_.envs[pick_env(rs)].name;
    g.seed = mix_seed(rs, 2);
    EnvResetReq req{g.env, "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + i), g.seed, 0};
    obs.push_back(sys.ask<EnvObs>(peers_.env_workers[i % peers_.env_workers.size()], req, kEnvTimeout));
  }
  for (int i = 0; i < P; ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto o, obs[i].get());
    r.groups[i].prompt_text = o.text;
    r.groups[i].metadata = json::parse(o.metadata_json, nullptr, false);
    (void)sys.send(peers_.env_workers[i % peers_.env_workers.size()],
             EnvReleaseReq{r.groups[i].env, "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + i)});
  }
  r.env_s += mono_s() - t_env;
  if (ro.max_turns > 1) return multi_turn(std::move(r), step, k);
  // generation: C parts of consecutive groups (rollout.async_chunks when streaming to a sink, else
  // one), each spread over the generators, G copies of each prompt; every part is requested at
  // once, and scored as soon as it is back (the generators go on with the next one meanwhile)
  const int C = sink ? std::min(ro.async_chunks, P) : 1;
  size_t NG = peers_.generators.size();
  struct Part {
    int g0 = 0, g1 = 0;
    std::vector<std::vector<int>> owned;
    std::vector<std::future<Result<GenerateRep>>> gens;  // invalid where a generator got no group
  };
  std::vector<Part> parts(C);
  for (int c = 0; c < C; ++c) {
    auto& part = parts[c];
    part.g0 = P * c / C;
    part.g1 = P * (c + 1) / C;
    part.owned.resize(NG);
    for (int i = part.g0; i < part.g1; ++i) part.owned[static_cast<size_t>(i - part.g0) % NG].push_back(i);
    for (size_t g = 0; g < NG; ++g) {
      part.gens.emplace_back();
      if (part.owned[g].empty()) continue;
      GenerateReq req;
      for (int i : part.owned[g])
        for (int j = 0; j < ro.num_generations; ++j) req.prompts.push_back(r.groups[i].prompt_text);
      req.sampling = {
          ro.temperature, ro.top_k, ro.top_p, ro.max_response_length,
          mix_seed(r.seed_base, 3, static_cast<uint64_t>(k), g + 1024 * static_cast<uint64_t>(c))};
      part.gens.back() = sys.ask<GenerateRep>(peers_.generators[g], std::move(req), kLongTimeout);
    }
  }
  r.policy_version = -1;
  const double reset_s = r.env_s;
  double t_gen = mono_s();
  for (int c = 0; c < C; ++c) {
    auto& part = parts[c];
    int64_t version = -1;
    for (size_t g = 0; g < NG; ++g) {
      if (!part.gens[g].valid()) continue;
      TROUPE_ASSIGN_OR_RETURN(auto rep, part.gens[g].get());
      version = version < 0 ? rep.policy_version : std::min(version, rep.policy_version);
      size_t n = 0;
      for (int i : part.owned[g])
        for (int j = 0; j < ro.num_generations; ++j)
          r.groups[i].samples.push_back(std::move(rep.samples[n++]));
    }
    r.policy_version = r.policy_version < 0 ? version : std::min(r.policy_version, version);
    const double gen_s = mono_s() - t_gen;
    // scoring: one verify call per group
    t_env = mono_s();
    std::vector<std::future<Result<EnvVerifyRep>>> ver;
    for (int i = part.g0; i < part.g1; ++i) {
      EnvVerifyReq req{r.groups[i].env, r.groups[i].metadata.dump(), {}};
      for (const auto& s : r.groups[i].samples) req.completions.push_back(s.text);
      ver.push_back(sys.ask<EnvVerifyRep>(peers_.env_workers[i % peers_.env_workers.size()], std::move(req),
                                          kEnvTimeout));
    }
    for (int i = part.g0; i < part.g1; ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto v, ver[i - part.g0].get());
      r.groups[i].rewards = std::move(v.rewards);
      r.groups[i].correct = std::move(v.correct);
      r.groups[i].errors = std::move(v.errors);
    }
    const double env_s = mono_s() - t_env;
    r.gen_s += gen_s;
    r.env_s += env_s;
    t_gen = mono_s();
    if (sink) {  // this part's groups move to the learner's side now
      Rollout out;
      out.policy_version = version;
      out.round = r.round;
      out.seed_base = r.seed_base;
      out.index0 = r.index0 + part.g0;
      out.part = c;
      out.parts = C;
      out.gen_s = gen_s;
      out.env_s = env_s + (c == 0 ? reset_s : 0.0);  // the resets count with the first part
      for (int i = part.g0; i < part.g1; ++i) out.groups.push_back(std::move(r.groups[i]));
      (*sink)(std::move(out));
    }
  }
  return r;
}

// Multi-turn episodes: every sample of a group is its own episode (same seed); each turn the
// generators continue the conversation text, the env answers with feedback, until done or
// max_turns. The training sample is the first prompt + every turn, feedback tokens masked out.
Result<Coordinator::Rollout> Coordinator::multi_turn(Rollout r, int64_t step, int64_t k) {
  auto& sys = *peers_.system;
  const auto& ro = cfg_.rollout;
  const auto& tok = *tokenizer_;
  int G = ro.num_generations;
  struct Episode {
    size_t group = 0;
    std::string id, context;
    GenSample merged;
    size_t first_prompt_len = 0;
    double reward = 0;
    bool done = false, exact = true, solved = false;
    std::string error;
  };
  std::vector<Episode> eps;
  double t_env = mono_s();
  std::vector<std::future<Result<EnvObs>>> resets;
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    for (int j = 0; j < G; ++j) {
      Episode e;
      e.group = gi;
      e.id = "grpo-" + std::to_string(step) + "-" + std::to_string(r.index0 + static_cast<int64_t>(gi)) + "-" +
             std::to_string(j);
      e.context = r.groups[gi].prompt_text;
      resets.push_back(sys.ask<EnvObs>(peers_.env_workers[gi % peers_.env_workers.size()],
                                       EnvResetReq{r.groups[gi].env, e.id, r.groups[gi].seed, 0}, kEnvTimeout));
      eps.push_back(std::move(e));
    }
  }
  for (auto& f : resets) TROUPE_TRY(f.get());
  r.env_s += mono_s() - t_env;
  size_t NG = peers_.generators.size();
  for (int turn = 0; turn < ro.max_turns; ++turn) {
    std::vector<size_t> active;
    for (size_t i = 0; i < eps.size(); ++i)
      if (!eps[i].done) active.push_back(i);
    if (active.empty()) break;
    double t_gen = mono_s();
    std::vector<std::future<Result<GenerateRep>>> gens;
    std::vector<std::vector<size_t>> owned(NG);
    for (size_t n = 0; n < active.size(); ++n) owned[n % NG].push_back(active[n]);
    for (size_t g = 0; g < NG; ++g) {
      GenerateReq req;
      for (size_t i : owned[g]) req.prompts.push_back(eps[i].context);
      req.sampling = {ro.temperature, ro.top_k, ro.top_p, ro.max_response_length,
                      mix_seed(r.seed_base, 4, static_cast<uint64_t>(k), g * 1024 + static_cast<uint64_t>(turn))};
      gens.push_back(sys.ask<GenerateRep>(peers_.generators[g], std::move(req), kLongTimeout));
    }
    std::vector<GenSample> out(eps.size());
    for (size_t g = 0; g < NG; ++g) {
      TROUPE_ASSIGN_OR_RETURN(auto rep, gens[g].get());
      if (turn == 0) r.policy_version = g == 0 ? rep.policy_version : std::min(r.policy_version, rep.policy_version);
      for (size_t n = 0; n < owned[g].size(); ++n) out[owned[g][n]] = std::move(rep.samples[n]);
    }
    r.gen_s += mono_s() - t_gen;
    t_env = mono_s();
    std::vector<std::future<Result<EnvObs>>> steps;
    for (size_t i : active)
      steps.push_back(sys.ask<EnvObs>(peers_.env_workers[eps[i].group % peers_.env_workers.size()],
                                      EnvStepReq{r.groups[eps[i].group].env, eps[i].id, out[i].text}, kEnvTimeout));
    for (size_t n = 0; n < active.size(); ++n) {
      auto& e = eps[active[n]];
      auto& s = out[active[n]];
      auto res = steps[n].get();
      // append this turn's sampled tokens (mask 1)
      if (turn == 0) {
        e.merged.prompt_tokens = s.prompt_tokens;
        e.first_prompt_len = s.prompt_tokens.size();
      } else if (s.prompt_tokens.size() < e.first_prompt_len + e.merged.tokens.size() ||
                 !std::equal(e.merged.tokens.begin(), e.merged.tokens.end(),
                             s.prompt_tokens.begin() + static_cast<std::ptrdiff_t>(e.first_prompt_len))) {
        e.exact = false;  // the context re-tokenized differently (or was cut): keep only complete turns
      }
      if (e.exact && turn > 0) {
        // feedback tokens between the previous turn and this one (mask 0)
        size_t have = e.first_prompt_len + e.merged.tokens.size();
        for (size_t t = have; t < s.prompt_tokens.size(); ++t) {
          e.merged.tokens.push_back(s.prompt_tokens[t]);
          e.merged.logprobs.push_back(0.0f);
          e.merged.mask.push_back(0.0f);
        }
      }
      e.merged.text = s.text;
      e.merged.truncated = s.truncated;
      if (!res.ok()) {
        e.error = res.error().message;
        e.done = true;
        continue;  // a failed episode is not trained on
      }
      e.reward += res->reward;
      e.done = res->done || turn + 1 == ro.max_turns;
      if (e.done) e.solved = episode_solved(res->components_json, e.reward);
      if (e.exact) {
        // an EOS ending a turn that the env continues is not part of the next context: drop it
        size_t n_tok = s.tokens.size();
        if (!e.done && n_tok > 0 && s.tokens.back() == tok.eos_id()) --n_tok;
        for (size_t t = 0; t < n_tok; ++t) {
          e.merged.tokens.push_back(s.tokens[t]);
          e.merged.logprobs.push_back(s.logprobs[t]);
          e.merged.mask.push_back(1.0f);
        }
      }
      // the next turn sees the completion (without EOS) and the env's feedback
      std::string completion = s.text;
      e.context += completion + "\n" + res->text + "\n";
    }
    r.env_s += mono_s() - t_env;
  }
  for (auto& e : eps) {
    (void)sys.send(peers_.env_workers[e.group % peers_.env_workers.size()], EnvReleaseReq{r.groups[e.group].env, e.id});
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
  return r;
}

// What a rollout (a whole step's, or one streamed part's) gives the learners: advantages per group
// (over the kept groups with dynamic sampling), samples without tokens or with env errors left out,
// and, in async mode, everything older than max_staleness dropped (stale_policy: drop).
Result<Coordinator::Prepared> Coordinator::prepare(const Rollout& r) const {
  const auto& ro = cfg_.rollout;
  const int G = ro.num_generations;
  Prepared p;
  const int64_t lag = version_ - r.policy_version;
  const bool stale = async_ && lag > ro.max_staleness;
  std::vector<float> rewards;
  for (auto& g : r.groups)
    for (double x : g.rewards) rewards.push_back(static_cast<float>(x));
  auto lcfg = learner_config(cfg_, learner::Phase::grpo);
  std::vector<char> keep(r.groups.size(), 1);
  p.groups_kept = static_cast<int>(r.groups.size());
  if (cfg_.grpo.dynamic_sampling) {
    // the first prompts_per_step groups with distinct rewards; advantages over them only
    learner::dapo_filter_groups(keep, rewards, G);
    p.groups_kept = 0;
    std::vector<float> kept_rewards;
    for (size_t gi = 0; gi < keep.size(); ++gi) {
      if (keep[gi] && p.groups_kept < ro.prompts_per_step) {
        ++p.groups_kept;
        kept_rewards.insert(kept_rewards.end(), rewards.begin() + static_cast<std::ptrdiff_t>(gi * G),
                            rewards.begin() + static_cast<std::ptrdiff_t>((gi + 1) * G));
      } else {
        keep[gi] = 0;
      }
    }
    p.adv.assign(rewards.size(), 0.0f);
    if (!kept_rewards.empty()) {
      TROUPE_ASSIGN_OR_RETURN(auto kadv, learner::compute_advantages(kept_rewards, G, lcfg.advantage));
      size_t n = 0;
      for (size_t gi = 0; gi < keep.size(); ++gi)
        if (keep[gi])
          for (int j = 0; j < G; ++j) p.adv[gi * G + j] = kadv[n++];
    }
  } else {
    TROUPE_ASSIGN_OR_RETURN(p.adv, learner::compute_advantages(rewards, G, lcfg.advantage));
  }
  for (size_t gi = 0; gi < r.groups.size(); ++gi) {
    const auto& g = r.groups[gi];
    for (int j = 0; j < G; ++j) {
      const auto& s = g.samples[j];
      if (!keep[gi] || s.tokens.empty() || !g.errors[j].empty()) continue;
      if (stale && cfg_.rollout.stale_policy == "drop") {
        ++p.stale_dropped;
        continue;
      }
      TrainSample t;
      t.prompt = s.prompt_tokens;
      t.completion = s.tokens;
      if (async_ && cfg_.rollout.stale_policy == "importance_weight") {
        // decoupled PPO: the ratio against the learner's current weights, and the sampler's
        // log-probs only in the truncated importance weight min(pi_current / pi_sampler, cap)
        t.behavior_logprobs = s.logprobs;
      } else {
        t.old_logprobs = s.logprobs;
      }
      t.mask = s.mask;
      t.advantage = p.adv[gi * G + j];
      t.truncated = s.truncated;
      p.samples.push_back(std::move(t));
    }
  }
  return p;
}

Status Coordinator::train_on(Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle) {
  auto& sys = *peers_.system;
  TROUPE_ASSIGN_OR_RETURN(auto p, prepare(r));
  Trained t;
  if (!p.samples.empty()) {
    TrainReq req;
    req.phase = 0;
    req.step = k;
    req.samples = std::move(p.samples);
    double t0 = mono_s();
    std::vector<std::future<Result<TrainRep>>> reps;
    learner_dirty_ = true;  // the learners update now: until the step is done, their state is no step's
    for (auto l : peers_.learners) reps.push_back(sys.ask<TrainRep>(l, req, kLongTimeout));
    for (size_t i = 0; i < reps.size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto rep, reps[i].get());
      if (i == 0) t.metrics = json::parse(rep.metrics_json, nullptr, false);
    }
    t.learner_s = mono_s() - t0;
    t.updated = true;
  }
  return log_grpo_step(r, p, t, step, step_start, gen_idle);
}

// Async with rollout.async_chunks > 1: step k's parts arrive one by one; each goes to the learners
// at once (they accumulate its gradient while the next part is generated), the last one takes the
// optimizer step. learner_s: the learner's own compute time over the parts.
Status Coordinator::train_streamed(int64_t step, int64_t k, double step_start) {
  auto& sys = *peers_.system;
  Rollout whole;
  Prepared all;
  Trained t;
  std::vector<std::future<Result<TrainRep>>> reps;
  std::vector<size_t> rep_learner;
  bool sent = false;
  double gen_idle = 0;
  for (int c = 0, C = 1; c < C; ++c) {
    auto item = async_->pop();
    if (!item.second.ok()) return item.second.error();
    Rollout& part = *item.second;
    if (item.first != k || part.part != c)
      return make_error(ErrorCode::internal, "coordinator: expected part " + std::to_string(c) +
                                                 " of GRPO step " + std::to_string(k) + ", got part " +
                                                 std::to_string(part.part) + " of step " +
                                                 std::to_string(item.first));
    C = part.parts;
    if (c == 0) {
      gen_idle = part.idle_s;
      whole = Rollout{};
      whole.policy_version = part.policy_version;
      whole.seed_base = part.seed_base;
      whole.index0 = part.index0;
    }
    TROUPE_ASSIGN_OR_RETURN(auto p, prepare(part));
    const bool last = c + 1 == C;
    if (!p.samples.empty() || (last && sent)) {
      TrainReq req;
      req.phase = 0;
      req.step = k;
      req.samples = std::move(p.samples);
      req.more = !last;
      if (last) learner_dirty_ = true;  // the last part takes the optimizer step
      for (size_t l = 0; l < peers_.learners.size(); ++l) {
        reps.push_back(sys.ask<TrainRep>(peers_.learners[l], req, kLongTimeout));
        rep_learner.push_back(l);
      }
      sent = true;
    }
    all.adv.insert(all.adv.end(), p.adv.begin(), p.adv.end());
    all.groups_kept += p.groups_kept;
    all.stale_dropped += p.stale_dropped;
    whole.policy_version = std::min(whole.policy_version, part.policy_version);
    whole.gen_s += part.gen_s;
    whole.env_s += part.env_s;
    for (auto& g : part.groups) whole.groups.push_back(std::move(g));
  }
  for (size_t i = 0; i < reps.size(); ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto rep, reps[i].get());
    if (rep_learner[i] != 0) continue;
    t.learner_s += rep.train_s;
    if (i + peers_.learners.size() >= reps.size()) t.metrics = json::parse(rep.metrics_json, nullptr, false);
  }
  t.updated = sent;
  return log_grpo_step(whole, all, t, step, step_start, gen_idle);
}

Status Coordinator::log_grpo_step(const Rollout& r, const Prepared& p, const Trained& tr, int64_t step,
                                  double step_start, double gen_idle) {
  const auto& ro = cfg_.rollout;
  const int G = ro.num_generations;
  const std::vector<float>& adv = p.adv;
  std::vector<float> rewards;
  double resp_len = 0, truncated = 0, correct = 0;
  int env_failures = 0;
  std::map<std::string, std::pair<double, int>> per_env;
  for (const auto& g : r.groups) {
    for (int j = 0; j < G; ++j) {
      rewards.push_back(static_cast<float>(g.rewards[j]));
      resp_len += static_cast<double>(g.samples[j].tokens.size());
      truncated += g.samples[j].truncated ? 1 : 0;
      correct += g.correct[j];
      if (!g.errors[j].empty()) ++env_failures;
      auto& pe = per_env[g.env];
      pe.first += g.rewards[j];
      pe.second += 1;
    }
  }
  double n = static_cast<double>(rewards.size());
  auto rs = learner::stats_of(rewards);
  const int64_t lag = version_ - r.policy_version;
  json row = {{"step", step},
              {"phase", "grpo"},
              {"policy_version", r.policy_version},
              {"reward_mean", rs.mean},
              {"reward_std", rs.std},
              {"accuracy", correct / n},
              {"response_len_mean", resp_len / n},
              {"truncated_frac", truncated / n},
              {"env_failures", env_failures},
              {"stale_dropped", p.stale_dropped},
              {"staleness", lag},
              {"groups_generated", r.groups.size()},
              {"groups_kept", p.groups_kept},
              {"generation_rounds", r.rounds}};
  for (auto& [name, v] : per_env) {
    row["reward_mean/" + name] = v.first / std::max(1, v.second);
    row["prompts/" + name] = v.second / std::max(1, G);  // groups sampled from this env (envs[].weight)
  }
  for (const char* key :
       {"loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "lr", "is_weight_mean"})
    row[key] = tr.updated ? tr.metrics.value(key, 0.0) : 0.0;
  double sync_s = 0;
  if (tr.updated) {
    TROUPE_TRY(sync_weights(&sync_s));
  } else if (async_) {  // no update, no new version: the rollout thread must not wait for one
    {
      std::lock_guard lk(async_->mu);
      async_->skipped += 1;
    }
    async_->cv.notify_all();
  }
  double step_s = mono_s() - step_start;
  double idle = async_ ? gen_idle : std::max(0.0, step_s - r.gen_s - r.env_s);
  row["gen_s"] = r.gen_s;
  row["env_s"] = r.env_s;
  row["learner_s"] = tr.learner_s;
  row["weight_sync_s"] = sync_s;
  row["idle_s"] = idle;  // generator idle: no sampling work during this step
  row["learner_idle_s"] =
      std::max(0.0, step_s - tr.learner_s - sync_s);  // learner neither training nor syncing
  row["step_s"] = step_s;
  row["tokens_per_s"] = step_s > 0 ? resp_len / step_s : 0.0;
  row["wall_s"] = now_s();
  row["process_cpu_s"] = process_cpu_s();  // CPU time of every thread of this process so far
  // trajectories
  if (cfg_.logger.trajectories && cfg_.logger.trajectories_per_step > 0) {
    auto w = envs::TrajectoryWriter::open(run_dir_ + "/trajectories/grpo.jsonl");
    if (w.ok()) {
      int written = 0;
      for (size_t gi = 0; gi < r.groups.size() && written < cfg_.logger.trajectories_per_step; ++gi) {
        auto& g = r.groups[gi];
        for (int j = 0; j < G && written < cfg_.logger.trajectories_per_step; ++j, ++written) {
          envs::Trajectory t;
          t.episode_id = "grpo-" + std::to_string(step) + "-" + std::to_string(gi) + "-" + std::to_string(j);
          t.env_name = g.env;
          t.seed = g.seed;
          t.step = step;
          t.group = static_cast<int64_t>(gi);
          t.prompt.text = g.prompt_text;
          t.prompt.metadata = g.metadata;
          envs::TurnRecord turn;
          turn.prompt_tokens = g.samples[j].prompt_tokens;
          turn.completion_tokens = g.samples[j].tokens;
          turn.logprobs = g.samples[j].logprobs;
          turn.policy_version = r.policy_version;
          turn.completion = g.samples[j].text;
          turn.truncated = g.samples[j].truncated;
          turn.observation = g.prompt_text;
          turn.reward = g.rewards[j];
          t.turns.push_back(std::move(turn));
          t.reward = g.rewards[j];
          t.termination = !g.errors[j].empty() ? envs::Termination::env_error
                          : g.samples[j].truncated ? envs::Termination::truncated
                                                   : envs::Termination::done;
          t.error = g.errors[j];
          t.extra = {{"advantage", adv[gi * G + j]}};
          (void)(*w)->write(t);
        }
      }
    }
  }
  return emit(row);
}

Result<json> Coordinator::evaluate() {
  auto& sys = *peers_.system;
  int n = cfg_.eval.num_prompts;
  json out = json::object();
  double acc_sum = 0, rew_sum = 0, turns_sum = 0;
  int total = 0;
  for (const auto& e : cfg_.envs) {
    std::vector<std::future<Result<EnvObs>>> obs;
    for (int i = 0; i < n; ++i) {
      EnvResetReq req{e.name, "eval-" + e.name + "-" + std::to_string(i), static_cast<uint64_t>(i), 1};
      obs.push_back(sys.ask<EnvObs>(peers_.env_workers[i % peers_.env_workers.size()], req, kEnvTimeout));
    }
    std::vector<EnvObs> got;
    bool multi = cfg_.rollout.max_turns > 1;
    auto worker = [&](int i) { return peers_.env_workers[static_cast<size_t>(i) % peers_.env_workers.size()]; };
    auto id_of = [&](int i) { return "eval-" + e.name + "-" + std::to_string(i); };
    for (int i = 0; i < n; ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto o, obs[i].get());
      if (!multi) (void)sys.send(worker(i), EnvReleaseReq{e.name, id_of(i)});
      got.push_back(std::move(o));
    }
    if (multi) {
      // full episodes, greedy, as training runs them: the context grows by completion + feedback
      std::vector<std::string> ctx(n);
      std::vector<double> ep_reward(n, 0.0);
      std::vector<char> done(n, 0), solved(n, 0);
      double turns = 0;  // env steps taken, all episodes
      for (int i = 0; i < n; ++i) ctx[i] = got[i].text;
      for (int turn = 0; turn < cfg_.rollout.max_turns; ++turn) {
        std::vector<int> active;
        for (int i = 0; i < n; ++i)
          if (!done[i]) active.push_back(i);
        if (active.empty()) break;
        GenerateReq req;
        for (int i : active) req.prompts.push_back(ctx[i]);
        req.sampling = {0.0f, 0, 1.0f, cfg_.rollout.max_response_length, 0};
        TROUPE_ASSIGN_OR_RETURN(auto rep, ask<GenerateRep>(sys, peers_.generators[0], std::move(req), kLongTimeout));
        std::vector<std::future<Result<EnvObs>>> steps;
        for (size_t a = 0; a < active.size(); ++a)
          steps.push_back(sys.ask<EnvObs>(worker(active[a]), EnvStepReq{e.name, id_of(active[a]), rep.samples[a].text},
                                          kEnvTimeout));
        for (size_t a = 0; a < active.size(); ++a) {
          int i = active[a];
          auto res = steps[a].get();
          if (!res.ok()) {  // a failed episode scores 0
            done[i] = 1;
            ep_reward[i] = 0;
            continue;
          }
          ep_reward[i] += res->reward;
          turns += 1;
          done[i] = res->done || turn + 1 == cfg_.rollout.max_turns;
          if (done[i]) solved[i] = episode_solved(res->components_json, ep_reward[i]) ? 1 : 0;
          ctx[i] += rep.samples[a].text + "\n" + res->text + "\n";
        }
      }
      double acc = 0, rew = 0;
      for (int i = 0; i < n; ++i) {
        (void)sys.send(worker(i), EnvReleaseReq{e.name, id_of(i)});
        acc += solved[i] ? 1.0 : 0.0;
        rew += ep_reward[i];
      }
      out["eval_accuracy/" + e.name] = acc / n;
      out["eval_reward_mean/" + e.name] = rew / n;
      out["eval_turns_mean/" + e.name] = turns / n;
      acc_sum += acc;
      rew_sum += rew;
      turns_sum += turns;
      total += n;
      continue;
    }
    GenerateReq req;
    for (auto& o : got) req.prompts.push_back(o.text);
    req.sampling = {0.0f, 0, 1.0f, cfg_.rollout.max_response_length, 0};
    TROUPE_ASSIGN_OR_RETURN(auto rep, ask<GenerateRep>(sys, peers_.generators[0], std::move(req), kLongTimeout));
    double acc = 0, rew = 0;
    std::vector<std::future<Result<EnvVerifyRep>>> ver;
    for (int i = 0; i < n; ++i) {
      EnvVerifyReq v{e.name, got[i].metadata_json, {rep.samples[i].text}};
      ver.push_back(sys.ask<EnvVerifyRep>(peers_.env_workers[i % peers_.env_workers.size()], std::move(v), kEnvTimeout));
    }
    for (int i = 0; i < n; ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto v, ver[i].get());
      acc += v.correct[0] >= 1.0 ? 1.0 : 0.0;
      rew += v.rewards[0];
    }
    out["eval_accuracy/" + e.name] = acc / n;
    out["eval_reward_mean/" + e.name] = rew / n;
    acc_sum += acc;
    rew_sum += rew;
    total += n;
  }
  out["eval_accuracy"] = acc_sum / std::max(1, total);
  out["eval_reward_mean"] = rew_sum / std::max(1, total);
  out["eval_prompts"] = total;
  if (cfg_.rollout.max_turns > 1) out["eval_turns_mean"] = turns_sum / std::max(1, total);
  return out;
}

Status Coordinator::eval_and_log(const std::string& phase) {
  TROUPE_ASSIGN_OR_RETURN(auto ev, evaluate());
  ev["step"] = step_;
  ev["phase"] = phase;
  ev["policy_version"] = version_;
  ev["wall_s"] = now_s();
  last_eval_ = ev;
  last_eval_step_ = step_;
  return emit(ev);
}

bool Coordinator::improves_best(double value) {
  if (!best_known_) {
    best_known_ = true;
    if (fs::exists(run_dir_ + "/checkpoints/best"))  // (a resumed run's; reading state.json is enough)
      best_value_ = learner::checkpoint_metric(run_dir_ + "/checkpoints/best");
  }
  if (!best_value_) return true;
  return cfg_.checkpointing.higher_is_better ? value > *best_value_ : value < *best_value_;
}

Status Coordinator::checkpoint(const std::string& phase, bool force, runtime::Duration timeout) {
  if (!cfg_.checkpointing.enabled) return {};
  const auto& best = cfg_.checkpointing.keep_best_by;
  const bool scored = !best.empty() && last_eval_step_ == step_ && last_eval_.contains(best) &&
                      last_eval_[best].is_number();
  const bool better = scored && improves_best(last_eval_[best].get<double>());
  bool due = cfg_.checkpointing.every > 0 && step_ % cfg_.checkpointing.every == 0;
  // an eval that beats the best so far is kept even between regular checkpoints
  if (!due && !force && !better) return {};
  CheckpointReq req;
  req.dir = run_dir_ + "/checkpoints";
  req.step = step_;
  req.extra_json = json{{"global_step", step_}, {"coordinator_phase", phase}, {"wall_s", now_s()}}.dump();
  if (scored) {
    req.has_metric = true;
    req.metric = last_eval_[best].get<double>();
  }
  std::vector<std::future<Result<CheckpointRep>>> reps;
  // only learner 0 writes; the others hold identical state
  TROUPE_ASSIGN_OR_RETURN(auto rep, ask<CheckpointRep>(*peers_.system, peers_.learners[0], req, timeout));
  if (better) best_value_ = req.metric;
  saved_step_ = step_;
  if (hooks_.log) hooks_.log("checkpoint " + rep.path + (better ? " (best " + best + " so far)" : ""));
  return {};
}

Status Coordinator::run_sft(int64_t first_step) {
  auto& sys = *peers_.system;
  const auto& tok = *tokenizer_;
  int S = cfg_.sft.max_steps;
  for (int64_t k = first_step; k < S; ++k) {
    double t = mono_s();
    int B = cfg_.sft.batch_size;
    std::vector<std::future<Result<EnvObs>>> obs;
    std::vector<std::string> envn;
    for (int i = 0; i < B; ++i) {
      uint64_t rs = mix_seed(cfg_.run.seed, 11, static_cast<uint64_t>(k), static_cast<uint64_t>(i));
      envn.push_back(cfg_.envs[pick_env(rs)].name);
      EnvResetReq req{envn.back(), "sft-" + std::to_string(k) + "-" + std::to_string(i), mix_seed(rs, 2), 0};
      obs.push_back(sys.ask<EnvObs>(peers_.env_workers[i % peers_.env_workers.size()], req, kEnvTimeout));
    }
    TrainReq req;
    req.phase = 1;
    req.step = k;
    double tokens = 0;
    for (int i = 0; i < B; ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto o, obs[i].get());
      (void)sys.send(peers_.env_workers[i % peers_.env_workers.size()],
               EnvReleaseReq{envn[i], "sft-" + std::to_string(k) + "-" + std::to_string(i)});
      json meta = json::parse(o.metadata_json, nullptr, false);
      if (!meta.is_object() || !meta.contains("reference_completion") || !meta["reference_completion"].is_string())
        return invalid_input("sft: env '" + envn[i] + "' gives no reference_completion to train on");
      TrainSample s;
      auto p = tok.encode(format_prompt(cfg_.rollout, o.text));
      auto c = tok.encode(meta["reference_completion"].get<std::string>());
      if (!p.ok()) return p.error();
      if (!c.ok()) return c.error();
      if (tok.bos_id() >= 0) s.prompt.push_back(tok.bos_id());
      s.prompt.insert(s.prompt.end(), p->begin(), p->end());
      if (s.prompt.size() > static_cast<size_t>(cfg_.rollout.max_prompt_length))
        s.prompt.erase(s.prompt.begin(), s.prompt.end() - cfg_.rollout.max_prompt_length);
      s.completion = *c;
      if (tok.eos_id() >= 0) s.completion.push_back(tok.eos_id());
      tokens += static_cast<double>(s.completion.size());
      req.samples.push_back(std::move(s));
    }
    std::vector<std::future<Result<TrainRep>>> reps;
    learner_dirty_ = true;  // the learners update now: until the step is done, their state is no step's
    for (auto l : peers_.learners) reps.push_back(sys.ask<TrainRep>(l, req, kLongTimeout));
    json m;
    for (size_t i = 0; i < reps.size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto rep, reps[i].get());
      if (i == 0) m = json::parse(rep.metrics_json, nullptr, false);
    }
    double sync_s = 0;
    TROUPE_TRY(sync_weights(&sync_s));
    step_ = k + 1;
    double step_s = mono_s() - t;
    json row = {{"step", step_}, {"phase", "sft"}, {"policy_version", version_}, {"reward_mean", nullptr},
                {"reward_std", nullptr}, {"response_len_mean", tokens / B}, {"truncated_frac", 0.0},
                {"env_failures", 0}, {"weight_sync_s", sync_s}, {"step_s", step_s},
                {"tokens_per_s", step_s > 0 ? tokens / step_s : 0.0}, {"wall_s", now_s()}};
    for (const char* key : {"loss", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "lr"})
      row[key] = m.value(key, 0.0);
    TROUPE_TRY(emit(row));
    done_step_ = step_;
    learner_dirty_ = false;
    bool last = step_ == S;
    if (cfg_.eval.every > 0 && step_ % cfg_.eval.every == 0 && !last) TROUPE_TRY(eval_and_log("sft"));
    if (last) TROUPE_TRY(eval_and_log("sft"));
    if (!last) TROUPE_TRY(checkpoint("sft", false));
    if (!last && cfg_.run.max_wall_s > 0 && now_s() > cfg_.run.max_wall_s) {
      TROUPE_TRY(checkpoint("sft", true));
      return make_error(ErrorCode::timeout, "run.max_wall_s reached at step " + std::to_string(step_) +
                                                " (continue with --resume " + run_dir_ + ")");
    }
  }
  if (S > 0 && first_step < S) TROUPE_TRY(checkpoint("sft", true));
  return {};
}

Status Coordinator::run_grpo(int64_t first_k) {
  int64_t S = cfg_.sft.enabled ? cfg_.sft.max_steps : 0;
  int64_t K = cfg_.grpo.max_steps;
  const auto& ro = cfg_.rollout;
  auto finish_step = [&](int64_t k) -> Status {
    done_step_ = step_;
    learner_dirty_ = false;
    bool last = k + 1 == K;
    if (cfg_.eval.every > 0 && step_ % cfg_.eval.every == 0 && !last) TROUPE_TRY(eval_and_log("grpo"));
    if (last) TROUPE_TRY(eval_and_log("grpo"));
    if (cfg_.run.max_wall_s > 0 && now_s() > cfg_.run.max_wall_s && !last) {
      TROUPE_TRY(checkpoint("grpo", true));
      return make_error(ErrorCode::timeout, "run.max_wall_s reached at step " + std::to_string(step_) +
                                                " (continue with --resume " + run_dir_ + ")");
    }
    return checkpoint("grpo", last);
  };
  if (!ro.async) {
    for (int64_t k = first_k; k < K; ++k) {
      double t = mono_s();
      TROUPE_ASSIGN_OR_RETURN(auto r, make_rollout(S + k + 1, k));
      step_ = S + k + 1;
      TROUPE_TRY(train_on(r, step_, k, t, 0));
      TROUPE_TRY(finish_step(k));
    }
    return {};
  }
  // async: the rollout thread runs ahead, bounded by the staleness condition
  async_ = std::make_unique<Async>();
  async_->weights_sent = version_;
  int64_t base = version_ - first_k;  // version before GRPO step 0
  // streamed: each step's groups come in rollout.async_chunks parts, and the learners start on a
  // part as soon as it is scored (the queue then holds parts; the staleness condition alone bounds
  // how far ahead the rollout thread runs)
  const bool streamed = ro.async_chunks > 1;
  async_->thread = std::thread([this, first_k, K, base, S, streamed]() {
    auto push = [this](int64_t k, Result<Rollout> r) {
      {
        std::lock_guard lk(async_->mu);
        async_->queue.emplace_back(k, std::move(r));
      }
      async_->cv.notify_all();
    };
    for (int64_t k = first_k; k < K; ++k) {
      double wait0 = mono_s();
      {
        std::unique_lock lk(async_->mu);
        async_->cv.wait(lk, [&] {
          return async_->stop ||
                 (async_->weights_sent + async_->skipped >= base + k - cfg_.rollout.max_staleness &&
                  (streamed ||
                   async_->queue.size() < static_cast<size_t>(std::max(1, cfg_.rollout.max_staleness))));
        });
        if (async_->stop) return;
      }
      double waited = mono_s() - wait0;
      if (streamed) {
        PartSink sink = [&](Rollout&& part) {
          part.idle_s = part.part == 0 ? waited : 0.0;
          push(k, std::move(part));
        };
        auto r = make_round(S + k + 1, k, 0, &sink);
        if (!r.ok()) {
          push(k, r.error());
          return;
        }
        continue;
      }
      auto r = make_rollout(S + k + 1, k);
      if (r.ok()) r->idle_s = waited;
      bool failed = !r.ok();
      push(k, std::move(r));
      if (failed) return;
    }
  });
  Status result;
  for (int64_t k = first_k; k < K; ++k) {
    double t = mono_s();
    step_ = S + k + 1;
    if (streamed) {
      if (auto st = train_streamed(step_, k, t); !st.ok()) {
        result = st;
        break;
      }
    } else {
      auto item = async_->pop();
      if (!item.second.ok()) {
        result = item.second.error();
        break;
      }
      if (auto st = train_on(*item.second, step_, k, t, item.second->idle_s); !st.ok()) {
        result = st;
        break;
      }
    }
    if (auto st = finish_step(k); !st.ok()) {
      result = st;
      break;
    }
  }
  {
    std::lock_guard lk(async_->mu);
    async_->stop = true;
  }
  async_->cv.notify_all();
  if (async_->thread.joinable()) async_->thread.join();
  async_.reset();
  return result;
}

Status Coordinator::run(bool resume) {
  t0_ = mono_s();
  if (!cfg_.policy.path.empty() && (cfg_.policy.tokenizer == "auto" || fs::exists(cfg_.policy.path))) {
    auto t = policy::io::load_tokenizer_dir(cfg_.policy.path);
    if (t.ok()) tokenizer_ = std::move(t).value();
  }
  if (!tokenizer_) {
    TROUPE_ASSIGN_OR_RETURN(tokenizer_, make_builtin_tokenizer(cfg_.policy.tokenizer == "auto" ? "char" : cfg_.policy.tokenizer));
  }
  int64_t S = cfg_.sft.enabled ? cfg_.sft.max_steps : 0;
  int64_t start = 0;
  if (resume) {
    TROUPE_ASSIGN_OR_RETURN(auto dir, learner::latest_checkpoint(run_dir_ + "/checkpoints"));
    CheckpointReq req;
    req.load = true;
    req.dir = dir;
    for (auto l : peers_.learners) {
      TROUPE_ASSIGN_OR_RETURN(auto rep, ask<CheckpointRep>(*peers_.system, l, req, kLongTimeout));
      json extra = json::parse(rep.extra_json, nullptr, false);
      start = extra.value("global_step", rep.step);
      wall_offset_ = extra.value("wall_s", 0.0);
    }
    TROUPE_TRY(sync_weights(nullptr));
    if (hooks_.log) hooks_.log("resumed from " + dir + " at step " + std::to_string(start));
  }
  step_ = start;
  done_step_ = saved_step_ = start;
  auto phases = [&]() -> Status {
    if (cfg_.eval.at_start && start == 0) TROUPE_TRY(eval_and_log(cfg_.sft.enabled ? "sft" : "grpo"));
    if (cfg_.sft.enabled && start < S) TROUPE_TRY(run_sft(start));
    if (cfg_.grpo.enabled) TROUPE_TRY(run_grpo(std::max<int64_t>(0, start - S)));
    return {};
  };
  Status st = phases();
  if (st.ok()) return st;
  const bool planned = st.error().code == ErrorCode::timeout && st.error().message.rfind("run.max_wall_s", 0) == 0;
  return planned ? st : save_what_is_done(st.error());
}

Status Coordinator::save_what_is_done(const Error& cause) {
  // Nothing new or no checkpoints: as it was. The learners updated for a step that did not finish
  // (their state is no step's), or they are what failed: nothing is saved, and the error says so.
  if (!cfg_.checkpointing.enabled || done_step_ <= saved_step_) return cause;
  const bool learner_failed = cause.message.find("learner") != std::string::npos;
  if (learner_dirty_ || learner_failed)
    return make_error(cause.code, cause.message + " (not saved: " +
                                      (learner_dirty_ ? "the learners had already updated for step " +
                                                            std::to_string(done_step_ + 1)
                                                      : std::string("a learner failed")) +
                                      "; the last checkpoint is step_" + std::to_string(saved_step_) + ")");
  const int64_t S = cfg_.sft.enabled ? cfg_.sft.max_steps : 0;
  step_ = done_step_;  // the learners' state is that of the last finished step
  // the save may take longer than the grace a peer failure leaves this process
  constexpr auto kSaveTimeout = std::chrono::seconds(300);
  if (hooks_.hold_exit) hooks_.hold_exit(kSaveTimeout);
  Status saved = checkpoint(done_step_ <= S ? "sft" : "grpo", true, kSaveTimeout);
  if (!saved.ok()) return make_error(cause.code, cause.message + " (saving step " + std::to_string(done_step_) +
                                                     " failed too: " + saved.error().message + ")");
  return make_error(cause.code, cause.message + "; steps up to " + std::to_string(done_step_) +
                                    " are saved in checkpoints/step_" + std::to_string(done_step_) +
                                    ": remove the cause and continue with --resume " + run_dir_);
}

}  // namespace troupe::actors
