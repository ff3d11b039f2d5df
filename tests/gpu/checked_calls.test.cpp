// gpu.checked_calls: the checked-call layer on a real device: an impossible allocation is an
// error naming the bytes asked for (Backend::alloc and device_alloc), a failing CUDA call throws
// CudaError with the file, line, call and CUDA's error string, as does a failing cuBLAS call.
#include <string>

#include "check.h"
#include "gpu_test.h"
#include "launchers.h"

int main() {
  using namespace troupe::gpu_test;
  namespace cu = troupe::kernels::cuda;
  return run_gpu_test("gpu.checked_calls", [] {
    const k::Backend& g = cuda();
    const size_t huge = size_t(1) << 52;  // 4 PiB
    auto r = g.alloc(huge);
    GPU_CHECK(!r.ok(), "a 4 PiB allocation fails");
    if (!r.ok()) GPU_CHECK(r.error().message.find(std::to_string(huge)) != std::string::npos, r.error().message);
    try {
      (void)TROUPE_DEVICE_ALLOC(huge, nullptr);
      GPU_CHECK(false, "device_alloc of 4 PiB threw nothing");
    } catch (const cu::CudaError& e) {
      const std::string m = e.what();
      GPU_CHECK(m.find(std::to_string(huge)) != std::string::npos, m);
      GPU_CHECK(m.find("checked_calls.test.cpp:") != std::string::npos, m);
      GPU_CHECK(m.find("free") != std::string::npos, m);
    }
    try {
      TROUPE_CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<void*>(16), 64, cudaMemcpyDeviceToDevice));
      GPU_CHECK(false, "a bad cudaMemcpy threw nothing");
    } catch (const cu::CudaError& e) {
      const std::string m = e.what();
      GPU_CHECK(m.find("cudaMemcpy") != std::string::npos && m.find("checked_calls.test.cpp:") != std::string::npos, m);
      std::printf("CUDA error as reported: %s\n", m.c_str());
    }
    try {
      const auto& q = cu::backend_queue(g);
      cu::gemm(q, false, false, 4, 4, 4, 1.0f, nullptr, 0, nullptr, 0, 0.0f, nullptr, 0);  // lda 0: invalid
      g.synchronize();
      GPU_CHECK(false, "an invalid cuBLAS call threw nothing");
    } catch (const cu::CudaError& e) {
      const std::string m = e.what();
      GPU_CHECK(m.find("cublasSgemm") != std::string::npos && m.find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos, m);
      std::printf("cuBLAS error as reported: %s\n", m.c_str());
    }
  });
}
