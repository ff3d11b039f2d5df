// The coordinator's parts (internal to actors/coordinator/): one function per job, each in its own
// file, over the run's state (run_state.h) and one step's data (step_data.h); the GRPO phase runs
// through a StepPipeline (step_pipeline.h). Every function that waits for a role is a coroutine
// (runtime/coroutine.h) running on the coordinator actor's thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "run_state.h"
#include "step_data.h"
#include "step_pipeline.h"
#include "troupe/actors/chat_turns.h"
#include "troupe/actors/coordinator.h"
#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/base/result.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/runtime/coroutine.h"

namespace troupe::actors::coord {

using runtime::Task;

inline constexpr auto kEnvTimeout = std::chrono::seconds(120);
inline constexpr auto kLongTimeout = std::chrono::hours(2);

// A generation request whose generator died: sent again, unchanged (same prompts, same sampling
// seed, so the same samples), to the next live generator, until one answers or none is left.
// A generator whose request failed as peer_failed (its rank is down, or its actor stopped) is
// dead from then on. Any other failure is returned as it is.
// type: reward_model envs with config.center batch or running: their scored rewards of groups
// [g0, g1) of r (skip[i]: not scored here) centered per env (reward_centering.cpp).
void center_reward_model_scores(RunState& s, Rollout& r, int g0, int g1, const std::vector<char>& skip);
// The running means to checkpoint, as they were once GRPO step `through`'s rollout was done (-1: now);
// and back on --resume (a malformed entry is an error naming it).
json centering_json(const RunState& s, int64_t through);
Status restore_centering(RunState& s, const json& saved);

Task<Result<GenerateRep>> generation_failover(RunState& s, Result<GenerateRep> first, const GenerateReq& req,
                                              size_t g);

// teacher_scores.cpp (distill): at start, every scorer serves distill.teacher with the student's
// tokenizer (else invalid_input naming both tokenizer hashes); per step, each prepared sample gets
// the teacher's log-probs (and top-k) from the scorers, a failed request retried on the next scorer
// up to distill.max_retries times (counted in p.scorer), after which the step fails (peer_failed).
Task<Status> check_teacher(RunState& s);
Task<Status> score_teacher(RunState& s, Prepared& p);

// training_step.cpp: what every step ends with, for the SFT loop and both GRPO pipelines.
std::vector<runtime::Reply<TrainRep>> send_train(RunState& s, TrainReq req);  // to every learner (one shared object)
bool eval_due(const ExperimentConfig& cfg, int64_t step, bool last_of_phase);
// A stop the run plans (a signal, run.max_wall_s) after a step that is not the phase's last; ok otherwise.
Status planned_stop_if_out_of_time(const RunState& s, bool last);
Task<Status> train_on(RunState& s, Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle);
// The metric row, the weight sync (then the pipeline's step_synced), trajectories.
Task<Status> finish_grpo_step(RunState& s, const Rollout& r, const Prepared& p, const Trained& tr,
                              int64_t step, double step_start, double gen_idle);
Task<Status> finish_step(RunState& s, int64_t k);  // evals, checkpoints, run.max_wall_s after GRPO step k

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
  std::string messages_json;         // rollout.template chat: the first prompt's messages ("": none)
  std::shared_ptr<ChatConversation> chat;  // rollout.template chat: the conversation the context renders
  int rerender_mismatches = 0;       // chat turns whose context is not the template's re-render
};
// Turn `turn` of episode e: sample s (this turn's completion, sampled from s.prompt_tokens) and the
// env's answer res. Appends the sampled tokens (mask 1) and, when the episode goes on, the
// tokenized feedback (mask 0) to e.merged, and sets e.context, the next turn's prompt tokens.
Status add_turn(Episode& e, const GenSample& s, const Result<EnvObs>& res, int turn, int max_turns,
                const policy::io::Tokenizer& tok);
// A step of e that failed (`failed`): e is reset on the next env worker (g's env, seed and draw,
// `split`), its earlier turns (e.actions) replayed and `action` stepped again, up to
// envs[].max_retries times; e.id and e.worker follow it. *retries counts the tries.
Task<EnvObs> step_retrying(RunState& s, Episode& e, const Rollout::Group& g, const std::string& action,
                           const EnvObs& failed, int* retries, int32_t split = 0);

// env_calls.cpp: env calls that fail. A failed call (an EnvObs / EnvVerifyRep error, or the
// request's own failure) is retried on the next env workers up to envs[].max_retries; what still
// fails is counted and bounded by envs[].max_failure_frac and envs[].max_restarts.
struct ResetOutcome {
  EnvObs obs;  // obs.error set: it failed on every try
  std::string episode_id;
  size_t worker = 0;  // env worker index that holds the episode
  uint64_t seed = 0;
  int64_t draw = -1;  // the env's draw number of the try that answered
  int retries = 0;
};
const EnvSpec& env_spec(const RunSetup& s, const std::string& name);
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
// One env's episodes of a step or an eval: how many, how many failed after retries, per reason.
struct EnvFailureCount {
  int total = 0, failed = 0;
  std::map<std::string, int> reasons;
  std::string last;  // the last failure's error
  void add(const std::string& error, const std::string& reason);  // one episode ("" error: it worked)
};
// Stop (peer_failed, exit 3) when env's count crossed a bound (more than envs[].max_failure_frac,
// every episode, or a worker past envs[].max_restarts), naming the env, `where` ("step 3", "the
// eval at step 3") and its last reasons; failures below the bounds are logged and the run goes on.
Status check_failure_bound(RunState& s, const std::string& env, const EnvFailureCount& c, const std::string& where);
// After a step's rollout: check_failure_bound for each env of it.
Status check_env_failures(RunState& s, const Rollout& r, int64_t step);
// Text the tokenizer cannot encode, mapped so that it can (characters it lacks become '?').
std::string encodable(const policy::io::Tokenizer& tok, const std::string& text);
// The same for each string content of a JSON list of chat messages ("" when there are none).
std::string encodable_messages(const policy::io::Tokenizer& tok, const std::string& messages_json);
// What a generation request carries as a prompt's messages (GenerateReq::prompt_messages): the
// env's messages, encodable, under rollout.template chat; "" under plain (the text is the prompt).
std::string prompt_messages_of(const RunState& s, const std::string& messages_json);

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
// One env's eval: sums over its scored episodes (acc: solved, reward, turns: env steps), and every
// episode counted in fails (a failed one, after retries, is left out of the sums); retries: the
// retries its calls took.
struct EvalScore {
  double acc = 0, reward = 0, turns = 0;
  EnvFailureCount fails;
  int retries = 0;
};
// Greedy held-out episodes of such an env (generator 0's endpoint), one per reset in got (a failed
// reset counts as a failed episode); a failed run is retried on the next env workers, all at once.
Task<Result<EvalScore>> served_eval(RunState& s, const std::string& env, const std::vector<ResetOutcome>& got);

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

// sync_weights.cpp: the learner's weights to every generator (s.version = theirs) through
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
void write_trajectories(const RunSetup& s, const Rollout& r, const std::vector<float>& adv, int64_t step);

// evaluation.cpp: held-out greedy evaluation (see Coordinator::Job::evaluate).
Task<Result<json>> evaluate(RunState& s);
Task<Status> eval_and_log(RunState& s, std::string phase);

// membership.cpp: members joining and leaving the running job (troupe join, troupe status). The
// handlers answer JoinReq (refused by name: no cluster.join, another role or model hash, a node id
// in use), LeaveReq (answered once the leaver's work is done) and MembersReq. admit_members runs
// before each weight sync (pending joiners become generators or scorers, so the sync sends them the
// full weights), settle_members after it (due leaves answered, dead members noted); members.json in
// the run directory follows every change.
Status on_join(RunState& s, runtime::Context& ctx, const JoinReq& r);
Status on_leave(RunState& s, runtime::Context& ctx, const LeaveReq& r);
Status on_members(RunState& s, runtime::Context& ctx, const MembersReq& r);
void admit_members(RunState& s);
bool members_pending(const RunState& s);  // a joiner waits for the next weight sync
void settle_members(RunState& s, int64_t version);  // version: what the sync sent
void note_sampled(RunState& s, size_t g, size_t samples, int64_t step);  // generator g answered
void note_failed(RunState& s, size_t g);                                // generator g's request failed
json members_json(const RunState& s);
void write_members(const RunState& s);

// checkpoint_policy.cpp: checkpoints (every, at phase ends, keep_best_by), resume, failure saves.
bool periodic_checkpoint_due(const ExperimentConfig& cfg, int64_t step);  // checkpointing.every divides the step
Task<Status> checkpoint(RunState& s, std::string phase, bool force,
                        runtime::Duration timeout = std::chrono::hours(2));
Task<Result<int64_t>> resume_from_latest(RunState& s);  // the global step to continue at
Task<Status> save_what_is_done(RunState& s, Error cause);

}  // namespace troupe::actors::coord
