// What every role starts from: the policy and tokenizer (fresh or from policy.path), the prompt
// format, the learner settings of a phase, the envs API's specs and the compute threads per role.
#include <algorithm>
#include <filesystem>

#include "troupe/actors/chat_turns.h"
#include "troupe/actors/roles.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/reward_model_dir.h"

namespace troupe::actors {
namespace fs = std::filesystem;
using json = nlohmann::json;

Result<std::unique_ptr<policy::io::Tokenizer>> make_builtin_tokenizer(const std::string& kind) {
  policy::io::CharTokenizerSpec spec;
  spec.kind = kind;
  if (kind == "char") {
    spec.chars.assign(1, '\n');  // (not = "\n": GCC 12 then warns a false -Wrestrict on the appends)
    for (char c = 32; c < 127; ++c) spec.chars.push_back(c);
  }
  return policy::io::make_char_tokenizer(spec);
}

Result<PolicyBundle> make_policy(const ExperimentConfig& cfg, int expert_shard, int expert_shards) {
  PolicyBundle b;
  const bool block = expert_shards > 1;  // only this block of the experts, never the whole model
  if (!cfg.policy.path.empty()) {
    TROUPE_ASSIGN_OR_RETURN(auto dir, block ? policy::io::load_expert_block(cfg.policy.path, expert_shard, expert_shards,
                                                                            cfg.policy)
                                            : policy::io::load_model(cfg.policy.path, cfg.policy));
    b.model = std::make_unique<policy::Model>(std::move(dir.model));
    if (dir.tokenizer && (dir.bos_token_id >= 0 || dir.eos_token_id >= 0))
      dir.tokenizer->set_special_ids(dir.bos_token_id >= 0 ? dir.bos_token_id : dir.tokenizer->bos_id(),
                                     dir.eos_token_id >= 0 ? dir.eos_token_id : dir.tokenizer->eos_id(),
                                     dir.pad_token_id >= 0 ? dir.pad_token_id : dir.tokenizer->pad_id());
    if (cfg.policy.tokenizer == TokenizerKind::from_model || dir.tokenizer) {
      if (!dir.tokenizer)
        return invalid_input("policy.tokenizer: auto, but " + cfg.policy.path + " has no tokenizer file");
      b.tokenizer = std::move(dir.tokenizer);
    }
    TROUPE_ASSIGN_OR_RETURN(b.chat_template, policy::io::load_chat_template_dir(cfg.policy.path));
  } else {
    policy::ModelConfig mc;
    static_cast<policy::ModelArchitecture&>(mc) = cfg.policy.model;
    static_cast<policy::ExecutionOptions&>(mc) = cfg.policy;
    const auto seed = static_cast<uint64_t>(cfg.run.seed);
    TROUPE_ASSIGN_OR_RETURN(auto model, block ? policy::Model::create_expert_block(mc, seed, expert_shard, expert_shards)
                                              : policy::Model::create(mc, seed));
    if (cfg.policy.init_std != 0.02f) {  // Model::create draws N(0, 0.02); norms stay at 1
      std::vector<float> flat(model.params().begin(), model.params().end());
      float scale = cfg.policy.init_std / 0.02f;
      for (const auto& s : model.tensors()) {
        if (s.name.find("norm") != std::string::npos) continue;
        for (size_t i = 0; i < s.numel(); ++i) flat[s.offset + i] *= scale;
      }
      TROUPE_TRY(model.set_params(flat));
    }
    b.model = std::make_unique<policy::Model>(std::move(model));
  }
  // LoRA: adapters over the base just built, their A drawn from run.seed (the same on every rank,
  // so learners and generators start from one adapter; policy/README.md "LoRA").
  if (cfg.policy.lora.enabled()) TROUPE_TRY(b.model->enable_lora(cfg.policy.lora, static_cast<uint64_t>(cfg.run.seed)));
  if (!b.tokenizer) {
    if (cfg.policy.tokenizer == TokenizerKind::from_model)
      return invalid_input("policy.tokenizer: auto needs policy.path (a model directory with a tokenizer)");
    TROUPE_ASSIGN_OR_RETURN(b.tokenizer, make_builtin_tokenizer(enum_string(cfg.policy.tokenizer)));
  }
  if (b.tokenizer->vocab_size() > b.model->config().vocab_size)
    return invalid_input("policy.model.vocab_size: " + std::to_string(b.model->config().vocab_size) +
                         " is smaller than the " + enum_string(cfg.policy.tokenizer) + " tokenizer's " +
                         std::to_string(b.tokenizer->vocab_size()) + " tokens");
  return b;
}

std::string format_prompt(const RolloutSection& r, const std::string& text) {
  if (r.template_name == PromptTemplate::chat) {
    std::string s;
    if (!r.system_prompt.empty()) s += "<|system|>\n" + r.system_prompt + "\n";
    return s + "<|user|>\n" + text + "\n<|assistant|>\n";
  }
  return r.system_prompt + text;
}

Result<std::vector<int32_t>> encode_prompt(const RolloutSection& r, const policy::io::Tokenizer& tok,
                                           const policy::io::ChatTemplate* chat, const std::string& text,
                                           const std::string& messages_json) {
  const bool has_messages = !messages_json.empty() && messages_json != "[]";
  if (r.template_name == PromptTemplate::chat && (chat || has_messages)) {
    std::shared_ptr<const policy::io::ChatTemplate> tmpl;
    if (chat) tmpl = std::shared_ptr<const policy::io::ChatTemplate>(std::shared_ptr<void>(), chat);  // (not owned)
    TROUPE_ASSIGN_OR_RETURN(ChatFormat f, make_chat_format(tok, std::move(tmpl)));
    TROUPE_ASSIGN_OR_RETURN(auto messages, first_messages(r.system_prompt, text, messages_json));
    return encode_chat_prompt(f, tok, messages);
  }
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  TROUPE_ASSIGN_OR_RETURN(auto body, tok.encode(format_prompt(r, text)));
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

// The loss, optimizer and advantage sections are the learner's own structs; what is left is what
// depends on the phase or on other sections.
learner::LearnerConfig learner_config(const ExperimentConfig& c, learner::Phase phase) {
  const bool sft = phase == learner::Phase::sft;
  learner::LearnerConfig l;
  l.phase = phase;
  l.advantage = c.grpo;
  l.loss = c.loss;
  l.optimizer = c.optimizer;
  if (sft && c.sft.lr > 0) l.optimizer.lr = c.sft.lr;
  if (c.policy.lora.enabled() && c.policy.lora.lr > 0) l.optimizer.lr = c.policy.lora.lr;  // only adapters train
  l.optimizer.total_steps = std::max(1, sft ? c.sft.max_steps : c.grpo.max_steps * c.grpo.num_iterations);
  l.batch.num_iterations = sft ? 1 : c.grpo.num_iterations;
  l.batch.micro_batch_tokens = c.grpo.micro_batch_tokens;
  l.batch.mask_truncated = c.grpo.mask_truncated;
  l.batch.temperature = sft || c.rollout.temperature <= 0 ? 1.0f : c.rollout.temperature;
  l.max_completion_length = c.rollout.max_response_length * c.rollout.max_turns;  // (the default agg_norm_length)
  l.importance_weight_cap = c.rollout.importance_weight_cap;
  l.seed = static_cast<uint64_t>(c.run.seed);
  l.shard = c.learner.shard;
  l.optimizer_offload = c.learner.optimizer_offload;
  l.expert_parallel = c.policy.expert_parallel;
  if (!sft) l.distill = c.distill;
  return l;
}

namespace {
// A remote env's config: each string (at any depth) that is a relative path naming an existing file
// or folder under base_dir is made absolute, as a `command` argument is; other strings stay.
void resolve_config_paths(json& v, const std::string& base_dir) {
  if (v.is_object() || v.is_array()) {
    for (auto& x : v) resolve_config_paths(x, base_dir);
    return;
  }
  if (!v.is_string()) return;
  const std::string a = v.get<std::string>();
  if (a.empty() || a == "." || a == ".." || a[0] == '-' || a.find('{') != std::string::npos || a.find('\n') != std::string::npos ||
      fs::path(a).is_absolute())
    return;
  std::error_code ec;
  const fs::path there = fs::path(base_dir) / a;
  if (fs::exists(there, ec)) v = fs::absolute(there).lexically_normal().string();
}
}  // namespace

Result<std::vector<envs::EnvSpec>> env_specs(const ExperimentConfig& cfg, const std::string& base_dir) {
  std::vector<envs::EnvSpec> out;
  for (size_t i = 0; i < cfg.envs.size(); ++i) {
    const auto& e = cfg.envs[i];
    json j = {{"name", e.name}, {"type", enum_name(e.type)}, {"weight", e.weight}, {"config", e.config}, {"timeout_s", e.timeout_s}};
    if (!e.env.empty()) j["env"] = e.env;
    const bool dataset = (e.type == EnvType::builtin && e.env_id() == "dataset") || e.type == EnvType::judge ||
                         e.type == EnvType::reward_model;
    if ((dataset || e.type == EnvType::nemo_gym) && j["config"].is_object()) {
      // the dataset and nemo_gym envs' relative file paths start at the YAML file's folder (or at its base_dir,
      // itself relative to that folder), whatever the working directory
      fs::path dir = fs::absolute(base_dir);
      if (auto it = j["config"].find("base_dir"); it != j["config"].end() && it->is_string())
        dir = fs::path(it->get<std::string>()).is_absolute() ? fs::path(it->get<std::string>())
                                                              : dir / it->get<std::string>();
      j["config"]["base_dir"] = dir.lexically_normal().string();
      // the dataset env's shuffle order comes from run.seed unless its config names a seed
      if (dataset && !j["config"].contains("seed")) j["config"]["seed"] = cfg.run.seed;
    }
    if (e.type == EnvType::remote) resolve_config_paths(j["config"], base_dir);
    if (!e.path.empty()) {
      std::string path = fs::path(e.path).is_absolute() ? e.path : (fs::path(base_dir) / e.path).string();
      if (!fs::exists(path) && e.type == EnvType::reward_model)
        return invalid_input("envs[" + std::to_string(i) + "].path: the reward model directory " + path +
                             " does not exist (relative paths start at the YAML file)");
      if (e.type == EnvType::reward_model)
        if (Status st = policy::io::check_reward_model_dir(path); !st.ok())
          return invalid_input("envs[" + std::to_string(i) + "].path: " + st.error().message);
      if (!fs::exists(path))
        return invalid_input("envs[" + std::to_string(i) + "].path: the plug-in " + path +
                             " does not exist (build it, or fix the path; relative paths start at the YAML file)");
      j["path"] = path;
    }
    if (!e.command.empty()) {
      // like path: an argument naming a file or folder relative to the YAML file's folder
      // (e.g. [python, my_env.py]) is made absolute; other words stay as they are
      std::vector<std::string> cmd = e.command;
      for (auto& a : cmd) {
        if (a.empty() || a[0] == '-' || a.find('{') != std::string::npos || fs::path(a).is_absolute()) continue;
        std::error_code ec;
        fs::path there = fs::path(base_dir) / a;
        if (fs::exists(there, ec)) a = fs::absolute(there).lexically_normal().string();
      }
      j["command"] = cmd;
    }
    if (!e.address.empty()) j["address"] = e.address;
    if (!e.addresses.empty()) j["addresses"] = e.addresses;
    if (e.isolate != IsolateMode::detect) j["isolate"] = e.isolate == IsolateMode::yes;
    j["startup_timeout_s"] = e.startup_timeout_s;
    j["max_restarts"] = e.max_restarts;
    j["max_message_bytes"] = e.max_message_bytes;
    if (!e.worker.empty()) j["worker"] = e.worker;
    j["max_retries"] = e.max_retries;
    j["max_failure_frac"] = e.max_failure_frac;
    j["reward_min"] = e.reward_min;
    j["reward_max"] = e.reward_max;
    if (!e.url.empty()) j["url"] = e.url;
    if (e.environment.is_object() && !e.environment.empty()) j["environment"] = e.environment;
    if (!e.cwd.empty())  // like path: relative to the YAML file's folder
      j["cwd"] = (fs::path(e.cwd).is_absolute() ? fs::path(e.cwd) : fs::absolute(fs::path(base_dir) / e.cwd)).lexically_normal().string();
    if (!e.command.empty() || e.type == EnvType::verifiers) j["log_dir"] = (fs::absolute(cfg.run.dir) / "logs").lexically_normal().string();
    TROUPE_ASSIGN_OR_RETURN(auto spec, envs::parse_env_spec(j, "envs[" + std::to_string(i) + "]"));
    const auto& f = cfg.faults;
    if (f.env.empty() || f.env == e.name) {
      spec.faults.seed = static_cast<uint64_t>(f.seed);
      spec.faults.op = f.env_op;
      spec.faults.exception = f.env_exception;
      spec.faults.crash = f.env_crash;
      spec.faults.hang = f.env_hang;
      spec.faults.slow = f.env_slow;
      spec.faults.malformed = f.env_malformed;
      spec.faults.dropped = f.env_drop;
      spec.faults.slow_s = f.env_slow_s;
      spec.faults.steps = f.env_steps;
    }
    out.push_back(std::move(spec));
  }
  return out;
}

int role_threads(const ClusterSection& c, const std::string& role, int fallback) {
  int own = role.rfind("generator", 0) == 0 ? c.generator_threads
            : role.rfind("learner", 0) == 0 ? c.learner_threads
            : role.rfind("scorer", 0) == 0  ? c.scorer_threads
                                            : 0;
  return own > 0 ? own : c.threads > 0 ? c.threads : fallback;
}

}  // namespace troupe::actors
