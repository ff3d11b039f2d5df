// kernels.local_collective: the in-process collective (local_collective.h) on the fenced backend,
// whose buffers the host cannot touch: a broadcast root does not wait for its receivers, the
// receivers get each broadcast in order, all-reduce gives every rank the same bits (the sum in
// rank order), so do reduce-scatter and all-gather, and bad ids, ranks, sizes and bounds are errors.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/local_collective.h"

namespace troupe::kernels {
namespace {

std::vector<float> down(const Backend& b, const Buffer& buf, size_t n) {
  std::vector<float> v(n);
  b.copy_device_to_host(v.data(), buf.data(), n * sizeof(float));
  return v;
}

Buffer up(const Backend& b, const std::vector<float>& v) {
  auto buf = b.alloc(v.size() * sizeof(float));
  EXPECT_TRUE(buf.ok());
  b.copy_host_to_device(buf->data(), v.data(), v.size() * sizeof(float));
  return std::move(*buf);
}

TEST(LocalCollective, BroadcastRootDoesNotWaitAndReceiversGetEachInOrder) {
  const Backend& b = cpu_fenced_backend();
  const auto id = local_collective_id();
  constexpr int kRanks = 3;
  auto root = join_local_collective(b, id, kRanks, 0);
  ASSERT_TRUE(root.ok()) << root.error().message;
  // The root broadcasts twice before any receiver has joined.
  Buffer first = up(b, {1, 2, 3}), second = up(b, {4, 5, 6});
  (*root)->broadcast(first.floats(), 3, 0);
  (*root)->broadcast(second.floats(), 3, 0);
  std::vector<std::vector<float>> got(kRanks);
  std::vector<std::thread> ts;
  for (int r = 1; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      auto c = join_local_collective(b, id, kRanks, r);
      ASSERT_TRUE(c.ok()) << c.error().message;
      Buffer buf = up(b, {0, 0, 0});
      (*c)->broadcast(buf.floats(), 3, 0);
      auto a = down(b, buf, 3);
      (*c)->broadcast(buf.floats(), 3, 0);
      auto bb = down(b, buf, 3);
      a.insert(a.end(), bb.begin(), bb.end());
      got[static_cast<size_t>(r)] = a;
    });
  for (auto& t : ts) t.join();
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(LocalCollective, AllReduceIsTheSumInRankOrderOnEveryRank) {
  const Backend& b = cpu_fenced_backend();
  const auto id = local_collective_id();
  constexpr int kRanks = 3;
  // Values whose float sum depends on the order: every rank must get (x0 + x1) + x2.
  const std::vector<std::vector<float>> in = {{1e8f, 1.0f}, {-1e8f, 3.0f}, {1.0f, 0.5f}};
  std::vector<std::vector<float>> out(kRanks);
  std::vector<std::thread> ts;
  for (int r = kRanks - 1; r >= 0; --r)
    ts.emplace_back([&, r] {
      auto c = join_local_collective(b, id, kRanks, r);
      ASSERT_TRUE(c.ok()) << c.error().message;
      Buffer buf = up(b, in[static_cast<size_t>(r)]);
      (*c)->all_reduce_sum(buf.floats(), 2);
      out[static_cast<size_t>(r)] = down(b, buf, 2);
    });
  for (auto& t : ts) t.join();
  const std::vector<float> want = {(1e8f + -1e8f) + 1.0f, (1.0f + 3.0f) + 0.5f};
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(0, std::memcmp(out[static_cast<size_t>(r)].data(), want.data(), 8));
}

// The sharded learners' pair: each rank's shard becomes the rank-ordered sum (the rest of its
// buffer is not read), then every rank's shard reaches every rank; shards of unequal length, one empty.
TEST(LocalCollective, ReduceScatterThenAllGatherIsTheRankOrderedAllReduce) {
  const Backend& b = cpu_fenced_backend();
  const auto id = local_collective_id();
  constexpr int kRanks = 3;
  const std::vector<size_t> bounds = {0, 3, 3, 5};
  std::vector<std::vector<float>> in(kRanks);
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < 5; ++i) in[static_cast<size_t>(r)].push_back(r == 1 ? -1e8f : (r == 0 ? 1e8f : 0.25f * static_cast<float>(i + 1)));
  std::vector<std::vector<float>> scattered(kRanks), gathered(kRanks);
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      auto c = join_local_collective(b, id, kRanks, r);
      ASSERT_TRUE(c.ok()) << c.error().message;
      Buffer buf = up(b, in[static_cast<size_t>(r)]);
      (*c)->reduce_scatter_sum(buf.floats(), bounds);
      scattered[static_cast<size_t>(r)] = down(b, buf, 5);
      (*c)->all_gather(buf.floats(), bounds);
      gathered[static_cast<size_t>(r)] = down(b, buf, 5);
    });
  for (auto& t : ts) t.join();
  std::vector<float> want(5);
  for (size_t i = 0; i < 5; ++i) want[i] = (in[0][i] + in[1][i]) + in[2][i];
  for (int r = 0; r < kRanks; ++r) {
    const size_t lo = bounds[static_cast<size_t>(r)], hi = bounds[static_cast<size_t>(r) + 1];
    for (size_t i = lo; i < hi; ++i) EXPECT_EQ(scattered[static_cast<size_t>(r)][i], want[i]) << r << " " << i;
    EXPECT_EQ(0, std::memcmp(gathered[static_cast<size_t>(r)].data(), want.data(), 5 * sizeof(float))) << r;
  }
  // Bounds that do not cut the buffer into one shard per rank are refused.
  auto lone = join_local_collective(b, local_collective_id(), 1, 0);
  ASSERT_TRUE(lone.ok());
  Buffer one = up(b, {1, 2});
  const std::vector<size_t> two_shards = {0, 1, 2};
  try {
    (*lone)->all_gather(one.floats(), two_shards);
    ADD_FAILURE() << "bounds for 2 ranks were accepted by a group of 1";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("3 shard bounds for 1 ranks"), std::string::npos) << e.what();
  }
}

TEST(LocalCollective, BadIdsRanksAndSizesAreErrors) {
  const Backend& b = cpu_fenced_backend();
  auto bad = join_local_collective(b, {1, 2, 3}, 2, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not one of this process's"), std::string::npos) << bad.error().message;
  const auto id = local_collective_id();
  EXPECT_FALSE(join_local_collective(b, id, 2, 2).ok());
  auto a = join_local_collective(b, id, 2, 0);
  ASSERT_TRUE(a.ok());
  auto twice = join_local_collective(b, id, 2, 0);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("joined twice"), std::string::npos);
  auto other = join_local_collective(b, id, 3, 1);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("it has 2"), std::string::npos) << other.error().message;
  auto c = join_local_collective(b, id, 2, 1);
  ASSERT_TRUE(c.ok());
  Buffer four = up(b, {1, 2, 3, 4}), three = up(b, {0, 0, 0});
  (*a)->broadcast(four.floats(), 4, 0);
  try {
    (*c)->broadcast(three.floats(), 3, 0);
    ADD_FAILURE() << "a size mismatch must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("3 values here, 4 at another rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::kernels
