// kernels.cuda_host_decisions (NCCL watchdog): a wait returns once the poll says done, aborts and
// names the rank on an async error, aborts and names the rank and the deadline when a peer never
// answers, and TROUPE_NCCL_TIMEOUT_S is parsed strictly.
#include <gtest/gtest.h>

#include <string>

#include "nccl_watch.h"

namespace troupe::kernels::cuda {
namespace {

struct FakeClock {
  double t = 0;
  int polls = 0, aborts = 0;
};

TEST(CudaNcclWatch, DoneAfterSomePolls) {
  FakeClock c;
  const Status st = nccl_wait(
      "all-reduce of 10 floats", 1, 2, 5.0,
      [&] { return NcclPoll{++c.polls < 4 ? NcclPoll::State::pending : NcclPoll::State::done, ""}; },
      [&] { return c.t; }, [&](double s) { c.t += s; }, [&] { ++c.aborts; });
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(c.polls, 4);
  EXPECT_EQ(c.aborts, 0);
}

TEST(CudaNcclWatch, AsyncErrorAbortsAndNamesTheRank) {
  FakeClock c;
  const Status st = nccl_wait(
      "joining the communicator", 3, 4, 5.0,
      [&] { return NcclPoll{NcclPoll::State::failed, "remote process exited or there was a network error"}; },
      [&] { return c.t; }, [&](double s) { c.t += s; }, [&] { ++c.aborts; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(c.aborts, 1);
  EXPECT_NE(st.error().message.find("NCCL rank 3 of 4: joining the communicator failed"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("remote process exited"), std::string::npos);
}

TEST(CudaNcclWatch, DeadPeerHitsTheDeadline) {
  FakeClock c;
  const Status st = nccl_wait(
      "broadcast of 7 floats from rank 0", 2, 3, 1.5, [&] { ++c.polls; return NcclPoll{}; }, [&] { return c.t; },
      [&](double s) { c.t += s; }, [&] { ++c.aborts; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(c.aborts, 1);
  EXPECT_GE(c.t, 1.5);
  EXPECT_LT(c.t, 1.5 + 0.2);  // polls at most 100 ms apart
  EXPECT_NE(st.error().message.find("NCCL rank 2 of 3: broadcast of 7 floats from rank 0 did not finish within"),
            std::string::npos)
      << st.error().message;
}

TEST(CudaNcclWatch, TimeoutVariable) {
  EXPECT_EQ(*nccl_timeout_s(nullptr), 600.0);
  EXPECT_EQ(*nccl_timeout_s(""), 600.0);
  EXPECT_EQ(*nccl_timeout_s("2.5"), 2.5);
  for (const char* bad : {"0", "-1", "abc", "5s", "nan"}) {
    const Result<double> r = nccl_timeout_s(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("TROUPE_NCCL_TIMEOUT_S='" + std::string(bad) + "'"), std::string::npos);
  }
}

}  // namespace
}  // namespace troupe::kernels::cuda
