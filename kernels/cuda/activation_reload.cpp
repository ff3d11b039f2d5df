// Double-buffered activation reload (activation_reload.h).
#include "activation_reload.h"

#include <string>

#include "check.h"

namespace troupe::kernels::cuda {

ActivationReload::ActivationReload(const Queue& compute, int layers, size_t floats, bool double_buffer)
    : q_(compute), layers_(layers), floats_(floats), double_buffer_(double_buffer),
      in_flight_(static_cast<size_t>(layers > 0 ? layers : 0), false) {
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  host_ = static_cast<float*>(TROUPE_PINNED_ALLOC(sizeof(float) * floats * static_cast<size_t>(layers)));
  for (int b = 0; b < 2; ++b) {
    dev_[b] = static_cast<float*>(TROUPE_DEVICE_ALLOC(sizeof(float) * floats, q_.stream));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&loaded_[b], cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&released_[b], cudaEventDisableTiming));
  }
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
}

ActivationReload::~ActivationReload() {
  TROUPE_CUDA_REPORT(cudaStreamSynchronize(copy_));
  TROUPE_CUDA_REPORT(cudaStreamSynchronize(q_.stream));
  for (int b = 0; b < 2; ++b) {
    TROUPE_CUDA_REPORT(cudaFree(dev_[b]));
    TROUPE_CUDA_REPORT(cudaEventDestroy(loaded_[b]));
    TROUPE_CUDA_REPORT(cudaEventDestroy(released_[b]));
  }
  TROUPE_CUDA_REPORT(cudaEventDestroy(produced_));
  TROUPE_CUDA_REPORT(cudaFreeHost(host_));
  TROUPE_CUDA_REPORT(cudaStreamDestroy(copy_));
}

void ActivationReload::offload(int layer, const float* device_src) {
  float* dst = host_ + static_cast<size_t>(layer) * floats_;
  TROUPE_CUDA_CHECK(cudaEventRecord(produced_, q_.stream));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, produced_, 0));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, device_src, sizeof(float) * floats_, cudaMemcpyDeviceToHost, copy_));
  in_flight_[static_cast<size_t>(layer)] = false;
}

void ActivationReload::load(int layer) {
  const int b = layer % 2;
  const float* src = host_ + static_cast<size_t>(layer) * floats_;
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, released_[b], 0));  // the buffer's last reader is done
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dev_[b], src, sizeof(float) * floats_, cudaMemcpyHostToDevice, copy_));
  TROUPE_CUDA_CHECK(cudaEventRecord(loaded_[b], copy_));
  in_flight_[static_cast<size_t>(layer)] = true;
}

const float* ActivationReload::acquire(int layer) {
  if (layer < 0 || layer >= layers_) throw CudaError("ActivationReload::acquire: layer " + std::to_string(layer) +
                                                     " outside [0, " + std::to_string(layers_) + ")");
  const int b = layer % 2;
  if (!double_buffer_) {
    // Synchronous baseline: the offload copies must have landed, then one copy on the compute stream.
    TROUPE_CUDA_CHECK(cudaEventRecord(produced_, copy_));
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(q_.stream, produced_, 0));
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dev_[b], host_ + static_cast<size_t>(layer) * floats_, sizeof(float) * floats_,
                                      cudaMemcpyHostToDevice, q_.stream));
    return dev_[b];
  }
  if (!in_flight_[static_cast<size_t>(layer)]) load(layer);
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(q_.stream, loaded_[b], 0));
  if (layer > 0) load(layer - 1);  // overlaps the backward of `layer`
  return dev_[b];
}

void ActivationReload::release(int layer) {
  if (!double_buffer_) return;
  TROUPE_CUDA_CHECK(cudaEventRecord(released_[layer % 2], q_.stream));
}

}  // namespace troupe::kernels::cuda
