// kernels.cuda_checks: the checked-call layer without a GPU: messages name the file, line, call and
// the library's error string; a failing allocation (here: no device, or no memory) is a CudaError
// naming the bytes; a failing CUDA call through TROUPE_CUDA_CHECK throws with this file's name.
#include "check.h"

#include <gtest/gtest.h>

#include <string>

namespace troupe::kernels::cuda {
namespace {

TEST(CudaChecks, MessagesNameFileLineCallAndError) {
  EXPECT_EQ(call_error_message("cudaFoo(x)", "a.cu", 12, "boom"), "a.cu:12: cudaFoo(x) failed: boom");
  try {
    throw_cuda_error(cudaErrorMemoryAllocation, "cudaMalloc(&p, 64)", "b.cu", 7);
    FAIL() << "nothing thrown";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("b.cu:7: cudaMalloc(&p, 64) failed: cudaErrorMemoryAllocation"), std::string::npos) << m;
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
  }
  try {
    throw_cublas_error(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm(...)", "c.cpp", 3);
    FAIL() << "nothing thrown";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("c.cpp:3: cublasSgemm(...) failed: CUBLAS_STATUS_INVALID_VALUE"),
              std::string::npos)
        << e.what();
  }
  try {
    throw_nccl_error(5, "ncclAllReduce(...)", "d.cpp", 9);
    FAIL() << "nothing thrown";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("d.cpp:9: ncclAllReduce(...) failed: "), std::string::npos) << e.what();
  }
}

TEST(CudaChecks, CheckedCallsThrowWithTheirSite) {
  // Without a GPU every call fails (no device / no driver); with one, an impossible size does.
  const size_t huge = size_t(1) << 52;
  try {
    (void)TROUPE_DEVICE_ALLOC(huge, nullptr);
    FAIL() << "a 4 PiB device allocation succeeded";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("check.test.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaMalloc"), std::string::npos) << m;
  }
  try {
    TROUPE_CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<const void*>(16), 64, cudaMemcpyDeviceToDevice));
    FAIL() << "a bad copy succeeded";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("check.test.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaMemcpy(nullptr"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace troupe::kernels::cuda
