// kernels.cuda_smoke: proves the CUDA path links and, where a GPU exists, runs. Skipped (exit 77)
// without one; fails when a GPU is there but CUDA cannot start on it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "troupe/kernels/device.h"

TEST(CudaSmoke, DeviceCountIsNonNegative) { EXPECT_GE(troupe::kernels::cuda_device_count(), 0); }

int main(int argc, char** argv) {
  const troupe::kernels::CudaProbe probe = troupe::kernels::cuda_probe();
  if (!probe.error.empty()) {  // a GPU is there but CUDA cannot start: a failure, never a skip
    std::printf("CUDA could not start on this machine's GPU: %s\n", probe.error.c_str());
    return 1;
  }
  if (probe.devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
