// CUDA device discovery: how many devices cudaGetDeviceCount reports, and, when it fails, whether
// that is "no device" or another start-up error (named), so callers can tell the two apart.
#include <cuda_runtime.h>

#include <cstdio>

extern "C" int troupe_cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

// The device count in *count (0 on failure); returns 0 on success, 1 for cudaErrorNoDevice, 2 for
// any other error, whose name and text go to err.
extern "C" int troupe_cuda_device_probe_impl(int* count, char* err, unsigned long err_len) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  *count = e == cudaSuccess ? n : 0;
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError();
  if (e == cudaErrorNoDevice) return 1;
  std::snprintf(err, err_len, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorName(e),
                cudaGetErrorString(e));
  return 2;
}
