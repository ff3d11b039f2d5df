// kernels.cuda_host_decisions (the NCCL all-to-all's plan): the per-peer offsets are the prefix
// sums of the counts in rank order, as MPI_Alltoallv lays them out; peers with nothing either way
// are skipped; a pair that only sends or only receives keeps one side; the self transfer is
// planned like any peer's; a self transfer whose counts differ and a bad rank are refused.
#include <gtest/gtest.h>

#include <vector>

#include "alltoallv_plan.h"

namespace troupe::kernels::cuda {
namespace {

TEST(CudaAlltoallvPlan, OffsetsAreRankOrderPrefixSums) {
  const std::vector<size_t> send{3, 0, 5, 2}, recv{1, 4, 5, 0};
  auto plan = alltoallv_plan(send.data(), recv.data(), 4, 2);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  ASSERT_EQ(plan->size(), 4u);  // every peer moves something one way or the other
  const std::vector<PeerTransfer> want{{0, 0, 3, 0, 1}, {1, 3, 0, 1, 4}, {2, 3, 5, 5, 5}, {3, 8, 2, 10, 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    const PeerTransfer& t = (*plan)[i];
    EXPECT_EQ(t.peer, want[i].peer);
    EXPECT_EQ(t.send_offset, want[i].send_offset) << "peer " << t.peer;
    EXPECT_EQ(t.send_count, want[i].send_count) << "peer " << t.peer;
    EXPECT_EQ(t.recv_offset, want[i].recv_offset) << "peer " << t.peer;
    EXPECT_EQ(t.recv_count, want[i].recv_count) << "peer " << t.peer;
  }
}

TEST(CudaAlltoallvPlan, SkipsIdlePeersButKeepsTheirOffsets) {
  const std::vector<size_t> send{0, 0, 7}, recv{0, 0, 2};
  auto plan = alltoallv_plan(send.data(), recv.data(), 3, 1);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].peer, 2);
  EXPECT_EQ((*plan)[0].send_offset, 0u);
  EXPECT_EQ((*plan)[0].recv_count, 2u);
  const std::vector<size_t> none{0, 0};
  auto empty = alltoallv_plan(none.data(), none.data(), 2, 0);  // an idle pass: nothing to queue
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(CudaAlltoallvPlan, RefusesASelfTransferOfTwoSizesAndABadRank) {
  const std::vector<size_t> send{2, 1}, recv{3, 1};
  auto plan = alltoallv_plan(send.data(), recv.data(), 2, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("rank 0 sends itself 2 elements but expects 3"), std::string::npos)
      << plan.error().message;
  auto bad = alltoallv_plan(send.data(), recv.data(), 2, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rank 2 of 2"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace troupe::kernels::cuda
