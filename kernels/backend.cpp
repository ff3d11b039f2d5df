// Device-neutral half of the backend seam (backend.h): BackendMemory (Buffer, HostBuffer) ownership, alloc/grow
// over a backend's raw memory, the synchronous defaults of the copy queue, and backend_for, the
// one place that maps a device name to a backend.
#include "troupe/kernels/backend.h"
#include "troupe/kernels/moe_expert_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace troupe::kernels {

#if TROUPE_WITH_CUDA
Result<const Backend*> cuda_backend();  // kernels/cuda/cuda_backend.cpp
#endif

template <MemorySide Side>
BackendMemory<Side>::BackendMemory(BackendMemory&& o) noexcept
    : backend_(std::exchange(o.backend_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

template <MemorySide Side>
BackendMemory<Side>& BackendMemory<Side>::operator=(BackendMemory&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = std::exchange(o.backend_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

template <MemorySide Side>
BackendMemory<Side>::~BackendMemory() {
  release();
}

template <MemorySide Side>
void BackendMemory<Side>::release() {
  if (backend_ && data_) {
    if constexpr (Side == MemorySide::device) {
      backend_->free_bytes(data_, bytes_);
    } else {
      backend_->free_host_bytes(data_, bytes_);
    }
  }
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

template class BackendMemory<MemorySide::device>;
template class BackendMemory<MemorySide::host>;

void* Backend::alloc_host_bytes(size_t bytes) const { return std::calloc(bytes, 1); }
void Backend::free_host_bytes(void* data, size_t) const { std::free(data); }

Result<HostBuffer> Backend::alloc_host(size_t bytes, std::string_view what) const {
  if (bytes == 0) return HostBuffer(this, nullptr, 0);
  void* p = alloc_host_bytes(bytes);
  if (!p)
    return make_error(ErrorCode::internal, std::string(name()) + " backend: out of pinned host memory allocating " +
                                               (what.empty() ? std::string("a host buffer") : std::string(what)) +
                                               " (" + std::to_string(bytes) + " bytes)");
  return HostBuffer(this, p, bytes);
}

// The default copy queue is the op queue: the copy is done on return (cpu).
CopyTicket Backend::copy_to_host_async(void* host_dst, const void* src, size_t bytes) const {
  copy_device_to_host(host_dst, src, bytes);
  return CopyTicket{1};
}

void Backend::chunked_logprob_fused(float* logp, float* entropy, float* lse, float* dh, float* dW, const float* dlogp,
                                    const float* dentropy, const RowLossGrad& grad, const float* h, const float* W,
                                    const int32_t* targets, float temperature, int N, int C, int V, int chunk,
                                    float* scratch) const {
  chunked_logprob_forward(logp, entropy, lse, h, W, targets, temperature, N, C, V, chunk, scratch);
  if (N > 0) grad(0, N);
  chunked_logprob_backward(dh, dW, dlogp, dentropy, h, W, lse, entropy, targets, temperature, N, C, V, chunk, scratch);
}

namespace {

// Backend::make_layer_offload's default: the backend's synchronous copies, one reload buffer.
class CopyingLayerOffload final : public LayerOffload {
 public:
  CopyingLayerOffload(const Backend& be, const OffloadOptions& o, Buffer reload)
      : be_(be), options_(o), store_(static_cast<size_t>(o.num_layers) * o.max_floats),
        stored_(static_cast<size_t>(o.num_layers), 0), reload_(std::move(reload)) {}
  bool offloaded(int l) const override { return offloads_layer(options_, l); }
  Status offload_begin(int l, const float* x, size_t n) override {
    TROUPE_TRY(check(l, n, "offload_begin"));
    be_.copy_device_to_host(slot(l), x, n * sizeof(float));  // waits for the queue: x is final
    stored_[static_cast<size_t>(l)] = n;
    return {};
  }
  Status offload_wait(int l) override { return check(l, 0, "offload_wait"); }
  Status reload_begin(int l) override { return check(l, 0, "reload_begin"); }
  Result<const float*> reload_wait(int l) override {
    TROUPE_TRY(check(l, 0, "reload_wait"));
    // The one buffer's last reader (layer l+1's backward) was queued before: the queue orders them.
    be_.copy_host_to_device(reload_.data(), slot(l), stored_[static_cast<size_t>(l)] * sizeof(float));
    return reload_.floats();
  }
  Status reload_release(int l) override { return check(l, 0, "reload_release"); }
  size_t reload_buffer_bytes() const override { return reload_.bytes(); }
  const OffloadOptions& options() const override { return options_; }
  void synchronize() override { be_.synchronize(); }

 private:
  float* slot(int l) { return store_.data() + static_cast<size_t>(l) * options_.max_floats; }
  Status check(int l, size_t n, const char* what) const {
    if (!offloaded(l))
      return invalid_input(std::string("activation offload: ") + what + ": layer " + std::to_string(l) +
                           " is not offloaded");
    if (n > options_.max_floats)
      return invalid_input(std::string("activation offload: ") + what + ": " + std::to_string(n) +
                           " floats exceed the slot's " + std::to_string(options_.max_floats));
    return {};
  }
  const Backend& be_;
  OffloadOptions options_;
  std::vector<float> store_;
  std::vector<size_t> stored_;
  Buffer reload_;
};

}  // namespace

Result<std::unique_ptr<LayerOffload>> Backend::make_layer_offload(const OffloadOptions& o) const {
  if (o.num_layers <= 0 || o.max_floats == 0)
    return invalid_input("activation offload: num_layers and max_floats must be > 0");
  TROUPE_ASSIGN_OR_RETURN(Buffer reload, alloc(o.max_floats * sizeof(float)));
  return std::unique_ptr<LayerOffload>(new CopyingLayerOffload(*this, o, std::move(reload)));
}

Status Backend::graph_begin() const {
  return make_error(ErrorCode::internal, std::string(name()) + " backend: no recorded op sequences (graphs)");
}
Status Backend::graph_end(uint64_t) const { return graph_begin(); }
Status Backend::graph_launch(uint64_t) const { return graph_begin(); }

Result<std::unique_ptr<DeviceCollective>> Backend::join_collective(const std::vector<uint8_t>&, int, int) const {
  return invalid_input(std::string(name()) + " backend: no device collectives (reduce host copies instead)");
}

Result<std::unique_ptr<MoeExchange>> Backend::join_expert_exchange(const std::vector<uint8_t>&, int, int) const {
  return std::unique_ptr<MoeExchange>();
}

namespace {
Status no_expert_parallel_layer(const Backend& be) {
  return invalid_input(std::string(be.name()) + " backend: no expert-parallel MoE layer (policy.moe.expert_parallel)");
}
}  // namespace

Status Backend::moe_ep_forward(float*, float*, MoeStats*, const float*, const MoeWeights&, const MoeConfig&, int, float*,
                               const int32_t*, const MoeExpertGroup&) const {
  return no_expert_parallel_layer(*this);
}
Status Backend::moe_ep_backward(float*, const MoeGrads&, const float*, float, const float*, const float*,
                                const MoeWeights&, const MoeConfig&, int, float*, const MoeExpertGroup&) const {
  return no_expert_parallel_layer(*this);
}
Status Backend::moe_ep_serve_forward(const MoeWeights&, const MoeConfig&, const MoeExpertGroup&) const {
  return no_expert_parallel_layer(*this);
}
Status Backend::moe_ep_serve_backward(const MoeGrads&, const MoeWeights&, const MoeConfig&,
                                      const MoeExpertGroup&) const {
  return no_expert_parallel_layer(*this);
}

Result<Buffer> Backend::alloc(size_t bytes, std::string_view what) const {
  if (bytes == 0) return Buffer(this, nullptr, 0);
  void* p = alloc_bytes(bytes);
  if (!p) {
    std::string msg = std::string(name()) + " backend: out of memory allocating ";
    msg += what.empty() ? std::string("a buffer") : std::string(what);
    msg += " (" + std::to_string(bytes) + " bytes)";
    if (const std::string report = memory_report(); !report.empty()) msg += "; " + report;
    return make_error(ErrorCode::internal, std::move(msg));
  }
  return Buffer(this, p, bytes);
}

Result<Buffer> Backend::alloc_sparse(size_t bytes, std::string_view what) const {
  const std::string name_of = what.empty() ? std::string("a sparse buffer") : std::string(what);
  if (sparse_granularity() == 0)
    return make_error(ErrorCode::internal, std::string(name()) + " backend: no sparse buffers (" + name_of + ")");
  if (bytes == 0) return Buffer(this, nullptr, 0);
  void* p = reserve_sparse_bytes(bytes);
  if (!p)
    return make_error(ErrorCode::internal, std::string(name()) + " backend: could not reserve the addresses of " +
                                               name_of + " (" + std::to_string(bytes) + " bytes)");
  return Buffer(this, p, bytes);
}

Status Backend::map_sparse(const Buffer&, size_t, size_t) const {
  return make_error(ErrorCode::internal, std::string(name()) + " backend: no sparse buffers");
}
Status Backend::unmap_sparse(const Buffer&, size_t, size_t) const {
  return make_error(ErrorCode::internal, std::string(name()) + " backend: no sparse buffers");
}

std::vector<std::pair<size_t, size_t>> Backend::mapped_ranges(const Buffer& buf) const {
  if (buf.bytes() == 0) return {};
  return {{0, buf.bytes()}};
}

Status Backend::grow(Buffer& buf, size_t bytes, std::string_view what) const {
  if (buf.backend() == this && buf.bytes() >= bytes) return {};
  TROUPE_ASSIGN_OR_RETURN(Buffer bigger, alloc(bytes, what));
  if (buf.data()) copy_device_to_device(bigger.data(), buf.data(), std::min(buf.bytes(), bytes));
  buf = std::move(bigger);
  return {};
}

Status check_device_built(std::string_view device) {
  if (device == "cpu" || device == "cpu_fenced") return {};
  if (device == "cuda") {
#if TROUPE_WITH_CUDA
    return {};
#else
    return invalid_input("this build of troupe has no CUDA (configure with nvcc installed, TROUPE_CUDA=ON); use cpu");
#endif
  }
  std::string msg = "'";
  msg.append(device);
  msg.append("' is not a device troupe knows; use cpu, cuda or cpu_fenced");
  return invalid_input(std::move(msg));
}

Result<const Backend*> backend_for(std::string_view device) {
  TROUPE_TRY(check_device_built(device));  // an unknown name, or cuda in a build without it
  if (device == "cpu") return &cpu_backend();
  if (device == "cpu_fenced") return &cpu_fenced_backend();
#if TROUPE_WITH_CUDA
  return cuda_backend();  // (check_device_built accepted only cuda beyond the two above)
#else
  return make_error(ErrorCode::internal, "backend_for: no backend for '" + std::string(device) + "'");
#endif
}

Result<const Backend*> backend_for(DeviceKind device) { return backend_for(enum_name(device)); }

void Backend::quant_projections_forward(const QuantProjection* p, int n, const float* x, int T) const {
  for (int i = 0; i < n; ++i) {
    quant_matmul_forward(p[i].y, x, p[i].W, T);
    if (p[i].A) lora_forward(p[i].y, x, p[i].A, p[i].B, p[i].scratch, T, p[i].W.cols, p[i].W.rows, p[i].r, p[i].scale);
  }
}

}  // namespace troupe::kernels
