// Double-buffered activation reload (activation_reload.h).
#include "activation_reload.h"

#include <string>

#include "check.h"
#include "offload_bounds.h"

namespace troupe::kernels::cuda {

ActivationReload::ActivationReload(const Queue& compute, int layers, size_t floats, bool double_buffer)
    : q_(compute), layers_(layers), floats_(floats), double_buffer_(double_buffer),
      offloaded_(static_cast<size_t>(layers > 0 ? layers : 0), nullptr),
      n_(static_cast<size_t>(layers > 0 ? layers : 0), floats),
      in_flight_(static_cast<size_t>(layers > 0 ? layers : 0), false) {
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  host_ = static_cast<float*>(TROUPE_PINNED_ALLOC(sizeof(float) * floats * static_cast<size_t>(layers)));
  for (int b = 0; b < 2; ++b) {
    dev_[b] = static_cast<float*>(TROUPE_DEVICE_ALLOC(sizeof(float) * floats, q_.stream));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&loaded_[b], cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&released_[b], cudaEventDisableTiming));
  }
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
  for (auto& e : offloaded_) TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
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
  for (auto& e : offloaded_)
    if (e) TROUPE_CUDA_REPORT(cudaEventDestroy(e));
  TROUPE_CUDA_REPORT(cudaFreeHost(host_));
  TROUPE_CUDA_REPORT(cudaStreamDestroy(copy_));
}

void ActivationReload::offload(int layer, const float* device_src, size_t n) {
  if (layer < 0 || layer >= layers_) throw CudaError("ActivationReload::offload: layer " + std::to_string(layer) +
                                                     " outside [0, " + std::to_string(layers_) + ")");
  const size_t l = static_cast<size_t>(layer);
  const Result<size_t> floats = offload_floats(layer, n, floats_);
  if (!floats.ok()) throw CudaError("ActivationReload::offload: " + floats.error().message);
  n_[l] = *floats;
  float* dst = host_ + l * floats_;
  TROUPE_CUDA_CHECK(cudaEventRecord(produced_, q_.stream));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, produced_, 0));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, device_src, sizeof(float) * n_[l], cudaMemcpyDeviceToHost, copy_));
  TROUPE_CUDA_CHECK(cudaEventRecord(offloaded_[l], copy_));
  in_flight_[l] = false;
}

void ActivationReload::synchronize() {
  TROUPE_CUDA_REPORT(cudaStreamSynchronize(copy_));
  TROUPE_CUDA_REPORT(cudaStreamSynchronize(q_.stream));
}

void ActivationReload::offload_done(int layer) {
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(q_.stream, offloaded_[static_cast<size_t>(layer)], 0));
}

void ActivationReload::load(int layer) {
  const int b = layer % 2;
  const float* src = host_ + static_cast<size_t>(layer) * floats_;
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, released_[b], 0));  // the buffer's last reader is done
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dev_[b], src, sizeof(float) * n_[static_cast<size_t>(layer)],
                                    cudaMemcpyHostToDevice, copy_));
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
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dev_[b], host_ + static_cast<size_t>(layer) * floats_,
                                      sizeof(float) * n_[static_cast<size_t>(layer)], cudaMemcpyHostToDevice,
                                      q_.stream));
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

namespace {

class CudaLayerOffload final : public LayerOffload {
 public:
  CudaLayerOffload(const Queue& q, const OffloadOptions& o) : q_(q), options_(o), reload_(q, o.num_layers, o.max_floats, o.double_buffer) {}
  bool offloaded(int l) const override { return offloads_layer(options_, l); }
  Status offload_begin(int l, const float* x, size_t n) override {
    return guarded(l, "offload_begin", [&] { reload_.offload(l, x, n); });
  }
  Status offload_wait(int l) override { return guarded(l, "offload_wait", [&] { reload_.offload_done(l); }); }
  Status reload_begin(int l) override { return guarded(l, "reload_begin", [] {}); }  // acquire(l+1) started it
  Result<const float*> reload_wait(int l) override {
    const float* x = nullptr;
    TROUPE_TRY(guarded(l, "reload_wait", [&] { x = reload_.acquire(l); }));
    return x;
  }
  Status reload_release(int l) override { return guarded(l, "reload_release", [&] { reload_.release(l); }); }
  size_t reload_buffer_bytes() const override { return 2 * options_.max_floats * sizeof(float); }
  const OffloadOptions& options() const override { return options_; }
  void synchronize() override { reload_.synchronize(); }

 private:
  template <class F>
  Status guarded(int l, const char* what, F&& f) {
    if (!offloaded(l))
      return invalid_input(std::string("activation offload: ") + what + ": layer " + std::to_string(l) +
                           " is not offloaded");
    try {
      f();
    } catch (const CudaError& e) {
      return make_error(ErrorCode::internal, std::string("activation offload: ") + what + ": " + e.what());
    }
    return {};
  }
  Queue q_;
  OffloadOptions options_;
  ActivationReload reload_;
};

}  // namespace

Result<std::unique_ptr<LayerOffload>> make_cuda_layer_offload(const Queue& q, const OffloadOptions& options) {
  if (options.num_layers <= 0 || options.max_floats == 0)
    return invalid_input("activation offload: num_layers and max_floats must be > 0");
  try {
    return std::unique_ptr<LayerOffload>(new CudaLayerOffload(q, options));
  } catch (const CudaError& e) {
    return make_error(ErrorCode::internal, std::string("activation offload on cuda: ") + e.what());
  }
}

}  // namespace troupe::kernels::cuda
