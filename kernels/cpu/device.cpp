// CPU side of device discovery: forwards to the CUDA runtime when built with CUDA.
#include "troupe/kernels/device.h"

#if TROUPE_WITH_CUDA
extern "C" int troupe_cuda_device_count_impl();
#endif

namespace troupe::kernels {

int cuda_device_count() {
#if TROUPE_WITH_CUDA
  int n = troupe_cuda_device_count_impl();
  return n > 0 ? n : 0;
#else
  return 0;
#endif
}

}  // namespace troupe::kernels
