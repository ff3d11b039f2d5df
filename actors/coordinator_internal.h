// The coordinator's parts and what they share (internal to actors/): the run's state, the data of
// one GRPO step, and one function per job, each in its own file. Every function that waits for a
// role is a coroutine (runtime/coroutine.h) running on the coordinator actor's thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/coordinator.h"
#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/weight_sync.h"
#include "troupe/base/result.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/runtime/coroutine.h"

namespace troupe::actors::coord {

using json = nlohmann::json;
using runtime::ActorId;
using runtime::Task;

inline constexpr auto kEnvTimeout = std::chrono::seconds(120);
inline constexpr auto kLongTimeout = std::chrono::hours(2);

double mono_s();  // steady clock, seconds

// The env side of one model turn of a multi-turn episode.
struct TurnInfo {
  std::string observation;  // what the env showed before the turn (turn 0: the prompt)
  double reward = 0;
  std::string info_json = "{}";
  double env_s = 0, generate_s = 0;
};

// One GRPO step's worth of data (or one streamed part of it): groups of G samples, scored.
struct Rollout {
  struct Group {
    int64_t index = 0;  // the prompt's index in its step's sequence (round * prompts_per_step + i)
    std::string env;
    std::string prompt_text;
    json metadata;
    uint64_t seed = 0;
    std::vector<GenSample> samples;
    std::vector<double> rewards, correct;
    std::vector<std::string> errors;
    std::vector<std::string> reasons;  // per sample: "" or why it failed (a trajectory termination)
    std::vector<std::string> components;  // per sample: the reward's parts (JSON), "" when unknown
    std::string env_version;
    std::string messages_json = "[]";  // the first observation's chat messages
    std::vector<std::vector<TurnInfo>> turns;  // multi-turn: per sample, the env side of each turn
    // envs that run their episodes (served_episodes.cpp): per sample, the episode's further
    // training samples (turns that did not extend the first sample's context), same advantage
    std::vector<std::vector<GenSample>> more_samples;
  };
  std::vector<Group> groups;
  int64_t policy_version = 0;
  int64_t sample_version = -1;  // the version every generation request named (-1: the newest)
  // dynamic sampling: generation round of these groups, its seed base and first group index
  int round = 0, rounds = 1;
  uint64_t seed_base = 0;
  int64_t index0 = 0;
  int part = 0, parts = 1;  // streamed (rollout.async_chunks): which part of the step's groups
  double gen_s = 0, env_s = 0, idle_s = 0;
  double version_wait_s = 0;  // in-flight updates: generation time spent waiting for versions (slowest generator)
  int retries = 0;  // env calls retried on another env worker
};

struct Prepared {  // what a rollout gives the learners
  std::vector<TrainSample> samples;
  std::vector<float> adv;  // per sample of the rollout's groups (0 where not kept)
  int groups_kept = 0, stale_dropped = 0;
};

struct Trained {  // what the learners gave back
  bool updated = false;
  json metrics = json::object();
  double learner_s = 0;
};

// Async mode: the rollout coroutine runs ahead of the training one, in the same actor.
// Which version samples step k's rollout depends only on the seed and the config, never on
// timing: the version the learners had once step k - max_staleness - 1 was done (the phase's
// first version for the first steps), which every generation request of the rollout names.
struct Pipeline {
  std::deque<std::pair<int64_t, Result<Rollout>>> queue;  // (k, rollout or one streamed part)
  int64_t first_k = 0;         // the phase's first GRPO step (after a resume: the step it continues at)
  int64_t start_version = 0;   // the learners' version at first_k
  std::map<int64_t, int64_t> version_after;  // GRPO step k -> the learners' version once it is done
  int64_t produced = -1;       // the last step whose whole rollout is queued (or trained)
  int64_t last_k = 0;          // the last step the rollout coroutine produces
  bool stop = false;           // the training side is done: the rollout coroutine ends
  bool ended = false;          // the rollout coroutine has ended (done, stopped or failed)
  runtime::Wakeup changed;  // any of the above changed
};

// The run's state, shared by the parts. Lives in the coordinator actor.
struct RunState {
  ExperimentConfig cfg;
  RolePeers peers;
  CoordinatorHooks hooks;
  std::string run_dir;
  runtime::ActorContext here;  // the Context the coroutines send with
  std::unique_ptr<policy::io::Tokenizer> tokenizer;
  std::shared_ptr<const policy::io::ChatTemplate> chat_template;  // policy.path's (rollout.template chat)
  int64_t step = 0;        // global step (SFT steps, then GRPO steps)
  int64_t version = 0;     // learner policy version
  double wall_offset = 0;  // wall_s already spent before a resume
  double t0 = 0;
  json last_eval;
  int64_t last_eval_step = -1;
  // checkpointing.keep_best_by: the best value checkpointed so far (read from checkpoints/best on
  // first use, so a resumed run knows it); an eval that beats it is checkpointed at once.
  bool best_known = false;
  std::optional<double> best_value;
  // Steps finished (trained and logged) and the last one checkpointed: when the run fails for a
  // reason other than a learner (an env that keeps crashing, a generator), what is done is saved.
  int64_t done_step = 0;
  int64_t saved_step = 0;
  bool learner_dirty = false;  // an update was sent for a step that is not done yet
  Pipeline* async = nullptr;   // set while an async GRPO phase runs
  std::string resumed_pipeline;  // the checkpoint's pipeline.bin (--resume of an async run)
  int64_t trained_episodes = 0;  // the ledger's count: episodes of the GRPO steps trained so far
  std::vector<std::string> serve_urls;  // each generator's rollout.serve endpoint (asked on first use)
  std::unique_ptr<WeightSync> weight_sync;  // what each generator holds (made on the first sync)

  double now_s() const { return wall_offset + mono_s() - t0; }
  Status emit(json row) const { return hooks.metrics ? hooks.metrics(row) : Status{}; }
  ActorId env_worker(size_t i) const { return peers.env_workers[i % peers.env_workers.size()]; }
  // A generator whose rank is down (under mpirun with two or more generators a dead generator
  // does not end the job: its prompts go to the others, generation_failover in rollout.cpp).
  // In one process a generator thread can die alone (its actor failed): generators_down.
  std::vector<char> generators_down;
  bool generator_alive(size_t g) const {
    if (g < generators_down.size() && generators_down[g]) return false;
    return !peers.system || !peers.system->node_is_down(peers.generators[g].node);
  }
  void mark_generator_down(size_t g) {
    generators_down.resize(peers.generators.size(), 0);
    generators_down[g] = 1;
  }
  // The first live generator at or after g (cyclically), or none when every one is down.
  std::optional<size_t> live_generator_from(size_t g) const {
    for (size_t d = 0; d < peers.generators.size(); ++d)
      if (generator_alive((g + d) % peers.generators.size())) return (g + d) % peers.generators.size();
    return std::nullopt;
  }
};

// A generation request whose generator died: sent again, unchanged (same prompts, same sampling
// seed, so the same samples), to the next live generator, until one answers or none is left.
// A generator whose request failed as peer_failed (its rank is down, or its actor stopped) is
// dead from then on. Any other failure is returned as it is.
Task<Result<GenerateRep>> generation_failover(RunState& s, Result<GenerateRep> first, const GenerateReq& req,
                                              size_t g);

// coordinator.cpp: the step loop's pieces that async_pipeline.cpp shares.
std::vector<runtime::Reply<TrainRep>> send_train(RunState& s, TrainReq req);  // to every learner (one shared object)
bool eval_due(const RunState& s, bool last_of_phase);
Task<Status> train_on(RunState& s, Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle);
// The metric row, the weight sync (or, in async mode, the skipped version), trajectories.
Task<Status> finish_grpo_step(RunState& s, const Rollout& r, const Prepared& p, const Trained& tr,
                              int64_t step, double step_start, double gen_idle);
Task<Status> finish_step(RunState& s, int64_t k);  // evals, checkpoints, run.max_wall_s after GRPO step k

// async_pipeline.cpp: the GRPO phase in async mode (rollout.async).
Task<Status> run_grpo_async(RunState& s, int64_t first_k);
// After GRPO step k, before an eval or a checkpoint: waits until the rollouts of the steps whose
// version is older than the learners' (k+1 .. k+max_staleness) are all finished, so that neither
// the eval's weights nor the checkpoint's contents depend on timing.
Task<Status> drain_pipeline(RunState& s, int64_t k);
// (pipeline_state.h: pipeline_snapshot, what a checkpoint keeps of the pipeline)
// Whether the GRPO step j is a drain point whatever the timing: an eval or a checkpoint follows it
// by the config (eval.every, checkpointing.every, the phase's last step).
bool drains_after(const RunState& s, int64_t j);
// The last step whose rollout drain_pipeline(s, k) finishes: k + max_staleness (at most the last
// one produced); with in-flight updates after a step that is no drain point (a stop for time or
// a signal), k + 1: later rollouts wait for versions of steps that will not be trained.
int64_t drained_through(const RunState& s, int64_t k);
// rollout.in_flight_updates: the GRPO steps whose versions step k's rollout moves to before decode
// steps N, 2N, ... (N = rollout.in_flight_every; GenerateReq::in_flight_steps): k - S + i - 1 for
// i = 1..S (S = max_staleness), none past k - rollout.in_flight_min_lag nor the first drain point
// in [k - S, k - 1] (its drain waits for this rollout), -1 (stay) where the step comes before the
// phase's first one.
std::vector<int64_t> in_flight_steps(const RunState& s, int64_t k);

// episodes.cpp: one multi-turn episode (token in, token out).
struct Episode {
  size_t group = 0;
  std::string id, prompt_text;
  std::vector<int32_t> context;  // the next turn's prompt tokens (after turn 0)
  GenSample merged;
  size_t first_prompt_len = 0;
  double reward = 0;
  bool done = false, exact = true, solved = false;
  std::string error, reason;
  size_t worker = 0;                 // env worker index that holds the episode
  std::vector<std::string> actions;  // the turns so far (replayed on another worker after a failure)
  std::vector<TurnInfo> turns;
  std::string components = "{}";     // the last step's reward parts
  std::string feedback;              // the env's last answer (the next turn's observation)
};
// Turn `turn` of episode e: sample s (this turn's completion, sampled from s.prompt_tokens) and the
// env's answer res. Appends the sampled tokens (mask 1) and, when the episode goes on, the
// tokenized feedback (mask 0) to e.merged, and sets e.context, the next turn's prompt tokens.
Status add_turn(Episode& e, const GenSample& s, const Result<EnvObs>& res, int turn, int max_turns,
                const policy::io::Tokenizer& tok);

// env_calls.cpp: env calls that fail. A failed call (an EnvObs / EnvVerifyRep error, or the
// request's own failure) is retried on the next env workers up to envs[].max_retries; what still
// fails is counted and bounded by envs[].max_failure_frac and envs[].max_restarts.
struct ResetOutcome {
  EnvObs obs;  // obs.error set: it failed on every try
  std::string episode_id;
  size_t worker = 0;  // env worker index that holds the episode
  uint64_t seed = 0;
  int retries = 0;
};
const EnvSpec& env_spec(const RunState& s, const std::string& name);
EnvObs settled(Result<EnvObs> r);  // a request that failed as a failed EnvObs (timeout, worker_crash)
// `first` is the reply of req on env worker w. Retries go to workers w+1, w+2, ...; with
// fresh_seed each retry draws a new seed (another prompt of the same env), else the same one.
// (Arguments by reference, kept alive by the caller's co_await: GCC 12 mishandles by-value
// coroutine parameters built from temporaries.)
Task<ResetOutcome> reset_retrying(RunState& s, const Result<EnvObs>& first, const EnvResetReq& req, size_t w,
                                  bool fresh_seed);
// `first` is the reply of req on env worker w; completions that failed are retried elsewhere.
Task<EnvVerifyRep> verify_retrying(RunState& s, const Result<EnvVerifyRep>& first, const EnvVerifyReq& req,
                                   size_t w, int* retries);
// After a step's rollout: stop (peer_failed, exit 3) when an env crossed a bound, naming the env
// and its last reasons; failures below the bounds are logged and the run goes on.
Status check_env_failures(RunState& s, const Rollout& r, int64_t step);
// Text the tokenizer cannot encode, mapped so that it can (characters it lacks become '?').
std::string encodable(const policy::io::Tokenizer& tok, const std::string& text);

// served_episodes.cpp: episodes an env runs itself (type verifiers) against the generators'
// rollout.serve endpoints; fills those groups' samples, rewards and errors. *version: the oldest
// policy version that served any of them (-1: none).
bool runs_episodes(const RunState& s, const std::string& env);
// An episode's recorded turns (in finish order) as its training samples: a turn whose prompt
// extends the previous context token for token continues the sample (the tokens between, mask 0,
// log-prob 0), any other starts one. *version: the oldest version among them (left if none).
std::vector<GenSample> samples_of_turns(const std::vector<ServedTurn>& turns, int64_t* version);
Task<Status> run_served(RunState& s, Rollout& r, const std::vector<int>& groups, int64_t step, int64_t k,
                        int64_t* version);
// Greedy held-out episodes of such an env (generator 0's endpoint): the sums of solved and reward.
Task<Result<std::pair<double, double>>> served_eval(RunState& s, const std::string& env, const std::vector<EnvObs>& got);

// rollout.cpp: prompts by env weight, generation, scoring, dynamic-sampling rounds.
size_t pick_env(const ExperimentConfig& cfg, uint64_t r);
// version: the policy version to sample with (async mode, Rollout::sample_version); -1: the newest.
Task<Result<Rollout>> make_rollout(RunState& s, int64_t step, int64_t k, int64_t version = -1);
// One generation round. With a sink: in rollout.async_chunks parts, each handed to the sink as
// soon as it is scored (its groups move there).
using PartSink = std::function<void(Rollout&& part)>;
Task<Result<Rollout>> make_round(RunState& s, int64_t step, int64_t k, int round,
                                 const PartSink* sink = nullptr, int64_t version = -1);

// episodes.cpp: multi-turn episodes (rollout.max_turns > 1).
Task<Result<Rollout>> multi_turn(RunState& s, Rollout r, int64_t step, int64_t k);
bool episode_solved(const std::string& components_json, double total_reward);

// train_batch.cpp: advantages, kept groups, stale samples -> the learners' samples.
Result<Prepared> prepare(const RunState& s, const Rollout& r);

// sft_batch.cpp: SFT step k's batch of reference completions; *tokens = completion tokens.
Task<Result<TrainReq>> sft_batch(RunState& s, int64_t k, double* tokens);

// weight_sync.cpp: the learner's weights to every generator (s.version = theirs) through
// s.weight_sync (troupe/actors/weight_sync.h). Sync mode waits for every generator's Ack; async
// mode only queues them (generators may be sampling).
Task<Status> sync_weights(RunState& s, double* seconds);

// step_metrics.cpp: the metric rows.
json sft_step_row(const RunState& s, const json& learner_metrics, double tokens, int batch, double sync_s,
                  double step_s);
// The GRPO row without its timings (staleness against s.version before the weight sync).
json grpo_step_row(const RunState& s, const Rollout& r, const Prepared& p, const Trained& tr, int64_t step);
void add_grpo_timings(const RunState& s, json& row, const Rollout& r, const Trained& tr, double sync_s,
                      double step_s, double gen_idle);

// trajectory_log.cpp: logger.trajectories rows of a GRPO step.
void write_trajectories(const RunState& s, const Rollout& r, const std::vector<float>& adv, int64_t step);

// evaluation.cpp: held-out greedy evaluation (see Coordinator::Job::evaluate).
Task<Result<json>> evaluate(RunState& s);
Task<Status> eval_and_log(RunState& s, std::string phase);

// checkpoint_policy.cpp: checkpoints (every, at phase ends, keep_best_by), resume, failure saves.
bool periodic_checkpoint_due(const RunState& s);  // checkpointing.every divides the step
Task<Status> checkpoint(RunState& s, std::string phase, bool force,
                        runtime::Duration timeout = std::chrono::hours(2));
Task<Result<int64_t>> resume_from_latest(RunState& s);  // the global step to continue at
Task<Status> save_what_is_done(RunState& s, Error cause);

}  // namespace troupe::actors::coord
