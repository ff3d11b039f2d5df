// kernels.cuda_host_decisions (CUDA start-up): only "no device" means no GPU; CUDA failing to
// start where a GPU's device nodes are is an error naming the CUDA error.
#include <gtest/gtest.h>

#include <string>

#include "troupe/kernels/device.h"

namespace troupe::kernels {
namespace {

// Only "no device" skips the GPU tests; CUDA failing where a GPU's device nodes are is an error.
TEST(CudaProbe, OnlyNoDeviceMeansNoGpu) {
  EXPECT_EQ(classify_cuda_probe(0, 2, "", true).devices, 2);
  EXPECT_TRUE(classify_cuda_probe(0, 2, "", true).error.empty());
  const CudaProbe none = classify_cuda_probe(1, 0, "", true);  // cudaErrorNoDevice
  EXPECT_EQ(none.devices, 0);
  EXPECT_TRUE(none.error.empty());
  const std::string old_driver =
      "cudaGetDeviceCount failed: cudaErrorInsufficientDriver (CUDA driver version is "
      "insufficient for CUDA runtime version)";
  const CudaProbe broken = classify_cuda_probe(2, 0, old_driver, true);
  EXPECT_EQ(broken.devices, 0);
  EXPECT_EQ(broken.error, old_driver);
  // No /dev/nvidia* at all: whatever the runtime says, there is no GPU to fail on.
  EXPECT_TRUE(classify_cuda_probe(2, 0, old_driver, false).error.empty());
}

// This machine: the probe agrees with its device nodes (no nodes: no error, whatever CUDA says).
TEST(CudaProbe, ThisMachine) {
  const CudaProbe p = cuda_probe();
  if (!nvidia_device_nodes_exist()) {
    EXPECT_TRUE(p.error.empty()) << p.error;
    EXPECT_EQ(p.devices, 0);
  }
}

}  // namespace
}  // namespace troupe::kernels
