// Cross-key checks of an experiment, one function per config section (see config_checks.h).
// Single keys (types, ranges, enum names) are the schema's; these see several keys at once.
#include "config_checks.h"
#include "troupe/launch/plan.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <utility>

#include "troupe/envs/env_pool.h"
#include "troupe/kernels/backend.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/runtime/bind_host.h"

namespace troupe::launch {
namespace {

using actors::EnvType;
using actors::ExperimentConfig;
using actors::IsolateMode;

void check_model(const ExperimentConfig& c, const ConfigReport& report) {
  const auto& m = c.policy.model;
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    report("policy.model.num_key_value_heads", "policy.model.num_key_value_heads",
           std::to_string(m.num_key_value_heads) + " does not divide num_attention_heads = " +
               std::to_string(m.num_attention_heads));
  if (m.num_experts > 0 && m.num_experts_per_tok > m.num_experts)
    report("policy.model.num_experts_per_tok", "policy.model.num_experts_per_tok",
           std::to_string(m.num_experts_per_tok) + " experts per token but only " + std::to_string(m.num_experts) +
               " experts");
  for (int l : m.mlp_only_layers)
    if (l >= m.num_hidden_layers)
      report("policy.model.mlp_only_layers", "policy.model.mlp_only_layers",
             "layer " + std::to_string(l) + " does not exist (num_hidden_layers = " +
                 std::to_string(m.num_hidden_layers) + ")");
}

// A loaded model's architecture is its config.json; a fresh one must fit the longest episode.
void check_model_source(const ExperimentConfig& c, const std::vector<std::string>& architecture_keys_set,
                        const ConfigReport& report) {
  const auto& m = c.policy.model;
  if (!c.policy.path.empty() && !architecture_keys_set.empty()) {  // never silently ignored; one error for the section
    std::string keys;
    for (const auto& key : architecture_keys_set) keys += (keys.empty() ? "" : ", ") + key.substr(key.rfind('.') + 1);
    const std::string& first = architecture_keys_set.front();
    report(first, first,
           "policy.path is set, so the architecture comes from its config.json; remove the policy.model section (" +
               keys + ") (execution options such as policy.moe_grouped apply to loaded models)");
  }
  long long need = static_cast<long long>(c.rollout.max_prompt_length) +
                   static_cast<long long>(c.rollout.max_response_length) * c.rollout.max_turns;
  if (c.policy.path.empty() && need > m.max_position_embeddings)
    report("rollout.max_response_length", "rollout.max_response_length",
           "max_prompt_length + max_response_length * max_turns = " + std::to_string(need) +
               " exceeds policy.model.max_position_embeddings = " + std::to_string(m.max_position_embeddings));
}

void check_loss(const ExperimentConfig& c, const ConfigReport& report) {
  for (const auto& [lo, hi, key] : {std::tuple{c.loss.mis_low, c.loss.mis_high, "loss.mis_high"},
                                    std::tuple{c.loss.geo_mask_low, c.loss.geo_mask_high, "loss.geo_mask_high"},
                                    std::tuple{c.loss.icepop_low, c.loss.icepop_high, "loss.icepop_high"}})
    if (!(hi > lo)) report(key, key, std::to_string(hi) + " must be above the lower bound " + std::to_string(lo));
}

void check_phases(const ExperimentConfig& c, const ConfigReport& report) {
  if (!c.sft.enabled && !c.grpo.enabled) report("grpo.enabled", "grpo.enabled", "neither sft nor grpo is enabled: nothing to run");
}

// policy.device and what each device implements; the generators' weights (weight_sync).
void check_execution(const ExperimentConfig& c, const ConfigReport& report) {
  const auto& m = c.policy.model;
  const auto& x = c.policy;
  bool any_moe = false;
  for (int l = 0; l < m.num_hidden_layers; ++l) any_moe = any_moe || m.is_moe_layer(l);
  if (x.routing_replay == policy::RoutingReplay::rollout && c.policy.path.empty() && !any_moe)
    report("policy.moe.routing_replay", "policy.moe.routing_replay",
           "rollout replays MoE routing, but policy.model is dense (num_experts = " + std::to_string(m.num_experts) +
               (m.num_experts > 0 ? ", every layer in mlp_only_layers" : "") + ")");
  if (x.offload_activations && !x.activation_checkpointing)
    report("policy.offload_activations", "policy.offload_activations",
           "needs policy.activation_checkpointing: true (only checkpointed inputs are offloaded)");
  // The name only: validate never starts a GPU (the model reports a missing one when it starts).
  if (Status st = kernels::check_device_built(enum_string(x.device)); !st.ok())
    report("policy.device", "policy.device", st.error().message);
  const bool bf16 = x.compute_dtype == kernels::ComputeDtype::bf16;
  const bool cuda = x.device == kernels::DeviceKind::cuda;
  if (bf16 && !cuda)
    report("policy.compute_dtype", "policy.compute_dtype",
           "bf16 GEMMs are implemented on policy.device: cuda only (got " + enum_string(x.device) + "); use fp32");
  if (c.weight_sync.transport == actors::WeightTransport::nccl && x.device == kernels::DeviceKind::cpu)
    report("weight_sync.transport", "weight_sync.transport",
           "nccl broadcasts the weights between the members' devices: it needs policy.device cuda (or cpu_fenced, "
           "in one process), got " + enum_string(x.device) + "; use zmq");
  if (bf16 && c.policy.batch_invariant)
    report("policy.compute_dtype", "policy.compute_dtype",
           "bf16 with policy.batch_invariant: exact on-policy sampling runs fp32 GEMMs; use fp32");
  // Options the CUDA backend does not implement yet are errors with it, never a silent fallback.
  if (cuda && c.policy.batch_invariant)
    report("policy.batch_invariant", "policy.batch_invariant",
           "not implemented with policy.device: cuda (the CUDA kernels have no fixed-chain GEMM or shared "
           "attention loop yet); set it to false or use policy.device: cpu");
  // Exact on-policy sampling needs the generators to hold the learner's own fp32 weights.
  if (c.policy.batch_invariant && c.weight_sync.dtype != actors::WeightDtype::fp32)
    report("weight_sync.dtype", "weight_sync.dtype",
           enum_string(c.weight_sync.dtype) +
               " generator weights differ from the learner's fp32 master, but policy.batch_invariant "
               "asks sampler and learner to agree bit for bit; use fp32");
  // QLoRA: a quantized base is frozen; gguf needs a .gguf file to take the blocks from.
  if (x.base_dtype != policy::BaseDtype::fp32 && !x.lora.enabled())
    report("policy.base_dtype", "policy.base_dtype",
           enum_string(x.base_dtype) + " holds a frozen, quantized base, but policy.lora.rank is 0 (full fine-tuning); "
           "turn LoRA on (policy.lora.rank > 0) or use fp32");
  if (x.base_dtype == policy::BaseDtype::q4_k && c.policy.path.empty()) {  // a loaded model's shapes: when it loads
    const int widths[] = {m.hidden_size, m.num_attention_heads * m.head_dim, m.intermediate_size};
    const char* names[] = {"policy.model.hidden_size", "num_attention_heads x head_dim", "policy.model.intermediate_size"};
    for (int i = 0; i < 3; ++i)
      if (widths[i] % 256 != 0 && (i < 2 || !any_moe || m.mlp_only_layers.size() > 0))
        report("policy.base_dtype", "policy.base_dtype",
               "q4_k blocks hold 256 values of a weight row, but " + std::string(names[i]) + " is " +
                   std::to_string(widths[i]) + " (not a multiple of 256); use q8_0 or bf16");
  }
  if (x.base_dtype == policy::BaseDtype::gguf && !c.policy.path.ends_with(".gguf"))
    report("policy.base_dtype", "policy.base_dtype",
           "gguf keeps the blocks of a .gguf policy.path, but policy.path is " +
               (c.policy.path.empty() ? std::string("empty (a fresh model)") : "'" + c.policy.path + "'") +
               "; use bf16, q8_0 or q4_k to quantize other weights");
  if (cuda && x.routing_replay == policy::RoutingReplay::rollout)
    report("policy.moe.routing_replay", "policy.moe.routing_replay",
           "not implemented with policy.device: cuda; set it to off or use policy.device: cpu");
}

// policy.moe.expert_parallel: E splits the experts of every MoE layer and the learner ranks (a
// loaded model's expert count is checked when it loads); what it does not run with yet.
void check_expert_parallel(const ExperimentConfig& c, const ConfigReport& report) {
  const int E = c.policy.expert_parallel;
  if (E <= 1) return;
  const std::string key = "policy.moe.expert_parallel", at = std::to_string(E);
  const auto& m = c.policy.model;
  bool any_moe = false;
  for (int l = 0; l < m.num_hidden_layers; ++l) any_moe = any_moe || m.is_moe_layer(l);
  if (c.policy.path.empty() && !any_moe)
    report(key, key, at + " splits MoE experts, but policy.model is dense (num_experts = " +
                         std::to_string(m.num_experts) + (m.num_experts > 0 ? ", every layer in mlp_only_layers" : "") + ")");
  else if (c.policy.path.empty() && m.num_experts % E != 0)
    report(key, key, at + " does not divide policy.model.num_experts = " + std::to_string(m.num_experts));
  if (c.cluster.learners % E != 0)
    report(key, key, at + " does not divide cluster.learners = " + std::to_string(c.cluster.learners) +
                         " (learner ranks = data-parallel x expert-parallel)");
  // Every policy.device runs it: the layer is the backend's (Backend::moe_ep_*; cuda over an NCCL
  // exchange of the group's GPUs), so nothing is refused here by device (routing replay on cuda is
  // refused by check_execution for every run). Divided learners send the weights from their blocks,
  // over ZeroMQ only (the broadcast of weight_sync.transport nccl sends learner 0's whole weights).
  if (actors::learners_divide_experts(c) && c.cluster.learners > 1 &&
      c.weight_sync.transport == actors::WeightTransport::nccl)
    report("weight_sync.transport", "weight_sync.transport",
           "nccl broadcasts learner 0's whole weights, but with " + key + " " + at +
               " (learner.shard none, sync) each learner holds one block of experts; use zmq");
}

// policy.lora against the architecture: policy.model, or policy.path's config.json when it is a
// model directory (a .gguf's is checked when the run loads it).
void check_lora(const ExperimentConfig& c, const ConfigReport& report) {
  if (!c.policy.lora.enabled()) return;
  policy::ModelArchitecture arch = c.policy.model;
  if (!c.policy.path.empty()) {
    std::ifstream f(std::filesystem::path(c.policy.path) / "config.json");
    if (!f) return;
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) return;  // the run's load reports it
    auto loaded = policy::io::config_from_hf_json(j);
    if (!loaded.ok()) return;
    arch = *loaded;
  }
  Status s = policy::validate_lora(c.policy.lora, arch);
  if (s.ok()) return;
  const std::string& msg = s.error().message;  // "policy.lora.<key>: why"
  const size_t colon = msg.find(": ");
  const std::string key = colon == std::string::npos ? "policy.lora.rank" : msg.substr(0, colon);
  report(key, key, colon == std::string::npos ? msg : msg.substr(colon + 2));
}

void check_env_process(const actors::EnvSpec& e, const std::string& pre, const ConfigReport& report);
void check_env_pool(const actors::EnvSpec& e, const std::string& pre, const ConfigReport& report);

// type: reward_model: the model directory and the two keys it adds to the dataset env's config.
void check_reward_model_entry(const ExperimentConfig& c, const actors::EnvSpec& e, const std::string& pre,
                              const ConfigReport& report) {
  if (c.rollout.max_turns > 1)  // its responses are scored by verify, which multi-turn episodes never call
    report("rollout.max_turns", "rollout.max_turns",
           "must be 1 with a reward_model env (env '" + e.name +
               "'): a reward model scores single-turn responses; multi-turn episodes are not scored by one");
  if (e.path.empty())
    report(pre + ".type", pre + ".path",
           "a reward_model env needs path: (a Hugging Face *ForSequenceClassification directory)");
  if (!e.config.is_object()) return;
  auto check = [&](const char* key, std::initializer_list<const char*> values, const char* list) {
    auto it = e.config.find(key);
    if (it == e.config.end() || it->is_null()) return;
    for (const char* v : values)
      if (it->is_string() && it->get<std::string>() == v) return;
    report(pre + ".config." + key, pre + ".config." + key, std::string("must be ") + list + " (got " + it->dump() + ")");
  };
  check("center", {"none", "batch", "running"}, "none, batch or running");
  check("score_template", {"chat", "plain"}, "chat or plain");
  if (e.config.contains("judge") && !e.config.contains("reward_weights"))
    report(pre + ".config.judge", pre + ".config.judge",
           "a reward_model env is scored by its model alone without config.reward_weights (which weighs its "
           "verifier, judge and reward_model components)");
}

// One env entry's keys agree with its type.
void check_env_entry(const ExperimentConfig& c, const actors::EnvSpec& e, const std::string& pre,
                     const ConfigReport& report) {
  if (e.type == EnvType::plugin && e.path.empty()) report(pre + ".type", pre + ".path", "a plugin env needs path: (the .so file)");
  if (e.type == EnvType::remote && e.command.empty() && e.address.empty() && e.addresses.empty())
    report(pre + ".type", pre + ".address", "a remote env needs command: (to start it) or address: (to reach it)");
  if (e.type == EnvType::nemo_gym && e.command.empty() == e.url.empty() && e.addresses.empty())
    report(pre + ".type", pre + ".url",
           "a nemo_gym env needs exactly one of url: (a running resource server) or command: (troupe starts it)");
  if (e.type != EnvType::nemo_gym && !e.url.empty()) report(pre + ".url", pre + ".url", "url is only for type: nemo_gym");
  if (e.type == EnvType::nemo_gym && c.rollout.max_turns > 1) {  // an episode cut before its last turn is never verified
    long long turns = 8;
    if (e.config.is_object() && e.config.contains("max_turns") && e.config["max_turns"].is_number_integer())
      turns = e.config["max_turns"].get<long long>();
    if (turns > c.rollout.max_turns)
      report(pre + ".config", pre + ".config",
             "config.max_turns " + std::to_string(turns) + " is above rollout.max_turns " +
                 std::to_string(c.rollout.max_turns) + ": episodes would end before /verify scores them");
  }
  if (e.type == EnvType::reasoning_gym && !(e.config.is_object() && e.config.contains("task") && e.config["task"].is_string()))
    report(pre + ".type", pre + ".config",
           "a reasoning_gym env needs config.task (a reasoning-gym dataset name, e.g. basic_arithmetic)");
  if (e.type != EnvType::plugin && e.type != EnvType::reward_model && !e.path.empty())
    report(pre + ".path", pre + ".path", "path is only for type: plugin or reward_model");
  if (e.type == EnvType::reward_model) check_reward_model_entry(c, e, pre, report);
  if (e.type == EnvType::verifiers) {  // the env server calls the generators' endpoints for every model turn
    if (e.address.empty() && e.addresses.empty())
      report(pre + ".type", pre + ".address", "a verifiers env needs address: (its env server, e.g. tcp://127.0.0.1:5000)");
    if (c.rollout.serve.empty())
      report(pre + ".type", "rollout.serve", "a verifiers env calls the policy over HTTP: set rollout.serve (e.g. 127.0.0.1:0)");
    if (c.rollout.max_turns > 1)
      report("rollout.max_turns", "rollout.max_turns", "must be 1 with a verifiers env (its env server runs the turns)");
  }
  if (!e.config.is_object()) report(pre + ".config", pre + ".config", "expected a mapping");
  check_env_process(e, pre, report);
  check_env_pool(e, pre, report);
}

// addresses: a pool of running servers of a remote, nemo_gym or verifiers env, each of its form, once.
void check_env_pool(const actors::EnvSpec& e, const std::string& pre, const ConfigReport& report) {
  if (e.addresses.empty()) return;
  const std::string key = pre + ".addresses";
  if (!e.address.empty() || !e.url.empty() || !e.command.empty())
    report(key, key, std::string("a pool (addresses:) goes without ") + (!e.address.empty() ? "address:" : !e.url.empty() ? "url:" : "command:") +
                         " (list every server in addresses:)");
  if (e.type != EnvType::remote && e.type != EnvType::nemo_gym && e.type != EnvType::verifiers)
    report(key, key, "addresses: is only for type remote, nemo_gym or verifiers (servers that are already running)");
  std::set<std::string> seen;
  for (size_t i = 0; i < e.addresses.size(); ++i) {
    const std::string& a = e.addresses[i];
    if (auto st = envs::check_pool_address(a, e.type == EnvType::nemo_gym); !st.ok())
      report(key, key + "[" + std::to_string(i) + "]", st.error().message);
    else if (!seen.insert(a).second)
      report(key, key + "[" + std::to_string(i) + "]", "'" + a + "' is listed twice");
  }
}

// environment and cwd: only for a process troupe starts, each variable a scalar.
void check_env_process(const actors::EnvSpec& e, const std::string& pre, const ConfigReport& report) {
  const bool starts_process = !e.command.empty() || e.type == EnvType::verifiers;  // a command, a taskset loader
  const bool has_environment = e.environment.is_object() && !e.environment.empty();
  if (!starts_process && (has_environment || !e.cwd.empty()))
    report(pre + (e.cwd.empty() ? ".environment" : ".cwd"), pre + (e.cwd.empty() ? ".environment" : ".cwd"),
           "environment and cwd are for a command troupe starts (or a verifiers taskset loader); this env has neither");
  if (e.environment.is_object())
    for (auto it = e.environment.begin(); it != e.environment.end(); ++it)
      if (!(it->is_string() || it->is_number() || it->is_boolean()))
        report(pre + ".environment", pre + ".environment", it.key() + " must be a string, number or bool");
}

void check_envs(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.envs.empty()) report("envs", "envs", "at least one env is required (- name: arithmetic)");
  std::set<std::string> names;
  for (size_t i = 0; i < c.envs.size(); ++i) {
    const auto& e = c.envs[i];
    const std::string pre = "envs[" + std::to_string(i) + "]";
    if (e.name.empty()) report(pre, pre + ".name", "every env needs a name");
    if (!names.insert(e.name).second) report(pre + ".name", pre + ".name", "env name '" + e.name + "' is used twice");
    check_env_entry(c, e, pre, report);
  }
}

void check_env_weights(const ExperimentConfig& c, const ConfigReport& report) {
  double total_weight = 0;
  for (const auto& e : c.envs) total_weight += e.weight;
  if (!c.envs.empty() && total_weight <= 0) report("envs", "envs", "the env weights sum to 0: no env would get prompts");
}

void check_serve(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.rollout.serve.empty()) return;
  const std::string& v = c.rollout.serve;
  const size_t colon = v.rfind(':');
  const std::string host = colon == std::string::npos ? "" : v.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : v.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stol(port) > 65535 || (host != "127.0.0.1" && host != "localhost"))
    report("rollout.serve", "rollout.serve",
           "'" + v + "' is not 127.0.0.1:PORT or localhost:PORT (a loopback address; port 0 = a free one)");
}

// Fault injection: the env it names exists; crash and hang need a worker troupe starts.
void check_faults(const ExperimentConfig& c, const ConfigReport& report) {
  const auto& f = c.faults;
  bool named = f.env.empty();
  for (const auto& e : c.envs) named = named || e.name == f.env;
  if (!named) report("faults.env", "faults.env", "no env is named '" + f.env + "'");
  if (f.env_exception + f.env_crash + f.env_hang + f.env_slow + f.env_malformed + f.env_drop > 1 + 1e-12)
    report("faults", "faults", "the env fault probabilities sum to more than 1");
  for (const auto& e : c.envs) {
    if (!f.env.empty() && f.env != e.name) continue;
    const bool own_process = (e.type == EnvType::plugin && e.isolate != IsolateMode::no) ||
                             ((e.type == EnvType::builtin || e.type == EnvType::judge || e.type == EnvType::reward_model) && e.isolate == IsolateMode::yes) ||
                             (e.type == EnvType::remote && !e.command.empty());
    const bool wire = own_process || e.type == EnvType::remote;
    auto needs = [&](const char* key, double p, bool ok, const char* what) {
      if (p > 0 && !ok)
        report(std::string("faults.") + key, std::string("faults.") + key,
               "env '" + e.name + "' " + what + " (set faults.env to another env, or isolate: true)");
    };
    needs("env_crash", f.env_crash, own_process, "runs in no worker process troupe starts, so it cannot be crashed");
    needs("env_hang", f.env_hang, own_process, "runs in no worker process troupe starts, so it cannot be hung");
    needs("env_malformed", f.env_malformed, wire, "is called in-process: there is no reply to corrupt");
    needs("env_drop", f.env_drop, wire, "is called in-process: there is no wire to lose a request on");
  }
  if ((f.learner_death_step > 0 || f.learner_death_sync > 0) && f.learner_death_rank >= c.cluster.learners)
    report("faults.learner_death_rank", "faults.learner_death_rank",
           "there are only " + std::to_string(c.cluster.learners) + " learner ranks");
  if (f.generator_death_step > 0 && f.generator_death_rank >= c.cluster.generators)
    report("faults.generator_death_rank", "faults.generator_death_rank",
           "there are only " + std::to_string(c.cluster.generators) + " generators");
}

void check_checkpointing(const ExperimentConfig& c, const ConfigReport& report) {
  const std::string& by = c.checkpointing.keep_best_by;
  if (!by.empty() && by != "eval_accuracy" && by != "eval_reward_mean")
    report("checkpointing.keep_best_by", "checkpointing.keep_best_by",
           "'" + by + "' is not an eval metric (eval_accuracy, eval_reward_mean)");
}

// learner.optimizer_offload needs a model on a device; learner.memory_budget must be a size (troupe
// run / validate compare the memory plan with it).
void check_learner(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.learner.optimizer_offload && c.policy.device == kernels::DeviceKind::cpu)
    report("learner.optimizer_offload", "learner.optimizer_offload",
           "true needs a model on a device (policy.device: cuda or cpu_fenced); on cpu the optimizer already runs "
           "in host memory: remove the key or set it to false");
  const std::string key = "learner.memory_budget";
  if (c.learner.memory_budget.empty()) return;
  if (auto b = parse_byte_size(c.learner.memory_budget, key); !b.ok())
    report(key, key, b.error().message.substr(key.size() + 2));
}

// Placement: every learner needs trajectories, every generator needs prompts.
void check_placement(const ExperimentConfig& c, const ConfigReport& report) {
  int trajectories = c.rollout.prompts_per_step * c.rollout.num_generations;
  if (c.grpo.enabled && c.cluster.learners > trajectories)
    report("cluster.learners", "cluster.learners",
           "impossible placement: " + std::to_string(c.cluster.learners) + " learners but only " +
               std::to_string(trajectories) + " trajectories per step (rollout.prompts_per_step * num_generations)");
  if (c.sft.enabled && c.cluster.learners > c.sft.batch_size)
    report("cluster.learners", "cluster.learners",
           "impossible placement: " + std::to_string(c.cluster.learners) + " learners but sft.batch_size = " +
               std::to_string(c.sft.batch_size));
  if (c.cluster.generators > c.rollout.prompts_per_step)
    report("cluster.generators", "cluster.generators",
           "impossible placement: " + std::to_string(c.cluster.generators) + " generators but only " +
               std::to_string(c.rollout.prompts_per_step) + " prompts per step (rollout.prompts_per_step)");
}

// Streamed async parts: the learner makes one update from parts it sees one at a time.
void check_async_chunks(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.rollout.async_chunks <= 1) return;
  auto chunks_error = [&](const std::string& why) {
    report("rollout.async_chunks", "rollout.async_chunks",
           std::to_string(c.rollout.async_chunks) + " parts per step need " + why);
  };
  if (!c.rollout.async) chunks_error("rollout.async: true (sync mode trains on the whole batch)");
  if (c.rollout.async_chunks > c.rollout.prompts_per_step)
    chunks_error("at least as many prompts per step (rollout.prompts_per_step = " +
                 std::to_string(c.rollout.prompts_per_step) + ")");
  if (c.grpo.num_iterations != 1)
    chunks_error("grpo.num_iterations: 1 (got " + std::to_string(c.grpo.num_iterations) +
                 "; later passes need the whole batch)");
  if (c.grpo.dynamic_sampling) chunks_error("grpo.dynamic_sampling: false (it refills the whole batch)");
  if (c.rollout.max_turns > 1) chunks_error("rollout.max_turns: 1 (multi-turn episodes run as one batch)");
  if (c.grpo.scale_rewards == learner::StdMode::batch || c.grpo.adv_estimator == learner::AdvantageEstimator::reinforce_pp)
    chunks_error(
        "advantages computed within each group (scale_rewards group or none, adv_estimator grpo or "
        "rloo): batch statistics need the whole batch");
}

// In-flight weight updates: one single-turn generation request per generator and step, whose
// switch points the coordinator fixes from the config.
void check_in_flight(const ExperimentConfig& c, const ConfigReport& report) {
  if (!c.rollout.in_flight_updates) return;
  auto in_flight_error = [&](const std::string& why) {
    report("rollout.in_flight_updates", "rollout.in_flight_updates", "needs " + why);
  };
  if (!c.rollout.async) in_flight_error("rollout.async: true (sync mode samples every step with the newest weights)");
  if (c.rollout.async && c.rollout.max_staleness < 1)
    in_flight_error("rollout.max_staleness >= 1 (with 0 a rollout has no newer version to move to)");
  if (c.rollout.async_chunks > 1)
    in_flight_error("rollout.async_chunks: 1 (streamed parts are not supported with in-flight updates)");
  if (c.rollout.async && c.rollout.in_flight_min_lag > c.rollout.max_staleness)
    report("rollout.in_flight_min_lag", "rollout.in_flight_min_lag",
           std::to_string(c.rollout.in_flight_min_lag) + " is more than rollout.max_staleness (" +
               std::to_string(c.rollout.max_staleness) + "): no version would be newer than the rollout's first");
  if (c.rollout.max_turns > 1)
    in_flight_error("rollout.max_turns: 1 (multi-turn episodes are not supported with in-flight updates)");
  if (!c.rollout.serve.empty())
    in_flight_error("no rollout.serve (the endpoint's copy of the policy is not switched mid-decode)");
}

void check_cluster(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.cluster.curve) {
    if (c.cluster.transport != runtime::TransportKind::tcp)
      report("cluster.curve", "cluster.curve", "CURVE secures tcp: set cluster.transport: tcp");
    for (auto [key, value] : {std::pair<const char*, const std::string*>{"cluster.curve_public_key", &c.cluster.curve_public_key},
                              {"cluster.curve_secret_key", &c.cluster.curve_secret_key},
                              {"cluster.curve_authorized_keys", &c.cluster.curve_authorized_keys}})
      if (value->empty())
        report("cluster.curve", key, "cluster.curve needs this key file (write a pair with troupe keygen PUBLIC SECRET)");
  }
  if (c.cluster.join && c.cluster.transport != runtime::TransportKind::tcp)
    report("cluster.join", "cluster.join", "members join over tcp: set cluster.transport: tcp");
  const std::string& bh = c.cluster.bind_host;
  if (c.cluster.transport == runtime::TransportKind::ipc && bh != "127.0.0.1" && bh != "localhost")
    report("cluster.bind_host", "cluster.bind_host", "bind_host is for transport: tcp; ipc only reaches ranks on this node");
  if (runtime::is_wildcard_bind_host(bh))
    report("cluster.bind_host", "cluster.bind_host",
           "'" + bh + "' binds every interface but gives the other ranks no address to reach this one: name the "
           "nodes' interface (e.g. eth0, resolved on each node) or an address of the node");
}

// The scorers' models: distill.teacher and each judge's local model need a scorer to serve them,
// and a judge that reaches one by messages must run in troupe's own process.
void check_scorers(const ExperimentConfig& c, const ConfigReport& report) {
  if (c.distill.enabled() && c.cluster.scorers < 1)
    report("distill.teacher", "distill.teacher",
           "the teacher is served by the scorers: set cluster.scorers >= 1 (each scorer loads it)");
  for (size_t i = 0; i < c.envs.size(); ++i) {
    const auto& e = c.envs[i];
    if (!e.config.is_object() || !e.config.contains("judge") || !e.config["judge"].is_object()) continue;
    const auto& j = e.config["judge"];
    if (!j.value("url", std::string()).empty() || !j.contains("model")) continue;
    const std::string key = "envs[" + std::to_string(i) + "].config.judge.model";
    if (c.cluster.scorers < 1)
      report("envs", key, "a judge with a local model (model: PATH, no url) is served by the scorers: set cluster.scorers >= 1");
    if (e.isolate == actors::IsolateMode::yes)
      report("envs", key, "a judge with a local model reaches the scorers from troupe's own process: not with isolate: true");
  }
}

}  // namespace

// run.launcher starts the job's ranks for the supervisor: without run.restarts there is none.
void check_supervisor(const ExperimentConfig& c, const ConfigReport& report) {
  if (!c.run.launcher.empty() && c.run.restarts == 0)
    report("run.launcher", "run.launcher",
           "the launcher is for the supervisor of run.restarts: set run.restarts N > 0 (or start the ranks yourself, "
           "e.g. mpirun -np 4 troupe run X.yaml)");
}

void check_config(const ExperimentConfig& c, const std::vector<std::string>& architecture_keys_set,
                  const ConfigReport& report) {
  check_supervisor(c, report);
  check_model(c, report);
  check_loss(c, report);
  check_execution(c, report);
  check_lora(c, report);
  check_expert_parallel(c, report);
  check_model_source(c, architecture_keys_set, report);
  check_phases(c, report);
  check_envs(c, report);
  check_serve(c, report);
  check_env_weights(c, report);
  check_faults(c, report);
  check_checkpointing(c, report);
  check_learner(c, report);
  check_placement(c, report);
  check_async_chunks(c, report);
  check_in_flight(c, report);
  check_cluster(c, report);
  check_scorers(c, report);
}

}  // namespace troupe::launch
