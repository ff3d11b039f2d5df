// actors.weight_group: weights by broadcast (weight_sync.transport nccl) between a learner and
// generators on the fenced device backend, whose weight group is the in-process collective: the
// generators end with learner 0's values in their dtype and the probe passing; a checksum that
// does not match leaves a generator's weights and version as they were; a generator in no group
// refuses; the group id is checked. (`e2e.device_path` runs whole training runs this way.)
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include "tiny_config.test.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_group.h"
#include "troupe/kernels/backend.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

ExperimentConfig fenced(const char* dtype) {
  ExperimentConfig c = test_support::tiny_config();
  c.optimizer.lr = 0.01f;
  c.policy.device = kernels::DeviceKind::cpu_fenced;
  c.weight_sync.transport = WeightTransport::nccl;
  c.weight_sync.dtype = *enum_from_name<WeightDtype>(dtype);
  return c;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

GetWeightsReq by_broadcast() {
  GetWeightsReq r;
  r.device = true;
  return r;
}

TEST(WeightGroup, GeneratorsTakeLearnerZerosWeightsByBroadcast) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const auto cfg = fenced(dtype);
    auto l = LearnerRole::create(cfg, nullptr);
    ASSERT_TRUE(l.ok()) << l.error().message;
    std::vector<std::unique_ptr<Generator>> gens;
    for (int i = 0; i < 2; ++i) {
      auto g = Generator::create(cfg);
      ASSERT_TRUE(g.ok()) << g.error().message;
      gens.push_back(std::move(*g));
    }
    auto id = (*l)->weight_group(WeightGroupReq{0, {}, 0, 0});
    ASSERT_TRUE(id.ok()) << id.error().message;
    ASSERT_EQ(id->id.at(0), 'L');  // cpu_fenced has no device collectives: the in-process group
    ASSERT_TRUE((*l)->weight_group(WeightGroupReq{1, id->id, 3, 0}).ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(gens[size_t(i)]->join_weight_group(WeightGroupReq{1, id->id, 3, i + 1}).ok());
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE((*l)->train(test_support::tiny_sft_batch()).ok());
      auto w = (*l)->weights_for_generators(by_broadcast());
      ASSERT_TRUE(w.ok()) << w.error().message;
      EXPECT_EQ(w->encoding, static_cast<int32_t>(WeightEncoding::device));
      EXPECT_TRUE(w->payload.empty() && w->params.empty());
      EXPECT_FALSE(w->checksums.empty());
      EXPECT_FALSE(w->probe_logprobs.empty());
      std::vector<float> master((*l)->weights().params);
      round_to_dtype(master, *enum_from_name<WeightDtype>(dtype));
      for (auto& g : gens) {
        ASSERT_TRUE(g->set_weights(*w).ok()) << g->weights_ack().detail;  // (the probe passes, bit for bit)
        EXPECT_EQ(g->weights_ack().status, 0);
        EXPECT_EQ(g->version(), w->version);
        EXPECT_TRUE(same_bits(g->model().params(), master));
      }
    }
  }
}

TEST(WeightGroup, ChecksumFailureKeepsTheWeightsAndNoGroupIsRefused) {
  const auto cfg = fenced("fp32");
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok()) << l.error().message;
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok());
  auto outsider = Generator::create(cfg);
  ASSERT_TRUE(outsider.ok());
  auto id = (*l)->weight_group(WeightGroupReq{0, {}, 0, 0});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*l)->weight_group(WeightGroupReq{1, id->id, 2, 0}).ok());
  ASSERT_TRUE((*g)->join_weight_group(WeightGroupReq{1, id->id, 2, 1}).ok());
  ASSERT_TRUE((*l)->train(test_support::tiny_sft_batch()).ok());
  auto w = (*l)->weights_for_generators(by_broadcast());
  ASSERT_TRUE(w.ok()) << w.error().message;
  const std::vector<float> before((*g)->model().params().begin(), (*g)->model().params().end());
  Weights bad = *w;
  bad.checksums.at(2) ^= 1;
  Status st = (*g)->set_weights(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ((*g)->weights_ack().status, static_cast<int32_t>(WeightsStatus::checksum_failed));
  EXPECT_NE(st.error().message.find("fails its checksum after version 1 came by broadcast"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find((*g)->model().tensors()[2].name), std::string::npos) << st.error().message;
  EXPECT_EQ((*g)->version(), 0);
  EXPECT_TRUE(same_bits((*g)->model().params(), before));
  // The next broadcast applies (the group stayed in step: the failed one was taken off it).
  auto again = (*l)->weights_for_generators(by_broadcast());
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*g)->set_weights(*again).ok()) << (*g)->weights_ack().detail;
  EXPECT_TRUE(same_bits((*g)->model().params(), (*l)->weights().params));
  // A count that is not the model's is refused before anything is taken from the group.
  Weights wrong = *again;
  wrong.elements += 1;
  Status miscount = (*g)->set_weights(wrong);
  ASSERT_FALSE(miscount.ok());
  EXPECT_EQ((*g)->weights_ack().status, static_cast<int32_t>(WeightsStatus::refused));
  EXPECT_NE(miscount.error().message.find("values by broadcast for a model of"), std::string::npos)
      << miscount.error().message;
  // A generator in no group refuses device weights and keeps version 0.
  Status out = (*outsider)->set_weights(*again);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ((*outsider)->weights_ack().status, static_cast<int32_t>(WeightsStatus::refused));
  EXPECT_NE(out.error().message.find("in no weight group"), std::string::npos) << out.error().message;
  EXPECT_EQ((*outsider)->version(), 0);
}

// The staging is in the generators' dtype: bf16 stages 2-byte words (half fp32's device bytes, an
// odd count rounded up to whole floats) and the receivers get the sent values bit for bit.
TEST(WeightGroup, StagesInTheGeneratorsDtype) {
  const kernels::Backend& b = kernels::cpu_fenced_backend();
  auto id = WeightGroup::make_id(b);
  ASSERT_TRUE(id.ok()) << id.error().message;
  auto sender = WeightGroup::join(b, *id, 3, 0);
  ASSERT_TRUE(sender.ok()) << sender.error().message;
  std::vector<std::unique_ptr<WeightGroup>> receivers;
  for (int r = 1; r < 3; ++r) {
    auto g = WeightGroup::join(b, *id, 3, r);
    ASSERT_TRUE(g.ok()) << g.error().message;
    receivers.push_back(std::move(*g));
  }
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}})
    for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
      SCOPED_TRACE(std::to_string(n) + " values, " + std::string(enum_string(dtype)));
      std::vector<float> values(n);
      for (size_t i = 0; i < n; ++i) values[i] = 0.37f * static_cast<float>(i) - 3.1f / static_cast<float>(i + 1);
      values[0] = -0.0f;
      round_to_dtype(values, dtype);
      EXPECT_EQ(WeightGroup::staged_bytes(n, dtype), dtype == WeightDtype::bf16 ? 4 * ((n + 1) / 2) : 4 * n);
      ASSERT_TRUE((*sender)->send(values, dtype).ok());
      for (auto& r : receivers) {
        std::vector<float> got(n, 1.0f);
        ASSERT_TRUE(r->receive(got, dtype).ok());
        EXPECT_TRUE(same_bits(got, values));
      }
    }
  // A sender that only ever sends bf16 stages half of what fp32 would.
  auto id2 = WeightGroup::make_id(b);
  ASSERT_TRUE(id2.ok());
  auto s2 = WeightGroup::join(b, *id2, 2, 0);
  auto r2 = WeightGroup::join(b, *id2, 2, 1);
  ASSERT_TRUE(s2.ok() && r2.ok());
  std::vector<float> big(4096, 0.5f);
  ASSERT_TRUE((*s2)->send(big, WeightDtype::bf16).ok());
  std::vector<float> got(big.size());
  ASSERT_TRUE((*r2)->receive(got, WeightDtype::bf16).ok());
  EXPECT_TRUE(same_bits(got, big));
  EXPECT_LE((*s2)->staging_bytes(), 2 * big.size() + 256);
  EXPECT_LE((*r2)->staging_bytes(), 2 * big.size() + 256);
}

TEST(WeightGroup, MalformedIdsAreErrors) {
  const kernels::Backend& b = kernels::cpu_fenced_backend();
  auto empty = WeightGroup::join(b, {}, 2, 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("malformed group id"), std::string::npos);
  auto bad = WeightGroup::join(b, {'L', 'x'}, 2, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rank 1 of 2 could not join"), std::string::npos) << bad.error().message;
  // A learner asked for broadcast weights before it joined any group says so.
  auto l = LearnerRole::create(fenced("fp32"), nullptr);
  ASSERT_TRUE(l.ok());
  auto w = (*l)->weights_for_generators(by_broadcast());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("in no weight group"), std::string::npos) << w.error().message;
}

}  // namespace
