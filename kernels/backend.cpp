// Device-neutral half of the backend seam (backend.h): Buffer ownership, alloc/grow over a
// backend's raw memory, and backend_for, the one place that maps a device name to a backend.
#include "troupe/kernels/backend.h"

#include <algorithm>
#include <string>
#include <utility>

namespace troupe::kernels {

#if TROUPE_WITH_CUDA
Result<const Backend*> cuda_backend();  // kernels/cuda/cuda_backend.cpp
#endif

Buffer::Buffer(Buffer&& o) noexcept
    : backend_(std::exchange(o.backend_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = std::exchange(o.backend_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (backend_ && data_) backend_->free_bytes(data_, bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void Backend::chunked_logprob_fused(float* logp, float* entropy, float* lse, float* dh, float* dW, const float* dlogp,
                                    const float* dentropy, const RowLossGrad& grad, const float* h, const float* W,
                                    const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                    float* scratch) const {
  chunked_logprob_forward(logp, entropy, lse, h, W, targets, temperature, N, C, V, chunk, scratch);
  if (N > 0) grad(0, N);
  chunked_logprob_backward(dh, dW, dlogp, dentropy, h, W, lse, entropy, targets, temperature, N, C, V, chunk, scratch);
}

Result<std::unique_ptr<DeviceCollective>> Backend::join_collective(const std::vector<uint8_t>&, int, int) const {
  return invalid_input(std::string(name()) + " backend: no device collectives (reduce host copies instead)");
}

Result<Buffer> Backend::alloc(size_t bytes) const {
  if (bytes == 0) return Buffer(this, nullptr, 0);
  void* p = alloc_bytes(bytes);
  if (!p)
    return make_error(ErrorCode::internal, std::string(name()) + " backend: out of memory allocating " +
                                               std::to_string(bytes) + " bytes");
  return Buffer(this, p, bytes);
}

Status Backend::grow(Buffer& buf, size_t bytes) const {
  if (buf.backend() == this && buf.bytes() >= bytes) return {};
  TROUPE_ASSIGN_OR_RETURN(Buffer bigger, alloc(bytes));
  if (buf.data()) copy_device_to_device(bigger.data(), buf.data(), std::min(buf.bytes(), bytes));
  buf = std::move(bigger);
  return {};
}

Result<const Backend*> backend_for(std::string_view device) {
  if (device == "cpu") return &cpu_backend();
  if (device == "cpu_fenced") return &cpu_fenced_backend();
  if (device == "cuda") {
#if TROUPE_WITH_CUDA
    return cuda_backend();
#else
    return invalid_input("this build of troupe has no CUDA (configure with nvcc installed, TROUPE_CUDA=ON); use cpu");
#endif
  }
  std::string msg = "'";
  msg.append(device);
  msg.append("' is not a device troupe knows; use cpu, cuda or cpu_fenced");
  return invalid_input(std::move(msg));
}

}  // namespace troupe::kernels
