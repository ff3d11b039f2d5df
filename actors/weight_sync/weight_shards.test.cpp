// actors.weight_shards: weight sync from sharded learners. Each of P shard encoders (2, 3 and 4
// shards; fp32 and bf16; full, delta and compressed full) encodes its shard; the joined message is
// byte for byte the one a single encoder over the whole arena and the cut table sends, applies bit
// for bit, and a corrupt piece fails the checksum of a tensor of that shard and leaves the receiver
// as it was; pieces that do not belong together are refused, naming the piece.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_shards.h"
#include "troupe/learner/communicator.h"
#include "weight_message_checks.h"

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::sync_checks::expect_same_message;
using troupe::actors::sync_checks::same_bits;

namespace {

// Four tensors, the second longer than a chunk, so shard bounds cut tensors and chunks.
std::vector<policy::TensorSpec> tensors() {
  const size_t a = 100003, b = kWeightChunkElements + 4099, c = 60017, d = 31;
  return {{"a.weight", {static_cast<int64_t>(a)}, 0},
          {"b.weight", {static_cast<int64_t>(b)}, a},
          {"c.weight", {static_cast<int64_t>(c)}, a + b},
          {"d.bias", {static_cast<int64_t>(d)}, a + b + c}};
}

std::vector<float> weights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> w(n);
  for (auto& x : w) x = d(rng);
  return w;
}

void update(std::vector<float>& w, uint64_t seed) {  // an AdamW-sized step on every value
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-4f);
  for (auto& x : w) x += d(rng);
}

struct Shards {
  std::vector<size_t> bounds;
  std::vector<policy::TensorSpec> cut;
  std::vector<std::unique_ptr<WeightEncoder>> encoders;
  Shards(WeightDtype dtype, const std::vector<policy::TensorSpec>& table, size_t n, int P, bool compress) {
    bounds = learner::shard_bounds(n, P);
    cut = cut_tensor_table(table, bounds);
    for (size_t r = 0; r < static_cast<size_t>(P); ++r) {
      encoders.push_back(std::make_unique<WeightEncoder>(dtype, shard_tensor_table(cut, bounds, r)));
      encoders.back()->set_compress_full(compress);
    }
  }
  Weights encode(std::span<const float> master, int64_t version, bool delta) {
    std::vector<Weights> pieces(encoders.size());
    for (size_t r = 0; r < encoders.size(); ++r)
      encoders[r]->encode(master.subspan(bounds[r], bounds[r + 1] - bounds[r]), version, delta, pieces[r]);
    auto joined = join_weight_shards(pieces, bounds);
    EXPECT_TRUE(joined.ok()) << (joined.ok() ? "" : joined.error().message);
    return joined.ok() ? std::move(joined).value() : Weights{};
  }
};

}  // namespace

TEST(WeightShards, CutTableSplitsTensorsAtTheBounds) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  const auto bounds = learner::shard_bounds(n, 2);
  const auto cut = cut_tensor_table(table, bounds);
  ASSERT_EQ(cut.size(), 5u);  // b.weight straddles the middle
  EXPECT_EQ(cut[0].name, "a.weight");
  EXPECT_EQ(cut[1].name, "b.weight[0:" + std::to_string(bounds[1] - table[1].offset) + "]");
  EXPECT_EQ(cut[2].offset, bounds[1]);
  size_t covered = 0;
  for (size_t r = 0; r < 2; ++r)
    for (const auto& t : shard_tensor_table(cut, bounds, r)) {
      EXPECT_LE(t.offset + t.numel(), bounds[r + 1] - bounds[r]) << t.name;
      covered += t.numel();
    }
  EXPECT_EQ(covered, n);
}

TEST(WeightShards, JoinedIsTheWholeEncodersMessage) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16})
    for (bool compress : {false, true})
      for (int P : {2, 3, 4}) {
        SCOPED_TRACE(enum_string(dtype) + (compress ? " compressed full, " : ", ") + std::to_string(P) + " shards");
        Shards shards(dtype, table, n, P, compress);
        WeightEncoder whole(dtype, shards.cut);
        whole.set_compress_full(compress);
        auto master = weights(n, 1);
        std::vector<float> receiver(n, 0.0f);
        for (int64_t v = 0; v <= 3; ++v) {
          if (v > 0) update(master, 10 + static_cast<uint64_t>(v));
          const bool delta = v != 3;  // version 0: nothing encoded yet (full); 3: asked in full
          Weights joined = shards.encode(master, v, delta), one;
          whole.encode(master, v, delta, one);
          EXPECT_EQ(joined.encoding,
                    static_cast<int32_t>(v == 0 || v == 3 ? WeightEncoding::full : WeightEncoding::delta));
          expect_same_message(joined, one);
          ASSERT_EQ(apply_weights(joined, receiver, shards.cut, dtype).status, WeightsStatus::applied) << v;
          auto expect = master;
          round_to_dtype(expect, dtype);
          ASSERT_TRUE(same_bits(receiver, expect)) << "version " << v;
        }
      }
}

TEST(WeightShards, CorruptPieceFailsItsShardsChecksum) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  Shards shards(WeightDtype::bf16, table, n, 2, false);
  auto master = weights(n, 2);
  std::vector<float> receiver(n, 0.0f);
  ASSERT_EQ(apply_weights(shards.encode(master, 0, false), receiver, shards.cut, WeightDtype::bf16).status,
            WeightsStatus::applied);
  update(master, 3);
  std::vector<Weights> pieces(2);
  for (size_t r = 0; r < 2; ++r)
    shards.encoders[r]->encode(std::span<const float>(master).subspan(shards.bounds[r], shards.bounds[r + 1] - shards.bounds[r]),
                               1, true, pieces[r]);
  std::string p = pieces[1].payload.str();  // the last byte of shard 1's last chunk: d.bias's XORs
  p.back() = static_cast<char>(p.back() ^ 0x40);
  pieces[1].payload = std::move(p);
  pieces[1].chunk_format.back() &= ~std::uint8_t{1};  // (stored as is, so the flip decodes)
  auto joined = join_weight_shards(pieces, shards.bounds);
  ASSERT_TRUE(joined.ok());
  const auto before = receiver;
  const auto got = apply_weights(*joined, receiver, shards.cut, WeightDtype::bf16);
  EXPECT_NE(got.status, WeightsStatus::applied);
  EXPECT_TRUE(same_bits(receiver, before));
}

TEST(WeightShards, PiecesThatDoNotBelongTogetherAreRefused) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  Shards shards(WeightDtype::fp32, table, n, 2, false);
  auto master = weights(n, 4);
  std::vector<Weights> pieces(2);
  for (size_t r = 0; r < 2; ++r)
    shards.encoders[r]->encode(std::span<const float>(master).subspan(shards.bounds[r], shards.bounds[r + 1] - shards.bounds[r]),
                               static_cast<int64_t>(r), false, pieces[r]);
  auto joined = join_weight_shards(pieces, shards.bounds);
  ASSERT_FALSE(joined.ok());
  EXPECT_NE(joined.error().message.find("piece 1 is version 1"), std::string::npos) << joined.error().message;
  auto short_list = join_weight_shards(std::span<const Weights>(pieces).first(1), shards.bounds);
  ASSERT_FALSE(short_list.ok());
  EXPECT_NE(short_list.error().message.find("1 pieces for 2 shards"), std::string::npos);
}

// Lean memory (a sharded learner's encoder): a full piece is a view of the held copy, a delta past
// held / kLeanDeltaShare goes in full, and either way the joined message is the whole encoder's of
// that encoding, byte for byte. A full piece still in flight keeps its bytes while the next version is
// encoded (the held copy is copied aside), and the pieces' heads join to the same message less its payload.
TEST(WeightShards, LeanPiecesAreTheSameMessages) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    SCOPED_TRACE(enum_string(dtype));
    Shards shards(dtype, table, n, 3, false);
    for (auto& e : shards.encoders) e->set_lean_memory(true);
    WeightEncoder whole(dtype, shards.cut);
    auto master = weights(n, 5);
    std::vector<float> receiver(n, 0.0f);
    std::vector<Weights> kept(3);  // version 0's full pieces, alive while version 1 is encoded
    for (size_t r = 0; r < 3; ++r)
      shards.encoders[r]->encode(std::span<const float>(master).subspan(shards.bounds[r], shards.bounds[r + 1] - shards.bounds[r]),
                                 0, false, kept[r]);
    std::vector<std::string> bytes0;
    for (const auto& p : kept) bytes0.push_back(p.payload.str());
    int deltas = 0, abandoned = 0;
    for (int64_t v = 0; v <= 4; ++v) {
      std::mt19937_64 rng(20 + static_cast<uint64_t>(v));
      std::normal_distribution<float> small(0.0f, 1e-6f);  // a few bf16 values change, every fp32 one
      for (auto& x : master) x += v > 0 ? small(rng) : 0.0f;
      if (v == 4)  // a big step: every bf16 value changes
        for (auto& x : master) x *= 1.5f;
      Weights joined = shards.encode(master, v, v > 0), one;
      whole.encode(master, v, joined.encoding == static_cast<int32_t>(WeightEncoding::delta), one);
      (joined.encoding == static_cast<int32_t>(WeightEncoding::delta) ? deltas : abandoned) += v > 0 ? 1 : 0;
      expect_same_message(joined, one);
      ASSERT_EQ(apply_weights(joined, receiver, shards.cut, dtype).status, WeightsStatus::applied) << v;
      auto expect = master;
      round_to_dtype(expect, dtype);
      ASSERT_TRUE(same_bits(receiver, expect)) << "version " << v;
    }
    for (size_t r = 0; r < 3; ++r) EXPECT_TRUE(kept[r].payload.str() == bytes0[r]) << "piece " << r;
    EXPECT_GE(abandoned, 1);  // fp32 (every value's low bits) and the big bf16 step go in full
    if (dtype == WeightDtype::bf16) {
      EXPECT_GE(deltas, 1);
    }
  }
}

TEST(WeightShards, HeadsJoinToTheMessageLessItsPayload) {
  const auto table = tensors();
  const size_t n = table.back().offset + table.back().numel();
  Shards shards(WeightDtype::bf16, table, n, 2, false);
  auto master = weights(n, 6);
  for (int64_t v = 0; v <= 1; ++v) {
    if (v > 0) update(master, 7);
    std::vector<Weights> pieces(2);
    for (size_t r = 0; r < 2; ++r)
      shards.encoders[r]->encode(std::span<const float>(master).subspan(shards.bounds[r], shards.bounds[r + 1] - shards.bounds[r]),
                                 v, v > 0, pieces[r]);
    auto joined = join_weight_shards(pieces, shards.bounds);
    ASSERT_TRUE(joined.ok());
    std::vector<Weights> heads = pieces;
    std::uint64_t sum = 0;
    for (auto& h : heads) {
      EXPECT_EQ(payload_bytes(h), h.payload.size());
      sum += payload_bytes(h);
      h.payload = runtime::Bytes();
    }
    auto head = join_piece_heads(heads);
    ASSERT_TRUE(head.ok());
    EXPECT_EQ(sum, joined->payload.size());
    EXPECT_EQ(payload_bytes(*head), sum);
    head->payload = joined->payload;
    expect_same_message(*head, *joined);
  }
}
