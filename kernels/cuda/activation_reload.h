// Double-buffered activation reload on the GPU: per-layer activations are offloaded to pinned host
// memory during the forward and reloaded for the backward, last layer first. With double
// buffering, a dedicated copy stream loads layer l-1 into the second of two device buffers while
// the compute stream runs the backward of layer l; events order the two streams (the compute
// stream waits for "loaded", the copy stream for "released"), so there is no device-wide
// synchronization inside the loop. Without it, each reload is a copy on the compute stream (the
// synchronous baseline). Both hand out the same bytes, so results are bit-identical.
//
// Use, for layers L-1 down to 0:  const float* x = r.acquire(l); ...backward of l on the compute
// stream...; r.release(l);  after offload(l, src) for every layer in the forward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "launchers.h"
#include "troupe/kernels/offload.h"

namespace troupe::kernels::cuda {

class ActivationReload {
 public:
  // `layers` slots of `floats` each; pinned host memory for all of them, two device buffers.
  ActivationReload(const Queue& compute, int layers, size_t floats, bool double_buffer);
  ~ActivationReload();
  ActivationReload(const ActivationReload&) = delete;
  ActivationReload& operator=(const ActivationReload&) = delete;

  // Copies layer's activation (device, n floats, default all `floats`) to its host slot once the
  // compute stream has produced it; returns at once (the copy runs on the copy stream).
  void offload(int layer, const float* device_src, size_t n = static_cast<size_t>(-1));
  // Work queued on the compute stream after this call waits for layer's offload copy (so it may
  // overwrite the source).
  void offload_done(int layer);
  // The layer's activation in a device buffer, ready for work queued on the compute stream after
  // this call; prefetches layer-1 when double buffered. Call in descending layer order.
  const float* acquire(int layer);
  // Work on the compute stream that reads acquire(layer)'s buffer has been queued: the buffer may
  // be overwritten after it.
  void release(int layer);
  bool double_buffered() const { return double_buffer_; }
  void synchronize();  // both streams drained (between steps, never inside the loop)

 private:
  void load(int layer);  // queue the host->device copy of `layer` into its buffer on the copy stream
  Queue q_;
  int layers_;
  size_t floats_;
  bool double_buffer_;
  cudaStream_t copy_ = nullptr;
  float* host_ = nullptr;  // pinned, layers * floats
  float* dev_[2] = {nullptr, nullptr};
  cudaEvent_t loaded_[2] = {nullptr, nullptr}, released_[2] = {nullptr, nullptr}, produced_ = nullptr;
  std::vector<cudaEvent_t> offloaded_;  // per layer: its offload copy
  std::vector<size_t> n_;               // per layer: floats offloaded
  std::vector<bool> in_flight_;  // per layer: its load has been queued
};

// The model's layer-input offload (offload.h LayerOffload) on the CUDA backend's queue: an
// ActivationReload with one slot per layer; offload_wait orders the compute stream after the
// layer's offload copy, reload_wait is acquire (which also starts layer-1's reload when double
// buffered), reload_release is release. Errors (CUDA calls, out of memory) come back as Status.
Result<std::unique_ptr<LayerOffload>> make_cuda_layer_offload(const Queue& q, const OffloadOptions& options);

}  // namespace troupe::kernels::cuda
