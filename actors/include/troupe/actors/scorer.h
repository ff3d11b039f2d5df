// The scorer role: frozen models (a distillation teacher, a judge's local model; later reward
// models) that every rollout asks for per-token log-probs or generations, by ScoreReq messages.
// Invariants: a scorer never trains (no optimizer, no gradients); a sequence's numbers never depend
// on which other requests shared its batch (log-probs: one sequence per forward; generations and
// reward scores: batch-invariant kernels); every reply
// names the model's version (the hash of its files); a failed request is an error value, retried
// on another scorer by its caller (ScorerClient, or the coordinator's teacher scoring) and counted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/serve_engine.h"
#include "troupe/base/result.h"
#include "troupe/kernels/bf16_weights.h"
#include "troupe/policy/execution_options.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/policy/model.h"
#include "troupe/policy/reward_model.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

// One frozen model a scorer serves, under the name requests use (its path as the config names it).
struct ScorerModel {
  std::string name;
  // null once `engine` owns the model (from its first generate request on)
  std::unique_ptr<policy::Model> model;
  // A generating model's ServeEngine (continuous batching per decode step): made at the model's
  // first generate request with kScorerSlots slots of kScorerContext tokens (at most the model's
  // max_position_embeddings); from then on every forward of the model (log-probs too) runs on its
  // compute thread, between decode steps.
  std::unique_ptr<ServeEngine> engine;
  int vocab_size = 0;
  // generate: the model's chat template (read at its first generate request; null: it has none)
  std::shared_ptr<const policy::io::ChatTemplate> chat_template;
  bool chat_template_read = false;
  std::unique_ptr<policy::io::Tokenizer> tokenizer;
  std::string model_hash;      // model_files_hash of its path
  std::string tokenizer_hash;  // learner::tokenizer_fingerprint
  // a sequence-classification model (a reward model: config.json's architectures names a
  // *ForSequenceClassification): its score head; it answers sequence_score requests only
  std::unique_ptr<policy::ScoreHead> head;
  // distill.teacher_dtype bf16 on a CPU with AVX512-BF16: the weights' bf16 copies its log-prob
  // forwards multiply by (kernels::Bf16WeightsScope); null: fp32
  std::unique_ptr<kernels::Bf16Weights> bf16;
};

inline constexpr int kScorerSlots = 8, kScorerContext = 2048;

// Threads: run_batch and submit_generate are called by one thread at a time (ScorerActor's compute
// thread); a generate request's `done` runs on its model's ServeEngine thread.
class Scorer {
 public:
  // Loads each path once (a model directory or a .gguf, as policy.path), on the backend `exec`
  // names, batch-invariant, fp32, activation checkpointing on (forward-only: a layer input each).
  // logprob_dtype bf16 (distill.teacher_dtype): the log-prob forwards of the models that are not
  // reward models run their projections and head as bf16 GEMMs (kernels/bf16_weights.h) when the
  // backend is the CPU's and the CPU has AVX512-BF16; else, and for everything else, fp32.
  static Result<std::unique_ptr<Scorer>> create(const std::vector<std::string>& paths, policy::ExecutionOptions exec,
                                                learner::TeacherDtype logprob_dtype = learner::TeacherDtype::fp32);
  // Whether `path`'s log-prob forwards run bf16 (logprob_dtype bf16 and the CPU could).
  bool bf16_logprobs(const std::string& path) const;
  // Runs the requests together, one result each in order (a bad request fails alone): the
  // log-prob requests of one model in tasks of at most max_batch_tokens tokens, each sequence in a
  // forward of its own with the default kernels (batch invariance off for it; those asking top-k
  // through the full logits, the others through the training head), the generate requests through
  // submit_generate (waiting for them).
  std::vector<Result<ScoreRep>> run_batch(const std::vector<const ScoreReq*>& reqs);
  // A generate request without waiting: each prompt (rendered as one user turn through the model's
  // chat template with its generation prompt when the model has one, else the text after BOS) joins its model's ServeEngine at the next
  // decode step (prompt p sampled with the request's seed and stream p, as a lone Model::generate
  // of the request samples it: batch-invariant, whatever else runs). `done` gets the reply (or the
  // error: a bad request at once, else when its last prompt ends; a request the engine cancels, e.g.
  // the scorer stopping, fails naming it). Returns the prompts' streams (cancel() ends them early).
  std::vector<std::shared_ptr<ServeStream>> submit_generate(const ScoreReq& r,
                                                            std::function<void(Result<ScoreRep>)> done);
  void set_threads(int threads) { threads_ = threads; }
  Result<ScoreRep> run(const ScoreReq& r) { return std::move(run_batch({&r})[0]); }
  const ScorerModel* find(const std::string& name) const;
  std::vector<std::string> names() const;
  void set_max_batch_tokens(int n) { max_batch_tokens_ = n; }

 private:
  Status check(const ScoreReq& r, const ScorerModel& m) const;
  void run_logprobs(ScorerModel& m, const std::vector<size_t>& idx, const std::vector<const ScoreReq*>& reqs,
                    std::vector<Result<ScoreRep>>& out);
  void run_sequence_scores(ScorerModel& m, const std::vector<size_t>& idx, const std::vector<const ScoreReq*>& reqs,
                           std::vector<Result<ScoreRep>>& out);
  Status with_model(ScorerModel& m, const std::function<Status(policy::Model&)>& task);
  Result<ServeEngine*> engine_for(ScorerModel& m);
  Result<std::vector<int32_t>> generate_prompt(ScorerModel& m, const std::string& text);
  std::map<std::string, std::unique_ptr<ScorerModel>> models_;
  int max_batch_tokens_ = 16384;
  int threads_ = 0;
};

// "xxh3:<hex>" over a model's files: each regular file of the directory (or the one file), by
// name in sorted order, with its name, size and bytes. The frozen model's version.
Result<std::string> model_files_hash(const std::string& path);

// The models a run's scorers serve: distill.teacher, each dataset env's judge.model when the
// judge has no url (a local model), and each type: reward_model env's path. Sorted, without repeats.
std::vector<std::string> scorer_model_paths(const ExperimentConfig& cfg);

// The actor hosting a Scorer: ScoreReq mail is queued and a compute thread of its own (OpenMP
// `threads`) takes everything queued at once: generate requests join their model's ServeEngine at
// its next decode step (submit_generate; answered when they end), the others run as one batch
// (continuous batching: requests that arrive while a batch computes form the next), so requests
// from every rollout share forwards. Stopping cancels its generations (each answered with an error).
class ScorerActor : public runtime::Actor {
 public:
  explicit ScorerActor(std::shared_ptr<Scorer> scorer, int threads = 0);
  ~ScorerActor() override;
  struct Queue;

 private:
  std::shared_ptr<Scorer> scorer_;
  std::shared_ptr<Queue> queue_;
};

// ScorerStats (what a caller's scorer requests cost, metrics scorer/*) is in messages.h: an env
// worker's EnvVerifyRep carries its judge's and reward model's.

// Counts the scorer requests this thread makes while it lives: every ScorerClient::call on this
// thread (a judge's local model, a reward model on the scorers) adds its tries to `into`. Scopes
// nest (the innermost counts); a call on another thread is not counted.
class CountScorerCalls {
 public:
  explicit CountScorerCalls(ScorerStats& into);
  ~CountScorerCalls();
  CountScorerCalls(const CountScorerCalls&) = delete;
  CountScorerCalls& operator=(const CountScorerCalls&) = delete;

 private:
  ScorerStats* previous_;
};

// A blocking caller of the scorers for code outside any coroutine (an env worker's judge): tries
// scorer `first` mod n, then each next one after a failure, at most max_retries retries, each try
// with the deadline timeout_s. The error after the last try names every scorer tried and why.
class ScorerClient {
 public:
  ScorerClient(runtime::ActorSystem& sys, std::vector<runtime::ActorId> scorers, double timeout_s, int max_retries);
  Result<ScoreRep> call(const ScoreReq& r, size_t first = 0);
  ScorerStats stats() const;

 private:
  runtime::ActorSystem& sys_;
  std::vector<runtime::ActorId> scorers_;
  double timeout_s_;
  int max_retries_;
  mutable std::mutex mu_;
  ScorerStats stats_;
};

// The scorers of this process's run as set_scorer_peers installed them (reward_model envs send
// their sequence_score requests there); nullopt when the run has none.
struct ScorerPeers {
  runtime::ActorSystem* system = nullptr;
  std::vector<runtime::ActorId> scorers;
};
std::optional<ScorerPeers> scorer_peers();

// Lets the envs of this process reach the scorers (envs::set_local_model_caller): a judge's local
// model call becomes a ScoreReq (kind generate) through a ScorerClient, first to the next scorer
// in turn (round robin over the calls), then each other scorer once after a failure, each try
// under the judge's timeout_s. No scorers:
// uninstalls the caller. Called by the launcher before it spawns env workers.
void set_scorer_peers(runtime::ActorSystem& sys, const std::vector<runtime::ActorId>& scorers,
                      const ExperimentConfig& cfg);

}  // namespace troupe::actors
