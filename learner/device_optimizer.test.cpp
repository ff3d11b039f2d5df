// The optimizer on the device (device_optimizer.h) against the host AdamW: a policy model on
// cpu_fenced (the device path a GPU takes) trains the bits the cpu model trains -- parameters,
// both moments, grad_norm -- over several steps with clipping and weight decay, across a resume
// (the moments loaded through load_optimizer and written through optimizer()), and the gradients
// never come down while learner.optimizer_offload is off -- streamed steps included (their
// normaliser is applied on the device). The weight sync's observer reads the host mirror as it
// comes down the backend's copy queue, in pieces, without marking it written.
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
  std::span<float> params() override { ++params_calls; return a_.params(); }
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
  void refresh_host_mirror() override { a_.refresh_host_mirror(); }
  const float* host_params_until(size_t end) override { return a_.host_params_until(end); }
  void scale_grads(double s) override { a_.scale_grads(s); }
  int grads_calls = 0;
  int params_calls = 0;  // the mutable params(): the caller may write, so the mirror goes up again

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
  ASSERT_FALSE(cpu.norms.empty());
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

// A streamed step (accumulate + finish_accumulated, rollout.async_chunks) scales the summed
// gradient by the batch's normaliser on the device: the bits of the cpu model, no gradient down.
TEST(DeviceOptimizer, StreamedStepsScaleOnTheDevice) {
  LocalCommunicator comm;
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload" : "on the device");
    LearnerConfig cfg = config(0.05, offload);
    cfg.batch.num_mini_batches = 1;  // (streamed steps are one optimizer step)
    Training cpu = start(kernels::DeviceKind::cpu, cfg, comm);
    Training dev = start(kernels::DeviceKind::cpu_fenced, cfg, comm);
    for (Training* t : {&cpu, &dev})
      for (int s = 0; s < 3; ++s) {
        const std::vector<Sample> b = batch_for(s);
        ASSERT_TRUE(t->trainer->accumulate({b.begin(), b.begin() + 2}).ok());
        ASSERT_TRUE(t->trainer->accumulate({b.begin() + 2, b.end()}).ok());
        auto m = t->trainer->finish_accumulated();
        ASSERT_TRUE(m.ok()) << m.error().message;
        t->norms.push_back(m->grad_norm);
      }
    expect_same(cpu, dev);
    if (!offload) {
      EXPECT_EQ(dev.adapter->grads_calls, 0) << "a streamed step brought the gradients down";
    }
  }
}

namespace {
// Learner 0's weight-sync observer: keeps every value it is shown.
class Recording final : public StepObserver {
 public:
  std::span<const std::pair<size_t, size_t>> begin_step(size_t n) override {
    seen.assign(n, -1.0f);
    whole = {{0, n}};
    return whole;
  }
  void updated(size_t, size_t b, size_t e, const float* params) override {
    std::copy(params + b, params + e, seen.begin() + static_cast<std::ptrdiff_t>(b));
  }
  void end_step() override { ++steps; }
  std::vector<float> seen;
  std::vector<std::pair<size_t, size_t>> whole;
  int steps = 0;
};
}  // namespace

// The observer sees the new weights through the host mirror the copy queue brings down, bit for
// bit what the cpu model's observer sees, and reading them does not mark the mirror written (the
// next forward does not upload the weights again).
TEST(DeviceOptimizer, ObserverReadsTheMirrorFromTheCopyQueue) {
  LocalCommunicator comm;
  const LearnerConfig cfg = config(0.05, false);
  Training cpu = start(kernels::DeviceKind::cpu, cfg, comm);
  Training dev = start(kernels::DeviceKind::cpu_fenced, cfg, comm);
  Recording on_cpu, on_dev;
  cpu.trainer->set_step_observer(&on_cpu);
  dev.trainer->set_step_observer(&on_dev);
  const int calls_before = dev.adapter->params_calls;
  for (int s = 0; s < 3; ++s) {
    steps(cpu, s, s + 1);
    steps(dev, s, s + 1);
    EXPECT_TRUE(same_bits(on_cpu.seen, on_dev.seen)) << "step " << s;
    EXPECT_TRUE(same_bits(on_dev.seen, std::as_const(dev.model).params())) << "step " << s;
  }
  EXPECT_GT(on_cpu.steps, 0);
  EXPECT_EQ(on_dev.steps, on_cpu.steps);
  EXPECT_EQ(dev.adapter->params_calls, calls_before) << "the observer marked the host mirror written";
  expect_same(cpu, dev);
}

// The mirror comes down in pieces: the host may read a piece once host_params_until has waited
// for it, while the next is still on the copy queue (reading that one faults on cpu_fenced); the
// next step's writes to the weights are ordered after the copies (else cpu_fenced aborts).
TEST(DeviceOptimizerDeathTest, MirrorPiecesAreReadOnlyOnceLanded) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const size_t piece = 1024;  // floats: one 4 KiB page
  auto made = policy::Model::create(tiny(kernels::DeviceKind::cpu_fenced), 11);
  ASSERT_TRUE(made.ok());
  policy::Model& m = *made;
  const size_t n = m.params().size();
  ASSERT_GT(n, 3 * piece);
  const std::vector<float> want(std::as_const(m).params().begin(), std::as_const(m).params().end());
  float* weights = m.device_train_arena().params;  // (taken before the copies: nothing ordered)
  m.device_params_written();  // (as after a device step: the mirror is stale)
  m.refresh_host_mirror(piece);
  const float* p = m.host_params_until(piece);
  for (size_t i = 0; i < piece; ++i) ASSERT_EQ(p[i], want[i]);
  EXPECT_DEATH(
      {
        volatile float x = p[piece];  // the second piece is still on the copy queue
        (void)x;
      },
      "");
  EXPECT_DEATH(  // a write of the weights that nothing ordered after the copies
      m.backend().fill(weights + piece, 1, 0.0f), "writes the source of a copy to the host still in flight");
  EXPECT_EQ(m.device_train_arena().params, weights);  // (a step's start: its writes wait for the copies)
  m.backend().fill(weights + piece, 1, 0.0f);  // now fine; the copies hold the values before it
  p = m.host_params_until(n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], want[i]);
  EXPECT_TRUE(same_bits(std::as_const(m).params(), want));
}
