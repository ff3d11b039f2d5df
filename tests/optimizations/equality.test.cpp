// Each training optimization switched on must not change a single bit: activation checkpointing
// (with and without offload, single or double reload buffer, under injected copy delays), packed
// metadata caching and grouped MoE routing, all against the plain path, over two training steps.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <string>
#include <vector>

#include "troupe/kernels/offload.h"
#include "troupe/policy/model.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/model_config.h"

namespace troupe {
namespace {

policy::ModelConfig tiny(int layers) {
  policy::ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.router_aux_loss_coef = 0.01f;
  if (layers > 2) c.mlp_only_layers = {0};  // a dense layer among MoE layers
  // The plain path: every optimization off.
  c.cache_packed_metadata = false;
  c.activation_checkpointing = false;
  c.offload_activations = false;
  c.offload_double_buffer = false;
  c.moe_grouped = false;
  return c;
}

policy::PackedBatch batch_of(std::vector<int> lengths, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, 63);
  policy::PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (int len : lengths) {
    for (int i = 0; i < len; ++i) b.tokens.push_back(tok(rng));
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  b.targets.resize(b.tokens.size());
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s)
    for (int t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t)
      b.targets[t] = t + 1 < b.cu_seqlens[s + 1] ? b.tokens[t + 1] : -1;
  return b;
}

struct Trace {
  std::vector<float> logp, entropy, grads, aux;
  uint64_t meta_builds = 0;
  int sync_reloads = 0, overlapped_reloads = 0;
};

Trace steps(policy::Model& model);

// Two training steps on two batches (gradients accumulate across them, as in micro-batching).
Trace run(const policy::ModelConfig& cfg, double max_delay_s = 0) {
  auto m = policy::Model::create(cfg, 5);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return {};
  policy::Model& model = m.value();
  if (max_delay_s > 0) {
    EXPECT_NE(model.offload_engine(), nullptr);
    if (model.offload_engine()) {
      auto delays = std::make_shared<std::vector<double>>();
      std::mt19937 rng(17);
      std::uniform_real_distribution<double> u(0.0, max_delay_s);
      for (int i = 0; i < 512; ++i) delays->push_back(u(rng));
      model.offload_engine()->set_delay([delays](uint64_t i) { return (*delays)[i % delays->size()]; });
    }
  }
  return steps(model);
}

Trace steps(policy::Model& model) {
  Trace tr;
  model.zero_grads();
  for (int step = 0; step < 2; ++step) {
    auto b = step == 0 ? batch_of({5, 9, 1, 7}, 1) : batch_of({12, 3, 8}, 2);
    const size_t T = b.tokens.size();
    std::vector<float> logp(T), ent(T), dlogp(T), dent(T);
    std::mt19937 rng(100 + step);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (size_t t = 0; t < T; ++t) {
      dlogp[t] = nd(rng);
      dent[t] = 0.1f * nd(rng);
    }
    Status st = model.forward_train(b, 1.0f, logp.data(), ent.data());
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    st = model.backward_train(dlogp.data(), dent.data());
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    tr.logp.insert(tr.logp.end(), logp.begin(), logp.end());
    tr.entropy.insert(tr.entropy.end(), ent.begin(), ent.end());
    tr.aux.push_back(model.last_aux_loss());
  }
  auto g = model.grads();
  tr.grads.assign(g.begin(), g.end());
  tr.meta_builds = model.packed_meta_builds();
  if (const auto* off = model.activation_offload()) {
    tr.sync_reloads = off->sync_reloads();
    tr.overlapped_reloads = off->overlapped_reloads();
  }
  return tr;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << " differs first at " << i << ": " << a[i] << " vs " << b[i];
      return;
    }
}

void expect_same(const Trace& a, const Trace& b, const std::string& what) {
  expect_bitwise(a.logp, b.logp, what + ": logp");
  expect_bitwise(a.entropy, b.entropy, what + ": entropy");
  expect_bitwise(a.aux, b.aux, what + ": aux loss");
  expect_bitwise(a.grads, b.grads, what + ": gradients");
  bool any_nonzero = false;
  for (float g : a.grads) any_nonzero = any_nonzero || g != 0.0f;
  EXPECT_TRUE(any_nonzero) << what;
}

TEST(Equality, CheckpointingEqualsPlain) {
  auto plain = tiny(4);
  auto ckpt = plain;
  ckpt.activation_checkpointing = true;
  expect_same(run(plain), run(ckpt), "checkpointing");
}

TEST(Equality, OffloadDoubleBufferEqualsPlain) {
  auto plain = tiny(4);
  auto off = plain;
  off.activation_checkpointing = off.offload_activations = off.offload_double_buffer = true;
  const Trace ref = run(plain);
  Trace t = run(off);
  expect_same(ref, t, "offload, double buffer");
  EXPECT_GT(t.overlapped_reloads, 0) << "double buffering prefetched nothing";
}

TEST(Equality, OffloadSyncReloadEqualsPlain) {
  auto plain = tiny(4);
  auto off = plain;
  off.activation_checkpointing = off.offload_activations = true;
  off.offload_double_buffer = false;
  Trace t = run(off);
  expect_same(run(plain), t, "offload, single buffer");
  EXPECT_GT(t.sync_reloads, 0);
}

// Random copy delays (up to 3 ms per copy, split before/inside the copy): a missing wait or a
// buffer reused too early reads stale or torn data and changes the gradients.
TEST(Equality, OffloadUnderInjectedDelays) {
  auto plain = tiny(5);  // odd layer count
  const Trace ref = run(plain);
  for (bool dbl : {true, false}) {
    auto off = plain;
    off.activation_checkpointing = off.offload_activations = true;
    off.offload_double_buffer = dbl;
    expect_same(ref, run(off, 3e-3), dbl ? "double buffer, delays" : "single buffer, delays");
  }
}

TEST(Equality, OneLayerModel) {
  auto plain = tiny(1);
  const Trace ref = run(plain);
  auto ckpt = plain;
  ckpt.activation_checkpointing = true;
  expect_same(ref, run(ckpt), "one layer, checkpointing");
  for (bool dbl : {true, false}) {
    auto off = ckpt;
    off.offload_activations = true;
    off.offload_double_buffer = dbl;
    Trace t = run(off, 1e-3);
    expect_same(ref, t, "one layer, offload");
    EXPECT_EQ(t.sync_reloads + t.overlapped_reloads, 0) << "the only layer is the last: nothing to reload";
  }
}

TEST(Equality, TwoLayersOffload) {
  auto plain = tiny(2);
  const Trace ref = run(plain);
  auto off = plain;
  off.activation_checkpointing = off.offload_activations = off.offload_double_buffer = true;
  expect_same(ref, run(off, 2e-3), "two layers, offload");
}

TEST(Equality, MetadataCacheOnOff) {
  const int L = 4;
  auto plain = tiny(L);
  auto cached = plain;
  cached.cache_packed_metadata = true;
  Trace a = run(plain), b = run(cached);
  expect_same(a, b, "metadata cache");
  EXPECT_EQ(b.meta_builds, 2u) << "one build per batch";
  EXPECT_EQ(a.meta_builds, 2u * 2 * L) << "per layer, forward and backward, per batch";
  // Under checkpointing the recompute also reuses the cached metadata.
  auto ck = cached;
  ck.activation_checkpointing = true;
  Trace c = run(ck);
  expect_same(a, c, "metadata cache + checkpointing");
  EXPECT_EQ(c.meta_builds, 2u);
  // Without the cache the recompute (every layer but the last) rebuilds it as well.
  auto ck_plain = plain;
  ck_plain.activation_checkpointing = true;
  Trace d = run(ck_plain);
  expect_same(a, d, "checkpointing without the metadata cache");
  EXPECT_EQ(d.meta_builds, 2u * (3 * L - 1)) << "forward L + recompute L-1 + backward L, per batch";
}

TEST(Equality, MoeGroupedOnOff) {
  auto plain = tiny(4);
  auto grouped = plain;
  grouped.moe_grouped = true;
  expect_same(run(plain), run(grouped), "moe grouped");
  // With a shared expert, no renormalization and top-1 (Mixtral-style layout).
  auto p2 = tiny(3);
  p2.family = troupe::policy::ModelFamily::mixtral;
  p2.shared_expert_intermediate_size = 24;
  p2.norm_topk_prob = false;
  p2.num_experts_per_tok = 1;
  auto g2 = p2;
  g2.moe_grouped = true;
  expect_same(run(p2), run(g2), "moe grouped, shared expert, top-1");
}

TEST(Equality, AllOnEqualsAllOff) {
  auto plain = tiny(5);
  auto all = plain;
  all.cache_packed_metadata = all.activation_checkpointing = all.offload_activations = true;
  all.offload_double_buffer = all.moe_grouped = true;
  expect_same(run(plain), run(all, 2e-3), "all optimizations");
}

TEST(Equality, ConfigErrorsAreClear) {
  auto bad = tiny(2);
  bad.offload_activations = true;  // without checkpointing
  auto m = policy::Model::create(bad, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("offload_activations"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// A loaded model (policy.path) runs with the YAML's execution options, each on or off, and gives
// the bits of the plain path: the options are not dropped when the architecture comes from disk.
TEST(Equality, LoadedModelTakesTheExecutionOptions) {
  auto created = policy::Model::create(tiny(4), 5);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_exec_options_" + std::to_string(::getpid()));
  ASSERT_TRUE(policy::io::save_model(dir.string(), created.value(), nullptr, policy::io::ExpertLayout::per_expert).ok());
  auto load = [&](const policy::ExecutionOptions& exec) {
    auto loaded = policy::io::load_model(dir.string(), exec);
    EXPECT_TRUE(loaded.ok()) << (loaded.ok() ? "" : loaded.error().message);
    const policy::ExecutionOptions& got = loaded.value().model.config();
    EXPECT_EQ(got.cache_packed_metadata, exec.cache_packed_metadata);
    EXPECT_EQ(got.activation_checkpointing, exec.activation_checkpointing);
    EXPECT_EQ(got.offload_activations, exec.offload_activations);
    EXPECT_EQ(got.moe_grouped, exec.moe_grouped);
    return steps(loaded.value().model);
  };
  policy::ExecutionOptions plain;
  plain.cache_packed_metadata = plain.activation_checkpointing = plain.offload_activations = false;
  plain.offload_double_buffer = plain.moe_grouped = false;
  const Trace base = load(plain);
  const int L = 4;
  EXPECT_EQ(base.meta_builds, static_cast<uint64_t>(2 * 2 * L));  // per layer and pass: the option is off
  for (int which = 0; which < 5; ++which) {
    policy::ExecutionOptions x = plain;
    std::string name;
    switch (which) {
      case 0: x.cache_packed_metadata = true; name = "cache_packed_metadata"; break;
      case 1: x.activation_checkpointing = true; name = "activation_checkpointing"; break;
      case 2: x.activation_checkpointing = x.offload_activations = true; name = "offload_activations"; break;
      case 3: x.activation_checkpointing = x.offload_activations = x.offload_double_buffer = true; name = "offload_double_buffer"; break;
      default: x.moe_grouped = true; name = "moe_grouped"; break;
    }
    const Trace t = load(x);
    expect_same(base, t, "loaded model, " + name + " on");
    if (which == 0) {
      EXPECT_EQ(t.meta_builds, 2u) << "once per batch: the loaded model took the option";
    }
    if (which == 3) {
      EXPECT_GT(t.overlapped_reloads + t.sync_reloads, 0) << "the loaded model offloads";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe
