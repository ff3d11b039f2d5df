// The three worker roles as plain objects (testable without an actor system) and the actors that
// host them. EnvWorker: env clients by name; Generator: a policy copy that formats prompts and
// samples; LearnerRole: a policy + trainer that publishes versioned weights. Invariant: a role
// only learns about the others through messages (actors/messages.h).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/serve_engine.h"
#include "troupe/actors/served_turns.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_group.h"
#include "troupe/base/result.h"
#include "troupe/envs/client.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/communicator.h"
#include "troupe/learner/policy_model.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/policy/model.h"
#include "troupe/policy/model_config.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

// The policy every role starts from: fresh init (run.seed) or policy.path, plus the tokenizer.
// With expert_shards > 1 the model is only block expert_shard of every MoE layer's routed experts
// (a divided learner's, policy.moe.expert_parallel): bit for bit the whole one's
// slice_experts(expert_shard, expert_shards), never built whole (Model::create_expert_block,
// policy::io::load_expert_block).
class InFlightVersions;  // in_flight_versions.h (internal)
class ExpertRunsEncoder;  // divided experts' weight sync: troupe/actors/expert_sync.h

struct PolicyBundle {
  std::unique_ptr<policy::Model> model;
  std::unique_ptr<policy::io::Tokenizer> tokenizer;
  std::shared_ptr<const policy::io::ChatTemplate> chat_template;  // policy.path's, null when it has none
};
Result<PolicyBundle> make_policy(const ExperimentConfig& cfg, int expert_shard = 0, int expert_shards = 1);
// The character tokenizer of built-in tasks: printable ASCII and newline after <pad> <bos> <eos>.
Result<std::unique_ptr<policy::io::Tokenizer>> make_builtin_tokenizer(const std::string& kind);

// Prompt text as the model sees it (plain: system prompt + text; chat: role-tagged turns).
std::string format_prompt(const RolloutSection& r, const std::string& text);
// A prompt's token ids (before the max_prompt_length cut). rollout.template chat with a model chat
// template: the template's rendering of the conversation (first_messages: the env's messages when
// messages_json has any, else [system prompt,] the user text) and the generation prompt, encoded
// without adding BOS/EOS (the template places them); chat without a model template: BOS + the
// built-in tags of that conversation (== format_prompt's text when there are no messages);
// otherwise (plain) BOS + format_prompt's text, messages ignored.
Result<std::vector<int32_t>> encode_prompt(const RolloutSection& r, const policy::io::Tokenizer& tok,
                                           const policy::io::ChatTemplate* chat, const std::string& text,
                                           const std::string& messages_json = "");

// The learner settings of one phase: the experiment's loss, optimizer and advantage (grpo) sections
// as they are, plus what is derived per phase: the SFT lr override, total_steps, the batch keys of
// grpo (num_iterations 1 in SFT), the training temperature (1 in SFT), max_completion_length
// (rollout.max_response_length * max_turns), importance_weight_cap and the seed.
learner::LearnerConfig learner_config(const ExperimentConfig& cfg, learner::Phase phase);

// Env specs of the run in the envs API's form (paths relative to `base_dir`).
Result<std::vector<envs::EnvSpec>> env_specs(const ExperimentConfig& cfg, const std::string& base_dir);

class RewardModelScorer;  // roles/reward_model_scoring.h: a reward_model env's model

class EnvWorker {
 public:
  EnvWorker();
  ~EnvWorker();
  // `role` (e.g. "env3") tells the workers' injected-fault draws apart (faults.h).
  static Result<std::unique_ptr<EnvWorker>> create(const std::vector<envs::EnvSpec>& specs,
                                                   const std::string& role = "");
  Result<EnvObs> reset(const EnvResetReq& r);
  Result<EnvObs> step(const EnvStepReq& r);
  Result<EnvVerifyRep> verify(const EnvVerifyReq& r);
  Result<EnvObs> run(const EnvRunReq& r);  // an episode the env runs itself (EnvClient::run)
  void release(const EnvReleaseReq& r);
  EnvAggregateRep aggregate(const EnvAggregateReq& r);
  const envs::EnvInfo* info(const std::string& env) const;
  // True when the env's calls may run concurrently (a server at `address:`) or wait for a scorer (a
  // judge with a local model): the actor then runs each call on a thread of its own, so one hung
  // call never delays the next and no runtime worker thread blocks.
  bool concurrent(const std::string& env) const;

 private:
  Result<envs::EnvClient*> client(const std::string& env);
  // A failed call as a reply: the error, its kind, and whether the env is past its bounds.
  void fail(EnvObs& out, const std::string& env, const Error& e) const;
  std::map<std::string, std::unique_ptr<envs::EnvClient>> clients_;
  std::map<std::string, envs::EnvSpec> specs_;
  // type: reward_model envs: the model that scores their responses (verify replaces the reward with its score).
  std::map<std::string, std::unique_ptr<RewardModelScorer>> reward_models_;
  Status score_with_reward_model(const std::string& env, const nlohmann::json& meta,
                                 const std::vector<std::string>& completions, EnvVerifyRep& out);
};

class Generator {
 public:
  static Result<std::unique_ptr<Generator>> create(const ExperimentConfig& cfg);
  // Samples r's prompts with version r.policy_version (taking the held-back Weights up to it first).
  Result<GenerateRep> generate(const GenerateReq& r);
  // Decodes and applies one Weights message (raw, full or delta; weight_codec.h), then runs the
  // probe check it asks for. Everything a weight message does to a generator happens here, so a
  // queue of them can be applied in order. Not applied (an error): a delta against another
  // version than the one held (refused), a payload that fails its checksums (the weights stay as
  // they were); a probe mismatch is an error too, and generate() then refuses to sample until a
  // later sync passes the probe. weights_ack() says what the last call did.
  Status set_weights(const Weights& w);
  const Ack& weights_ack() const { return ack_; }
  // weight_sync.transport nccl: joins the weight group (WeightGroupReq op 1); Weights of encoding
  // device then take their values from its broadcast.
  Status join_weight_group(const WeightGroupReq& r);
  // Async mode (rollout.async): weights arrive while the generator may still owe samples of an
  // older version. hold_weights decodes and checks a message at once, against the newest version
  // received (its Ack says so), but keeps the weights aside, in order; use_version takes those up
  // to `version` (-1: all) and fails when the generator then does not hold exactly that version (it
  // never samples with weights it cannot name the version of). receive_weights is the Weights
  // handler's choice: hold in async mode, set_weights otherwise.
  Status hold_weights(const Weights& w);
  Status use_version(int64_t version);
  Status receive_weights(const Weights& w);
  // weight_sync.relay_fanout, sync mode: a delta applied to the weights it samples with while its
  // parts still arrive (StreamedDelta, weight_decoder.h). stream_weights_begin (the message
  // without its payload) is false when it is not streamed (async or in-flight modes, not a delta
  // against the version held, ...); stream_weights_feed gives the payload's first bytes so far;
  // stream_weights_end is receive_weights(w) with what was fed already applied: the same Ack,
  // bits and errors. stream_weights_abort(payload) undoes what was fed (payload: those bytes).
  // Sync mode sends no generation while weights arrive, so nothing samples half-applied weights.
  bool stream_weights_begin(const Weights& head);
  void stream_weights_feed(const char* payload, std::size_t size);
  Status stream_weights_end(const Weights& w);
  void stream_weights_abort(const char* payload);
  // rollout.in_flight_updates: Weights are decoded and checked on a staging copy of the model
  // (so the actor's thread never touches the model a generation is running on) and kept by
  // version; generate() runs on the actor's compute thread, starts with r.policy_version and,
  // before decode step i * r.in_flight_every, moves to the version step_done() names for GRPO
  // step r.in_flight_steps[i-1], waiting for it. Each sample records its tokens' versions.
  // step_done and receive_weights may run while generate() runs (on another thread).
  bool in_flight() const { return in_flight_ != nullptr; }
  void step_done(const StepVersion& s);
  int64_t version() const { return version_; }
  WeightDtype weight_dtype() const { return dtype_; }
  policy::Model& model() { return *policy_.model; }
  const policy::io::Tokenizer& tokenizer() const { return *policy_.tokenizer; }
  const ExperimentConfig& config() const { return cfg_; }

  // rollout.serve: the engine behind this generator's OpenAI-compatible endpoint (a copy of the
  // policy that set_weights updates too), what it served for episodes, and the tokenizer and chat
  // template the HTTP side renders with. All null/empty when rollout.serve is off. The HTTP server
  // itself lives in launch/ (rollout_serve.h), which calls set_serve_url once it listens.
  const std::shared_ptr<ServeEngine>& serve_engine() const { return engine_; }
  ServedTurnLog& served_turns() { return served_; }
  const std::shared_ptr<const policy::io::Tokenizer>& serve_tokenizer() const { return serve_tok_; }
  const std::shared_ptr<const policy::io::ChatTemplate>& serve_chat_template() const { return serve_tmpl_; }
  void set_serve_url(std::string url) { serve_url_ = std::move(url); }
  const std::string& serve_url() const { return serve_url_; }

 private:
  ExperimentConfig cfg_;
  PolicyBundle policy_;
  std::shared_ptr<ServeEngine> engine_;
  ServedTurnLog served_;
  std::shared_ptr<const policy::io::Tokenizer> serve_tok_;
  std::shared_ptr<const policy::io::ChatTemplate> serve_tmpl_;
  std::string serve_url_;
  // Decodes w into `model`, which holds version `held` (updated when applied): the Ack, the probe
  // check (a failure is kept in probe_failure), the serving engine's copy when to_engine.
  Status apply_weights_to(policy::Model& model, int64_t& held, const Weights& w, bool to_engine,
                          std::string& probe_failure);
  Status stage_weights(const Weights& w);                 // in-flight: receive_weights
  Status take_version(int64_t version);                   // in-flight: the live model to `version`
  std::shared_ptr<InFlightVersions> in_flight_;           // in-flight: versions and step notices
  PolicyBundle staging_;                                  // in-flight: holds the newest version received
  int64_t staging_version_ = 0;
  bool live_synced_ = false;                              // in-flight: the live model holds a received version
  int64_t version_ = 0;
  struct HeldWeights {
    int64_t version = 0;
    std::vector<float> params;  // decoded, in the generator's dtype
  };
  std::deque<HeldWeights> held_;           // hold_weights: not taken yet, oldest first
  bool holding_ = false;                   // set_weights is decoding for hold_weights (the engine waits)
  WeightDtype dtype_ = WeightDtype::fp32;  // weight_sync.dtype: how this generator holds its weights
  Ack ack_;                                // what the last set_weights did
  std::string probe_failure_;              // set while the weights held failed the probe check
  std::unique_ptr<StreamedDelta> streamed_;  // a delta applied while its parts arrive (stream_weights_*)
  StreamedDelta* finishing_ = nullptr;       // stream_weights_end: the delta apply_weights_to finishes
  std::unique_ptr<WeightGroup> weight_group_;  // weight_sync.transport nccl: where device Weights' values come from
  // The table the Weights' checksums follow (sync_tensor_table: cut at the learners' shard bounds
  // when the weights come from the shards); the staging copy's and the serving copy's are the same.
  std::vector<policy::TensorSpec> sync_table_;
  std::vector<int32_t> stop_tokens_;       // EOS + single-token stop strings
  std::vector<std::string> stop_strings_;  // the rest, cut after decoding
};

class LearnerRole {
 public:
  static Result<std::unique_ptr<LearnerRole>> create(const ExperimentConfig& cfg,
                                                     std::unique_ptr<learner::Communicator> comm);
  ~LearnerRole();
  Result<TrainRep> train(const TrainReq& r);
  Weights weights() const;  // the current version, raw (the fp32 arena: with the experts divided, this learner's)
  // The current version for the generators (weight_sync): a delta against r.base_version when that
  // is the version encoded last, weight_sync.mode is delta and the version is no full_every
  // multiple; else in full. With weight_sync.probe, learner 0's probe log-probs with exactly the
  // weights the generators will hold (in their dtype) travel along.
  // r.device (weight_sync.transport nccl): the values go to the weight group by broadcast, the
  // message carries their version, checksums and probe.
  Result<Weights> weights_for_generators(const GetWeightsReq& r);
  // weights_from_shards: the payload of the piece weights_for_generators encoded last (divided
  // experts: one per run it sends, none beyond the first group), when it is of `version` (else an
  // error naming both).
  Result<std::vector<runtime::Bytes>> piece_payloads(std::int64_t version) const;
  // faults.learner_death_sync: SIGKILLs this rank when it is the one to die while sending `version`.
  void fault_in_sync(std::int64_t version) const;
  // Learner 0: makes the weight group's id (op 0) or joins it as rank 0 (op 1).
  Result<WeightGroupRep> weight_group(const WeightGroupReq& r);
  Result<CheckpointRep> checkpoint(const CheckpointReq& r);
  Result<CheckpointRep> load_checkpoint(const CheckpointReq& r);  // checkpoint()'s load = true
  int64_t version() const { return version_; }
  // Learner 0: how many delta syncs took the delta prepared in the optimizer step (the bench, tests).
  int64_t prepared_deltas() const { return encoder_ ? encoder_->prepared_encodes() : 0; }

 private:
  LearnerRole();
  learner::Trainer& trainer_for(learner::Phase phase);
  ExperimentConfig cfg_;
  PolicyBundle policy_;
  std::unique_ptr<learner::ModelAdapter> adapter_;
  // learners_divide_experts: policy_.model holds this learner's block of experts only, on every
  // learner (learner 0 included): the weight sync goes from the blocks (runs_encoder_), its probe runs
  // with the group, and each of the first group's learners writes its runs in a checkpoint.
  bool divided_ = false;
  // divided_: a checkpoint (of any layout) loaded into this learner's block: only its values of the
  // weights and moments are read (learner::load_checkpoint_ranges); and one written by the first
  // group's learners, each its runs (a sharded checkpoint, pieced).
  Result<learner::CheckpointData> load_divided_checkpoint(const std::string& dir, learner::Trainer& trainer);
  Result<std::string> save_divided_checkpoint(const std::string& dir, learner::CheckpointData& d,
                                              const learner::ModelDirWriter& writer, learner::Trainer& trainer,
                                              const learner::CheckpointOptions& opt);
  std::unique_ptr<policy::Model> ref_model_;  // loss.kl_coef > 0: the frozen initial policy
  std::unique_ptr<learner::ModelAdapter> ref_adapter_;
  std::unique_ptr<learner::Communicator> comm_;
  std::unique_ptr<kernels::DeviceCollective> device_comm_;  // the learners' NCCL communicator (cuda), or null
  std::unique_ptr<learner::Trainer> trainer_;
  // Async: the parameters of recent versions (at most rollout.max_staleness back), so that a sample
  // is scored for the mismatch metrics with the weights that sampled it.
  std::map<int64_t, std::vector<float>> snapshots_;
  std::unique_ptr<WeightEncoder> encoder_;  // learner 0: what the generators were sent last
  // Learner 0, delta sync over ZeroMQ: has the encoder prepare the next delta in each optimizer step.
  class DeltaPrep;
  std::unique_ptr<DeltaPrep> delta_prep_;
  std::unique_ptr<WeightGroup> weight_group_;  // learner 0, weight_sync.transport nccl: the broadcast's group
  std::vector<float> master_backup_;        // bf16 probe: the master while the rounded copy is in place
  // weights_from_shards: every learner encodes its own shard (encoder_ over its part of the cut
  // table, in lean memory), keeps it in piece_ and answers with its head (no payload); only learner
  // 0 adds the probe. SendPieceReq then sends piece_'s payload to the generators (weight_pieces.h).
  bool shard_sync_ = false;
  Weights piece_;
  Result<Weights> shard_weights_for_generators(const GetWeightsReq& r);
  // weights_from_shards with divided_: the first group's learners encode their runs of the whole
  // arena (ExpertRunsEncoder, expert_sync.h; the payloads kept in run_payloads_), the others answer
  // with a head of no values; every learner runs the probe with its group, learner 0's goes along.
  std::unique_ptr<ExpertRunsEncoder> runs_encoder_;
  std::vector<runtime::Bytes> run_payloads_;
  Result<Weights> divided_weights_for_generators(const GetWeightsReq& r);
  // weight_sync.probe: the probe sequence and learner 0's log-probs of it into `w`, with the weights
  // the generators hold: the master as it is (fp32), or with `put_rounded` writing their rounded
  // values over it for the probe and the master put back bit for bit after. `forward`, where given,
  // runs the probe's forward (divided experts: with the group's exchange, a collective).
  using ProbeForward = std::function<Status(const std::function<Status()>&)>;
  Status add_probe(Weights& w, const std::function<void(std::span<float>)>& put_rounded,
                   const ProbeForward& forward = {});
  learner::MismatchSums stale_mismatch_;  // of the stale samples of a streamed step's parts so far
  Result<learner::MismatchSums> score_stale(const TrainReq& r, const std::vector<learner::Sample>& samples,
                                            learner::Trainer& trainer);
  learner::Phase phase_ = learner::Phase::grpo;
  bool has_trainer_ = false;
  int64_t version_ = 0;
  int64_t streamed_step_ = -1;  // the GRPO step whose parts are being accumulated
};

// ---- the actors hosting the roles (each answers the requests of its role) ----
class EnvActor : public runtime::Actor {
 public:
  explicit EnvActor(std::shared_ptr<EnvWorker> worker);
  ~EnvActor() override;
  void on_stop(runtime::Context&) override;
  struct Inflight;  // calls running on their own threads (concurrent envs)
 private:
  std::shared_ptr<EnvWorker> worker_;
  std::shared_ptr<Inflight> inflight_;
};

// threads: OpenMP threads the role computes with (0 = the process default). Actors run on the
// runtime's worker threads and OpenMP's thread count is per calling thread, so each handler sets
// it before it computes.
//
// nice > 0 (cluster.generator_nice): the generator samples on a thread of its own at that OS
// priority (and so do the OpenMP threads it starts, which inherit it). With roles sharing cores
// in one process in async mode, the learner -- the critical path -- then runs at full speed and
// sampling takes the cycles it leaves. The handler waits for the job, so the model is still
// touched by one thread at a time. With rollout.in_flight_updates the generation always runs on
// that thread (at nice 0 unless set) and replies from it, the handler returning at once.
class ComputeThread;
class RelayReceiver;  // weight_sync.relay_fanout: troupe/actors/weight_relay.h
class PiecesReceiver;  // weights_from_shards: troupe/actors/weight_pieces.h

class GeneratorActor : public runtime::Actor {
 public:
  // index: which of cluster.generators it is; own_process: alone in its process (an mpirun rank),
  // so that faults.generator_death_step kills the process rather than the actor.
  explicit GeneratorActor(std::shared_ptr<Generator> gen, int threads = 0, int nice = 0, int index = 0,
                          bool own_process = false);
  ~GeneratorActor() override;

 private:
  std::shared_ptr<Generator> gen_;
  int threads_;
  int index_;
  bool own_process_;
  std::unique_ptr<ComputeThread> compute_;
  std::unique_ptr<RelayReceiver> relay_;  // WeightsParts: applied here and passed on
  std::unique_ptr<PiecesReceiver> pieces_;  // the learners' pieces (weights_from_shards), assembled here
  Ack apply_pieces(const Weights& w);
  // Async weights from the shards: a GenerateReq that comes while a transmission is still being
  // assembled (its head came from the coordinator before the request, but a learner's runs travel
  // on another connection and may come after it) waits here until every transmission is applied.
  std::deque<std::pair<runtime::ReplyTo, GenerateReq>> deferred_;
  void generate_later(runtime::ReplyTo reply, const GenerateReq& r);
  void replay_deferred();
};

class LearnerActor : public runtime::Actor {
 public:
  explicit LearnerActor(std::shared_ptr<LearnerRole> role, int threads = 0);

 private:
  std::shared_ptr<LearnerRole> role_;
  int threads_;
};

// The compute threads of a role ("generator" or "learner") on this rank: its own key, else
// cluster.threads, else `fallback` (what the launcher resolved for the rank).
int role_threads(const ClusterSection& c, const std::string& role, int fallback);

}  // namespace troupe::actors
