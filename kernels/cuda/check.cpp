// The checked-call layer (check.h): error messages and the checked allocators.
#include "check.h"

#include <cstdio>

#if TROUPE_HAVE_NCCL
#include <nccl.h>
#endif

namespace troupe::kernels::cuda {

std::string call_error_message(const char* call, const char* file, int line, const std::string& what) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + what;
}

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  const std::string what = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
  (void)cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  throw CudaError(call_error_message(call, file, line, what));
}

void report_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  const std::string what = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
  (void)cudaGetLastError();
  std::fprintf(stderr, "troupe: %s\n", call_error_message(call, file, line, what).c_str());
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw CudaError(call_error_message(call, file, line, std::string(cublasGetStatusName(st)) + " (" +
                                                           cublasGetStatusString(st) + ")"));
}

void throw_nccl_error(int result, const char* call, const char* file, int line) {
#if TROUPE_HAVE_NCCL
  const std::string what = ncclGetErrorString(static_cast<ncclResult_t>(result));
#else
  const std::string what = "NCCL error " + std::to_string(result);
#endif
  throw CudaError(call_error_message(call, file, line, what));
}

namespace {
std::string oom_message(size_t bytes) {
  size_t free_b = 0, total_b = 0;
  std::string what = "out of memory asking for " + std::to_string(bytes) + " bytes";
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    what += " (device has " + std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free)";
  (void)cudaGetLastError();
  return what;
}
}  // namespace

void* device_alloc(size_t bytes, cudaStream_t stream, const char* file, int line) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw CudaError(call_error_message("cudaMalloc", file, line, oom_message(bytes)));
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaMalloc", file, line);
  const cudaError_t zero = cudaMemsetAsync(p, 0, bytes, stream);
  if (zero != cudaSuccess) {
    cudaFree(p);
    throw_cuda_error(zero, "cudaMemsetAsync", file, line);
  }
  return p;
}

void device_grow(void*& data, size_t& bytes, size_t need, cudaStream_t stream, const char* file, int line) {
  if (need <= bytes) return;
  const cudaError_t wait = cudaStreamSynchronize(stream);
  if (wait != cudaSuccess) throw_cuda_error(wait, "cudaStreamSynchronize", file, line);
  if (data) {
    const cudaError_t freed = cudaFree(data);
    if (freed != cudaSuccess) throw_cuda_error(freed, "cudaFree", file, line);
  }
  data = nullptr;
  bytes = 0;
  data = device_alloc(need, stream, file, line);
  bytes = need;
}

void* pinned_alloc(size_t bytes, const char* file, int line) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw CudaError(call_error_message("cudaMallocHost", file, line,
                                       "out of pinned host memory asking for " + std::to_string(bytes) + " bytes"));
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaMallocHost", file, line);
  return p;
}

}  // namespace troupe::kernels::cuda
