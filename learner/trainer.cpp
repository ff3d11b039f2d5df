// Trainer (see trainer.h). Every rank walks the same global batch in the same order (same RNG),
// so mini-batch boundaries and global normalisers agree without communication; the only
// collectives per optimizer step are one all-reduce of the flat gradient buffer (and one of the
// metric sums per call).
#include "troupe/learner/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "troupe/base/seed_streams.h"
#include "troupe/learner/correction.h"
#include "troupe/learner/device_shards.h"

namespace troupe::learner {

namespace {
std::string sample_name(size_t i) { return "learner: sample " + std::to_string(i); }
}  // namespace

Result<PackedMicroBatch> pack_samples(const std::vector<const Sample*>& samples, bool mask_truncated) {
  PackedMicroBatch out;
  auto& b = out.batch;
  b.cu_seqlens.push_back(0);
  out.has_old = !samples.empty() && !samples[0]->old_logprobs.empty();
  out.has_ref = !samples.empty() && !samples[0]->ref_logprobs.empty();
  out.has_behavior = !samples.empty() && !samples[0]->behavior_logprobs.empty();
  out.has_teacher = !samples.empty();
  for (const Sample* s : samples) out.has_teacher = out.has_teacher && !s->teacher_logprobs.empty();
  size_t replay_width = 0;  // batch.experts: every recorded completion token, for routing replay
  for (const Sample* s : samples) {
    const size_t n = s->completion.size();
    if (replay_width == 0 && n > 0 && !s->sampler_experts.empty() && s->sampler_experts.size() % n == 0)
      replay_width = s->sampler_experts.size() / n;
  }
  for (const Sample* s : samples) {
    const auto& sampler = s->behavior_logprobs.empty() ? s->old_logprobs : s->behavior_logprobs;
    if (s->score_mismatch && !sampler.empty()) out.has_mismatch = true;
    const size_t C = s->completion.size();
    if (s->score_mismatch && !s->sampler_experts.empty() && C > 0 && s->sampler_experts.size() % C == 0 &&
        out.experts_width == 0)
      out.experts_width = static_cast<int>(s->sampler_experts.size() / C);
  }
  for (const Sample* s : samples) {
    const size_t P = s->prompt.size(), C = s->completion.size();
    if (P < 1 || C < 1) return invalid_input("learner: a sample needs >= 1 prompt and >= 1 completion token");
    if (s->old_logprobs.empty() == out.has_old || s->ref_logprobs.empty() == out.has_ref ||
        s->behavior_logprobs.empty() == out.has_behavior)
      return invalid_input("learner: old/ref/behavior log-probs must be given for every sample of a batch or for none");
    const float keep = (mask_truncated && s->truncated) ? 0.0f : 1.0f;
    for (size_t t = 0; t + 1 < P + C; ++t) {
      const int32_t x = t < P ? s->prompt[t] : s->completion[t - P];
      const int32_t y = t + 1 < P ? s->prompt[t + 1] : s->completion[t + 1 - P];
      b.tokens.push_back(x);
      b.targets.push_back(y);
      const bool completion = t + 1 >= P;
      const size_t j = t + 1 - P;  // completion index predicted here (valid when `completion`)
      out.mask.push_back(completion ? keep * (s->completion_mask.empty() ? 1.0f : s->completion_mask[j]) : 0.0f);
      if (replay_width > 0) {
        const size_t W = replay_width;
        if (completion && s->sampler_experts.size() == C * W)
          b.experts.insert(b.experts.end(), s->sampler_experts.begin() + static_cast<std::ptrdiff_t>(j * W),
                           s->sampler_experts.begin() + static_cast<std::ptrdiff_t>((j + 1) * W));
        else
          b.experts.insert(b.experts.end(), W, -1);
      }
      if (out.has_old) out.logp_old.push_back(completion ? s->old_logprobs[j] : 0.0f);
      if (out.has_ref) out.logp_ref.push_back(completion ? s->ref_logprobs[j] : 0.0f);
      if (out.has_behavior) out.logp_behavior.push_back(completion ? s->behavior_logprobs[j] : 0.0f);
      if (out.has_teacher) out.logp_teacher.push_back(completion ? s->teacher_logprobs[j] : 0.0f);
      if (out.has_mismatch) {
        const auto& sampler = s->behavior_logprobs.empty() ? s->old_logprobs : s->behavior_logprobs;
        const bool scored = completion && s->score_mismatch && !sampler.empty();
        const float m = scored ? (s->completion_mask.empty() ? 1.0f : s->completion_mask[j]) : 0.0f;
        out.mismatch_mask.push_back(m);
        out.logp_sampler.push_back(scored ? sampler[j] : 0.0f);
        const size_t W = static_cast<size_t>(out.experts_width);
        const bool routed = scored && W > 0 && s->sampler_experts.size() == C * W;
        out.route_mask.push_back(routed ? m : 0.0f);
        if (W > 0) {
          if (routed)
            out.experts.insert(out.experts.end(), s->sampler_experts.begin() + static_cast<std::ptrdiff_t>(j * W),
                               s->sampler_experts.begin() + static_cast<std::ptrdiff_t>((j + 1) * W));
          else
            out.experts.insert(out.experts.end(), W, -1);
        }
      }
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    out.advantages.push_back(s->advantage);
  }
  return out;
}

void add_packed_mismatch(MismatchSums& out, const PackedMicroBatch& packed, const float* logp, const PolicyModel& model) {
  if (!packed.has_mismatch) return;
  const int T = static_cast<int>(packed.batch.tokens.size());
  add_logprob_mismatch(out, packed.logp_sampler.data(), logp, packed.mismatch_mask.data(), T);
  const int W = packed.experts_width;
  const auto routing = model.last_routing();
  if (W > 0 && W == model.routing_width() && routing.size() == static_cast<size_t>(T) * W)
    add_routing_mismatch(out, packed.experts.data(), routing.data(), packed.route_mask.data(), T, W,
                         model.routing_k());
}

namespace {

// score_mismatch's samples: prompt, completion, mask and what the sampler recorded, nothing else
// (those without recorded log-probs left out).
std::vector<Sample> mismatch_samples(const std::vector<const Sample*>& samples) {
  std::vector<Sample> bare;
  for (const Sample* s : samples) {
    const auto& sampler = s->behavior_logprobs.empty() ? s->old_logprobs : s->behavior_logprobs;
    if (sampler.empty()) continue;
    Sample b;
    b.prompt = s->prompt;
    b.completion = s->completion;
    b.completion_mask = s->completion_mask;
    b.old_logprobs = sampler;
    b.sampler_experts = s->sampler_experts;
    b.score_mismatch = true;
    bare.push_back(std::move(b));
  }
  return bare;
}

std::vector<int> mismatch_cuts(const std::vector<Sample>& bare, int max_tokens_per_batch) {
  std::vector<int> lengths;
  for (const auto& s : bare) lengths.push_back(static_cast<int>(s.prompt.size() + s.completion.size()) - 1);
  return split_micro_batches(lengths, 0, max_tokens_per_batch);
}

}  // namespace

size_t score_mismatch_passes(const std::vector<const Sample*>& samples, int max_tokens_per_batch) {
  return mismatch_cuts(mismatch_samples(samples), max_tokens_per_batch).size() - 1;
}

Result<MismatchSums> score_mismatch(PolicyModel& model, const std::vector<const Sample*>& samples, float temperature,
                                    int max_tokens_per_batch) {
  MismatchSums out;
  const std::vector<Sample> bare = mismatch_samples(samples);
  const auto cuts = mismatch_cuts(bare, max_tokens_per_batch);
  std::vector<float> logp;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    std::vector<const Sample*> ptrs;
    for (int i = cuts[c]; i < cuts[c + 1]; ++i) ptrs.push_back(&bare[static_cast<size_t>(i)]);
    TROUPE_ASSIGN_OR_RETURN(auto packed, pack_samples(ptrs, false));
    logp.assign(packed.batch.tokens.size(), 0.0f);
    TROUPE_TRY(model.forward_train(packed.batch, temperature, logp.data(), nullptr));
    add_packed_mismatch(out, packed, logp.data(), model);
  }
  return out;
}

std::vector<int> split_micro_batches(const std::vector<int>& lengths, int micro_batch_size, int max_tokens) {
  std::vector<int> cuts{0};
  const int n = static_cast<int>(lengths.size());
  if (n == 0) return cuts;
  if (max_tokens > 0) {
    int tokens = 0, count = 0;
    for (int i = 0; i < n; ++i) {
      if (count > 0 && tokens + lengths[i] > max_tokens) {
        cuts.push_back(i);
        tokens = 0;
        count = 0;
      }
      tokens += lengths[i];
      ++count;
    }
    cuts.push_back(n);
    return cuts;
  }
  const int step = micro_batch_size > 0 ? micro_batch_size : n;
  for (int i = step; i < n; i += step) cuts.push_back(i);
  cuts.push_back(n);
  return cuts;
}

Result<std::vector<std::vector<float>>> compute_completion_logprobs(PolicyModel& model, const std::vector<Sample>& samples,
                                                                    float temperature, int max_tokens_per_batch) {
  std::vector<std::vector<float>> out(samples.size());
  std::vector<int> lengths;
  for (const auto& s : samples) lengths.push_back(static_cast<int>(s.prompt.size() + s.completion.size()) - 1);
  auto cuts = split_micro_batches(lengths, 0, max_tokens_per_batch);
  std::vector<float> logp, entropy;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    std::vector<const Sample*> ptrs;
    std::vector<Sample> bare;  // without log-probs, so packing ignores them
    bare.reserve(cuts[c + 1] - cuts[c]);
    for (int i = cuts[c]; i < cuts[c + 1]; ++i) {
      Sample s;
      s.prompt = samples[i].prompt;
      s.completion = samples[i].completion;
      bare.push_back(std::move(s));
    }
    for (auto& s : bare) ptrs.push_back(&s);
    TROUPE_ASSIGN_OR_RETURN(auto packed, pack_samples(ptrs, false));
    logp.assign(packed.batch.tokens.size(), 0.0f);
    entropy.assign(packed.batch.tokens.size(), 0.0f);
    TROUPE_TRY(model.forward_train(packed.batch, temperature, logp.data(), entropy.data()));
    for (int i = cuts[c]; i < cuts[c + 1]; ++i) {
      const int s = i - cuts[c];
      const size_t P = samples[i].prompt.size(), C = samples[i].completion.size();
      const size_t base = static_cast<size_t>(packed.batch.cu_seqlens[s]) + P - 1;
      out[i].assign(logp.begin() + static_cast<std::ptrdiff_t>(base), logp.begin() + static_cast<std::ptrdiff_t>(base + C));
    }
  }
  return out;
}

Result<PreparedBatch> prepare_grpo_batch(std::vector<Sample> samples, int group_size, const LearnerConfig& cfg) {
  if (group_size < 1 || samples.size() % static_cast<size_t>(group_size) != 0)
    return invalid_input("learner: " + std::to_string(samples.size()) + " samples do not make groups of " +
                         std::to_string(group_size));
  const auto& a = cfg.advantage;
  std::vector<float> rewards;
  for (auto& s : samples) {
    if (a.overlong_buffer_len > 0)
      s.reward += overlong_penalty(static_cast<int>(s.completion.size()), cfg.max_completion_length,
                                   a.overlong_buffer_len, a.overlong_penalty_factor);
    rewards.push_back(s.reward);
  }
  PreparedBatch out;
  out.groups_in = static_cast<int>(samples.size() / group_size);
  std::vector<char> keep(out.groups_in, 1);
  if (a.dynamic_sampling) dapo_filter_groups(keep, rewards, group_size);
  // Advantages use the statistics of the kept groups only (batch std included), as after DAPO's refill.
  std::vector<float> kept_rewards;
  for (int g = 0; g < out.groups_in; ++g)
    if (keep[g])
      for (int i = 0; i < group_size; ++i) {
        kept_rewards.push_back(rewards[static_cast<size_t>(g) * group_size + i]);
        out.samples.push_back(std::move(samples[static_cast<size_t>(g) * group_size + i]));
      }
  out.groups_kept = static_cast<int>(out.samples.size() / group_size);
  TROUPE_ASSIGN_OR_RETURN(auto adv, compute_advantages(kept_rewards, group_size, a));
  for (size_t i = 0; i < adv.size(); ++i) out.samples[i].advantage = adv[i];
  return out;
}

Trainer::Trainer(PolicyModel& model, const LearnerConfig& cfg, Communicator& comm, kernels::DeviceCollective* device)
    : model_(model),
      cfg_(cfg),
      comm_(comm),
      device_(device),
      sharded_(cfg.shard != ShardStage::none && comm.size() > 1),
      bounds_(shard_bounds(model.params().size(), comm.size())),
      opt_(sharded_ ? shard_end() - shard_begin() : model.params().size()),
      rng_(cfg.seed) {
  if (cfg_.loss.agg_norm_length <= 0) cfg_.loss.agg_norm_length = cfg_.max_completion_length;
  // ZeRO-3 keeps host shards, reduced over comm on the host copy (a host-visible model), or device
  // shards of a sparse device arena, reduced by the device collective (device_zero3).
  const bool zero3 = sharded_ && cfg_.shard == ShardStage::parameters;
  // Per layer where the model has the hook and every forward of a step is a loss micro-batch's
  // (not with distill.teacher, whose top-k pass runs forwards of its own, nor with LoRA dropout's
  // separate scoring forward; a streamed step gathers the whole weights too, zero3_begin).
  const bool layered = !cfg_.distill.enabled() && !model_.has_lora_dropout();
  if (zero3 && model_.backend().host_visible()) {
    device_ = nullptr;
    zero3_ = std::make_unique<ParamShards>(model_.params(), model_.grads(), model_.tensors(), bounds_, comm_, layered);
    if (layered && !model_.set_param_hook(zero3_.get()))
      zero3_ = std::make_unique<ParamShards>(model_.params(), model_.grads(), model_.tensors(), bounds_, comm_, false);
  } else if (zero3 && layered && !cfg_.optimizer_offload) {
    device_zero3();
  }
}

// learner.shard parameters on a device model: the arena made sparse and the layers gathered into it
// on the device (DeviceParamShards). Where the model refuses (LoRA adapters, a quantized base, a
// backend without sparse buffers) its arena stays whole, and the step divides the moments only
// (sharded_device_step, as learner.shard gradients).
void Trainer::device_zero3() {
  if (!device_) staged_ = staged_device_collective(model_.backend(), comm_);
  auto made = DeviceParamShards::create(model_, bounds_, comm_, device_ ? *device_ : *staged_);
  if (!made.ok()) return;
  zero3_ = std::move(*made);
  zero3_on_device_ = true;
  if (!model_.set_param_hook(zero3_.get())) zero3_.reset(), zero3_on_device_ = false;  // (not expected: the arena is sparse)
}

Trainer::~Trainer() {
  // (a Trainer made over the same model before this one went may have put its own hook there)
  if (zero3_ && zero3_->layered() && model_.param_hook() == zero3_.get()) model_.set_param_hook(nullptr);
}

Status Trainer::check_sample(const Sample& s, size_t i) const {
  if (s.prompt.empty()) return invalid_input(sample_name(i) + ": empty prompt");
  if (s.completion.empty()) return invalid_input(sample_name(i) + ": empty completion");
  const size_t C = s.completion.size();
  // each per-token vector is empty or has one entry per completion token
  for (const auto& [v, field] : {std::pair{&s.completion_mask, "completion_mask"}, std::pair{&s.old_logprobs, "old_logprobs"},
                                 std::pair{&s.behavior_logprobs, "behavior_logprobs"},
                                 std::pair{&s.ref_logprobs, "ref_logprobs"},
                                 std::pair{&s.teacher_logprobs, "teacher_logprobs"}})
    if (!v->empty() && v->size() != C)
      return invalid_input(sample_name(i) + ": " + field + " has " + std::to_string(v->size()) + " entries for " +
                           std::to_string(C) + " completion tokens");
  if (cfg_.phase == Phase::grpo && cfg_.loss.kl_coef != 0 && s.ref_logprobs.empty())
    return invalid_input(sample_name(i) + ": kl_coef = " + std::to_string(cfg_.loss.kl_coef) +
                         " needs ref_logprobs (or set kl_coef: 0)");
  if (cfg_.phase == Phase::grpo && cfg_.distill.enabled()) {
    if (s.teacher_logprobs.empty())
      return invalid_input(sample_name(i) + ": distill.teacher is set but the sample has no teacher_logprobs");
    const size_t K = static_cast<size_t>(cfg_.distill.topk);
    if (K > 0 && (s.teacher_topk_ids.size() != C * K || s.teacher_topk_logprobs.size() != C * K))
      return invalid_input(sample_name(i) + ": distill.topk = " + std::to_string(K) + " needs " + std::to_string(C * K) +
                           " teacher_topk_ids and teacher_topk_logprobs, got " +
                           std::to_string(s.teacher_topk_ids.size()) + " and " +
                           std::to_string(s.teacher_topk_logprobs.size()));
  }
  return {};
}

// LoRA dropout: the loss's forward and backward drop with a mask seeded by (run seed, optimizer
// step, rank, micro-batch of the step), so a run and its --resume draw the same masks. The
// mismatch of the sampled tokens is scored without dropout (a forward of its own), as the sampler
// computed them; with expert parallelism that forward runs every expert on this rank (a LoRA
// model holds them all), out of the group's exchange, since its count differs by rank.
Result<LossMetrics> Trainer::run_micro_batch(const std::vector<const Sample*>& samples, const LossNorm& norm,
                                             bool score, MismatchSums& mismatch) {
  if (!model_.has_lora_dropout()) return micro_batch_step(samples, norm, score, mismatch);
  if (score) {
    std::vector<const Sample*> scored;
    for (const Sample* s : samples)
      if (s->score_mismatch) scored.push_back(s);
    if (ep_) TROUPE_TRY(model_.set_expert_exchange(nullptr));
    auto sums = score_mismatch(model_, scored, cfg_.batch.temperature);
    if (ep_) TROUPE_TRY(model_.set_expert_exchange(&ep_->exchange()));
    if (!sums.ok()) return sums.error();
    mismatch.add(*sums);
  }
  const uint64_t where = (static_cast<uint64_t>(comm_.rank()) << 32) | dropout_micro_++;
  model_.set_lora_dropout(true, mix_seed(cfg_.seed, seed_stream::lora_dropout, opt_.steps(), where));
  auto m = micro_batch_step(samples, norm, false, mismatch);
  model_.set_lora_dropout(false, 0);
  return m;
}

Result<LossMetrics> Trainer::micro_batch_step(const std::vector<const Sample*>& samples, const LossNorm& norm,
                                              bool score, MismatchSums& mismatch) {
  TROUPE_ASSIGN_OR_RETURN(auto packed, pack_samples(samples, cfg_.batch.mask_truncated));
  const size_t T = packed.batch.tokens.size();
  logp_.assign(T, 0.0f);
  entropy_.assign(T, 0.0f);
  dlogp_.assign(T, 0.0f);
  dentropy_.assign(T, 0.0f);
  TokenBatch tb;
  tb.T = static_cast<int>(T);
  tb.S = static_cast<int>(samples.size());
  tb.cu_seqlens = packed.batch.cu_seqlens.data();
  tb.mask = packed.mask.data();
  tb.advantages = packed.advantages.data();
  tb.logp_old = packed.has_old ? packed.logp_old.data() : nullptr;
  tb.logp_ref = packed.has_ref ? packed.logp_ref.data() : nullptr;
  const bool grpo = cfg_.phase == Phase::grpo;
  // distill: the env reward's advantage scaled by reward_coef, plus the per-token reverse-KL term
  // added to each row's derivative (add_distill) after the GRPO loss assigned it
  const bool distill = grpo && cfg_.distill.enabled();
  std::vector<double> agg_w;
  if (distill) {
    TROUPE_ASSIGN_OR_RETURN(agg_w, aggregation_weights(packed, norm));
    for (float& a : packed.advantages) a *= cfg_.distill.reward_coef;
  }
  auto add_distill = [&](int t0, int t1) {
    if (distill)
      distill_reverse_kl(dlogp_.data() + t0, logp_.data() + t0, packed.logp_teacher.data() + t0,
                         tb.logp_old ? tb.logp_old + t0 : nullptr, packed.mask.data() + t0, agg_w.data() + t0,
                         t1 - t0, cfg_.distill.coef, distill_);
  };
  // Importance weight against the policy that sampled, of rho = pi_old / pi_behavior, pi_old the
  // recorded/recomputed old policy or, on-policy, the current one (detached): the configured
  // loss.mismatch_correction, else truncated at importance_weight_cap (stale async samples).
  const bool weighted = packed.has_behavior && grpo;
  const auto mode = cfg_.loss.mismatch_correction == MismatchCorrection::none ? MismatchCorrection::tis
                                                                              : cfg_.loss.mismatch_correction;
  const double cap = cfg_.loss.mismatch_correction == MismatchCorrection::none
                         ? static_cast<double>(cfg_.importance_weight_cap)
                         : 0.0;
  auto weights = [&](int t0, int t1, const int32_t* cu, int S) {  // rows [t0, t1); cu/S: seq_geo_mask only
    const float* base = tb.logp_old ? tb.logp_old : logp_.data();
    correction_weights(is_weight_.data() + t0, base + t0, packed.logp_behavior.data() + t0, packed.mask.data() + t0,
                       cu, S, t1 - t0, mode, cfg_.loss, cap);
  };
  if (weighted) {
    is_weight_.assign(T, 0.0f);
    tb.is_weight = is_weight_.data();
  }
  // The loss reads the host arrays the model hands back: on the model's backend when the host's
  // memory is its memory (cpu), else on the CPU backend (the per-token loss is O(tokens)).
  const kernels::Backend& loss_backend =
      model_.backend().host_visible() ? model_.backend() : kernels::cpu_backend();
  auto loss = [&](const TokenBatch& b, float* dlogp, float* dentropy, const float* logp, const float* entropy) {
    return grpo ? grpo_loss_fused(dlogp, dentropy, logp, entropy, b, cfg_.loss, norm, loss_backend)
                : sft_loss(dlogp, dentropy, logp, entropy, b, norm);
  };
  const bool need_dentropy = grpo && cfg_.loss.entropy_coef != 0;
  // The loss's derivative at a position depends on that position alone (so the model may take it
  // tile by tile of rows, forward_backward_train) unless it needs a mean over a sequence of the
  // current log-probs: the sequence-level ratio, or on-policy the sequence-level geometric-mean mask.
  const bool per_token = !grpo || (!cfg_.loss.sequence_level_ratio &&
                                   !(weighted && !tb.logp_old && mode == MismatchCorrection::seq_geo_mask));
  if (per_token) {
    if (weighted && tb.logp_old) weights(0, tb.T, tb.cu_seqlens, tb.S);  // fixed before the forward
    std::vector<double> seq_tokens(tb.S, 0.0);  // each sequence's mask sum, summed as grpo_loss sums it
    for (int s = 0; s < tb.S; ++s)
      for (int t = tb.cu_seqlens[s]; t < tb.cu_seqlens[s + 1]; ++t) seq_tokens[s] += tb.mask[t];
    std::vector<int32_t> cu;
    Status failed;
    // rows [t0, t1) as a batch of their own: the sequences they touch, cut to those rows
    auto grad = [&](int t0, int t1) {
      if (weighted && !tb.logp_old) weights(t0, t1, nullptr, 0);  // token-level modes only here
      TokenBatch b = tb;
      b.T = t1 - t0;
      b.mask = tb.mask + t0;
      if (b.logp_old) b.logp_old += t0;
      if (b.logp_ref) b.logp_ref += t0;
      if (b.is_weight) b.is_weight += t0;
      if (t0 > 0 || t1 < tb.T) {
        const int s0 = static_cast<int>(std::upper_bound(tb.cu_seqlens, tb.cu_seqlens + tb.S + 1, t0) - tb.cu_seqlens) - 1;
        const int s1 = static_cast<int>(std::lower_bound(tb.cu_seqlens, tb.cu_seqlens + tb.S + 1, t1) - tb.cu_seqlens);
        cu.clear();
        for (int s = s0; s <= s1; ++s) cu.push_back(std::clamp(tb.cu_seqlens[s], t0, t1) - t0);
        b.S = s1 - s0;
        b.cu_seqlens = cu.data();
        b.advantages = tb.advantages + s0;
        b.seq_tokens = seq_tokens.data() + s0;
      }
      auto r = loss(b, dlogp_.data() + t0, dentropy_.data() + t0, logp_.data() + t0, entropy_.data() + t0);
      if (!r.ok() && failed.ok()) failed = r.error();
      add_distill(t0, t1);
    };
    TROUPE_TRY(model_.forward_backward_train(packed.batch, cfg_.batch.temperature, logp_.data(), entropy_.data(),
                                             dlogp_.data(), need_dentropy ? dentropy_.data() : nullptr, grad));
    TROUPE_TRY(failed);
    if (score) add_packed_mismatch(mismatch, packed, logp_.data(), model_);
    if (distill && cfg_.distill.topk > 0) TROUPE_TRY(run_topk_pass(samples, norm));
    // The metrics of the whole micro-batch (the gradients it assigns again are the ones grad gave).
    return loss(tb, dlogp_.data(), dentropy_.data(), logp_.data(), entropy_.data());
  }
  TROUPE_TRY(model_.forward_train(packed.batch, cfg_.batch.temperature, logp_.data(), entropy_.data()));
  if (score) add_packed_mismatch(mismatch, packed, logp_.data(), model_);
  if (weighted) weights(0, tb.T, tb.cu_seqlens, tb.S);
  TROUPE_ASSIGN_OR_RETURN(LossMetrics m, loss(tb, dlogp_.data(), dentropy_.data(), logp_.data(), entropy_.data()));
  add_distill(0, tb.T);
  TROUPE_TRY(model_.backward_train(dlogp_.data(), need_dentropy ? dentropy_.data() : nullptr));
  if (distill && cfg_.distill.topk > 0) TROUPE_TRY(run_topk_pass(samples, norm));
  return m;
}

Result<std::vector<double>> Trainer::aggregation_weights(const PackedMicroBatch& packed, const LossNorm& norm) const {
  const auto& cu = packed.batch.cu_seqlens;
  std::vector<double> w(packed.mask.size(), 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    double tokens = 0;
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) tokens += packed.mask[static_cast<size_t>(t)];
    TROUPE_ASSIGN_OR_RETURN(double ws, aggregation_weight(cfg_.loss.agg_mode, tokens, norm, cfg_.loss.agg_norm_length));
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) w[static_cast<size_t>(t)] = ws * packed.mask[static_cast<size_t>(t)];
  }
  return w;
}

Status Trainer::run_topk_pass(const std::vector<const Sample*>& samples, const LossNorm& norm) {
  const size_t K = static_cast<size_t>(cfg_.distill.topk);
  policy::PackedBatch b;
  b.cu_seqlens.push_back(0);
  std::vector<float> mask, teacher;  // per completion position (n); teacher (n x K)
  std::vector<double> weight;        // per completion position
  std::vector<size_t> row;           // (n x K): the packed row predicting position p's j-th token
  for (const Sample* s : samples) {
    const size_t P = s->prompt.size(), C = s->completion.size(), p0 = mask.size();
    const float keep = (cfg_.batch.mask_truncated && s->truncated) ? 0.0f : 1.0f;
    double tokens = 0;
    for (size_t c = 0; c < C; ++c) {
      mask.push_back(keep * (s->completion_mask.empty() ? 1.0f : s->completion_mask[c]));
      tokens += mask.back();
    }
    TROUPE_ASSIGN_OR_RETURN(double ws, aggregation_weight(cfg_.loss.agg_mode, tokens, norm, cfg_.loss.agg_norm_length));
    for (size_t c = 0; c < C; ++c) weight.push_back(ws * mask[p0 + c]);
    teacher.insert(teacher.end(), s->teacher_topk_logprobs.begin(), s->teacher_topk_logprobs.end());
    row.resize(mask.size() * K);
    for (size_t j = 0; j < K; ++j) {  // copy j: the completion's targets are the teacher's j-th tokens
      const size_t base = b.tokens.size();
      for (size_t t = 0; t + 1 < P + C; ++t) {
        b.tokens.push_back(t < P ? s->prompt[t] : s->completion[t - P]);
        b.targets.push_back(t + 1 < P ? -1 : s->teacher_topk_ids[(t + 1 - P) * K + j]);
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
      for (size_t c = 0; c < C; ++c) row[(p0 + c) * K + j] = base + P - 1 + c;
    }
  }
  std::vector<float> logp(b.tokens.size(), 0.0f), dlogp(b.tokens.size(), 0.0f);
  TROUPE_TRY(model_.forward_train(b, cfg_.batch.temperature, logp.data(), nullptr));
  std::vector<float> student(row.size()), dstudent(row.size());
  for (size_t i = 0; i < row.size(); ++i) student[i] = logp[row[i]];
  distill_topk_forward_kl(dstudent.data(), student.data(), teacher.data(), mask.data(), weight.data(),
                          static_cast<int>(mask.size()), static_cast<int>(K), cfg_.distill.coef, distill_);
  for (size_t i = 0; i < row.size(); ++i) dlogp[row[i]] = dstudent[i];
  return model_.backward_train(dlogp.data(), nullptr);
}

Status Trainer::check_batch(const std::vector<Sample>& batch) const {
  for (size_t i = 0; i < batch.size(); ++i) TROUPE_TRY(check_sample(batch[i], i));
  for (size_t i = 1; i < batch.size(); ++i)
    if (batch[i].old_logprobs.empty() != batch[0].old_logprobs.empty())
      return invalid_input(sample_name(i) + ": old_logprobs must be given for every sample or for none");
  return {};
}

double Trainer::sample_tokens(const Sample& s) const {
  if (cfg_.batch.mask_truncated && s.truncated) return 0.0;
  if (s.completion_mask.empty()) return static_cast<double>(s.completion.size());
  return std::accumulate(s.completion_mask.begin(), s.completion_mask.end(), 0.0);
}

Result<size_t> Trainer::most_micro_batches(size_t mine) {
  std::vector<double> counts(static_cast<size_t>(comm_.size()), 0.0);
  counts[static_cast<size_t>(comm_.rank())] = static_cast<double>(mine);
  TROUPE_TRY(comm_.allreduce_sum(std::span<double>(counts)));
  return static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
}

Status Trainer::plain_micro_batches(const std::vector<std::vector<const Sample*>>& mbs, const LossNorm& norm,
                                    bool score, MismatchSums& mismatch, LossMetrics& sums) {
  if (!ep_) {
    for (const auto& mb : mbs) {
      TROUPE_ASSIGN_OR_RETURN(auto m, run_micro_batch(mb, norm, score, mismatch));
      sums.add(m);
    }
    return {};
  }
  // Only these passes split the experts: the other forwards of a step (old log-probs, mismatch
  // scoring) run every expert here on the whole weights, needing no peer. A micro-batch is one
  // forward/backward pair, two with distillation's top-k pass (run_topk_pass): a rank out of
  // micro-batches serves its peers' pairs in as many idle passes.
  TROUPE_ASSIGN_OR_RETURN(const size_t passes, most_micro_batches(mbs.size()));
  TROUPE_TRY(model_.set_expert_exchange(&ep_->exchange()));
  const bool topk = cfg_.phase == Phase::grpo && cfg_.distill.enabled() && cfg_.distill.topk > 0;
  Status st;
  for (size_t c = 0; c < passes && st.ok(); ++c) {
    if (c >= mbs.size()) {
      st = model_.expert_parallel_idle_pass(true);
      if (st.ok() && topk) st = model_.expert_parallel_idle_pass(true);
      continue;
    }
    auto m = run_micro_batch(mbs[c], norm, score, mismatch);
    if (m.ok())
      sums.add(*m);
    else
      st = m.error();
  }
  (void)model_.set_expert_exchange(nullptr);
  return st;
}

Status Trainer::optimizer_step(StepMetrics& out, double& norm_sum, bool last) {
  if (model_.expert_shards()) return divided_optimizer_step(out, norm_sum);
  if (sharded_) return sharded_optimizer_step(out, norm_sum, last);
  // The sum over learner ranks: on the device (NCCL) before the gradients come down, else over
  // comm on the host copy. The same sum either way, so clipping and AdamW below are one code path.
  if (device_) TROUPE_TRY(model_.all_reduce_grads(*device_));
  if (device_optimizer_on()) return device_optimizer_step(out, norm_sum, last);
  auto grads = model_.grads();
  // Beyond two ranks the sum runs in rank order (reduce-scatter + all-gather), whatever MPI's
  // algorithm would add first: the sharded stages sum so too, and equal this step bit for bit.
  if (!device_) TROUPE_TRY(comm_.size() > 2 ? comm_.ordered_allreduce_sum(grads, bounds_) : comm_.allreduce_sum(grads));
  norm_sum += clip_grad_norm(grads, cfg_.optimizer.max_grad_norm);
  out.lr = learning_rate_at(cfg_.optimizer, opt_.steps());
  TROUPE_TRY(opt_.step(model_.params(), grads, cfg_.optimizer, out.lr, last ? watch_ : nullptr));
  dropout_micro_ = 0;
  ++out.optimizer_steps;
  return {};
}

Status Trainer::finish_metrics(StepMetrics& out, const LossMetrics& sums, const MismatchSums& mismatch, double norm_sum,
                               const std::vector<float>& adv, const std::vector<float>& rew, double len,
                               double trunc, double seconds) {
  double v[11] = {sums.loss,        sums.pg_loss,      sums.kl_loss,       sums.tokens,
                  sums.kl_sum,      sums.clip_low_sum, sums.clip_high_sum, sums.dual_clip_sum,
                  sums.entropy_sum, sums.ratio_sum,    sums.is_weight_sum};
  TROUPE_TRY(comm_.allreduce_sum(std::span<double>(v, 11)));
  LossMetrics total{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
  double mm[6] = {mismatch.tokens, mismatch.diff_sum, mismatch.kl_sum, mismatch.over_tol, mismatch.route_pairs,
                  mismatch.route_agree};
  TROUPE_TRY(comm_.allreduce_sum(std::span<double>(mm, 6)));
  std::vector<double> maxes(static_cast<size_t>(comm_.size()), 0.0);  // a max as a sum of one slot per rank
  maxes[static_cast<size_t>(comm_.rank())] = mismatch.diff_max;
  TROUPE_TRY(comm_.allreduce_sum(std::span<double>(maxes)));
  out.mismatch = MismatchSums{mm[0], mm[1], *std::max_element(maxes.begin(), maxes.end()), mm[2], mm[3], mm[4], mm[5]};
  if (cfg_.phase == Phase::grpo && cfg_.distill.enabled()) {
    double d[6] = {distill_.tokens, distill_.reverse_kl_sum, distill_.teacher_logp_sum,
                   distill_.loss,   distill_.topk_kl_sum,    distill_.topk_loss};
    TROUPE_TRY(comm_.allreduce_sum(std::span<double>(d, 6)));
    out.distill = DistillSums{d[0], d[1], d[2], d[3], d[4], d[5]};
  }
  out.loss = finalize(total);
  const double steps = std::max(out.optimizer_steps, 1);
  out.loss.loss /= steps;
  out.loss.pg_loss /= steps;
  out.loss.kl_loss /= steps;
  out.grad_norm = norm_sum / steps;
  out.tokens = total.tokens;
  const double n = std::max<double>(1.0, static_cast<double>(adv.size()));
  out.advantages = stats_of(adv);
  out.rewards = stats_of(rew);
  out.response_len_mean = len / n;
  out.truncated_frac = trunc / n;
  out.wall_s = seconds;
  out.tokens_per_s = out.wall_s > 0 ? out.tokens / out.wall_s : 0.0;
  return {};
}

Result<StepMetrics> Trainer::train_step(const std::vector<Sample>& batch_in) {
  const auto t_start = std::chrono::steady_clock::now();
  TROUPE_TRY(validate(cfg_));
  if (acc_.active) return invalid_input("learner: train_step while a streamed step is being accumulated");
  const size_t N = batch_in.size();
  const int M = cfg_.batch.num_mini_batches;
  if (N == 0) return invalid_input("learner: empty batch");
  if (N < static_cast<size_t>(M))
    return invalid_input("learner: a batch of " + std::to_string(N) + " samples cannot make num_mini_batches = " +
                         std::to_string(M));
  TROUPE_TRY(check_batch(batch_in));
  TROUPE_TRY(join_expert_parallel());
  const bool has_old = !batch_in[0].old_logprobs.empty();

  // Old log-probs: recorded at generation, or recomputed now when the batch is used for more than
  // one update (otherwise the update is on-policy: old = logp detached, ratio 1).
  const std::vector<Sample>* batch = &batch_in;
  std::vector<Sample> with_old;
  const bool grpo = cfg_.phase == Phase::grpo;
  // Mismatch of the samples the current weights sampled, before any update: from the first
  // training forward when one optimizer step follows it (free), else a forward pass of its own
  // over this rank's share of the batch.
  const bool score_in_forward = grpo && M == 1 && cfg_.batch.num_iterations == 1;
  const bool recompute_old = grpo && !has_old && (cfg_.batch.num_iterations > 1 || M > 1);
  // ZeRO-3: the forwards before the update (old log-probs, the mismatch) gather layer by layer
  // with the hook (zero3_forwards); without the hook zero3_begin gathers the whole weights anyway.
  const bool layered3 = zero3_ && zero3_->layered();
  if (zero3_) TROUPE_TRY(zero3_begin(false));
  if (recompute_old) {
    std::vector<std::vector<float>> old;
    auto forwards = [&]() -> Status {
      TROUPE_ASSIGN_OR_RETURN(old, old_logprobs(batch_in));
      return {};
    };
    TROUPE_TRY(layered3 ? zero3_forwards(0, forwards) : forwards());  // (the same forwards on every rank)
    with_old = batch_in;
    for (size_t i = 0; i < N; ++i) with_old[i].old_logprobs = std::move(old[i]);
    batch = &with_old;
  }

  std::vector<size_t> order(N);
  std::iota(order.begin(), order.end(), size_t{0});
  StepMetrics out;
  LossMetrics sums;
  MismatchSums mismatch;
  distill_ = DistillSums{};
  double norm_sum = 0;
  const int W = comm_.size(), r = comm_.rank();
  if (grpo && !score_in_forward) {
    std::vector<const Sample*> mine;
    for (size_t i = N * r / W; i < N * (r + 1) / W; ++i)
      if (batch_in[i].score_mismatch) mine.push_back(&batch_in[i]);
    auto forwards = [&]() -> Status {
      TROUPE_ASSIGN_OR_RETURN(mismatch, mismatch_before_update(mine));
      return {};
    };
    TROUPE_TRY(layered3 ? zero3_forwards(score_mismatch_passes(mine), forwards) : forwards());
  }
  for (int it = 0; it < cfg_.batch.num_iterations; ++it) {
    if (cfg_.batch.shuffle) std::shuffle(order.begin(), order.end(), rng_);
    for (int k = 0; k < M; ++k) {
      const size_t mb0 = N * k / M, mb1 = N * (k + 1) / M, n = mb1 - mb0;
      LossNorm norm;
      norm.num_seqs = static_cast<double>(n);
      for (size_t i = mb0; i < mb1; ++i) norm.num_tokens += sample_tokens((*batch)[order[i]]);
      norm.num_tokens = std::max(norm.num_tokens, 1.0);  // an all-masked mini-batch trains on nothing
      const size_t s0 = mb0 + n * r / W, s1 = mb0 + n * (r + 1) / W;
      std::vector<int> lengths;
      for (size_t i = s0; i < s1; ++i) {
        const Sample& s = (*batch)[order[i]];
        lengths.push_back(static_cast<int>(s.prompt.size() + s.completion.size()) - 1);
      }
      const auto cuts = split_micro_batches(lengths, cfg_.batch.micro_batch_size, cfg_.batch.micro_batch_tokens);
      std::vector<std::vector<const Sample*>> mbs(cuts.size() - 1);
      for (size_t c = 0; c + 1 < cuts.size(); ++c)
        for (int i = cuts[c]; i < cuts[c + 1]; ++i) mbs[c].push_back(&(*batch)[order[s0 + i]]);
      if (zero3_) {
        if (!zero3_->layered()) model_.zero_grads();
        TROUPE_TRY(zero3_->zero_grads());
        TROUPE_TRY(zero3_micro_batches(mbs, norm, score_in_forward, mismatch, sums));
      } else {
        model_.zero_grads();
        TROUPE_TRY(plain_micro_batches(mbs, norm, score_in_forward, mismatch, sums));
      }
      TROUPE_TRY(optimizer_step(out, norm_sum, it + 1 == cfg_.batch.num_iterations && k + 1 == M));
    }
  }
  if (zero3_) TROUPE_TRY(zero3_end());
  std::vector<float> adv, rew;
  double len = 0, trunc = 0;
  for (const auto& s : batch_in) {
    adv.push_back(s.advantage);
    rew.push_back(s.reward);
    len += static_cast<double>(s.completion.size());
    trunc += s.truncated ? 1.0 : 0.0;
  }
  TROUPE_TRY(
      finish_metrics(out, sums, mismatch, norm_sum, adv, rew, len, trunc,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()));
  return out;
}

Status Trainer::accumulate(const std::vector<Sample>& part) {
  const auto t_start = std::chrono::steady_clock::now();
  TROUPE_TRY(validate(cfg_));
  if (cfg_.phase != Phase::grpo) return invalid_input("learner: a streamed (partial) batch is for GRPO only");
  if (cfg_.batch.num_iterations != 1 || cfg_.batch.num_mini_batches != 1)
    return invalid_input("learner: a streamed batch needs num_iterations = 1 and num_mini_batches = 1 (got " +
                         std::to_string(cfg_.batch.num_iterations) + " and " +
                         std::to_string(cfg_.batch.num_mini_batches) + ")");
  TROUPE_TRY(check_batch(part));
  TROUPE_TRY(join_expert_parallel());
  if (!acc_.active) {
    acc_ = Accumulated{};
    acc_.active = true;
    distill_ = DistillSums{};
    if (zero3_) {  // a streamed step runs on the whole weights (its parts' micro-batches differ by rank)
      TROUPE_TRY(zero3_begin(true));
      model_.zero_grads();
      TROUPE_TRY(zero3_->zero_grads());
      TROUPE_TRY(zero3_->grads_whole());  // (a device maps them: the backward writes every one)
    } else {
      model_.zero_grads();
    }
  }
  if (!part.empty()) {
    const bool has_old = !part[0].old_logprobs.empty();
    if (!acc_.adv.empty() && has_old != acc_.has_old)
      return invalid_input(
          "learner: old_logprobs must be given for every part of a streamed batch or for none");
    acc_.has_old = has_old;
  }
  const size_t n = part.size();
  const int W = comm_.size(), r = comm_.rank();
  const size_t s0 = n * r / W, s1 = n * (r + 1) / W;
  std::vector<int> lengths;
  for (size_t i = s0; i < s1; ++i)
    lengths.push_back(static_cast<int>(part[i].prompt.size() + part[i].completion.size()) - 1);
  const auto cuts =
      split_micro_batches(lengths, cfg_.batch.micro_batch_size, cfg_.batch.micro_batch_tokens);
  std::vector<std::vector<const Sample*>> mbs(cuts.size() - 1);
  for (size_t c = 0; c + 1 < cuts.size(); ++c)
    for (int i = cuts[c]; i < cuts[c + 1]; ++i) mbs[c].push_back(&part[s0 + static_cast<size_t>(i)]);
  const LossNorm unit{1.0, 1.0};  // the global normaliser is applied in finish_accumulated()
  // (with expert parallelism every rank of the group runs the part's most micro-batches, an empty
  // share of it idle passes only)
  Status st = plain_micro_batches(mbs, unit, true, acc_.mismatch, acc_.sums);
  if (!st.ok()) {
    acc_ = Accumulated{};  // the partial gradient is dropped with the step
    return st;
  }
  for (const auto& s : part) {
    acc_.tokens += sample_tokens(s);
    acc_.seqs += 1;
    acc_.adv.push_back(s.advantage);
    acc_.rew.push_back(s.reward);
    acc_.len += static_cast<double>(s.completion.size());
    acc_.trunc += s.truncated ? 1.0 : 0.0;
  }
  acc_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return {};
}

Result<StepMetrics> Trainer::finish_accumulated() {
  const auto t_start = std::chrono::steady_clock::now();
  if (!acc_.active) return invalid_input("learner: finish of a streamed step that has no parts");
  Accumulated a = std::move(acc_);
  acc_ = Accumulated{};
  if (a.adv.empty()) return invalid_input("learner: empty batch (every part of the streamed step was empty)");
  // the normaliser the unit-norm parts left out: 1 / tokens (token-mean) or 1 / sequences (seq-mean-*)
  const double scale =
      cfg_.loss.agg_mode == LossAggMode::token_mean ? 1.0 / std::max(a.tokens, 1.0) : 1.0 / a.seqs;
  model_.scale_grads(scale);  // on the model's backend: a device model's gradients stay there
  a.sums.loss *= scale;
  a.sums.pg_loss *= scale;
  a.sums.kl_loss *= scale;
  distill_.loss *= scale;
  distill_.topk_loss *= scale;
  StepMetrics out;
  double norm_sum = 0;
  TROUPE_TRY(optimizer_step(out, norm_sum, true));
  if (zero3_) TROUPE_TRY(zero3_end());
  a.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  TROUPE_TRY(finish_metrics(out, a.sums, a.mismatch, norm_sum, a.adv, a.rew, a.len, a.trunc, a.seconds));
  return out;
}

nlohmann::json Trainer::state_json() const {
  std::ostringstream rng;
  rng << rng_;
  return {{"optimizer_steps", opt_.steps()}, {"rng_mt19937_64", rng.str()}};
}

Status Trainer::load_state_json(const nlohmann::json& j) {
  if (!j.contains("optimizer_steps") || !j["optimizer_steps"].is_number_integer() || !j.contains("rng_mt19937_64") ||
      !j["rng_mt19937_64"].is_string())
    return invalid_input("learner: trainer state needs integer optimizer_steps and string rng_mt19937_64");
  std::istringstream rng(j["rng_mt19937_64"].get<std::string>());
  std::mt19937_64 r;
  rng >> r;
  if (rng.fail()) return invalid_input("learner: trainer state: rng_mt19937_64 is not an mt19937_64 state");
  rng_ = r;
  opt_.set_steps(j["optimizer_steps"].get<int64_t>());
  return {};
}

}  // namespace troupe::learner
