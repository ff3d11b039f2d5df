// The learner role (SFT/GRPO steps through learner::Trainer, versioned weights, checkpoints) and
// the actor that hosts it.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "role_support.h"
#include "troupe/actors/expert_sync.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/step_counter.h"
#include "troupe/actors/weight_pieces.h"
#include "troupe/actors/weight_shards.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/checkpoint_ranges.h"
#include "troupe/learner/lora_checkpoint.h"
#include "troupe/learner/sharded_checkpoint.h"
#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/safetensors.h"

namespace troupe::actors {

namespace {

constexpr const char* kPipelineFile = "pipeline.bin";  // CheckpointReq::pipeline
// Async mode: the parameters of the last max_staleness versions (LearnerRole::score_stale), so a
// resumed run scores the stale samples it trains first as the uninterrupted run did.
constexpr const char* kSnapshotsFile = "policy_snapshots.safetensors";  // one 1-D tensor "version_<v>" each

Status write_snapshots(const std::string& path, const std::map<int64_t, std::vector<float>>& snaps) {
  policy::io::TensorMap tensors;
  for (const auto& [v, p] : snaps)
    tensors["version_" + std::to_string(v)] = {{static_cast<int64_t>(p.size())}, p};
  return policy::io::write_safetensors(path, tensors);
}

Result<std::map<int64_t, std::vector<float>>> read_snapshots(const std::string& path, size_t params) {
  TROUPE_ASSIGN_OR_RETURN(auto tensors, policy::io::read_safetensors(path));
  std::map<int64_t, std::vector<float>> snaps;
  for (auto& [name, t] : tensors) {
    char* end = nullptr;
    const long long v = name.rfind("version_", 0) == 0 ? std::strtoll(name.c_str() + 8, &end, 10) : -1;
    if (v < 0 || !end || *end != '\0') return invalid_input(path + ": tensor '" + name + "' is not version_<N>");
    if (t.data.size() != params)
      return invalid_input(path + ": " + name + " holds " + std::to_string(t.data.size()) +
                           " parameters, the model has " + std::to_string(params));
    snaps[v] = std::move(t.data);
  }
  return snaps;
}

// A checkpoint of a loaded model keeps what its source directory says beyond the weights and the
// tokenizer: the chat template (tokenizer_config.json, chat_template.jinja) and the generation
// defaults, so that `troupe generate --messages` and a later run render prompts the same way.
Status copy_model_side_files(const std::string& policy_path, const std::string& dir) {
  if (policy_path.empty()) return {};
  TROUPE_ASSIGN_OR_RETURN(std::string src, policy::io::model_dir_for(policy_path));
  namespace fs = std::filesystem;
  for (const char* name : {"tokenizer_config.json", "chat_template.jinja", "generation_config.json"}) {
    const fs::path from = fs::path(src) / name, to = fs::path(dir) / name;
    std::error_code ec;
    if (!fs::exists(from, ec) || fs::exists(to, ec)) continue;
    fs::copy_file(from, to, ec);
    if (ec) return invalid_input("checkpoint: cannot copy " + from.string() + " to " + dir + ": " + ec.message());
  }
  return {};
}

}  // namespace
using json = nlohmann::json;

// Learner 0's optimizer steps hand each block of the new master to the weight encoder, which
// prepares the next delta there (WeightEncoder::begin_prepare). The model's write count at the end
// of the step says whether the prepared delta still describes the master when the weights are asked for.
class LearnerRole::DeltaPrep final : public learner::StepObserver {
 public:
  DeltaPrep(WeightEncoder& encoder, const policy::Model& model) : encoder_(encoder), model_(model) {}
  std::span<const std::pair<size_t, size_t>> begin_step(size_t n) override { return encoder_.begin_prepare(n); }
  void updated(size_t range, size_t begin, size_t end, const float* params) override {
    encoder_.prepare_block(range, begin, end, params);
  }
  void end_step() override {
    encoder_.end_prepare();
    writes_at_end_ = model_.params_writes();
  }
  // Nothing has written the master since the prepared step (a checkpoint load, a set_params).
  bool still_current() const { return model_.params_writes() == writes_at_end_; }

 private:
  WeightEncoder& encoder_;
  const policy::Model& model_;
  std::uint64_t writes_at_end_ = 0;
};

LearnerRole::LearnerRole() = default;
LearnerRole::~LearnerRole() = default;

Result<std::unique_ptr<LearnerRole>> LearnerRole::create(const ExperimentConfig& cfg,
                                                         std::unique_ptr<learner::Communicator> comm) {
  std::unique_ptr<LearnerRole> l(new LearnerRole());
  l->cfg_ = cfg;
  l->comm_ = comm ? std::move(comm) : std::make_unique<learner::LocalCommunicator>();
  l->divided_ = learners_divide_experts(cfg) && l->comm_->size() > 1;
  const int E = cfg.policy.expert_parallel, rank = l->comm_->rank();
  // A divided learner, learner 0 included, builds its block of the experts alone (make_policy's
  // block: never the whole model, nothing of the others' experts), as does its reference model.
  const int block_shards = l->divided_ ? E : 1, block = l->divided_ ? rank % E : 0;
  TROUPE_ASSIGN_OR_RETURN(l->policy_, make_policy(cfg, block, block_shards));
  l->adapter_ = std::make_unique<learner::ModelAdapter>(*l->policy_.model);
  if (cfg.loss.kl_coef > 0) {
    TROUPE_ASSIGN_OR_RETURN(auto ref, make_policy(cfg, block, block_shards));
    l->ref_model_ = std::move(ref.model);
    l->ref_adapter_ = std::make_unique<learner::ModelAdapter>(*l->ref_model_);
  }
  // Learner ranks on GPUs sum their gradients with NCCL; elsewhere (null) over comm on the host.
  TROUPE_ASSIGN_OR_RETURN(l->device_comm_, learner::join_device_collective(l->policy_.model->backend(), *l->comm_));
  TROUPE_TRY(learner::validate(learner_config(cfg, learner::Phase::grpo)));
  l->shard_sync_ = weights_from_shards(cfg) && l->comm_->size() > 1;
  return l;
}

learner::Trainer& LearnerRole::trainer_for(learner::Phase phase) {
  if (!has_trainer_ || phase != phase_) {  // a phase starts with a fresh optimizer and schedule
    trainer_ = std::make_unique<learner::Trainer>(*adapter_, learner_config(cfg_, phase), *comm_, device_comm_.get());
    trainer_->set_step_observer(delta_prep_.get());
    // learner.shard parameters: every learner keeps its shard between steps when each encodes its
    // own shard for the weight sync; else learner 0, which then syncs the whole weights, holds them
    // whole (async runs score stale samples with the whole weights on every learner).
    trainer_->set_params_between_steps(cfg_.rollout.async ? learner::ParamsAtRest::whole
                                       : shard_sync_      ? learner::ParamsAtRest::shard
                                                          : learner::ParamsAtRest::rank0);
    phase_ = phase;
    has_trainer_ = true;
  }
  return *trainer_;
}

Result<TrainRep> LearnerRole::train(const TrainReq& r) {
  auto t0 = MonoClock::now();
  const learner::Phase phase = r.phase;
  const auto& faults = cfg_.faults;
  const int64_t run_step = StepCounter::of(cfg_).global_of_grpo(r.step);  // the metrics' step
  if (phase == learner::Phase::grpo && faults.learner_death_step > 0 && run_step == faults.learner_death_step &&
      comm_->rank() == faults.learner_death_rank)
    die_by_fault("learner rank " + std::to_string(comm_->rank()) + " killed as step " + std::to_string(run_step) +
                 " starts");
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
    s.sampler_experts = t.experts;
    s.teacher_logprobs = t.teacher_logprobs;
    s.teacher_topk_ids = t.teacher_topk_ids;
    s.teacher_topk_logprobs = t.teacher_topk_logprobs;
    // sampled by the weights held now (in-flight updates: every token by them)
    s.score_mismatch = t.versions.empty() ? t.policy_version == version_
                                          : t.versions.size() == 1 && t.versions[0] == version_;
  }
  learner::MismatchSums stale_mismatch;
  if (phase == learner::Phase::grpo) {
    TROUPE_ASSIGN_OR_RETURN(stale_mismatch, score_stale(r, samples, trainer));
  }
  if (ref_adapter_ && phase == learner::Phase::grpo) {
    TROUPE_ASSIGN_OR_RETURN(auto ref, trainer.reference_logprobs(*ref_adapter_, samples));  // (divided: with the group)
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
  m.mismatch.add(stale_mismatch);
  stale_mismatch_ = {};
  const learner::MismatchSummary mm = learner::summarize(m.mismatch);
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
            {"learner_tokens_per_s", m.tokens_per_s},
            {"state_bytes", trainer.state_bytes()}};
  if (mm.tokens > 0) {  // sampler vs learner on the same version's weights, before the update
    j["logprob_diff_max"] = mm.logprob_diff_max;
    j["logprob_diff_mean"] = mm.logprob_diff_mean;
    j["mismatch_kl"] = mm.mismatch_kl;
    j["mismatch_frac"] = mm.mismatch_frac;
    j["mismatch_tokens"] = mm.tokens;
    if (mm.has_routing) j["routing_agreement"] = mm.routing_agreement;
  }
  if (m.distill.tokens > 0) {  // distill: the student (this forward) against the teacher's log-probs
    const double steps = std::max(m.optimizer_steps, 1);
    j["distill/reverse_kl"] = m.distill.reverse_kl_sum / m.distill.tokens;
    j["distill/teacher_logprob_mean"] = m.distill.teacher_logp_sum / m.distill.tokens;
    j["distill/loss"] = m.distill.loss / steps;
    if (cfg_.distill.topk > 0) {
      j["distill/topk_kl"] = m.distill.topk_kl_sum / m.distill.tokens;
      j["distill/topk_loss"] = m.distill.topk_loss / steps;
    }
  }
  TrainRep rep;
  rep.metrics_json = j.dump();
  rep.policy_version = version_;
  rep.train_s = seconds_since(t0);
  return rep;
}

Result<learner::MismatchSums> LearnerRole::score_stale(const TrainReq& r, const std::vector<learner::Sample>& samples,
                                                      learner::Trainer& trainer) {
  if (!cfg_.rollout.async) return learner::MismatchSums{};
  // The weights of this version may sample later steps: keep them for as long as they may be
  // max_staleness behind (only the versions of this many last updates stay).
  if (!snapshots_.count(version_)) {
    auto p = policy_.model->params();
    snapshots_[version_].assign(p.begin(), p.end());
  }
  while (!snapshots_.empty() && snapshots_.begin()->first < version_ - cfg_.rollout.max_staleness)
    snapshots_.erase(snapshots_.begin());
  std::map<int64_t, std::vector<const learner::Sample*>> by_version;
  // in-flight updates: a sample's tokens of each version, as a copy masked to them, scored with
  // that version's weights (the current version's too when the sample has older tokens)
  std::deque<learner::Sample> per_version;
  for (size_t i = 0; i < samples.size(); ++i) {
    const TrainSample& t = r.samples[i];
    if (!t.versions.empty()) {
      if (samples[i].score_mismatch) continue;  // the training forward scores it
      const size_t n = t.completion.size();
      for (size_t u = 0; u < t.versions.size(); ++u) {
        if (!snapshots_.count(t.versions[u])) continue;
        const auto [b, e] = version_span(t.version_starts, u, n);
        if (e <= b) continue;
        learner::Sample& part = per_version.emplace_back(samples[i]);
        if (part.completion_mask.empty()) part.completion_mask.assign(n, 1.0f);
        for (size_t x = 0; x < n; ++x)
          if (x < b || x >= e) part.completion_mask[x] = 0.0f;
        by_version[t.versions[u]].push_back(&part);
      }
      continue;
    }
    if (t.policy_version >= 0 && t.policy_version != version_ && snapshots_.count(t.policy_version))
      by_version[t.policy_version].push_back(&samples[i]);
  }
  if (by_version.empty()) return stale_mismatch_;
  // Each older version's samples are scored with that version's weights (every rank scores all of
  // them, so the sums need no reduction), then the current weights come back bit for bit.
  const std::vector<float> current(policy_.model->params().begin(), policy_.model->params().end());
  learner::MismatchSums sums = stale_mismatch_;
  for (const auto& [v, list] : by_version) {
    TROUPE_TRY(policy_.model->set_params(snapshots_[v]));
    auto part = learner::score_mismatch(*adapter_, list, trainer.config().batch.temperature);
    if (!part.ok()) {
      TROUPE_TRY(policy_.model->set_params(current));
      return part.error();
    }
    sums.add(*part);
  }
  TROUPE_TRY(policy_.model->set_params(current));
  stale_mismatch_ = sums;  // streamed parts: carried to the step's last part
  return sums;
}

Weights LearnerRole::weights() const {
  Weights w;
  w.version = version_;
  auto p = policy_.model->params();
  w.params.assign(p.begin(), p.end());
  return w;
}

Status LearnerRole::add_probe(Weights& w, const std::function<void(std::span<float>)>& put_rounded,
                              const ProbeForward& forward) {
  w.probe_tokens = probe_tokens(policy_.model->config().vocab_size);
  Result<std::vector<float>> lp = std::vector<float>{};
  auto probe = [&]() -> Status {
    lp = probe_logprobs(*policy_.model, w.probe_tokens);
    return lp.ok() ? Status{} : lp.error();
  };
  if (cfg_.weight_sync.dtype == WeightDtype::fp32) {  // the generators hold the master as it is
    TROUPE_TRY(forward ? forward(probe) : probe());
    w.probe_logprobs = std::move(lp).value();
    return {};
  }
  // with the rounded copy in place for the probe, then the master back bit for bit
  auto params = policy_.model->params();  // (host memory: Model::params)
  master_backup_.assign(params.begin(), params.end());
  put_rounded(params);
  Status probed = forward ? forward(probe) : probe();
  // set_params, not a write through `params`: on a device backend the probe's forward has
  // uploaded the rounded copy, and only a new write marks the mirror for upload again.
  TROUPE_TRY(policy_.model->set_params(master_backup_));
  TROUPE_TRY(probed);
  w.probe_logprobs = std::move(lp).value();
  return {};
}

Result<Weights> LearnerRole::shard_weights_for_generators(const GetWeightsReq& r) {
  const auto& ws = cfg_.weight_sync;
  const auto params = std::as_const(*policy_.model).params();  // this rank's shard is always in place
  const auto bounds = learner::shard_bounds(params.size(), comm_->size());
  const auto rank = static_cast<size_t>(comm_->rank());
  if (!encoder_) {
    encoder_ = std::make_unique<WeightEncoder>(
        ws.dtype, shard_tensor_table(cut_tensor_table(policy_.model->tensors(), bounds), bounds, rank));
    encoder_->set_compress_full(policy_.model->lora_enabled());
    encoder_->set_lean_memory(true);  // a full piece is its held copy; a big delta goes in full
  }
  const bool full_due = ws.mode == WeightSyncMode::full || (ws.full_every > 0 && version_ % ws.full_every == 0);
  const bool delta = !full_due && r.base_version >= 0 && r.base_version == encoder_->held_version();
  piece_ = Weights{};  // (the last piece's payload let go first: it may be a view of the held copy)
  encoder_->encode(params.subspan(bounds[rank], bounds[rank + 1] - bounds[rank]), version_, delta, piece_);
  // The head answers; the payload stays here until the coordinator says where to send it.
  Weights w = piece_;
  w.payload = runtime::Bytes();
  learner::Trainer* t = trainer_.get();
  if (!t && cfg_.learner.shard == learner::ShardStage::parameters && !cfg_.rollout.async) {
    // The first sync, before any step: the trainer made now (as the first step would make it) lets
    // every learner drop to its shard here rather than hold the whole initial weights until then.
    t = &trainer_for(phase_);
    if (t->forwards_from_shards()) TROUPE_TRY(t->release_params());
  }
  if (!ws.probe) return w;
  if (t && t->forwards_from_shards()) {
    // ZeRO-3 learners that keep only their shard: every learner runs the probe's forward with each
    // layer gathered from the shards (as in a step) and rounded as the generators hold it, so no
    // rank holds the whole weights (collectives: every learner is asked). Learner 0's goes along.
    const auto tokens = probe_tokens(policy_.model->config().vocab_size);
    std::function<void(std::span<float>)> round;
    if (ws.dtype != WeightDtype::fp32) round = [&](std::span<float> p) { round_to_dtype(p, ws.dtype); };
    std::vector<float> lp;
    TROUPE_TRY(t->forward_from_shards(
        [&]() -> Status {
          TROUPE_ASSIGN_OR_RETURN(lp, probe_logprobs(*policy_.model, tokens));
          return {};
        },
        round));
    if (rank == 0) {
      w.probe_tokens = tokens;
      w.probe_logprobs = std::move(lp);
    }
    return w;
  }
  // Else the probe needs the whole weights on learner 0: learners that keep only their shard
  // without the per-layer gathers gather them there for it and drop them again (collectives).
  if (t) TROUPE_TRY(t->gather_params_to_rank0());
  Status probed = rank == 0 ? add_probe(w, [&](std::span<float> p) { round_to_dtype(p, ws.dtype); }) : Status{};
  if (t) TROUPE_TRY(t->release_params());
  TROUPE_TRY(probed);
  return w;
}

void LearnerRole::fault_in_sync(std::int64_t version) const {
  const auto& f = cfg_.faults;
  if (f.learner_death_sync > 0 && version == f.learner_death_sync && comm_->rank() == f.learner_death_rank)
    die_by_fault("learner rank " + std::to_string(comm_->rank()) + " killed while it sends its piece of version " +
                 std::to_string(version));
}

Result<std::vector<runtime::Bytes>> LearnerRole::piece_payloads(std::int64_t version) const {
  if (piece_.version != version || (piece_.encoding == 0 && piece_.elements > 0))
    return make_error(ErrorCode::internal, "learner " + std::to_string(comm_->rank()) + ": asked to send its piece of version " +
                                               std::to_string(version) + ", but the piece it holds is of version " +
                                               std::to_string(piece_.version));
  if (divided_) return run_payloads_;
  return std::vector<runtime::Bytes>{piece_.payload};
}

Result<Weights> LearnerRole::divided_weights_for_generators(const GetWeightsReq& r) {
  const auto& ws = cfg_.weight_sync;
  learner::Trainer& trainer = trainer_for(phase_);
  const policy::ExpertShardLayout& layout = *policy_.model->expert_shards();
  const bool sends = comm_->rank() < layout.shards;  // (the first group's learners; the others hold the same)
  if (sends && !runs_encoder_) {
    TROUPE_ASSIGN_OR_RETURN(runs_encoder_, ExpertRunsEncoder::make(ws.dtype, layout));
  }
  const bool full_due = ws.mode == WeightSyncMode::full || (ws.full_every > 0 && version_ % ws.full_every == 0);
  const bool delta = !full_due && r.base_version >= 0 && runs_encoder_ && r.base_version == runs_encoder_->held_version();
  piece_ = Weights{};
  piece_.version = version_;
  run_payloads_.clear();
  if (sends)
    TROUPE_TRY(runs_encoder_->encode(std::as_const(*policy_.model).params(), version_, delta, piece_, run_payloads_));
  Weights w = piece_;  // (the head: the payloads stay here until the coordinator says where they go)
  if (!ws.probe) return w;
  // The probe with the values the generators hold, every learner running it with its group (the
  // experts' exchange); learner 0's goes along.
  Weights probed;
  TROUPE_TRY(add_probe(
      probed, [&](std::span<float> p) { round_to_dtype(p, ws.dtype); },
      [&](const std::function<Status()>& fn) { return trainer.forward_with_expert_group(fn); }));
  if (comm_->rank() == 0) {
    w.probe_tokens = std::move(probed.probe_tokens);
    w.probe_logprobs = std::move(probed.probe_logprobs);
  }
  return w;
}

Result<Weights> LearnerRole::weights_for_generators(const GetWeightsReq& r) {
  if (divided_ && r.device)
    return invalid_input("weight_sync.transport: nccl broadcasts learner 0's whole weights, but with "
                         "policy.moe.expert_parallel the learners hold one block of experts each (use zmq)");
  if (shard_sync_ && !r.device) return divided_ ? divided_weights_for_generators(r) : shard_weights_for_generators(r);
  const auto& ws = cfg_.weight_sync;
  if (!encoder_) {
    encoder_ = std::make_unique<WeightEncoder>(ws.dtype, policy_.model->tensors());
    // LoRA: the weights are the adapters (a few MB), so a full sync is worth compressing.
    encoder_->set_compress_full(policy_.model->lora_enabled());
    if (!r.device && ws.mode != WeightSyncMode::full && ws.prepare_in_step) {  // deltas over ZeroMQ: prepared in each step from now on
      delta_prep_ = std::make_unique<DeltaPrep>(*encoder_, *policy_.model);
      if (trainer_) trainer_->set_step_observer(delta_prep_.get());
    }
  }
  Weights w;
  // By broadcast: the values as the generators will hold them (fp32: the master itself, read only;
  // bf16: a rounded copy in `rounded`).
  std::span<const float> sent;
  std::vector<float> rounded;
  if (r.device) {
    if (!weight_group_)
      return make_error(ErrorCode::internal, "learner 0: asked for the weights by broadcast, but it is in no weight group");
    sent = policy_.model->params();
    if (encoder_->dtype() != WeightDtype::fp32) {
      rounded.assign(sent.begin(), sent.end());
      round_to_dtype(rounded, encoder_->dtype());
      sent = rounded;
    }
    w.version = version_;
    w.encoding = static_cast<std::int32_t>(WeightEncoding::device);
    w.dtype = static_cast<std::int32_t>(encoder_->dtype());
    w.elements = sent.size();
    w.checksums = weight_checksums(sent, policy_.model->tensors(), encoder_->dtype());
  } else {
    const bool full_due = ws.mode == WeightSyncMode::full || (ws.full_every > 0 && version_ % ws.full_every == 0);
    const bool delta = !full_due && r.base_version >= 0 && r.base_version == encoder_->held_version();
    if (encoder_->has_prepared() && !(delta_prep_ && delta_prep_->still_current())) encoder_->discard_prepared();
    encoder_->encode(std::as_const(*policy_.model).params(), version_, delta, w);
  }
  if (ws.probe)
    TROUPE_TRY(add_probe(w, [&](std::span<float> params) {
      if (r.device)
        std::copy(rounded.begin(), rounded.end(), params.begin());
      else
        encoder_->held_into(params);
    }));
  // The broadcast goes last: with NCCL it is queued on the model's stream and completes only once
  // every generator takes it, which it does when it gets this reply's message, so any later work
  // of this model that waits for its stream (the probe's log-probs) would wait forever.
  if (r.device) TROUPE_TRY(weight_group_->send(sent, encoder_->dtype()));
  return w;
}

Result<WeightGroupRep> LearnerRole::weight_group(const WeightGroupReq& r) {
  WeightGroupRep rep;
  if (r.op == 0) {
    TROUPE_ASSIGN_OR_RETURN(rep.id, WeightGroup::make_id(policy_.model->backend()));
    return rep;
  }
  TROUPE_ASSIGN_OR_RETURN(weight_group_, WeightGroup::join(policy_.model->backend(), r.id, r.nranks, r.rank));
  return rep;
}

Result<CheckpointRep> LearnerRole::checkpoint(const CheckpointReq& r) {
  if (r.load) return load_checkpoint(r);
  const auto& specs = policy_.model->tensors();
  CheckpointRep rep;
  rep.step = r.step;
  rep.policy_version = version_;
  json extra = json::parse(r.extra_json, nullptr, false);
  if (extra.is_discarded()) extra = json::object();
  extra["phase"] = phase_ == learner::Phase::sft ? "sft" : "grpo";
  auto& trainer = trainer_for(phase_);
  learner::CheckpointData d;
  d.step = r.step;
  d.policy_version = version_;
  d.trainer_state = trainer.state_json();
  if (r.has_metric) d.metric = r.metric;
  learner::CheckpointOptions opt;
  opt.keep_last = cfg_.checkpointing.keep_last;
  opt.best_metric = cfg_.checkpointing.keep_best_by;
  opt.higher_is_better = cfg_.checkpointing.higher_is_better;
  const auto* tok = policy_.tokenizer.get();
  const auto& model = *policy_.model;
  const bool sharded = trainer.sharded() || divided_;
  // The model's files (without the weights when sharded: the ranks write those), then the rest.
  learner::ModelDirWriter writer = [&](const std::string& dir) -> Status {
    if (model.lora_enabled())  // the adapters only, in PEFT's layout; the base is policy.path / run.seed's (base.json)
      TROUPE_TRY(learner::write_lora_adapter_files(dir, model, cfg_.policy.path, !sharded));
    else if (sharded)
      TROUPE_TRY(policy::io::save_model_dir_meta(dir, model.config(), tok, tok->bos_id(), tok->eos_id(), tok->pad_id()));
    else
      TROUPE_TRY(policy::io::save_model(dir, model, tok, policy::io::ExpertLayout::per_expert, tok->bos_id(),
                                        tok->eos_id(), tok->pad_id()));
    if (cfg_.faults.checkpoint_interrupt_step > 0 && r.step == cfg_.faults.checkpoint_interrupt_step)
      die_by_fault("checkpoint of step " + std::to_string(r.step) + " interrupted after its model files");
    if (cfg_.rollout.async && !snapshots_.empty()) TROUPE_TRY(write_snapshots(dir + "/" + kSnapshotsFile, snapshots_));
    if (!r.pipeline.empty()) {  // (listed with its CRC in state.json like the other files)
      std::ofstream out(dir + "/" + kPipelineFile, std::ios::binary);
      out.write(r.pipeline.data(), static_cast<std::streamsize>(r.pipeline.size()));
      if (!out.flush()) return make_error(ErrorCode::io, dir + "/" + kPipelineFile + ": write failed");
    }
    return copy_model_side_files(cfg_.policy.path, dir);
  };
  if (divided_) {
    d.extra = extra;
    TROUPE_ASSIGN_OR_RETURN(rep.path, save_divided_checkpoint(r.dir, d, writer, trainer, opt));
    return rep;
  }
  if (sharded) {
    // Sharded learners: every rank is asked and writes its own shard of the weights and moments in
    // parallel; learner 0 the rest, then the layout, and commits once every rank's file is in.
    extra["learner_shard"] = {{"stage", std::string(enum_string(cfg_.learner.shard))},
                              {"learners", comm_->size()},
                              {"optimizer_layout", "shards"}};
    d.extra = extra;
    const auto& o = std::as_const(trainer).optimizer();  // (read only: no upload after)
    const size_t lo = trainer.shard_begin(), n = trainer.shard_end() - lo;
    const auto bounds = learner::shard_bounds(model.params().size(), comm_->size());
    learner::RankShard shard{model.params().subspan(lo, n), o.exp_avg(), o.exp_avg_sq(), bounds, &specs,
                             model.lora_enabled() ? "lora_adapter" : "model",
                             std::string(enum_string(cfg_.learner.shard)), o.steps()};
    TROUPE_ASSIGN_OR_RETURN(rep.path, learner::save_sharded_checkpoint(r.dir, d, writer, shard, *comm_, opt));
    return rep;
  }
  d.extra = extra;
  TROUPE_ASSIGN_OR_RETURN(rep.path, learner::save_checkpoint(r.dir, d, writer, std::as_const(trainer).optimizer(), specs, opt));
  return rep;
}

Result<std::string> LearnerRole::save_divided_checkpoint(const std::string& dir, learner::CheckpointData& d,
                                                         const learner::ModelDirWriter& writer,
                                                         learner::Trainer& trainer,
                                                         const learner::CheckpointOptions& opt) {
  // Every learner of the first group writes the runs of the weight sync it sends (its experts and
  // 1/E of the rest), weights and moments, in parallel; learner 0 the rest and shards.json; the other
  // groups hold the same values and write nothing. No learner gathers the whole model.
  const policy::ExpertShardLayout& layout = *policy_.model->expert_shards();
  std::vector<SyncRun> runs;
  TROUPE_ASSIGN_OR_RETURN(const auto mine, local_sync_runs(layout, runs));
  const auto bounds = sync_run_bounds(runs);
  const auto& o = std::as_const(trainer).optimizer();  // (read only)
  const auto params = std::as_const(*policy_.model).params();
  d.extra["expert_parallel"] = {{"E", layout.shards}, {"optimizer_layout", "shards"}};
  learner::RankShard shard{{}, {}, {}, bounds, &layout.whole_table, "model",
                           std::string(enum_string(cfg_.learner.shard)), o.steps()};
  shard.pieced = true;
  shard.layout = "expert_runs " + std::to_string(layout.shards);
  if (comm_->rank() < layout.shards)
    for (const LocalRun& lr : mine)
      shard.pieces.push_back({lr.index, params.subspan(lr.local, lr.n), o.exp_avg().subspan(lr.local, lr.n),
                              o.exp_avg_sq().subspan(lr.local, lr.n)});
  return learner::save_sharded_checkpoint(dir, d, writer, shard, *comm_, opt);
}

Result<learner::CheckpointData> LearnerRole::load_divided_checkpoint(const std::string& dir, learner::Trainer& trainer) {
  // This learner's values alone (its experts and what every rank holds), weights and moments, from
  // whichever files of the checkpoint hold them (any layout, any E): the rest is never read.
  const policy::ExpertShardLayout& layout = *policy_.model->expert_shards();
  learner::AdamW moments(policy_.model->params().size());
  TROUPE_ASSIGN_OR_RETURN(auto d, learner::load_checkpoint_ranges(dir, layout.whole_table, learner::held_ranges(layout),
                                                                  policy_.model->params(), moments));
  TROUPE_TRY(trainer.load_optimizer_share(std::move(moments)));
  return d;
}

Result<CheckpointRep> LearnerRole::load_checkpoint(const CheckpointReq& r) {
  CheckpointRep rep;
  // the phase (which optimizer) is in state.json's extra
  std::ifstream in(r.dir + "/state.json");
  json state = json::parse(in, nullptr, false);
  if (state.is_discarded() || !state.is_object())
    return invalid_input(r.dir + "/state.json: missing or not JSON");
  std::string phase = state.value("extra", json::object()).value("phase", std::string("grpo"));
  auto& trainer = trainer_for(phase == "sft" ? learner::Phase::sft : learner::Phase::grpo);
  const auto& specs = policy_.model->tensors();
  const size_t n = policy_.model->params().size(), lo = trainer.shard_begin(), hi = trainer.shard_end();
  const bool lora = policy_.model->lora_enabled();
  // The moments: a sharded learner reads only its own share of them, and a ZeRO-3 learner that keeps
  // only its shard of the weights only that shard of them too (load_checkpoint_ranges: only those
  // values' bytes, from whichever files hold them, whatever the checkpoint's rank count or layout;
  // the launcher verified the checksums before); an unsharded one all of the moments. LoRA runs read
  // their adapters' moments by load_checkpoint_share.
  const bool own_weights = !divided_ && !lora && trainer.keeps_shard_only();
  learner::AdamW moments(divided_ ? 0 : hi - lo);
  const learner::HeldRange share[1] = {{lo, 0, hi - lo}};
  TROUPE_ASSIGN_OR_RETURN(
      auto d, divided_ ? load_divided_checkpoint(r.dir, trainer)
              : lora   ? learner::load_checkpoint_share(r.dir, specs, lo, n, moments)
                       : learner::load_checkpoint_ranges(
                             r.dir, specs, share,
                             own_weights ? policy_.model->params().subspan(lo, hi - lo) : std::span<float>(), moments));
  if (!divided_) TROUPE_TRY(trainer.load_optimizer_share(std::move(moments)));
  if (divided_) {
    // (load_divided_checkpoint took the moments and the weights)
  } else if (lora) {  // (read_peft_adapter reads a sharded checkpoint's shards)
    TROUPE_TRY(learner::read_lora_adapter_files(r.dir, *policy_.model));
  } else if (own_weights) {
    // (its shard of the weights came with the moments) the rest of the arena is dropped
    TROUPE_TRY(trainer.release_params());
  } else if (learner::is_sharded_checkpoint(r.dir)) {
    std::vector<float> params(n);
    TROUPE_TRY(learner::read_sharded_params(r.dir, specs, params));
    TROUPE_TRY(policy_.model->set_params(params));
  } else {
    TROUPE_ASSIGN_OR_RETURN(auto loaded, policy::io::load_model(r.dir));
    TROUPE_TRY(policy_.model->set_params(loaded.model.params()));
  }
  TROUPE_TRY(trainer.load_state_json(d.trainer_state));
  version_ = d.policy_version;
  rep.path = r.dir;
  rep.step = d.step;
  rep.policy_version = d.policy_version;
  rep.extra_json = d.extra.dump();
  // (load_checkpoint checked their sizes and CRCs with the others)
  snapshots_.clear();
  if (std::filesystem::exists(r.dir + "/" + kSnapshotsFile)) {
    TROUPE_ASSIGN_OR_RETURN(snapshots_, read_snapshots(r.dir + "/" + kSnapshotsFile, policy_.model->params().size()));
  }
  if (std::ifstream p(r.dir + "/" + kPipelineFile, std::ios::binary); p)
    rep.pipeline.assign(std::istreambuf_iterator<char>(p), std::istreambuf_iterator<char>());
  return rep;
}

LearnerActor::LearnerActor(std::shared_ptr<LearnerRole> role, int threads)
    : role_(std::move(role)), threads_(threads) {
  // Each request answered by the role's method, on this actor's thread count where `threads`
  // (a weight group join only waits for the others).
  auto answer = [this](auto method, bool threads) {
    return [this, method, threads](runtime::Context& ctx, const auto& r) -> Status {
      if (threads) use_threads(threads_);
      TROUPE_ASSIGN_OR_RETURN(auto rep, ((*role_).*method)(r));
      return ctx.reply(std::move(rep));
    };
  };
  handle<TrainReq>(answer(&LearnerRole::train, true));
  handle<GetWeightsReq>(answer(&LearnerRole::weights_for_generators, true));
  handle<WeightGroupReq>(answer(&LearnerRole::weight_group, false));
  // weights_from_shards: the piece encoded last to the generators the coordinator names, answered
  // once every one of them took it (paced) or it is all sent (weight_pieces.h).
  handle<SendPieceReq>([this](runtime::Context& ctx, const SendPieceReq& r) -> Status {
    TROUPE_ASSIGN_OR_RETURN(std::vector<runtime::Bytes> payloads, role_->piece_payloads(r.version));
    if (std::string bad = PieceSender::mismatch(payloads, r); !bad.empty())
      return make_error(ErrorCode::internal, "learner: asked to send its piece of version " + std::to_string(r.version) +
                                                 ": " + bad);
    runtime::ReplyTo reply = ctx.reply_later();
    runtime::Bytes kept;
    if (r.reply_payload) {  // (the runs one after another: the coordinator places them at their spans)
      std::string all;
      for (const auto& p : payloads) all.append(p.data(), p.size());
      kept = runtime::Bytes(std::move(all));
    }
    auto sender = std::make_shared<PieceSender>(std::move(payloads), r, [reply, kept](runtime::Context&, SendPieceRep rep) {
      rep.payload = kept;
      if (reply) (void)reply.send(std::move(rep));
    });
    sender->start(ctx);
    role_->fault_in_sync(r.version);  // (faults.learner_death_sync: dies with its first runs sent)
    return {};
  });
  handle<CheckpointReq>(answer(&LearnerRole::checkpoint, true));
}

}  // namespace troupe::actors
