// kernels.cuda_host_decisions (GPU pick): one rank per GPU; more ranks on a node than GPUs is an
// error naming both unless policy.share_gpu; TROUPE_CUDA_DEVICE must name a visible device.
#include <gtest/gtest.h>

#include <string>

#include "device_pick.h"

namespace troupe::kernels::cuda {
namespace {

DevicePickEnv ranks(const char* rank, const char* size) {
  DevicePickEnv e;
  e.local_rank = rank;
  e.local_rank_name = "OMPI_COMM_WORLD_LOCAL_RANK";
  e.local_size = size;
  return e;
}

TEST(CudaDevicePick, OneRankPerGpu) {
  EXPECT_EQ(*pick_cuda_device(2, DevicePickEnv{}, false), 0);  // no launcher: device 0
  EXPECT_EQ(*pick_cuda_device(4, ranks("0", "4"), false), 0);
  EXPECT_EQ(*pick_cuda_device(4, ranks("3", "4"), false), 3);
  EXPECT_EQ(*pick_cuda_device(4, ranks("1", nullptr), false), 1);
}

TEST(CudaDevicePick, MoreRanksThanGpusIsAnErrorUnlessShared) {
  auto r = pick_cuda_device(2, ranks("2", "3"), false);
  ASSERT_FALSE(r.ok());
  std::string m = r.error().message;
  EXPECT_NE(m.find("3 ranks on this node (OMPI_COMM_WORLD_LOCAL_RANK=2) but 2 visible GPU(s)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("policy.share_gpu: true"), std::string::npos) << m;
  // Rank 0 of the same node fails too (the node's size says so), not only the rank that would collide.
  r = pick_cuda_device(2, ranks("0", "3"), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("3 ranks on this node"), std::string::npos) << r.error().message;
  // Without a local size, the rank alone shows it.
  r = pick_cuda_device(1, ranks("1", nullptr), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("2 ranks on this node"), std::string::npos) << r.error().message;
  // policy.share_gpu: rank r on GPU r modulo the count.
  EXPECT_EQ(*pick_cuda_device(2, ranks("2", "3"), true), 0);
  EXPECT_EQ(*pick_cuda_device(2, ranks("1", "3"), true), 1);
}

TEST(CudaDevicePick, ExplicitDeviceMustExist) {
  DevicePickEnv e = ranks("5", "8");
  e.troupe_cuda_device = "1";
  EXPECT_EQ(*pick_cuda_device(2, e, false), 1);  // TROUPE_CUDA_DEVICE wins over the rank
  e.troupe_cuda_device = "2";
  auto r = pick_cuda_device(2, e, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("TROUPE_CUDA_DEVICE=2 is not a device of this process (it sees 2)"),
            std::string::npos)
      << r.error().message;
  EXPECT_FALSE(pick_cuda_device(0, DevicePickEnv{}, true).ok());
}

}  // namespace
}  // namespace troupe::kernels::cuda
