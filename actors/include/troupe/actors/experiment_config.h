// One experiment, as the YAML file describes it, after validation: what every role is told.
// Defaults live here and in the sections it takes from other libraries (the field initializers):
// policy is policy::ExecutionOptions (policy.device and the training optimizations) plus
// policy.model, a fresh model's policy::ModelArchitecture; loss and optimizer are learner's GrpoLossConfig and
// OptimizerConfig, and grpo holds learner's AdvantageConfig, so every C++ field has its YAML key's
// name. launch/config_schema.cpp names every field with its YAML path, range and description, so
// the schema and these structs cannot drift apart.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/actors/weight_dtype.h"
#include "troupe/base/enum_names.h"
#include "troupe/envs/faults.h"
#include "troupe/learner/config.h"
#include "troupe/policy/model_config.h"
#include "troupe/runtime/transport_kind.h"

namespace troupe::actors {

// The enum-valued keys, each parsed once by the schema (launch/config_schema.cpp) through the
// YAML names at the end of this file.
enum class TokenizerKind { char_level, byte_level, from_model };  // policy.tokenizer: char | byte | auto
enum class PromptTemplate { plain, chat };                        // rollout.template
enum class StalePolicy { drop, importance_weight };               // rollout.stale_policy
enum class WeightSyncMode { delta, full };                        // weight_sync.mode
enum class WeightTransport { zmq, nccl };                         // weight_sync.transport
enum class ProgressMode { detect, tty, plain, off };              // logger.progress: auto | tty | plain | off
enum class WandbMode { online, offline, disabled };               // logger.wandb.mode
enum class EnvType { builtin, plugin, remote, nemo_gym, reasoning_gym, verifiers, judge, reward_model };  // envs[].type
enum class IsolateMode { detect, yes, no };                       // envs[].isolate: auto | true | false

struct RunSection {
  std::string dir = "runs/default";  // run directory (metrics, checkpoints, resolved config)
  std::string name = "troupe";
  int seed = 1;
  double max_wall_s = 0;  // stop the run after this many seconds (0 = no limit)
  int restarts = 0;       // troupe run restarts a failed job from its latest checkpoint this often (--restarts)
  std::string launcher;   // with restarts: the command that starts the job's ranks (--launcher), e.g. "mpirun -np 4"
  bool restart_remaining_ranks = false;  // restart without the ranks the launcher reported dead ({np} in launcher)
};

// How the model runs (policy.device, policy.moe_grouped, ...) applies to fresh and loaded models
// alike; policy.model is only a fresh model's architecture (a loaded one's is its config.json).
struct PolicySection : policy::ExecutionOptions {
  policy::ModelArchitecture model;
  std::string path;               // start from this model directory ("" = fresh initialization)
  TokenizerKind tokenizer = TokenizerKind::char_level;  // char | byte | auto (from the model directory)
  float init_std = 0.02f;
  policy::LoraConfig lora;        // policy.lora: adapters on the frozen base (rank 0 = off)
  int expert_parallel = 1;        // policy.moe.expert_parallel: learner ranks per expert-parallel group (1 = off)
};

struct SftSection {
  bool enabled = false;
  int max_steps = 0;
  int batch_size = 32;  // prompt/completion pairs per step
  float lr = 0;         // 0 = optimizer.lr
};

// The advantage keys (adv_estimator, scale_rewards, reward_clip, dynamic_sampling) are the
// learner's AdvantageConfig; the rest steers the phase.
struct GrpoSection : learner::AdvantageConfig {
  bool enabled = true;
  int max_steps = 10;
  int num_iterations = 1;       // optimization passes over one generation batch (PPO epochs)
  int micro_batch_tokens = 0;   // token budget per micro-batch (0 = one micro-batch)
  int max_generation_rounds = 4;  // dynamic sampling: generation rounds per step at most
  bool mask_truncated = false;    // no loss on completions cut at max_response_length
};

struct EnvSpec {
  std::string name;                // label in metrics (reward_mean/<name>); builtin id by default
  EnvType type = EnvType::builtin;
  std::string env;                 // builtin id ("" = name)
  std::string path;                // plugin: path of the .so
  std::vector<std::string> command;  // remote: argv that starts the env server ({bind} = its address)
  std::string address;             // remote: address of a running env server
  std::vector<std::string> addresses;  // remote/nemo_gym/verifiers: a pool of running servers (episodes by load)
  double weight = 1;               // share of the prompts drawn from this env
  double timeout_s = 30;           // per call
  IsolateMode isolate = IsolateMode::detect;  // auto | true | false: run builtin/plugin envs in a worker process
  nlohmann::json config = nlohmann::json::object();  // passed to the env as is
  double startup_timeout_s = 60;   // a started env server must answer hello within this
  int max_restarts = 100;          // env worker restarts per run before the env is given up
  int max_message_bytes = 64 << 20;  // largest env protocol message a socket accepts; larger: connection dropped
  std::string worker;              // troupe-env-worker binary ("" = found automatically)
  int max_retries = 2;             // a failed episode is retried this often, on the next env worker
  double max_failure_frac = 0.5;   // more of one step's episodes failing (after retries) stops the run
  double reward_min = -1e6, reward_max = 1e6;  // a reward outside (or not finite) fails the episode
  std::string url;                 // nemo_gym: a running resource server, http://HOST:PORT
  nlohmann::json environment = nlohmann::json::object();  // command: variables set in its environment
  std::string cwd;                 // command: its working directory ("" = troupe's; relative: the YAML's folder)
  const std::string& env_id() const { return env.empty() ? name : env; }
};

struct RolloutSection {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  int max_prompt_length = 64;    // tokens; longer prompts are cut from the left (recorded)
  int max_response_length = 32;  // tokens per turn; longer responses are truncated (recorded)
  int num_generations = 8;       // G
  int prompts_per_step = 8;
  std::vector<std::string> stop;  // stop strings (besides EOS)
  PromptTemplate template_name = PromptTemplate::plain;
  std::string system_prompt;
  int max_turns = 1;
  bool async = false;
  int max_staleness = 1;
  int async_chunks = 1;               // async: parts per step streamed to the learners as they are scored
  StalePolicy stale_policy = StalePolicy::drop;
  float importance_weight_cap = 2.0f;  // importance_weight: truncation of pi_old / pi_behavior
  // async: generators move to newer weights between decode steps (every in_flight_every steps, at
  // decode steps fixed by the config, never by timing; docs/weight_sync.md)
  bool in_flight_updates = false;
  int in_flight_every = 16;
  int in_flight_min_lag = 1;  // step k's rollout moves at most to the version after step k - this
  std::string serve;    // HOST:PORT: each generator serves its policy over OpenAI-compatible HTTP ("" = off)
  int serve_slots = 16; // sequences the endpoint samples together
};

// How learner 0's weights reach the generators after each update (docs/weight_sync.md).
struct WeightSyncSection {
  WeightSyncMode mode = WeightSyncMode::delta;  // delta: the XOR against the version the generator holds, zstd-compressed | full
  int full_every = 50;         // delta mode: versions divisible by this go in full (0 = only when needed)
  WeightDtype dtype = WeightDtype::fp32;  // the generators' weights: fp32 (the master as is) | bf16 (rounded, nearest even)
  bool probe = true;           // after each sync the generator's log-probs of a probe sequence must equal learner 0's
  WeightTransport transport = WeightTransport::zmq;  // zmq: Weights messages | nccl: values by broadcast over the weight group
  bool prepare_in_step = true;    // bf16 deltas: learner 0 prepares the next delta inside each optimizer step
  // zmq: the most generators one sender (learner 0's rank or a relaying generator) sends a version
  // to; more live generators than this make a relay tree. 0 or 1: every one from learner 0 (star).
  int relay_fanout = 4;
};

struct ClusterSection {
  int learners = 1;
  int generators = 1;
  int env_workers = 1;
  runtime::TransportKind transport = runtime::TransportKind::ipc;  // between ranks; one process always uses inproc
  std::string bind_host = "127.0.0.1";
  double heartbeat_s = 1.0;
  double peer_timeout_s = 30.0;
  int threads = 0;  // compute threads per rank (0 = all cores / ranks on the node)
  int generator_threads = 0;  // compute threads of a generator (0 = threads)
  int learner_threads = 0;    // compute threads of a learner (0 = threads)
  int generator_nice = 0;     // OS priority (nice) of the generator's compute threads (0 = as the process)
  int scorers = 0;            // scorer ranks: frozen models (distill.teacher, judges' model) served to every rollout
  int scorer_threads = 0;     // compute threads of a scorer (0 = threads)
  bool curve = false;                 // tcp between ranks encrypted and authenticated (ZeroMQ CURVE)
  std::string curve_public_key;       // this rank's key files (Z85, `troupe keygen`), relative to the YAML's folder
  std::string curve_secret_key;
  std::string curve_authorized_keys;  // the public keys of every rank allowed to connect, one per line
  bool join = false;  // rank 0 admits generators and scorers that join over tcp (`troupe join`)
};

struct CheckpointSection {
  bool enabled = true;
  int every = 0;        // steps (0 = at the end of each phase only)
  int keep_last = 2;
  std::string keep_best_by;  // metric name, e.g. eval_accuracy ("" = off)
  bool higher_is_better = true;
};

struct LoggerSection {
  bool tensorboard = true;
  ProgressMode progress = ProgressMode::detect;  // auto | tty | plain | off
  bool trajectories = true;       // write trajectories/*.jsonl
  int trajectories_per_step = 8;  // at most this many per step are written
  struct Wandb {
    std::string project;            // W&B project ("" = no W&B logging)
    std::string name;               // the W&B run's name ("" = run.name)
    WandbMode mode = WandbMode::online;
  } wandb;
};

struct EvalSection {
  int every = 0;          // steps (0 = only at the end of each phase)
  int num_prompts = 64;   // held-out prompts per env
  bool at_start = false;  // evaluate before training, too
};

// Fault injection, off by default (docs/reliability.md): the reliability tests and
// `troupe bench reliability` make envs, learners and checkpoint writes fail on purpose.
struct FaultsSection {
  int seed = 0;                    // the draws below are a hash of this, the call and the env worker
  std::string env;                 // the env the env faults hit (empty: every env)
  envs::FaultOp env_op = envs::FaultOp::any;  // reset | step | verify | any
  double env_exception = 0;        // probability per call of each env fault kind
  double env_crash = 0;
  double env_hang = 0;
  double env_slow = 0;
  double env_malformed = 0;
  double env_drop = 0;             // the request is lost on the wire (the call times out)
  double env_slow_s = 1.0;         // the delay of a slow call
  std::vector<int> env_steps;      // env faults only in these GRPO steps (empty: every step)
  int learner_death_step = 0;      // SIGKILL learner rank learner_death_rank as this GRPO step starts
  int learner_death_rank = 0;
  int learner_death_sync = 0;      // ... or as it sends its piece of this version (weights_from_shards)
  int generator_death_step = 0;    // generator generator_death_rank dies as it samples this GRPO step
  int generator_death_rank = 0;    // (its index among cluster.generators)
  int checkpoint_interrupt_step = 0;  // the process is killed half-way through this step's checkpoint
  double generator_token_s = 0;    // every generation waits this long per sampled token (a slower generator)
};

// YAML `learner.*`: how the learner ranks split the training state, and the memory each rank may use.
struct LearnerSection {
  learner::ShardStage shard = learner::ShardStage::none;  // none | optimizer | gradients | parameters (ZeRO 1-3)
  bool optimizer_offload = false;  // AdamW on the host mirror of a device model's weights (else on the device)
  std::string memory_budget;  // e.g. "4GiB": each rank's planned memory (troupe plan) must fit ("" = no budget)
};

struct ExperimentConfig {
  RunSection run;
  PolicySection policy;
  SftSection sft;
  GrpoSection grpo;
  learner::GrpoLossConfig loss;
  learner::OptimizerConfig optimizer;
  LearnerSection learner;
  learner::DistillConfig distill;  // on-policy distillation from a teacher on the scorers
  std::vector<EnvSpec> envs;
  RolloutSection rollout;
  WeightSyncSection weight_sync;
  ClusterSection cluster;
  CheckpointSection checkpointing;
  LoggerSection logger;
  EvalSection eval;
  FaultsSection faults;
};

// policy.moe.expert_parallel > 1 with learner.shard: none in a synchronous run: each learner holds
// only its block of the experts (policy::Model::slice_experts), learner 0 too: the weights go to the
// generators from the blocks (weights_from_shards, actors/expert_sync.h) and each learner writes its
// part of a checkpoint (a sharded one). With learner.shard
// optimizer or gradients, or rollout.async (whose stale samples are scored with older whole
// weights on every learner), or policy.lora (slice_experts keeps whole models: the frozen base
// and the adapters stay on every learner), every learner holds every expert and only the compute
// is split.
inline bool learners_divide_experts(const ExperimentConfig& c) {
  return c.policy.expert_parallel > 1 && c.learner.shard == learner::ShardStage::none && !c.rollout.async &&
         !c.policy.lora.enabled();
}

}  // namespace troupe::actors

// The YAML names of the enums above (troupe/base/enum_names.h).
namespace troupe {
#define TROUPE_ENUM_NAMES(E, ...)                                            \
  template <>                                                                \
  struct EnumNames<actors::E> {                                              \
    using V = actors::E;                                                     \
    static constexpr std::pair<std::string_view, V> table[] = {__VA_ARGS__}; \
  };
TROUPE_ENUM_NAMES(TokenizerKind, {"char", V::char_level}, {"byte", V::byte_level}, {"auto", V::from_model})
TROUPE_ENUM_NAMES(PromptTemplate, {"plain", V::plain}, {"chat", V::chat})
TROUPE_ENUM_NAMES(StalePolicy, {"drop", V::drop}, {"importance_weight", V::importance_weight})
TROUPE_ENUM_NAMES(WeightSyncMode, {"delta", V::delta}, {"full", V::full})
TROUPE_ENUM_NAMES(WeightTransport, {"zmq", V::zmq}, {"nccl", V::nccl})
TROUPE_ENUM_NAMES(ProgressMode, {"auto", V::detect}, {"tty", V::tty}, {"plain", V::plain}, {"off", V::off})
TROUPE_ENUM_NAMES(WandbMode, {"online", V::online}, {"offline", V::offline}, {"disabled", V::disabled})
TROUPE_ENUM_NAMES(EnvType, {"builtin", V::builtin}, {"plugin", V::plugin}, {"remote", V::remote},
                  {"nemo_gym", V::nemo_gym}, {"reasoning_gym", V::reasoning_gym}, {"verifiers", V::verifiers},
                  {"judge", V::judge}, {"reward_model", V::reward_model})
TROUPE_ENUM_NAMES(IsolateMode, {"auto", V::detect}, {"true", V::yes}, {"false", V::no})
#undef TROUPE_ENUM_NAMES
}  // namespace troupe
