// The learner's step driver: one generation batch -> num_iterations passes x num_mini_batches
// optimizer steps; each mini-batch is sharded over the ranks and split into micro-batches (by
// count or token budget), gradients accumulate into the model's flat buffer, ONE all-reduce per
// optimizer step, then clipping and AdamW. Invariant: since every loss is normalised by global
// counts of the mini-batch, the update does not depend on the micro-batch split or the rank count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/learner/advantages.h"
#include "troupe/learner/communicator.h"
#include "troupe/learner/config.h"
#include "troupe/learner/device_optimizer.h"
#include "troupe/learner/distill.h"
#include "troupe/learner/expert_parallel.h"
#include "troupe/learner/loss.h"
#include "troupe/learner/mismatch.h"
#include "troupe/learner/optimizer.h"
#include "troupe/learner/param_shards.h"
#include "troupe/learner/policy_model.h"

namespace troupe::learner {

// One prompt + completion of a generation batch.
struct Sample {
  std::vector<int32_t> prompt;          // >= 1 token
  std::vector<int32_t> completion;      // sampled tokens, EOS included when it stopped
  std::vector<float> completion_mask;   // (completion) 1 = train on it; empty = all ones
  std::vector<float> old_logprobs;      // (completion) recorded at generation; empty = recomputed before the first update
  std::vector<float> ref_logprobs;      // (completion) reference policy; needed when loss.kl_coef != 0
  // (completion) log-probs of the policy that sampled it, when that is not the one the PPO ratio is
  // taken against (stale async samples, rollout.stale_policy: importance_weight): each token's
  // policy-gradient term is weighted by min(exp(old - behavior), importance_weight_cap), old
  // being old_logprobs or, when those are empty, the current log-probs (detached). Empty = none.
  std::vector<float> behavior_logprobs;
  // MoE: (completion x routing width) the sampler's top-k expert ids of every MoE layer for each
  // token (policy::Generation::experts); empty = not recorded.
  std::vector<int32_t> sampler_experts;
  // Compare what the sampler recorded (behavior_logprobs, else old_logprobs, and sampler_experts)
  // with this trainer's forward before the update (StepMetrics::mismatch). Set it when the weights
  // the trainer holds are the ones that sampled this completion.
  bool score_mismatch = false;
  // distill (LearnerConfig::distill): (completion) the teacher's log-prob of each completion token,
  // and with distill.topk k its k most likely token ids and log-probs per completion position
  // ((completion) x k, position-major); empty = no teacher for this sample
  std::vector<float> teacher_logprobs;
  std::vector<int32_t> teacher_topk_ids;
  std::vector<float> teacher_topk_logprobs;
  float advantage = 0;                  // from compute_advantages (unused by SFT)
  float reward = 0;                     // the scalar reward (metrics only; advantages carry the signal)
  bool truncated = false;               // hit max_completion_length without EOS
};

// From scored groups to a training batch (what the coordinator does between generation and
// train_step): adds the DAPO soft overlong punishment to each reward (if configured), drops
// all-equal groups when advantage.dynamic_sampling is set, and fills `advantage` of each sample.
// `samples` holds groups of `group_size` consecutive completions of one prompt, `reward` set.
struct PreparedBatch {
  std::vector<Sample> samples;  // kept groups, advantages filled
  int groups_in = 0;
  int groups_kept = 0;          // the coordinator over-samples until this reaches its target
};
Result<PreparedBatch> prepare_grpo_batch(std::vector<Sample> samples, int group_size, const LearnerConfig& cfg);

struct StepMetrics {
  LossSummary loss;        // summed over all optimizer steps of this call, means per token
  double grad_norm = 0;    // mean over optimizer steps of the norm before clipping
  double lr = 0;           // learning rate of the last optimizer step
  int optimizer_steps = 0;
  double tokens = 0;       // completion tokens trained on (all ranks, all passes)
  double tokens_per_s = 0;
  double wall_s = 0;
  Stats advantages;        // over the batch's samples
  Stats rewards;           // reward_mean / reward_std (population std) of the batch
  double response_len_mean = 0;
  double truncated_frac = 0;
  MismatchSums mismatch;   // of the samples with score_mismatch, all ranks (summarize() for the metrics)
  DistillSums distill;     // distill on: the distillation terms' sums, all ranks, all passes
};

// The packing of samples into one PackedBatch: position t predicts targets[t]; mask, old and ref
// log-probs are laid out per position (completion token j of a sample sits at P - 1 + j).
struct PackedMicroBatch {
  policy::PackedBatch batch;
  std::vector<float> mask, logp_old, logp_ref, logp_behavior, advantages;  // (T) (T) (T) (T) (S)
  bool has_old = false, has_ref = false, has_behavior = false;
  bool has_teacher = false;       // every sample carries teacher_logprobs
  std::vector<float> logp_teacher;  // (T) the teacher's log-prob at each completion target, 0 elsewhere
  // Mismatch scoring (samples with score_mismatch and recorded log-probs): the response tokens to
  // compare (T), the sampler's log-probs (T), and where experts were recorded, route_mask (T) and
  // experts (T x experts_width, -1 elsewhere).
  bool has_mismatch = false;
  std::vector<float> mismatch_mask, logp_sampler, route_mask;
  std::vector<int32_t> experts;
  int experts_width = 0;
};
Result<PackedMicroBatch> pack_samples(const std::vector<const Sample*>& samples, bool mask_truncated);

// Adds the mismatch of a packed batch's scored tokens: the sampler's log-probs and experts against
// logp (T) and `model`'s routing of the forward that produced logp.
void add_packed_mismatch(MismatchSums& out, const PackedMicroBatch& packed, const float* logp, const PolicyModel& model);

// Forward only: the mismatch between what each sample's sampler recorded (behavior_logprobs, else
// old_logprobs; sampler_experts) and `model` (every given sample, whatever its score_mismatch).
Result<MismatchSums> score_mismatch(PolicyModel& model, const std::vector<const Sample*>& samples, float temperature,
                                    int max_tokens_per_batch = 4096);

// How many forwards score_mismatch runs for these samples.
size_t score_mismatch_passes(const std::vector<const Sample*>& samples, int max_tokens_per_batch = 4096);

// Split of `n` samples (lengths in tokens) into micro-batches: consecutive runs of at most
// micro_batch_size samples (0 = one run), or, with max_tokens > 0, greedy runs whose total length
// fits the budget (a longer sample goes alone). Returns the run boundaries (size = runs + 1).
std::vector<int> split_micro_batches(const std::vector<int>& lengths, int micro_batch_size, int max_tokens);

// Per-token log-probs of each completion under `model` (forward only), with the temperature.
Result<std::vector<std::vector<float>>> compute_completion_logprobs(PolicyModel& model, const std::vector<Sample>& samples,
                                                                    float temperature, int max_tokens_per_batch = 4096);

// learner.shard parameters: where the weights are between steps (Trainer::set_params_between_steps).
enum class ParamsAtRest { whole, rank0, shard };

class Trainer {
 public:
  // device: a collective of the learner ranks on the model's device (join_device_collective), or
  // null: the gradient all-reduce runs over comm on the host copy of the gradients.
  Trainer(PolicyModel& model, const LearnerConfig& cfg, Communicator& comm,
          kernels::DeviceCollective* device = nullptr);
  ~Trainer();  // takes its per-layer hook (learner.shard parameters) off the model
  Trainer(Trainer&&) noexcept = default;

  // One generation batch, the same (global order) on every rank: rank r trains on its shard of each
  // mini-batch. GRPO or SFT per cfg.phase. Errors name the sample and field at fault.
  Result<StepMetrics> train_step(const std::vector<Sample>& batch);

  // The same GRPO step for a batch that arrives in parts (async rollouts, streamed): accumulate()
  // takes the parts in order, each the same (global order) on every rank, and runs this rank's
  // shard of it at once, with unit normalisers; finish_accumulated() scales the summed gradient by
  // the whole batch's global normaliser (known only now), then all-reduce, clipping and AdamW as in
  // train_step. The update equals train_step's on the concatenated batch up to rounding (the
  // normaliser is applied after the sum instead of per token). Needs num_iterations = 1 and
  // num_mini_batches = 1 (one on-policy update per batch); GRPO only. An empty part is allowed.
  // With expert parallelism each call is a collective of the learners (the part's pass count is
  // agreed by an all-reduce): every learner passes every part, empty ones included.
  Status accumulate(const std::vector<Sample>& part);
  Result<StepMetrics> finish_accumulated();
  bool accumulating() const { return acc_.active; }

  // Hands the blocks of each train step's last optimizer step to `watch` (AdamW::step) from now
  // on (what it prepares describes the weights the step ends with); null: none.
  void set_step_observer(StepObserver* watch) { watch_ = watch; }
  // This rank's AdamW: over the whole flat buffer, or with learner.shard over this rank's shard.
  // The AdamW state. With the optimizer on the device (device_optimizer.h) a host mirror: the
  // moments are brought down first, and what the caller writes through the mutable one goes up
  // before the next step.
  AdamW& optimizer();
  const AdamW& optimizer() const;
  // Sharded (learner.shard other than none, more than one rank): this rank's shard of the flat
  // buffer is [shard_begin(), shard_end()); unsharded: the whole buffer.
  bool sharded() const { return sharded_; }
  // learner.shard parameters: what params() holds between steps, the same setting on every rank:
  // the whole weights on every rank (ParamsAtRest::whole, the default), on rank 0 only (rank0: it
  // syncs the weights and writes checkpoints; the others keep their shard), or only each rank's
  // shard (shard). Dropped values read as zero; gather_params() (a collective) brings them back.
  void set_params_between_steps(ParamsAtRest mode) { params_at_rest_ = mode; }
  // learner.shard parameters: whether the next layer's gather and the last layer's gradient
  // reduce-scatter run while the current layer computes (ParamShards::set_prefetch; default on). The
  // same setting on every rank; the same bits either way.
  void set_shard_prefetch(bool on) {
    if (zero3_) zero3_->set_prefetch(on);
  }
  Status gather_params();
  // learner.shard parameters with ParamsAtRest::shard (a collective, every rank calls it): the whole
  // weights on rank 0 (the weight sync's probe) until release_params() drops them again to the
  // rank's shard. Nothing to do (returns at once on every rank) in any other layout.
  Status gather_params_to_rank0();
  Status release_params();
  // learner.shard parameters with ParamsAtRest::shard (a collective, every rank calls it with the
  // same fn): runs fn, whose training forwards (no backward) gather each group of weights from the
  // shards as a step does and drop it after, so no rank holds the whole weights; `transform` (may be
  // null) is applied to each group's values once gathered, this rank's own part of them put back
  // bit for bit after (kept meanwhile in host memory; on a device model's sparse arena each range is
  // rounded on the host and goes up again). The weight sync's probe with the generators' rounding.
  // An error where the trainer keeps more than its shard or has no layered hook.
  Status forward_from_shards(const std::function<Status()>& fn, const std::function<void(std::span<float>)>& transform);
  // Whether forward_from_shards can run (ZeRO-3 keeping its shard, with the per-group hook).
  bool forwards_from_shards() const { return keeps_shard_only() && zero3_->layered(); }
  size_t shard_begin() const { return sharded_ ? bounds_[static_cast<size_t>(comm_.rank())] : 0; }
  size_t shard_end() const { return sharded_ ? bounds_[static_cast<size_t>(comm_.rank()) + 1] : bounds_.back(); }
  // The whole AdamW state (every rank's moments gathered; a collective when sharded or when the
  // experts are divided: every rank calls it), for a checkpoint of the unsharded layout. Divided
  // experts: whole on learner 0, empty (size 0) on the others.
  Result<AdamW> gathered_optimizer();
  // Takes the whole AdamW state `full` (a checkpoint's, of any rank count or stage): this rank's
  // shard of it when sharded, its blocks when the experts are divided, all of it otherwise. No
  // collective.
  Status load_optimizer(AdamW full);
  // Sharded: takes this rank's share of the AdamW state alone (load_checkpoint_share of
  // [shard_begin(), shard_end())), so the whole moments are never held; with the experts divided,
  // the moments of this rank's own arena (load_checkpoint_ranges of held_ranges). No collective.
  Status load_optimizer_share(AdamW share);
  // Expert parallelism whose model holds one block of experts (PolicyModel::expert_shards;
  // divided_experts.cpp). join_expert_parallel: the groups (a collective of the learners; the first
  // train_step joins them otherwise). gathered_optimizer() and load_optimizer() work on the whole
  // model's moments in that layout (load_optimizer_share on this rank's own).
  // forward_with_expert_group: `fn` (forwards of this model, such as the weight sync's probe) with
  // the group's exchange installed (a collective: every learner calls it, joining the groups first;
  // the ranks of a group run the same forwards).
  Status join_expert_parallel();
  Status forward_with_expert_group(const std::function<Status()>& fn);
  // compute_completion_logprobs of `batch` on another model (loss.kl_coef's reference model) at
  // the batch temperature. A model holding one block of experts (the same block as the trainer's)
  // runs with the expert-parallel group: every rank of it calls this with the whole batch (the same
  // forwards, as the recomputed old log-probs run; joins the groups on a first call).
  Result<std::vector<std::vector<float>>> reference_logprobs(PolicyModel& ref, const std::vector<Sample>& batch);
  // learner.shard parameters with ParamsAtRest::shard: between steps each rank holds its shard alone.
  bool keeps_shard_only() const { return zero3_ && params_at_rest_ == ParamsAtRest::shard; }
  // Bytes of training state this rank holds: parameters (the trainable arena, and the frozen base
  // of a LoRA model), gradients and the AdamW moments (metric learner/state_bytes).
  size_t state_bytes() const;
  PolicyModel& model() { return model_; }
  const LearnerConfig& config() const { return cfg_; }
  // The trainer's own state for checkpoints: optimizer step count and RNG.
  nlohmann::json state_json() const;
  Status load_state_json(const nlohmann::json& j);

 private:
  Status check_sample(const Sample& s, size_t index) const;
  // score: add the scored samples' mismatch (MismatchSums) from this forward (pre-update weights).
  Result<LossMetrics> run_micro_batch(const std::vector<const Sample*>& samples, const LossNorm& norm, bool score,
                                      MismatchSums& mismatch);
  Result<LossMetrics> micro_batch_step(const std::vector<const Sample*>& samples, const LossNorm& norm, bool score,
                                       MismatchSums& mismatch);
  Status check_batch(const std::vector<Sample>& batch) const;
  // distill.topk > 0: the forward-KL term over the teacher's top-k tokens (distill.h), as a second
  // forward/backward of k copies of each sample whose completion targets are the teacher's j-th
  // tokens; its gradient adds to the micro-batch's.
  Status run_topk_pass(const std::vector<const Sample*>& samples, const LossNorm& norm);
  // Per position of a packed micro-batch: the loss's aggregation weight times the mask.
  Result<std::vector<double>> aggregation_weights(const PackedMicroBatch& packed, const LossNorm& norm) const;
  double sample_tokens(const Sample& s) const;
  // All-reduce the accumulated gradient, clip, AdamW: one optimizer step.
  // last: the train step's last optimizer step, the one the step observer watches.
  Status optimizer_step(StepMetrics& out, double& norm_sum, bool last);
  // The same step with sharded state (sharded_step.cpp): reduce-scatter (or, ZeRO-1, the ordered
  // all-reduce), the global norm chained through the ranks, AdamW on this rank's shard, all-gather.
  Status sharded_optimizer_step(StepMetrics& out, double& norm_sum, bool last);
  // learner.shard parameters (sharded_step.cpp): the step's start (the whole weights for forwards
  // outside the loss micro-batches where there is no hook: `whole`), one mini-batch's micro-batches with the per-layer
  // gathers (a rank with fewer micro-batches than another runs the hook's phantom passes), the end.
  Status zero3_begin(bool whole);
  Status zero3_micro_batches(const std::vector<std::vector<const Sample*>>& mbs, const LossNorm& norm, bool score,
                             MismatchSums& mismatch, LossMetrics& sums);
  Status zero3_end();
  // The most micro-batches any rank runs for this mini-batch (an all-reduce): ZeRO-3's gathers and
  // expert parallelism's all-to-alls are collectives, so every rank runs that many passes.
  Result<size_t> most_micro_batches(size_t mine);
  // One mini-batch's (or streamed part's) micro-batches on the whole weights; with expert
  // parallelism (ep_) the MoE experts split over the group, a rank with fewer micro-batches serving
  // its peers' in idle passes (two per micro-batch with distillation's top-k pass).
  Status plain_micro_batches(const std::vector<std::vector<const Sample*>>& mbs, const LossNorm& norm, bool score,
                             MismatchSums& mismatch, LossMetrics& sums);
  // Divided experts (divided_experts.cpp): the step (each piece summed over the ranks that hold
  // it, the whole model's norm chained through the group, clipping, AdamW on this rank's arena),
  // and the forwards outside the loss micro-batches, which run with the group (old log-probs: the
  // same forwards on every rank; the mismatch: idle forwards up to the most any rank runs).
  Status divided_optimizer_step(StepMetrics& out, double& norm_sum);
  Result<std::vector<std::vector<float>>> old_logprobs(const std::vector<Sample>& batch);
  // compute_completion_logprobs on `model`, with the group when it holds one block of experts.
  Result<std::vector<std::vector<float>>> group_logprobs(PolicyModel& model, const std::vector<Sample>& batch);
  Result<MismatchSums> mismatch_before_update(const std::vector<const Sample*>& mine);
  Result<AdamW> gathered_divided_optimizer();
  Status load_divided_optimizer(const AdamW& whole);
  // The step on the model's device (device_optimizer.cpp): where the model keeps a device arena,
  // learner.optimizer_offload is off and the state is not sharded.
  bool device_optimizer_on();
  Status device_optimizer_missing() const;  // the error of a device optimizer that could not be made
  Status device_optimizer_step(StepMetrics& out, double& norm_sum, bool last);
  Status sharded_device_step(StepMetrics& out, double& norm_sum, bool last);  // learner.shard on a device model
  void device_zero3();     // learner.shard parameters on a device model (device_shards.h), where it can
  void params_gathered();  // ZeRO-3's gathers wrote the weights: the model's mirror (or arena) follows
  Status zero3_forwards(size_t passes, const std::function<Status()>& fn);  // pre-update forwards, per layer
  void show_device_step();  // learner 0's step observer after a device step (the mirror comes down)
  // Metric all-reduce and the per-batch statistics of a finished call.
  Status finish_metrics(StepMetrics& out, const LossMetrics& sums, const MismatchSums& mismatch, double norm_sum,
                        const std::vector<float>& adv, const std::vector<float>& rew, double len,
                        double trunc, double seconds);

  PolicyModel& model_;
  LearnerConfig cfg_;
  Communicator& comm_;
  kernels::DeviceCollective* device_;
  bool sharded_ = false;
  std::vector<size_t> bounds_;  // shard_bounds(params, ranks): the shards (and the ordered all-reduce's)
  std::unique_ptr<ParamShards> zero3_;  // learner.shard parameters with more than one rank
  bool zero3_on_device_ = false;         // ... a DeviceParamShards (a device model's sparse arena)
  std::unique_ptr<ExpertParallel> ep_;  // policy.moe.expert_parallel > 1 (joined by the first step)
  ParamsAtRest params_at_rest_ = ParamsAtRest::whole;
  mutable AdamW opt_;  // (mutable: the const optimizer() refreshes the device optimizer's mirror)
  std::unique_ptr<DeviceOptimizer> dev_opt_;
  // Without a device collective, sharded learners on a device stage theirs through host copies over comm_.
  std::unique_ptr<kernels::DeviceCollective> staged_;
  bool dev_opt_checked_ = false;
  std::string dev_opt_error_;
  StepObserver* watch_ = nullptr;
  std::mt19937_64 rng_;
  uint64_t dropout_micro_ = 0;  // micro-batches of the current optimizer step (LoRA dropout's mask seed)
  std::vector<float> logp_, entropy_, dlogp_, dentropy_, is_weight_;  // (T) scratch of one micro-batch
  DistillSums distill_;  // this call's distillation sums so far (this rank)
  struct Accumulated {                                    // a streamed step in progress
    bool active = false, has_old = false;
    LossMetrics sums;
    MismatchSums mismatch;
    double tokens = 0, seqs = 0, len = 0, trunc = 0, seconds = 0;
    std::vector<float> adv, rew;
  } acc_;
};

}  // namespace troupe::learner
