// CPU side of device discovery: forwards to the CUDA runtime when built with CUDA.
#include "troupe/kernels/device.h"

#include <atomic>

#if TROUPE_WITH_CUDA
extern "C" int troupe_cuda_device_count_impl();
#endif

namespace troupe::kernels {

namespace {
std::atomic<int> runtime_queries{0};
}  // namespace

int cuda_runtime_queries() { return runtime_queries.load(); }

int cuda_device_count() {
#if TROUPE_WITH_CUDA
  runtime_queries.fetch_add(1);
  int n = troupe_cuda_device_count_impl();
  return n > 0 ? n : 0;
#else
  return 0;
#endif
}

}  // namespace troupe::kernels
