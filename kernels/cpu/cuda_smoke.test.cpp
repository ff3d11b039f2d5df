// kernels.cuda_smoke: proves the CUDA path links and, where a GPU exists, runs. Skipped (exit 77) without one.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "troupe/kernels/device.h"

TEST(CudaSmoke, DeviceCountIsNonNegative) { EXPECT_GE(troupe::kernels::cuda_device_count(), 0); }

int main(int argc, char** argv) {
  if (troupe::kernels::cuda_device_count() == 0) {
    std::printf("no usable CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
