// CPU side of device discovery: forwards to the CUDA runtime when built with CUDA.
#include "troupe/kernels/device.h"

#include <atomic>
#include <filesystem>

#if TROUPE_WITH_CUDA
extern "C" int troupe_cuda_device_count_impl();
extern "C" int troupe_cuda_device_probe_impl(int* count, char* err, unsigned long err_len);
#endif

namespace troupe::kernels {

namespace {
std::atomic<int> runtime_queries{0};
std::atomic<bool> share_gpu{false};
}  // namespace

int cuda_runtime_queries() { return runtime_queries.load(); }
void set_cuda_share_gpu(bool share) { share_gpu.store(share); }
bool cuda_share_gpu() { return share_gpu.load(); }

int cuda_device_count() {
#if TROUPE_WITH_CUDA
  runtime_queries.fetch_add(1);
  int n = troupe_cuda_device_count_impl();
  return n > 0 ? n : 0;
#else
  return 0;
#endif
}

CudaProbe classify_cuda_probe(int status, int count, const std::string& error, bool device_nodes) {
  CudaProbe p;
  if (status == 0) p.devices = count > 0 ? count : 0;
  else if (status != 1 && device_nodes) p.error = error;  // a GPU is there, CUDA cannot start on it
  return p;
}

bool nvidia_device_nodes_exist() {
  std::error_code ec;
  for (int i = 0; i < 64; ++i)
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i), ec)) return true;
  return false;
}

CudaProbe cuda_probe() {
#if TROUPE_WITH_CUDA
  runtime_queries.fetch_add(1);
  int count = 0;
  char err[256] = {0};
  const int status = troupe_cuda_device_probe_impl(&count, err, sizeof err);
  return classify_cuda_probe(status, count, err, nvidia_device_nodes_exist());
#else
  return {};
#endif
}

}  // namespace troupe::kernels
