// What the learner needs from a policy model: flat params/grads (same layout), the tensor table,
// and a per-token training forward/backward on a packed batch. policy::Model satisfies it through
// an adapter; BigramModel is a tiny exact model for tests and benchmarks of the learner alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/kernels/backend.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

class PolicyModel {
 public:
  virtual ~PolicyModel() = default;
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;  // mirrors params()
  virtual const std::vector<policy::TensorSpec>& tensors() const = 0;
  virtual void zero_grads() = 0;
  // logp[t] = log softmax(logits_t / temperature)[targets[t]], entropy[t] of that distribution
  // (entropy may be nullptr). Keeps what backward_train needs for this batch.
  virtual Status forward_train(const policy::PackedBatch& batch, float temperature, float* logp, float* entropy) = 0;
  // Accumulates (+=) d loss/d params into grads() for the last forward_train batch (dentropy may be nullptr).
  virtual Status backward_train(const float* dlogp, const float* dentropy) = 0;
  // forward_train, grad(t0, t1) over the rows (it assigns dlogp/dentropy[t0..t1) from logp/
  // entropy[t0..t1)), backward_train, for a loss whose derivative at each position depends on that
  // position alone (policy::Model::forward_backward_train, which may call grad once per tile of rows
  // and run its head once). dentropy null = no entropy term. This default is the three calls.
  virtual Status forward_backward_train(const policy::PackedBatch& batch, float temperature, float* logp,
                                        float* entropy, float* dlogp, float* dentropy,
                                        const kernels::RowLossGrad& grad) {
    TROUPE_TRY(forward_train(batch, temperature, logp, entropy));
    if (!batch.tokens.empty()) grad(0, static_cast<int>(batch.tokens.size()));
    return backward_train(dlogp, dentropy);
  }
  // The backend the model computes on; the trainer runs the fused loss there too when the host can
  // read its memory (else on the CPU backend: the loss's arrays are host arrays).
  virtual const kernels::Backend& backend() const { return kernels::cpu_backend(); }
  // Sums grads() over the ranks of a device collective (learner ranks on GPUs: NCCL) where the
  // model's gradients live on the device; the trainer calls it instead of the host all-reduce.
  virtual Status all_reduce_grads(kernels::DeviceCollective&) {
    return invalid_input("this model keeps no gradients on a device: all-reduce grads() on the host");
  }
  // The trainable arena in the model's device memory (policy::Model::device_train_arena), where an
  // optimizer may step without the gradients coming down; empty: the optimizer steps params() on
  // the host. device_params_written: a device step wrote the parameters (the mirror is stale).
  virtual policy::Model::DeviceArena device_train_arena() { return {}; }
  virtual void device_params_written() {}
  // After such a step: start bringing the host mirror down on the device's copy queue
  // (policy::Model::refresh_host_mirror), and read [0, end) of it without marking it written
  // (host_params_until waits for the pieces that hold it). The defaults: the host params().
  virtual void refresh_host_mirror() {}
  virtual const float* host_params_until(size_t end) {
    (void)end;
    return params().data();
  }
  // grads() *= s, each float(double(g) * s) (a streamed step's normaliser). policy::Model runs it
  // on its backend (no gradient comes down from a device); this default is the host loop.
  virtual void scale_grads(double s) {
    for (float& g : grads()) g = static_cast<float>(g * s);
  }
  // MoE routing of the last forward_train: (T x routing_width()) top-k expert ids, routing_k() per
  // MoE layer, ascending within a layer (policy::Model::last_routing). Dense models: width 0.
  virtual int routing_width() const { return 0; }
  virtual int routing_k() const { return 0; }
  virtual std::span<const int32_t> last_routing() const { return {}; }
  // Bytes of parameters the model holds besides params() that train (a LoRA model's frozen base).
  virtual size_t frozen_param_bytes() const { return 0; }
  // LoRA dropout (policy::Model::set_lora_dropout): whether the model has it, and arming it with a
  // mask seed for the next training calls (on = false: none).
  virtual bool has_lora_dropout() const { return false; }
  virtual void set_lora_dropout(bool /*on*/, uint64_t /*seed*/) {}
  // learner.shard parameters: installs the per-layer weight hook (policy::ParamHook; null removes
  // it). False where the model has no layers to gather one at a time (then the trainer gathers the
  // whole buffer once per step).
  virtual bool set_param_hook(policy::ParamHook* /*hook*/) { return false; }
  virtual policy::ParamHook* param_hook() const { return nullptr; }
  // learner.shard parameters on a device (device_shards.h): the trainable arena made sparse, and
  // [begin, end) of its weights or gradients mapped or unmapped (policy::Model::
  // make_train_arena_sparse, map_train_arena). The defaults refuse: the arena is host memory.
  virtual Status make_train_arena_sparse() {
    return invalid_input("sparse weights: this model keeps its weights in host memory");
  }
  virtual Status map_train_arena(bool /*grads*/, size_t /*begin*/, size_t /*end*/, bool /*map*/) {
    return make_error(ErrorCode::internal, "map_train_arena: this model has no sparse arena");
  }
  // Expert parallelism (policy::Model::set_expert_exchange, expert_parallel_idle_pass): the
  // exchange the training passes that follow split the MoE experts over (null: none), and a pass
  // that only serves the peers' rows. Models without MoE layers refuse an exchange.
  virtual Status set_expert_exchange(kernels::MoeExchange* exchange) {
    return exchange ? invalid_input("policy.moe.expert_parallel: this model has no MoE layers") : Status{};
  }
  virtual Status expert_parallel_idle_pass(bool /*with_backward*/) {
    return invalid_input("policy.moe.expert_parallel: this model has no MoE layers");
  }
  // A model holding one expert-parallel rank's block of experts (policy::Model::slice_experts): its
  // layout against the whole model's arena; null for a model that holds every weight.
  virtual const policy::ExpertShardLayout* expert_shards() const { return nullptr; }
};

// The real policy model behind the interface (it keeps the reference; the Model must outlive it).
class ModelAdapter final : public PolicyModel {
 public:
  explicit ModelAdapter(policy::Model& model) : model_(model) {}
  std::span<float> params() override { return model_.params(); }
  std::span<float> grads() override { return model_.grads(); }
  const std::vector<policy::TensorSpec>& tensors() const override { return model_.tensors(); }
  void zero_grads() override { model_.zero_grads(); }
  Status forward_train(const policy::PackedBatch& batch, float temperature, float* logp, float* entropy) override {
    return model_.forward_train(batch, temperature, logp, entropy);
  }
  Status backward_train(const float* dlogp, const float* dentropy) override {
    return model_.backward_train(dlogp, dentropy);
  }
  Status forward_backward_train(const policy::PackedBatch& batch, float temperature, float* logp, float* entropy,
                                float* dlogp, float* dentropy, const kernels::RowLossGrad& grad) override {
    return model_.forward_backward_train(batch, temperature, logp, entropy, dlogp, dentropy, grad);
  }
  const kernels::Backend& backend() const override { return model_.backend(); }
  Status all_reduce_grads(kernels::DeviceCollective& c) override { return model_.all_reduce_grads(c); }
  policy::Model::DeviceArena device_train_arena() override { return model_.device_train_arena(); }
  void device_params_written() override { model_.device_params_written(); }
  void refresh_host_mirror() override { model_.refresh_host_mirror(); }
  const float* host_params_until(size_t end) override { return model_.host_params_until(end); }
  void scale_grads(double s) override { model_.scale_grads(s); }
  int routing_width() const override { return model_.routing_width(); }
  int routing_k() const override { return model_.routing_width() > 0 ? model_.config().num_experts_per_tok : 0; }
  std::span<const int32_t> last_routing() const override { return model_.last_routing(); }
  size_t frozen_param_bytes() const override {
    return model_.lora_enabled() ? sizeof(float) * model_.base_params().size() : 0;
  }
  bool has_lora_dropout() const override { return model_.lora_enabled() && model_.config().lora.dropout > 0; }
  void set_lora_dropout(bool on, uint64_t seed) override { model_.set_lora_dropout(on, seed); }
  // Full-parameter training only (a LoRA model's trainable arena is its adapters, gathered whole),
  // with the weights where the hook gathers them: host-visible, or a sparse device arena.
  bool set_param_hook(policy::ParamHook* hook) override {
    if (hook && (model_.lora_enabled() || (!model_.backend().host_visible() && !model_.train_arena_sparse())))
      return false;
    model_.set_param_hook(hook);
    hook_ = hook;
    return true;
  }
  policy::ParamHook* param_hook() const override { return hook_; }
  Status make_train_arena_sparse() override { return model_.make_train_arena_sparse(); }
  Status map_train_arena(bool grads, size_t begin, size_t end, bool map) override {
    return model_.map_train_arena(grads, begin, end, map);
  }
  Status set_expert_exchange(kernels::MoeExchange* exchange) override { return model_.set_expert_exchange(exchange); }
  Status expert_parallel_idle_pass(bool with_backward) override {
    return model_.expert_parallel_idle_pass(with_backward);
  }
  const policy::ExpertShardLayout* expert_shards() const override { return model_.expert_shards(); }
  policy::Model& model() { return model_; }

 private:
  policy::Model& model_;
  policy::ParamHook* hook_ = nullptr;  // what set_param_hook put on the model
};

// logits_t = W[token_t] + b: one (V, V) table and a (V) bias, named like an HF checkpoint.
class BigramModel final : public PolicyModel {
 public:
  explicit BigramModel(int vocab_size, uint64_t seed = 0, float init_scale = 0.5f);
  std::span<float> params() override { return params_; }
  std::span<float> grads() override { return grads_; }
  const std::vector<policy::TensorSpec>& tensors() const override { return specs_; }
  void zero_grads() override;
  Status forward_train(const policy::PackedBatch& batch, float temperature, float* logp, float* entropy) override;
  Status backward_train(const float* dlogp, const float* dentropy) override;
  int vocab_size() const { return V_; }

 private:
  int V_;
  std::vector<policy::TensorSpec> specs_;
  std::vector<float> params_, grads_;
  // saved by forward_train
  std::vector<int32_t> tokens_, targets_;
  std::vector<float> probs_;  // (T, V) softmax of the scaled logits
  std::vector<float> logp_all_;  // (T, V)
  std::vector<float> entropy_;   // (T)
  float temperature_ = 1.0f;
};

}  // namespace troupe::learner
