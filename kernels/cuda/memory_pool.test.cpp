// kernels.cuda_host_decisions (memory pool report): the out-of-memory detail names what the pool
// holds, what live buffers use and what the device has free, and leaves out figures it lacks.
#include <gtest/gtest.h>

#include <string>

#include "memory_pool.h"

namespace troupe::kernels::cuda {
namespace {

TEST(CudaMemoryPool, ReportNamesThePoolAndTheDevice) {
  PoolFigures f;
  f.reserved = uint64_t(3) << 30;
  f.used = uint64_t(2) << 30;
  f.device_free = uint64_t(1) << 20;
  f.device_total = uint64_t(80) << 30;
  EXPECT_EQ(pool_report(f),
            "the memory pool holds 3072.0 MiB (2048.0 MiB in live buffers, 1024.0 MiB cached for reuse); "
            "the device has 1.0 MiB of 81920.0 MiB free");
  EXPECT_EQ(mib(1536 * 1024), "1.5 MiB");
}

TEST(CudaMemoryPool, UnknownFiguresAreLeftOut) {
  EXPECT_EQ(pool_report({}), "");
  PoolFigures f;
  f.device_free = 0;
  f.device_total = uint64_t(1) << 20;
  EXPECT_EQ(pool_report(f), "the device has 0.0 MiB of 1.0 MiB free");
  f = {};
  f.reserved = 1 << 20;
  EXPECT_EQ(pool_report(f), "the memory pool holds 1.0 MiB");
}

}  // namespace
}  // namespace troupe::kernels::cuda
