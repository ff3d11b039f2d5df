// The worker roles: env worker (env clients by name), rollout generator (prompt formatting, KV-cache
// sampling, stop strings, truncation) and learner (SFT/GRPO steps, versioned weights, checkpoints),
// plus the actors that host them. All randomness comes from seeds carried in the requests.
#include "troupe/actors/roles.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "troupe/learner/checkpoint.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::actors {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<policy::io::Tokenizer>> make_builtin_tokenizer(const std::string& kind) {
  policy::io::CharTokenizerSpec spec;
  spec.kind = kind;
  if (kind == "char") {
    spec.chars = "\n";
    for (char c = 32; c < 127; ++c) spec.chars += c;
  }
  return policy::io::make_char_tokenizer(spec);
}

Result<PolicyBundle> make_policy(const ExperimentConfig& cfg) {
  PolicyBundle b;
  if (!cfg.policy.path.empty()) {
    TROUPE_ASSIGN_OR_RETURN(auto dir, policy::io::load_model(cfg.policy.path));
    b.model = std::make_unique<policy::Model>(std::move(dir.model));
    if (dir.tokenizer && (dir.bos_token_id >= 0 || dir.eos_token_id >= 0))
      dir.tokenizer->set_special_ids(dir.bos_token_id >= 0 ? dir.bos_token_id : dir.tokenizer->bos_id(),
                                     dir.eos_token_id >= 0 ? dir.eos_token_id : dir.tokenizer->eos_id(),
                                     dir.pad_token_id >= 0 ? dir.pad_token_id : dir.tokenizer->pad_id());
    if (cfg.policy.tokenizer == "auto" || dir.tokenizer) {
      if (!dir.tokenizer)
        return invalid_input("policy.tokenizer: auto, but " + cfg.policy.path + " has no tokenizer file");
      b.tokenizer = std::move(dir.tokenizer);
    }
  } else {
    TROUPE_ASSIGN_OR_RETURN(auto model, policy::Model::create(cfg.policy.model, static_cast<uint64_t>(cfg.run.seed)));
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
  if (!b.tokenizer) {
    if (cfg.policy.tokenizer == "auto")
      return invalid_input("policy.tokenizer: auto needs policy.path (a model directory with a tokenizer)");
    TROUPE_ASSIGN_OR_RETURN(b.tokenizer, make_builtin_tokenizer(cfg.policy.tokenizer));
  }
  if (b.tokenizer->vocab_size() > b.model->config().vocab_size)
    return invalid_input("policy.model.vocab_size: " + std::to_string(b.model->config().vocab_size) +
                         " is smaller than the " + cfg.policy.tokenizer + " tokenizer's " +
                         std::to_string(b.tokenizer->vocab_size()) + " tokens");
  return b;
}

std::string format_prompt(const RolloutSection& r, const std::string& text) {
  if (r.template_name == "chat") {
    std::string s;
    if (!r.system_prompt.empty()) s += "<|system|>\n" + r.system_prompt + "\n";
    return s + "<|user|>\n" + text + "\n<|assistant|>\n";
  }
  return r.system_prompt + text;
}

learner::LearnerConfig learner_config(const ExperimentConfig& c, learner::Phase phase) {
  learner::LearnerConfig l;
  l.phase = phase;
  auto& a = l.advantage;
  a.estimator = c.grpo.adv_estimator == "rloo"           ? learner::AdvantageEstimator::rloo
                : c.grpo.adv_estimator == "reinforce_pp" ? learner::AdvantageEstimator::reinforce_pp
                                                         : learner::AdvantageEstimator::grpo;
  a.scale_rewards = c.grpo.scale_rewards == "batch"  ? learner::StdMode::batch
                    : c.grpo.scale_rewards == "none" ? learner::StdMode::none
                                                     : learner::StdMode::group;
  a.reward_clip = c.grpo.reward_clip;
  a.filter_groups = c.grpo.dynamic_sampling;
  auto& s = l.loss;
  s.epsilon = c.loss.clip_low;
  s.epsilon_high = c.loss.clip_high;
  s.clip_ratio_c = c.loss.dual_clip;
  s.importance_sampling_level =
      c.loss.sequence_level_ratio ? learner::ImportanceSamplingLevel::sequence : learner::ImportanceSamplingLevel::token;
  s.beta = c.loss.kl_coef;
  s.kl_estimator = c.loss.kl_type == "k1" ? learner::KlEstimator::k1
                   : c.loss.kl_type == "k2" ? learner::KlEstimator::k2
                                            : learner::KlEstimator::k3;
  s.kl_input_clamp = c.loss.kl_input_clamp;
  s.kl_output_clamp = c.loss.kl_output_clamp;
  s.entropy_coef = c.loss.entropy_coef;
  s.importance_weight_cap = c.rollout.importance_weight_cap;
  s.loss_agg_mode = c.loss.agg_mode == "seq-mean-token-mean"       ? learner::LossAggMode::seq_mean_token_mean
                    : c.loss.agg_mode == "seq-mean-token-sum-norm" ? learner::LossAggMode::seq_mean_token_sum_norm
                                                                   : learner::LossAggMode::token_mean;
  l.max_completion_length = c.rollout.max_response_length * c.rollout.max_turns;
  s.loss_scale_factor =
      static_cast<float>(c.loss.agg_norm_length > 0 ? c.loss.agg_norm_length : l.max_completion_length);
  auto& o = l.optimizer;
  o.learning_rate = (phase == learner::Phase::sft && c.sft.lr > 0) ? c.sft.lr : c.optimizer.lr;
  o.beta1 = c.optimizer.beta1;
  o.beta2 = c.optimizer.beta2;
  o.adam_epsilon = c.optimizer.eps;
  o.weight_decay = c.optimizer.weight_decay;
  o.max_grad_norm = c.optimizer.max_grad_norm;
  o.lr_scheduler_type = c.optimizer.schedule == "cosine" ? learner::LrSchedule::cosine : learner::LrSchedule::constant;
  o.warmup_steps = c.optimizer.warmup_steps;
  int phase_steps = phase == learner::Phase::sft ? c.sft.max_steps : c.grpo.max_steps * c.grpo.num_iterations;
  o.total_steps = std::max(1, phase_steps);
  o.min_lr_ratio = c.optimizer.min_lr_ratio;
  auto& b = l.batch;
  b.num_iterations = phase == learner::Phase::sft ? 1 : c.grpo.num_iterations;
  b.max_tokens_per_micro_batch = c.grpo.micro_batch_tokens;
  b.temperature = phase == learner::Phase::sft || c.rollout.temperature <= 0 ? 1.0f : c.rollout.temperature;
  b.mask_truncated_completions = c.grpo.mask_truncated;
  l.seed = static_cast<uint64_t>(c.run.seed);
  return l;
}

Result<std::vector<envs::EnvSpec>> env_specs(const ExperimentConfig& cfg, const std::string& base_dir) {
  std::vector<envs::EnvSpec> out;
  for (size_t i = 0; i < cfg.envs.size(); ++i) {
    const auto& e = cfg.envs[i];
    json j = {{"name", e.name}, {"type", e.type}, {"weight", e.weight}, {"config", e.config}, {"timeout_s", e.timeout_s}};
    if (!e.env.empty()) j["env"] = e.env;
    if (e.type == "builtin" && e.env_id() == "dataset" && j["config"].is_object()) {
      // the dataset env's relative file paths start at the YAML file's folder (or at its base_dir,
      // itself relative to that folder), whatever the working directory
      fs::path dir = fs::absolute(base_dir);
      if (auto it = j["config"].find("base_dir"); it != j["config"].end() && it->is_string())
        dir = fs::path(it->get<std::string>()).is_absolute() ? fs::path(it->get<std::string>())
                                                              : dir / it->get<std::string>();
      j["config"]["base_dir"] = dir.lexically_normal().string();
    }
    if (!e.path.empty()) {
      std::string path = fs::path(e.path).is_absolute() ? e.path : (fs::path(base_dir) / e.path).string();
      if (!fs::exists(path))
        return invalid_input("envs[" + std::to_string(i) + "].path: the plug-in " + path +
                             " does not exist (build it, or fix the path; relative paths start at the YAML file)");
      j["path"] = path;
    }
    if (!e.command.empty()) j["command"] = e.command;
    if (!e.address.empty()) j["address"] = e.address;
    if (e.isolate != "auto") j["isolate"] = e.isolate == "true";
    TROUPE_ASSIGN_OR_RETURN(auto spec, envs::parse_env_spec(j, "envs[" + std::to_string(i) + "]"));
    out.push_back(std::move(spec));
  }
  return out;
}

// ---------------- EnvWorker ----------------

Result<std::unique_ptr<EnvWorker>> EnvWorker::create(const std::vector<envs::EnvSpec>& specs) {
  auto w = std::make_unique<EnvWorker>();
  for (const auto& s : specs) {
    auto c = envs::make_env_client(s);
    if (!c.ok()) return Error{c.error().code, "env '" + s.name + "': " + c.error().message};
    w->clients_[s.name] = std::move(c).value();
  }
  return w;
}

Result<envs::EnvClient*> EnvWorker::client(const std::string& env) {
  auto it = clients_.find(env);
  if (it == clients_.end()) return invalid_input("env worker has no env named '" + env + "'");
  return it->second.get();
}

const envs::EnvInfo* EnvWorker::info(const std::string& env) const {
  auto it = clients_.find(env);
  return it == clients_.end() ? nullptr : &it->second->info();
}

Result<EnvObs> EnvWorker::reset(const EnvResetReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  envs::ResetOptions opt;
  opt.split = r.split == 1 ? envs::Split::eval : envs::Split::train;
  auto obs = c->reset(r.episode_id, r.seed, opt);
  if (!obs.ok()) return Error{obs.error().code, "env '" + r.env + "' reset: " + obs.error().message};
  EnvObs out;
  out.text = obs->text;
  out.metadata_json = obs->metadata.dump();
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvObs> EnvWorker::step(const EnvStepReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  auto s = c->step(r.episode_id, r.action);
  if (!s.ok()) return Error{s.error().code, "env '" + r.env + "' step: " + s.error().message};
  EnvObs out;
  out.text = s->observation.text;
  out.metadata_json = s->observation.metadata.dump();
  out.reward = s->reward;
  out.done = s->done;
  out.components_json = json(s->components).dump();
  out.env_s = seconds_since(t0);
  return out;
}

Result<EnvVerifyRep> EnvWorker::verify(const EnvVerifyReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  TROUPE_ASSIGN_OR_RETURN(auto* c, client(r.env));
  json meta = json::parse(r.metadata_json, nullptr, false);
  if (meta.is_discarded()) return invalid_input("EnvVerifyReq: metadata is not JSON");
  EnvVerifyRep out;
  for (const auto& completion : r.completions) {
    auto v = c->verify(meta, completion);
    if (!v.ok()) {
      out.rewards.push_back(0);
      out.correct.push_back(0);
      out.errors.push_back(v.error().message);
      continue;
    }
    out.rewards.push_back(v->reward);
    auto it = v->components.find("correct");
    out.correct.push_back(it != v->components.end() ? it->second : (v->reward >= 1.0 ? 1.0 : 0.0));
    out.errors.emplace_back();
  }
  out.env_s = seconds_since(t0);
  return out;
}

void EnvWorker::release(const EnvReleaseReq& r) {
  auto it = clients_.find(r.env);
  if (it != clients_.end()) it->second->release(r.episode_id);
}

// ---------------- Generator ----------------

Result<std::unique_ptr<Generator>> Generator::create(const ExperimentConfig& cfg) {
  auto g = std::make_unique<Generator>();
  g->cfg_ = cfg;
  TROUPE_ASSIGN_OR_RETURN(g->policy_, make_policy(cfg));
  const auto& tok = *g->policy_.tokenizer;
  if (tok.eos_id() >= 0) g->stop_tokens_.push_back(tok.eos_id());
  for (const auto& s : cfg.rollout.stop) {
    auto ids = tok.encode(s);
    if (ids.ok() && ids->size() == 1)
      g->stop_tokens_.push_back((*ids)[0]);  // stops inside the sampler
    else
      g->stop_strings_.push_back(s);  // cut after decoding
  }
  return g;
}

Status Generator::set_weights(const Weights& w) {
  TROUPE_TRY(policy_.model->set_params(w.params));
  version_ = w.version;
  return {};
}

Result<GenerateRep> Generator::generate(const GenerateReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  const auto& tok = *policy_.tokenizer;
  GenerateRep rep;
  rep.policy_version = version_;
  std::vector<std::vector<int32_t>> prompts;
  rep.samples.resize(r.prompts.size());
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    auto ids = tok.encode(format_prompt(cfg_.rollout, r.prompts[i]));
    if (!ids.ok()) return invalid_input("prompt " + std::to_string(i) + ": " + ids.error().message);
    std::vector<int32_t> p;
    if (tok.bos_id() >= 0) p.push_back(tok.bos_id());
    p.insert(p.end(), ids->begin(), ids->end());
    auto max_len = static_cast<size_t>(cfg_.rollout.max_prompt_length);
    if (p.size() > max_len) {
      p.erase(p.begin(), p.end() - static_cast<std::ptrdiff_t>(max_len));
      rep.samples[i].prompt_cut = true;
    }
    prompts.push_back(p);
  }
  policy::SamplingParams sp;
  sp.temperature = r.sampling.temperature;
  sp.top_k = r.sampling.top_k;
  sp.top_p = r.sampling.top_p;
  sp.max_new_tokens = r.sampling.max_new_tokens;
  sp.stop_tokens = stop_tokens_;
  sp.seed = r.sampling.seed;
  TROUPE_ASSIGN_OR_RETURN(auto gens, policy_.model->generate(prompts, sp));
  for (size_t i = 0; i < gens.size(); ++i) {
    auto& s = rep.samples[i];
    s.prompt_tokens = std::move(prompts[i]);
    s.tokens = std::move(gens[i].tokens);
    s.logprobs = std::move(gens[i].logprobs);
    bool stopped = gens[i].stopped;
    auto text = tok.decode(s.tokens, true);
    s.text = text.ok() ? *text : std::string();
    if (!stop_strings_.empty()) {
      size_t cut = std::string::npos;
      for (const auto& ss : stop_strings_) cut = std::min(cut, s.text.find(ss));
      if (cut != std::string::npos) {
        // the shortest token prefix whose text reaches past the stop string
        for (size_t k = 1; k <= s.tokens.size(); ++k) {
          auto t = tok.decode(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(k)), true);
          bool hit = false;
          for (const auto& ss : stop_strings_) hit = hit || (t.ok() && t->find(ss) != std::string::npos);
          if (hit) {
            s.tokens.resize(k);
            s.logprobs.resize(k);
            s.text = *t;
            stopped = true;
            break;
          }
        }
      }
    }
    s.truncated = !stopped;
  }
  rep.generate_s = seconds_since(t0);
  return rep;
}

// ---------------- LearnerRole ----------------

struct LearnerRole::Adapter final : learner::PolicyModel {
  explicit Adapter(policy::Model& m) : m_(m) {}
  std::span<float> params() override { return m_.params(); }
  std::span<float> grads() override { return m_.grads(); }
  const std::vector<policy::TensorSpec>& tensors() const override { return m_.tensors(); }
  void zero_grads() override { m_.zero_grads(); }
  Status forward_train(const policy::PackedBatch& b, float temperature, float* logp, float* entropy) override {
    return m_.forward_train(b, temperature, logp, entropy);
  }
  Status backward_train(const float* dlogp, const float* dentropy) override {
    return m_.backward_train(dlogp, dentropy);
  }
  policy::Model& m_;
};

LearnerRole::~LearnerRole() = default;

Result<std::unique_ptr<LearnerRole>> LearnerRole::create(const ExperimentConfig& cfg,
                                                         std::unique_ptr<learner::Communicator> comm) {
  std::unique_ptr<LearnerRole> l(new LearnerRole());
  l->cfg_ = cfg;
  TROUPE_ASSIGN_OR_RETURN(l->policy_, make_policy(cfg));
  l->adapter_ = std::make_unique<Adapter>(*l->policy_.model);
  if (cfg.loss.kl_coef > 0) {
    TROUPE_ASSIGN_OR_RETURN(auto ref, make_policy(cfg));
    l->ref_model_ = std::move(ref.model);
    l->ref_adapter_ = std::make_unique<Adapter>(*l->ref_model_);
  }
  l->comm_ = comm ? std::move(comm) : std::make_unique<learner::LocalCommunicator>();
  TROUPE_TRY(learner::validate(learner_config(cfg, learner::Phase::grpo)));
  return l;
}

learner::Trainer& LearnerRole::trainer_for(learner::Phase phase) {
  if (!has_trainer_ || phase != phase_) {  // a phase starts with a fresh optimizer and schedule
    trainer_ = std::make_unique<learner::Trainer>(*adapter_, learner_config(cfg_, phase), *comm_);
    phase_ = phase;
    has_trainer_ = true;
  }
  return *trainer_;
}

Result<TrainRep> LearnerRole::train(const TrainReq& r) {
  auto t0 = std::chrono::steady_clock::now();
  auto phase = r.phase == 1 ? learner::Phase::sft : learner::Phase::grpo;
  auto& trainer = trainer_for(phase);
  std::vector<learner::Sample> samples(r.samples.size());
  for (size_t i = 0; i < r.samples.size(); ++i) {
    const auto& t = r.samples[i];
    auto& s = samples[i];
    s.prompt = t.prompt;
    s.completion = t.completion;
    s.completion_mask = t.mask;
    s.old_logprobs = t.old_logprobs;
    s.behavior_logprobs = t.behavior_logprobs;
    s.advantage = t.advantage;
    s.truncated = t.truncated;
  }
  if (ref_adapter_ && phase == learner::Phase::grpo) {
    TROUPE_ASSIGN_OR_RETURN(auto ref, learner::compute_completion_logprobs(*ref_adapter_, samples,
                                                                           trainer.config().batch.temperature));
    for (size_t i = 0; i < samples.size(); ++i) samples[i].ref_logprobs = std::move(ref[i]);
  }
  const bool streamed = r.more || trainer.accumulating();
  if (streamed) {
    if (phase != learner::Phase::grpo)
      return invalid_input("learner: a partial (streamed) batch is for GRPO only");
    if (trainer.accumulating() && r.step != streamed_step_)
      return invalid_input("learner: a part of GRPO step " + std::to_string(r.step) + " arrived while step " +
                           std::to_string(streamed_step_) + " is being accumulated");
    streamed_step_ = r.step;
    TROUPE_TRY(trainer.accumulate(samples));
    if (r.more) {  // no update yet
      TrainRep rep;
      rep.policy_version = version_;
      rep.train_s = seconds_since(t0);
      return rep;
    }
  }
  TROUPE_ASSIGN_OR_RETURN(auto m, streamed ? trainer.finish_accumulated() : trainer.train_step(samples));
  ++version_;
  json j = {{"loss", m.loss.loss},
            {"pg_loss", m.loss.pg_loss},
            {"kl", m.loss.kl},
            {"clip_frac_low", m.loss.clip_frac_low},
            {"clip_frac_high", m.loss.clip_frac_high},
            {"entropy", m.loss.entropy},
            {"is_weight_mean", m.loss.is_weight_mean},
            {"grad_norm", m.grad_norm},
            {"lr", m.lr},
            {"train_tokens", m.tokens},
            {"learner_tokens_per_s", m.tokens_per_s}};
  TrainRep rep;
  rep.metrics_json = j.dump();
  rep.policy_version = version_;
  rep.train_s = seconds_since(t0);
  return rep;
}

Weights LearnerRole::weights() const {
  Weights w;
  w.version = version_;
  auto p = policy_.model->params();
  w.params.assign(p.begin(), p.end());
  return w;
}

Result<CheckpointRep> LearnerRole::checkpoint(const CheckpointReq& r) {
  const auto& specs = policy_.model->tensors();
  CheckpointRep rep;
  if (!r.load) {
    json extra = json::parse(r.extra_json, nullptr, false);
    if (extra.is_discarded()) extra = json::object();
    extra["phase"] = phase_ == learner::Phase::sft ? "sft" : "grpo";
    auto& trainer = trainer_for(phase_);
    learner::CheckpointData d;
    d.step = r.step;
    d.policy_version = version_;
    d.trainer_state = trainer.state_json();
    d.extra = extra;
    if (r.has_metric) d.metric = r.metric;
    learner::CheckpointOptions opt;
    opt.keep_last = cfg_.checkpointing.keep_last;
    opt.best_metric = cfg_.checkpointing.keep_best_by;
    opt.higher_is_better = cfg_.checkpointing.higher_is_better;
    const auto* tok = policy_.tokenizer.get();
    const auto& model = *policy_.model;
    learner::ModelDirWriter writer = [&](const std::string& dir) {
      return policy::io::save_model(dir, model, tok, policy::io::ExpertLayout::per_expert, tok->bos_id(),
                                    tok->eos_id(), tok->pad_id());
    };
    TROUPE_ASSIGN_OR_RETURN(rep.path, learner::save_checkpoint(r.dir, d, writer, trainer.optimizer(), specs, opt));
    rep.step = r.step;
    rep.policy_version = version_;
    return rep;
  }
  // load: the phase (which optimizer) is in state.json's extra
  std::ifstream in(r.dir + "/state.json");
  json state = json::parse(in, nullptr, false);
  if (state.is_discarded() || !state.is_object())
    return invalid_input(r.dir + "/state.json: missing or not JSON");
  std::string phase = state.value("extra", json::object()).value("phase", std::string("grpo"));
  auto& trainer = trainer_for(phase == "sft" ? learner::Phase::sft : learner::Phase::grpo);
  TROUPE_ASSIGN_OR_RETURN(auto d, learner::load_checkpoint(r.dir, specs, trainer.optimizer()));
  TROUPE_ASSIGN_OR_RETURN(auto loaded, policy::io::load_model(r.dir));
  TROUPE_TRY(policy_.model->set_params(loaded.model.params()));
  TROUPE_TRY(trainer.load_state_json(d.trainer_state));
  version_ = d.policy_version;
  rep.path = r.dir;
  rep.step = d.step;
  rep.policy_version = d.policy_version;
  rep.extra_json = d.extra.dump();
  return rep;
}

// ---------------- actors ----------------

EnvActor::EnvActor(std::shared_ptr<EnvWorker> worker) : worker_(std::move(worker)) {
  handle<EnvResetReq>([this](runtime::Context& ctx, const EnvResetReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->reset(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvStepReq>([this](runtime::Context& ctx, const EnvStepReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->step(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvVerifyReq>([this](runtime::Context& ctx, const EnvVerifyReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto rep, worker_->verify(r));
    return ctx.reply(std::move(rep));
  });
  handle<EnvReleaseReq>([this](runtime::Context&, const EnvReleaseReq& r) { worker_->release(r); });
}

namespace {
// OpenMP's nthreads is a per-thread setting: set it on the worker thread that runs the handler.
void use_threads(int n) {
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}
}  // namespace

int role_threads(const ClusterSection& c, const std::string& role, int fallback) {
  int own = role.rfind("generator", 0) == 0 ? c.generator_threads
            : role.rfind("learner", 0) == 0 ? c.learner_threads
                                            : 0;
  return own > 0 ? own : c.threads > 0 ? c.threads : fallback;
}

// One thread at a fixed nice value that runs jobs handed to it, one at a time; run() waits.
class ComputeThread {
 public:
  ComputeThread(int nice, int threads) : thread_([this, nice, threads] { loop(nice, threads); }) {}
  ~ComputeThread() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(const std::function<void()>& job) {
    std::unique_lock lk(mu_);
    job_ = &job;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_; });
  }

 private:
  void loop(int nice, int threads) {
    // Lowering one's own priority needs no privilege; threads started from here inherit it.
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) != 0)
      std::fprintf(stderr, "troupe: warning: generator nice %d: %s\n", nice, std::strerror(errno));
    use_threads(threads);
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      const auto* job = job_;
      lk.unlock();
      (*job)();
      lk.lock();
      job_ = nullptr;
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool done_ = false, stop_ = false;
  std::thread thread_;
};

GeneratorActor::GeneratorActor(std::shared_ptr<Generator> gen, int threads, int nice)
    : gen_(std::move(gen)), threads_(threads) {
  if (nice > 0) compute_ = std::make_unique<ComputeThread>(nice, threads);
  handle<GenerateReq>([this](runtime::Context& ctx, const GenerateReq& r) -> Status {
    Result<GenerateRep> rep = Error{};
    if (compute_) {
      compute_->run([&] { rep = gen_->generate(r); });
    } else {
      use_threads(threads_);
      rep = gen_->generate(r);
    }
    if (!rep.ok()) return rep.error();
    return ctx.reply(std::move(rep).value());
  });
  handle<Weights>([this](runtime::Context& ctx, const Weights& w) -> Status {
    use_threads(threads_);
    TROUPE_TRY(gen_->set_weights(w));
    if (ctx.header() && (ctx.header()->flags & runtime::kFlagRequest)) return ctx.reply(Ack{w.version});
    return {};
  });
}

GeneratorActor::~GeneratorActor() = default;

LearnerActor::LearnerActor(std::shared_ptr<LearnerRole> role, int threads)
    : role_(std::move(role)), threads_(threads) {
  handle<TrainReq>([this](runtime::Context& ctx, const TrainReq& r) -> Status {
    use_threads(threads_);
    TROUPE_ASSIGN_OR_RETURN(auto rep, role_->train(r));
    return ctx.reply(std::move(rep));
  });
  handle<GetWeightsReq>([this](runtime::Context& ctx, const GetWeightsReq&) -> Status {
    return ctx.reply(role_->weights());
  });
  handle<CheckpointReq>([this](runtime::Context& ctx, const CheckpointReq& r) -> Status {
    use_threads(threads_);
    TROUPE_ASSIGN_OR_RETURN(auto rep, role_->checkpoint(r));
    return ctx.reply(std::move(rep));
  });
}

}  // namespace troupe::actors
