// The model's device path -- what it runs on a backend whose memory the host cannot touch -- on the
// device TROUPE_TEST_DEVICE names, against the cpu backend:
//   policy.device_path (cpu_fenced, the default): the fenced CPU backend (device addresses fault
//     on the host, a host array handed to an op aborts naming it); every result bit for bit.
//   gpu.model_on_cuda (cuda): the same cases on a GPU within atol + rtol |cpu| (the CUDA kernels
//     sum in other orders); exits 77 (skipped) where there is no usable GPU.
// Every family, the switches that change the call list, the training step, forward_logits,
// generate and continuous batching, activation offload through the backend's own copies, and the
// host mirror of the weights and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "test_models.h"
#include "troupe/kernels/backend.h"
#include "troupe/policy/decode_slots.h"
#include "troupe/policy/model.h"

using namespace troupe::policy;

#ifndef TROUPE_TEST_DEVICE
#define TROUPE_TEST_DEVICE "cpu_fenced"
#endif

namespace {

const std::string kDevice = TROUPE_TEST_DEVICE;
const bool kExact = kDevice == "cpu_fenced";  // the fenced backend runs the CPU ops themselves

// The device's model of a config: test::make (seed 11) on kDevice or the given device. On a GPU the
// comparisons with cpu are of fp32 GEMMs (no TF32): compute_dtype auto would be bf16 there.
Model make(ModelConfig c, const std::string& device = kDevice) {
  c.device = *troupe::enum_from_name<troupe::kernels::DeviceKind>(device);
  if (!kExact && c.compute_dtype == troupe::kernels::ComputeDtype::auto_) {
    c.compute_dtype = troupe::kernels::ComputeDtype::fp32;
    c.allow_tf32 = false;
  }
  return test::make(c, 11);
}

PackedBatch batch() { return test::batch_of({{1, 5, 9, 2, 7, 7, 3}, {4, 8}, {11, 12, 13, 14, 15, 16, 17, 18, 19}}); }

// Whether a and b agree: bit for bit on cpu_fenced; on a GPU within 1e-4 + 1e-3 |a| (NaN where the
// other is NaN).
bool matches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  if (kExact) return a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return false;
      continue;
    }
    if (std::fabs(a[i] - b[i]) > 1e-4 + 1e-3 * std::fabs(a[i])) {
      std::fprintf(stderr, "  element %zu: %.9g vs %.9g\n", i, a[i], b[i]);
      return false;
    }
  }
  return true;
}
bool matches(const std::vector<int32_t>& a, const std::vector<int32_t>& b) { return a == b; }
bool matches_value(float a, float b) { return matches(std::vector<float>{a}, std::vector<float>{b}); }

template <class S>
std::vector<float> vec(S s) {
  return std::vector<float>(s.begin(), s.end());
}

// What one model computes: a training step (forward, a loss of both outputs, backward twice so
// gradients accumulate), the routing record, forward_logits and generate.
struct Run {
  std::vector<float> logp, entropy, grads, logits;
  std::vector<int32_t> routing;
  std::vector<Generation> gens;
  float aux = 0;
};

Run run(Model& m) {
  Run r;
  const PackedBatch b = batch();
  const size_t T = b.tokens.size();
  r.logp.resize(T);
  r.entropy.resize(T);
  std::vector<float> dlogp(T), dent(T);
  for (size_t t = 0; t < T; ++t) dlogp[t] = 0.1f * static_cast<float>(t % 5) - 0.2f, dent[t] = 0.01f * t;
  m.zero_grads();
  for (int rep = 0; rep < 2; ++rep) {
    EXPECT_TRUE(m.forward_train(b, 0.9f, r.logp.data(), r.entropy.data()).ok());
    EXPECT_TRUE(m.backward_train(dlogp.data(), dent.data()).ok());
  }
  r.aux = m.last_aux_loss();
  r.grads = vec(std::as_const(m).grads());
  r.routing.assign(m.last_routing().begin(), m.last_routing().end());
  r.logits.resize(T * static_cast<size_t>(m.config().vocab_size));
  EXPECT_TRUE(m.forward_logits(b, r.logits.data()).ok());
  SamplingParams sp;
  sp.max_new_tokens = 6;
  sp.temperature = 0.8f;
  sp.top_k = 7;
  sp.seed = 3;
  auto g = m.generate({{1, 2, 3}, {9}, {4, 4, 4, 4, 4}}, sp);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  if (g.ok()) r.gens = std::move(*g);
  return r;
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  EXPECT_TRUE(matches(a.logp, b.logp)) << what << ": logp";
  EXPECT_TRUE(matches(a.entropy, b.entropy)) << what << ": entropy";
  EXPECT_TRUE(matches(a.grads, b.grads)) << what << ": grads";
  EXPECT_TRUE(matches(a.logits, b.logits)) << what << ": forward_logits";
  EXPECT_TRUE(matches(a.routing, b.routing)) << what << ": routing record";
  EXPECT_TRUE(matches_value(a.aux, b.aux)) << what << ": aux loss";
  ASSERT_EQ(a.gens.size(), b.gens.size()) << what;
  for (size_t i = 0; i < a.gens.size(); ++i) {
    EXPECT_EQ(a.gens[i].tokens, b.gens[i].tokens) << what << ": generation " << i;
    EXPECT_TRUE(matches(a.gens[i].logprobs, b.gens[i].logprobs)) << what << ": generation " << i << " logprobs";
    EXPECT_EQ(a.gens[i].experts, b.gens[i].experts) << what << ": generation " << i << " experts";
  }
}

TEST(DevicePath, BackendIsNotHostVisible) {
  auto be = troupe::kernels::backend_for(kDevice);
  ASSERT_TRUE(be.ok());
  EXPECT_FALSE((*be)->host_visible());
  EXPECT_EQ((*be)->name(), kDevice);
}

TEST(DevicePath, EveryFamilyEqualsCpuBitForBit) {
  for (const char* family : test::kAllFamilies) {
    Model cpu = make(test::tiny_family(family), "cpu");
    Model dev = make(test::tiny_family(family));
    EXPECT_TRUE(matches(vec(std::as_const(cpu).params()), vec(std::as_const(dev).params()))) << family;
    expect_same(run(cpu), run(dev), family);
  }
}

TEST(DevicePath, SwitchesEqualCpuBitForBit) {
  struct Case {
    const char* name;
    void (*set)(ModelConfig&);
  };
  const Case cases[] = {
      {"chunked head", [](ModelConfig& c) { c.logprob_chunk = 16; }},
      {"checkpointing", [](ModelConfig& c) { c.activation_checkpointing = true; }},
      {"metadata per layer", [](ModelConfig& c) { c.cache_packed_metadata = false; }},
      {"masked MoE", [](ModelConfig& c) { c.moe_grouped = false; }},
      {"batch invariant", [](ModelConfig& c) { c.batch_invariant = true, c.logprob_chunk = 16; }},
      {"offload, double buffer",
       [](ModelConfig& c) { c.activation_checkpointing = c.offload_activations = c.offload_double_buffer = true; }},
      {"offload, one buffer",
       [](ModelConfig& c) {
         c.activation_checkpointing = c.offload_activations = true;
         c.offload_double_buffer = false;
       }},
  };
  for (const auto& k : cases) {
    if (!kExact && std::string(k.name) == "batch invariant") continue;  // a cpu-only option
    ModelConfig c = test::tiny("qwen3_moe");
    k.set(c);
    Model cpu = make(c, "cpu");
    Model dev = make(c);
    expect_same(run(cpu), run(dev), k.name);
  }
}

TEST(DevicePath, HostMirrorStaysInStep) {
  Model cpu = make(test::tiny_family("qwen3"), "cpu");
  Model dev = make(test::tiny_family("qwen3"));
  const PackedBatch b = batch();
  const size_t T = b.tokens.size();
  std::vector<float> lc(T), ld(T), dl(T, 0.5f);
  // A write through params() reaches the next forward (an SGD step, as an optimizer does it).
  for (Model* m : {&cpu, &dev}) {
    m->zero_grads();
    ASSERT_TRUE(m->forward_train(b, 1.0f, lc.data(), nullptr).ok());
    ASSERT_TRUE(m->backward_train(dl.data(), nullptr).ok());
    auto g = m->grads();
    auto p = m->params();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * g[i];
  }
  ASSERT_TRUE(cpu.forward_train(b, 1.0f, lc.data(), nullptr).ok());
  ASSERT_TRUE(dev.forward_train(b, 1.0f, ld.data(), nullptr).ok());
  EXPECT_TRUE(matches(lc, ld)) << "a write through params() did not reach the device";
  // A write through grads() is what the next backward accumulates onto (gradient accumulation
  // after an all-reduce or a clip scaled the host copy).
  for (Model* m : {&cpu, &dev}) {
    for (float& g : m->grads()) g *= 0.5f;
    ASSERT_TRUE(m->backward_train(dl.data(), nullptr).ok());
  }
  EXPECT_TRUE(matches(vec(std::as_const(cpu).grads()), vec(std::as_const(dev).grads())));
  // set_params replaces both copies; zero_grads clears both.
  std::vector<float> flat(cpu.params().size(), 0.01f);
  ASSERT_TRUE(cpu.set_params(flat).ok());
  ASSERT_TRUE(dev.set_params(flat).ok());
  EXPECT_TRUE(matches(vec(std::as_const(dev).params()), flat));
  dev.zero_grads();
  for (float g : std::as_const(dev).grads()) ASSERT_EQ(g, 0.0f);
  ASSERT_TRUE(cpu.forward_train(b, 1.0f, lc.data(), nullptr).ok());
  ASSERT_TRUE(dev.forward_train(b, 1.0f, ld.data(), nullptr).ok());
  EXPECT_TRUE(matches(lc, ld)) << "set_params did not reach the device";
}

TEST(DevicePath, DecodeSlotsEqualCpuBitForBit) {
  for (int chunk : {0, 16}) {
    ModelConfig c = test::tiny("qwen3_moe");
    c.logprob_chunk = chunk;
    Model cpu = make(c, "cpu");
    Model dev = make(c);
    std::vector<std::vector<SlotToken>> out[2];
    Model* models[2] = {&cpu, &dev};
    for (int i = 0; i < 2; ++i) {
      auto slots = DecodeSlots::create(*models[i], 3, 32, 16);
      ASSERT_TRUE(slots.ok()) << slots.error().message;
      SlotSampling sp;
      sp.temperature = 0.7f;
      sp.seed = 9;
      sp.top_logprobs = 3;
      ASSERT_TRUE((*slots)->add({1, 2, 3, 4}, sp).ok());
      sp.stream = 1;
      ASSERT_TRUE((*slots)->add({7, 7}, sp).ok());
      for (int step = 0; step < 6; ++step) {
        if (step == 2) {  // a sequence joins mid-flight (continuous batching)
          sp.stream = 2;
          ASSERT_TRUE((*slots)->add({5, 6, 8}, sp).ok());
        }
        auto t = (*slots)->step();
        ASSERT_TRUE(t.ok()) << t.error().message;
        out[i].push_back(std::move(*t));
      }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t s = 0; s < out[0].size(); ++s) {
      ASSERT_EQ(out[0][s].size(), out[1][s].size()) << "step " << s;
      for (size_t r = 0; r < out[0][s].size(); ++r) {
        const SlotToken &a = out[0][s][r], &b = out[1][s][r];
        EXPECT_EQ(a.slot, b.slot);
        EXPECT_EQ(a.token, b.token) << "chunk " << chunk << " step " << s;
        EXPECT_TRUE(matches_value(a.logprob, b.logprob));
        ASSERT_EQ(a.top.size(), b.top.size());
        for (size_t j = 0; j < a.top.size(); ++j) {
          EXPECT_EQ(a.top[j].first, b.top[j].first);
          EXPECT_TRUE(matches_value(a.top[j].second, b.top[j].second));
        }
      }
    }
  }
}

// policy.compute_dtype bf16: GEMMs on bf16 operands with fp32 accumulation. On cuda the training
// forward stays within bf16 rounding of the fp32 cpu model's and SGD steps raise the batch's
// log-likelihood; a backend without bf16 GEMMs (cpu_fenced, cpu) refuses the option.
TEST(DevicePath, Bf16Compute) {
  ModelConfig c = test::tiny("qwen3_moe");
  c.compute_dtype = troupe::kernels::ComputeDtype::bf16;
  if (kExact) {
    c.device = *troupe::enum_from_name<troupe::kernels::DeviceKind>(kDevice);
    auto m = Model::create(c, 1);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("compute_dtype"), std::string::npos) << m.error().message;
    return;
  }
  Model dev = make(c);
  ModelConfig f = c;
  f.compute_dtype = troupe::kernels::ComputeDtype::fp32;
  Model cpu = make(f, "cpu");
  const PackedBatch b = batch();
  const size_t T = b.tokens.size();
  std::vector<float> lc(T), ld(T), dl(T, -1.0f);
  ASSERT_TRUE(cpu.forward_train(b, 1.0f, lc.data(), nullptr).ok());
  ASSERT_TRUE(dev.forward_train(b, 1.0f, ld.data(), nullptr).ok());
  double first = 0;
  for (size_t t = 0; t < T; ++t) {
    EXPECT_NEAR(ld[t], lc[t], 0.05 + 0.02 * std::fabs(lc[t])) << "token " << t;
    first += ld[t];
  }
  for (int step = 0; step < 5; ++step) {  // minimise -sum logp
    dev.zero_grads();
    ASSERT_TRUE(dev.forward_train(b, 1.0f, ld.data(), nullptr).ok());
    ASSERT_TRUE(dev.backward_train(dl.data(), nullptr).ok());
    auto g = dev.grads();
    auto p = dev.params();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.05f * g[i];
  }
  ASSERT_TRUE(dev.forward_train(b, 1.0f, ld.data(), nullptr).ok());
  double last = 0;
  for (float v : ld) last += v;
  EXPECT_GT(last, first);
}

// policy.compute_dtype auto (the default): the model resolves it to bf16 on cuda and fp32 on cpu and
// cpu_fenced, whose numbers therefore never change.
TEST(DevicePath, ComputeDtypeAutoResolves) {
  ModelConfig c = test::tiny("qwen3_moe");
  ASSERT_EQ(c.compute_dtype, troupe::kernels::ComputeDtype::auto_);
  c.device = *troupe::enum_from_name<troupe::kernels::DeviceKind>(kDevice);
  auto dev = Model::create(c, 1);
  ASSERT_TRUE(dev.ok()) << dev.error().message;
  EXPECT_EQ(dev->config().compute_dtype,
            kExact ? troupe::kernels::ComputeDtype::fp32 : troupe::kernels::ComputeDtype::bf16);
  c.device = troupe::kernels::DeviceKind::cpu;
  auto cpu = Model::create(c, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ(cpu->config().compute_dtype, troupe::kernels::ComputeDtype::fp32);
}

// The fence itself: a host array where the table wants device memory aborts naming the op.
TEST(DevicePathDeathTest, HostPointerToAnOpAborts) {
  if (!kExact) return;  // the fence is the fenced backend's
  const troupe::kernels::Backend& be = troupe::kernels::cpu_fenced_backend();
  auto buf = be.alloc(64 * sizeof(float));
  ASSERT_TRUE(buf.ok());
  std::vector<float> host(64);
  EXPECT_DEATH(be.add(buf->floats(), host.data(), buf->floats(), 64), "add: pointer .* is host memory");
  EXPECT_DEATH(be.copy_device_to_host(buf->data(), buf->data(), 4), "copy_device_to_host: pointer .* is device memory");
  EXPECT_DEATH({ volatile float x = buf->floats()[0]; (void)x; }, "");  // the host cannot read device memory
}

}  // namespace

int main(int argc, char** argv) {
  auto be = troupe::kernels::backend_for(kDevice);
  if (!be.ok()) {  // no usable GPU (or no CUDA in this build): skipped, never passed
    std::printf("skipped: policy.device %s: %s\n", kDevice.c_str(), be.error().message.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP's threads are up before the death test
  return RUN_ALL_TESTS();
}
