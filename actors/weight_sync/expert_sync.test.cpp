// actors.expert_sync: weight sync from divided experts. A small MoE model's experts divided over E
// ranks (policy::Model::slice_experts, E = 2 and 4): every rank's ExpertRunsEncoder encodes the runs
// it sends from its own arena, and the heads joined (a rank beyond the group adding nothing) with
// the payloads placed at their spans are byte for byte the message one WeightEncoder over the whole
// arena and the cut table sends (fp32 and bf16; full, delta, a delta that one run sends in full);
// it applies bit for bit. Each rank sends its experts and 1/E of the rest (to shard_bounds' rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "troupe/actors/expert_sync.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/learner/expert_parallel.h"
#include "weight_message_checks.h"

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::sync_checks::expect_same_message;
using troupe::actors::sync_checks::same_bits;

namespace {

policy::ModelConfig moe_shape() {
  policy::ModelConfig mc;
  mc.family = policy::ModelFamily::qwen3_moe;
  mc.vocab_size = 512;
  mc.hidden_size = 64;
  mc.num_hidden_layers = 3;
  mc.num_attention_heads = 4;
  mc.num_key_value_heads = 2;
  mc.head_dim = 16;
  mc.intermediate_size = 128;
  mc.num_experts = 8;
  mc.num_experts_per_tok = 2;
  mc.moe_intermediate_size = 48;
  return mc;
}

// E ranks' models and encoders, plus one rank beyond the group (a head of no values).
struct Divided {
  std::vector<policy::Model> blocks;
  std::vector<std::unique_ptr<ExpertRunsEncoder>> encoders;
  Divided(const policy::Model& whole, int E, WeightDtype dtype) {
    for (int q = 0; q < E; ++q) {
      auto b = whole.slice_experts(q, E);
      EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
      blocks.push_back(std::move(b).value());
      auto enc = ExpertRunsEncoder::make(dtype, *blocks.back().expert_shards());
      EXPECT_TRUE(enc.ok()) << (enc.ok() ? "" : enc.error().message);
      encoders.push_back(std::move(enc).value());
    }
  }
  // Every rank's piece from `whole`'s values, joined as the coordinator does and the payloads put at
  // their spans as the generators do.
  Weights encode(std::span<const float> whole, int64_t version, bool delta) {
    std::vector<Weights> heads(blocks.size() + 1);
    std::vector<std::vector<runtime::Bytes>> payloads(blocks.size() + 1);
    for (size_t q = 0; q < blocks.size(); ++q) {
      learner::take_local(whole, *blocks[q].expert_shards(), blocks[q].params());
      EXPECT_TRUE(encoders[q]->encode(std::as_const(blocks[q]).params(), version, delta, heads[q], payloads[q]).ok());
    }
    heads.back().version = version;  // (a learner of a second group: nothing to send)
    std::vector<std::vector<std::uint64_t>> spans;
    auto joined = join_piece_heads(heads, &spans);
    EXPECT_TRUE(joined.ok()) << (joined.ok() ? "" : joined.error().message);
    if (!joined.ok()) return {};
    EXPECT_TRUE(spans.back().empty());
    std::string payload(payload_bytes(*joined), '\0');
    for (size_t q = 0; q < blocks.size(); ++q) {
      EXPECT_EQ(spans[q].size(), 2 * payloads[q].size());
      for (size_t i = 0; i < payloads[q].size(); ++i) {
        EXPECT_EQ(spans[q][2 * i + 1], payloads[q][i].size());
        std::memcpy(payload.data() + spans[q][2 * i], payloads[q][i].data(), payloads[q][i].size());
      }
    }
    joined->payload = runtime::Bytes(std::move(payload));
    return std::move(joined).value();
  }
};

}  // namespace

TEST(ExpertSync, EachRankSendsItsExpertsAndItsShareOfTheRest) {
  auto whole = policy::Model::create(moe_shape(), 1);
  ASSERT_TRUE(whole.ok());
  for (int E : {2, 4}) {
    const auto runs = expert_sync_runs(whole->tensors(), E);
    std::vector<size_t> sent(static_cast<size_t>(E), 0);
    size_t end = 0;
    for (const SyncRun& r : runs) {
      EXPECT_EQ(r.begin, end);
      ASSERT_GE(r.sender, 0);
      ASSERT_LT(r.sender, E);
      sent[static_cast<size_t>(r.sender)] += r.end - r.begin;
      end = r.end;
    }
    EXPECT_EQ(end, whole->params().size());
    const auto [lo, hi] = std::minmax_element(sent.begin(), sent.end());
    EXPECT_LE(*hi - *lo, 16u * static_cast<size_t>(E)) << "E = " << E;  // (shard_bounds' parts: multiples of 16)
    Divided d(*whole, E, WeightDtype::fp32);
    for (int q = 0; q < E; ++q) EXPECT_EQ(d.encoders[static_cast<size_t>(q)]->values(), sent[static_cast<size_t>(q)]);
  }
}

TEST(ExpertSync, JoinedIsTheWholeEncodersMessage) {
  auto whole = policy::Model::create(moe_shape(), 2);
  ASSERT_TRUE(whole.ok());
  const size_t n = whole->params().size();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16})
    for (int E : {2, 4}) {
      SCOPED_TRACE(enum_string(dtype) + ", E = " + std::to_string(E));
      const auto cut = cut_tensor_table(whole->tensors(), sync_run_bounds(expert_sync_runs(whole->tensors(), E)));
      Divided d(*whole, E, dtype);
      WeightEncoder one_encoder(dtype, cut);
      std::vector<float> master(whole->params().begin(), whole->params().end()), receiver(n, 0.0f);
      std::mt19937_64 rng(3);
      std::normal_distribution<float> small(0.0f, 1e-6f);
      for (int64_t v = 0; v <= 4; ++v) {
        if (v > 0)
          for (auto& x : master) x += small(rng);  // a few bf16 values change, every fp32 one
        if (v == 3)  // one expert block changes a lot: its run's lean delta goes in full, so every run does
          for (size_t i = 0; i < n / 2; ++i) master[i] *= 1.5f;
        const bool delta = v > 0 && v != 4;  // 4: asked in full
        Weights joined = d.encode(master, v, delta), one;
        one_encoder.encode(master, v, joined.encoding == static_cast<int32_t>(WeightEncoding::delta), one);
        if (dtype == WeightDtype::bf16 && (v == 1 || v == 2)) {
          EXPECT_EQ(joined.encoding, static_cast<int32_t>(WeightEncoding::delta)) << v;
        }
        if (v == 3 || v == 4) {
          EXPECT_EQ(joined.encoding, static_cast<int32_t>(WeightEncoding::full)) << v;
        }
        expect_same_message(joined, one);
        ASSERT_EQ(apply_weights(joined, receiver, cut, dtype).status, WeightsStatus::applied) << v;
        auto expect = master;
        round_to_dtype(expect, dtype);
        ASSERT_TRUE(same_bits(receiver, expect)) << "version " << v;
      }
    }
}

TEST(ExpertSync, RunsThatDoNotTileTheArenaAreRefused) {
  auto whole = policy::Model::create(moe_shape(), 4);
  ASSERT_TRUE(whole.ok());
  Divided d(*whole, 2, WeightDtype::fp32);
  std::vector<float> master(whole->params().begin(), whole->params().end());
  std::vector<Weights> heads(2);
  std::vector<runtime::Bytes> payloads;
  learner::take_local(master, *d.blocks[0].expert_shards(), d.blocks[0].params());
  ASSERT_TRUE(d.encoders[0]->encode(std::as_const(d.blocks[0]).params(), 0, false, heads[0], payloads).ok());
  heads[1].version = 0;  // learner 1's runs missing
  auto joined = join_piece_heads(heads);
  ASSERT_FALSE(joined.ok());
  EXPECT_NE(joined.error().message.find("but the runs before end at"), std::string::npos) << joined.error().message;
  heads[0].runs.pop_back();
  joined = join_piece_heads(heads);
  ASSERT_FALSE(joined.ok());
  EXPECT_NE(joined.error().message.find("learner 0's piece lists"), std::string::npos) << joined.error().message;
}
