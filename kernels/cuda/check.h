// Checked calls into CUDA, cuBLAS and NCCL: every call the CUDA backend makes goes through one of
// these macros (destructors and frees, which must not throw, use TROUPE_CUDA_REPORT: the same
// message on stderr), and a failure throws CudaError whose message names the call, the file and line it
// was made from and the library's own error string (cudaGetErrorString, cublasGetStatusString,
// ncclGetErrorString). Device allocations go through device_alloc, whose out-of-memory error names
// the bytes asked for and what the device had free. The backend table's ops return nothing, so an
// error inside one is an exception; Backend::alloc turns a failed allocation into a Result.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace troupe::kernels::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "FILE:LINE: CALL failed: WHAT"; the message of every CudaError.
std::string call_error_message(const char* call, const char* file, int line, const std::string& what);

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
// For destructors and frees, which must not throw: the same message on stderr.
void report_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);
// NCCL's result is passed as an int so this header does not need nccl.h.
[[noreturn]] void throw_nccl_error(int result, const char* call, const char* file, int line);

// cudaMalloc of `bytes`, zero-filled on `stream`; on failure a CudaError naming the size (and, on
// out-of-memory, the device's free and total bytes). bytes == 0 gives nullptr.
void* device_alloc(size_t bytes, cudaStream_t stream, const char* file, int line);
void device_grow(void*& data, size_t& bytes, size_t need, cudaStream_t stream, const char* file, int line);
// cudaMallocHost (pinned host memory) with the same error.
void* pinned_alloc(size_t bytes, const char* file, int line);

}  // namespace troupe::kernels::cuda

#define TROUPE_CUDA_CHECK(call)                                                                 \
  do {                                                                                          \
    const cudaError_t troupe_cuda_err_ = (call);                                                \
    if (troupe_cuda_err_ != cudaSuccess)                                                        \
      ::troupe::kernels::cuda::throw_cuda_error(troupe_cuda_err_, #call, __FILE__, __LINE__);   \
  } while (0)

#define TROUPE_CUDA_REPORT(call)                                                                \
  do {                                                                                          \
    const cudaError_t troupe_cuda_err_ = (call);                                                \
    if (troupe_cuda_err_ != cudaSuccess)                                                        \
      ::troupe::kernels::cuda::report_cuda_error(troupe_cuda_err_, #call, __FILE__, __LINE__);  \
  } while (0)

#define TROUPE_CUBLAS_CHECK(call)                                                               \
  do {                                                                                          \
    const cublasStatus_t troupe_cublas_st_ = (call);                                            \
    if (troupe_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::troupe::kernels::cuda::throw_cublas_error(troupe_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

#define TROUPE_NCCL_CHECK(call)                                                                 \
  do {                                                                                          \
    const int troupe_nccl_res_ = static_cast<int>(call);                                        \
    if (troupe_nccl_res_ != 0)                                                                  \
      ::troupe::kernels::cuda::throw_nccl_error(troupe_nccl_res_, #call, __FILE__, __LINE__);   \
  } while (0)

#define TROUPE_DEVICE_ALLOC(bytes, stream) ::troupe::kernels::cuda::device_alloc((bytes), (stream), __FILE__, __LINE__)
// A device workspace (data, bytes) grown to at least `need` bytes: the stream is waited for first
// (queued work may still read the old block), which is then freed and replaced (zero-filled).
#define TROUPE_DEVICE_GROW(data, bytes, need, stream) \
  ::troupe::kernels::cuda::device_grow((data), (bytes), (need), (stream), __FILE__, __LINE__)
#define TROUPE_PINNED_ALLOC(bytes) ::troupe::kernels::cuda::pinned_alloc((bytes), __FILE__, __LINE__)
