// The optimizer on the device (device_optimizer.h) against the host AdamW: a policy model on
// cpu_fenced (the device path a GPU takes) trains the bits the cpu model trains -- parameters,
// both moments, grad_norm -- over several steps with clipping and weight decay, across a resume
// (the moments loaded through load_optimizer and written through optimizer()), and the gradients
// never come down while learner.optimizer_offload is off.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

policy::ModelConfig tiny(kernels::DeviceKind device) {
  policy::ModelConfig mc;
  mc.vocab_size = 32;
  mc.hidden_size = 16;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 2;
  mc.num_key_value_heads = 1;
  mc.head_dim = 8;
  mc.intermediate_size = 32;
  mc.device = device;
  return mc;
}

std::vector<Sample> batch_for(int step) {
  std::mt19937_64 rng(700 + step);
  std::uniform_int_distribution<int> tok(0, 31), len(1, 6);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(6);
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

LearnerConfig config(double max_grad_norm, bool offload) {
  LearnerConfig c;
  c.optimizer.lr = 3e-3f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.max_grad_norm = max_grad_norm;
  c.optimizer.warmup_steps = 2;
  c.batch.num_mini_batches = 2;
  c.seed = 5;
  c.optimizer_offload = offload;
  return c;
}

// The model behind the trainer, counting how often the gradients are brought to the host.
class Counting final : public PolicyModel {
 public:
  explicit Counting(policy::Model& m) : a_(m) {}
  std::span<float> params() override { return a_.params(); }
  std::span<float> grads() override { ++grads_calls; return a_.grads(); }
  const std::vector<policy::TensorSpec>& tensors() const override { return a_.tensors(); }
  void zero_grads() override { a_.zero_grads(); }
  Status forward_train(const policy::PackedBatch& b, float t, float* logp, float* ent) override {
    return a_.forward_train(b, t, logp, ent);
  }
  Status backward_train(const float* dlogp, const float* dent) override { return a_.backward_train(dlogp, dent); }
  const kernels::Backend& backend() const override { return a_.backend(); }
  policy::Model::DeviceArena device_train_arena() override { return a_.device_train_arena(); }
  void device_params_written() override { a_.device_params_written(); }
  int grads_calls = 0;

 private:
  ModelAdapter a_;
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

struct Training {
  policy::Model model;
  std::unique_ptr<Counting> adapter;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> norms;
};

Training start(kernels::DeviceKind device, const LearnerConfig& cfg, LocalCommunicator& comm) {
  auto m = policy::Model::create(tiny(device), 11);
  EXPECT_TRUE(m.ok()) << m.error().message;
  Training r{std::move(*m), nullptr, nullptr, {}};
  r.adapter = std::make_unique<Counting>(r.model);
  r.trainer = std::make_unique<Trainer>(*r.adapter, cfg, comm);
  return r;
}

void steps(Training& r, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto m = r.trainer->train_step(batch_for(s));
    ASSERT_TRUE(m.ok()) << m.error().message;
    r.norms.push_back(m->grad_norm);
  }
}

void expect_same(const Training& cpu, Training& dev) {
  EXPECT_TRUE(same_bits(cpu.model.params(), dev.model.params())) << "parameters differ";
  const AdamW& a = cpu.trainer->optimizer();
  const AdamW& b = std::as_const(*dev.trainer).optimizer();
  EXPECT_TRUE(same_bits(a.exp_avg(), b.exp_avg())) << "first moments differ";
  EXPECT_TRUE(same_bits(a.exp_avg_sq(), b.exp_avg_sq())) << "second moments differ";
  EXPECT_EQ(a.steps(), b.steps());
  ASSERT_EQ(cpu.norms.size(), dev.norms.size());
  for (size_t i = 0; i < cpu.norms.size(); ++i) EXPECT_EQ(cpu.norms[i], dev.norms[i]) << "grad_norm of step " << i;
}

}  // namespace

TEST(DeviceOptimizer, SameBitsAsHostAdamW) {
  LocalCommunicator comm;
  for (double clip : {0.0, 0.05, 1e3})  // off, clipping every step, never clipping
    for (bool offload : {false, true}) {
      SCOPED_TRACE("max_grad_norm " + std::to_string(clip) + (offload ? ", offload" : ", on the device"));
      Training cpu = start(kernels::DeviceKind::cpu, config(clip, offload), comm);
      Training dev = start(kernels::DeviceKind::cpu_fenced, config(clip, offload), comm);
      steps(cpu, 0, 4);
      steps(dev, 0, 4);
      expect_same(cpu, dev);
      for (double n : dev.norms) {  // (0.05 clips every step, 1e3 none)
        if (clip > 0) {
          EXPECT_EQ(n > clip, clip < 1) << n;
        }
      }
      if (offload)
        EXPECT_GT(dev.adapter->grads_calls, 0);
      else
        EXPECT_EQ(dev.adapter->grads_calls, 0) << "the gradients came down with the optimizer on the device";
    }
}

TEST(DeviceOptimizer, ResumeBitIdentical) {
  LocalCommunicator comm;
  const LearnerConfig cfg = config(0.05, false);
  Training straight = start(kernels::DeviceKind::cpu, cfg, comm);
  steps(straight, 0, 4);
  for (bool through_load : {true, false}) {
    SCOPED_TRACE(through_load ? "load_optimizer" : "writes through optimizer()");
    Training first = start(kernels::DeviceKind::cpu_fenced, cfg, comm);
    steps(first, 0, 2);
    // a checkpoint: the weights, the moments (brought down), the trainer's state
    const std::vector<float> params(first.model.params().begin(), first.model.params().end());
    const AdamW saved = std::as_const(*first.trainer).optimizer();
    const auto state = first.trainer->state_json();
    Training resumed = start(kernels::DeviceKind::cpu_fenced, cfg, comm);
    steps(resumed, 0, 1);  // a step first, so the device holds moments the resume must replace
    ASSERT_TRUE(resumed.model.set_params(params).ok());
    if (through_load) {
      ASSERT_TRUE(resumed.trainer->load_optimizer(saved).ok());
    } else {
      AdamW& o = resumed.trainer->optimizer();
      std::copy(saved.exp_avg().begin(), saved.exp_avg().end(), o.exp_avg().begin());
      std::copy(saved.exp_avg_sq().begin(), saved.exp_avg_sq().end(), o.exp_avg_sq().begin());
    }
    ASSERT_TRUE(resumed.trainer->load_state_json(state).ok());
    resumed.norms = first.norms;
    steps(resumed, 2, 4);
    expect_same(straight, resumed);
  }
}
