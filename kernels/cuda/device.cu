// CUDA device discovery. Treats every CUDA error as "no GPU" (e.g. error 35, insufficient driver).
#include <cuda_runtime.h>

extern "C" int troupe_cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}
