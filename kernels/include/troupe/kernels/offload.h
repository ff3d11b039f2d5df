// Activation offload for checkpointed training: a copy engine (one FIFO copy thread on CPU; on
// CUDA a copy stream + pinned buffers + events, kernels/cuda/activation_reload.h, behind the same
// LayerOffload protocol below) and ActivationOffload, which moves each
// checkpointed layer input out of the activation arena into a host store and reloads it in
// backward into one of two reload buffers, so the reload of layer l-1 overlaps layer l's backward.
// Invariant: a reload buffer is never written while a layer still reads it, and never read before
// its copy has completed; the protocol below enforces both and reports misuse as an error.
//
// The CUDA mapping (make_cuda_layer_offload): copy_async = cudaMemcpyAsync on the copy stream + cudaEventRecord;
// wait = cudaStreamWaitEvent(compute stream, event) (host-side: cudaEventSynchronize); the store is
// pinned host memory (cudaHostAlloc); reload_release records an event on the compute stream and the
// next reload into that buffer makes the copy stream wait on it. On CPU the compute "stream" is the
// calling thread, so release is a host-order fact and needs no event.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::kernels {

// ---- Copy engine -------------------------------------------------------------------------------

// Completion marker of one queued copy. A default event (seq 0) was never recorded: waiting on it
// returns at once, as with a CUDA event that was never recorded.
struct CopyEvent {
  uint64_t seq = 0;
};

struct CopyEngineOptions {
  // 0 = unlimited. Otherwise every copy takes at least bytes / bandwidth seconds (emulated PCIe):
  // the copy thread sleeps out the rest, like a DMA engine that does not use a CPU core.
  double bandwidth_bytes_per_s = 0;
  // Injected delay for race tests (null = none): copy i (0-based) sleeps delay_s(i)/2 before it
  // starts and delay_s(i)/2 after copying its first half, so a reader that does not wait sees
  // stale or torn data.
  std::function<double(uint64_t copy_index)> delay_s;
};

struct CopyEngineStats {
  uint64_t copies = 0;
  uint64_t bytes = 0;
  double busy_s = 0;       // time the copy thread spent copying (incl. bandwidth sleeps and delays)
  double host_wait_s = 0;  // time callers spent blocked in wait()/synchronize() (incl. copies they ran)
  uint64_t host_copies = 0;  // copies a waiting host ran itself because the copy thread had not started them
};

// Copies run one at a time in the order they were queued (FIFO): an event completes after its
// copy and every copy queued before it. Thread-safe; usually one host thread queues and waits.
// On CPU the copy thread shares the cores with compute threads: a copy it has not started when the
// host waits for it is run by the waiting host (in FIFO order, one copy at a time, with the same
// bandwidth and delay emulation), so waiting never costs more than copying synchronously would.
class CopyEngine {
 public:
  explicit CopyEngine(CopyEngineOptions options = {});
  ~CopyEngine();  // finishes every queued copy, then joins the copy thread
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Queues memcpy(dst, src, bytes). src must stay unchanged and dst unread until wait(event).
  CopyEvent copy_async(void* dst, const void* src, size_t bytes);
  void wait(CopyEvent event);         // blocks until the event's copy has completed
  bool query(CopyEvent event) const;  // true when completed (never blocks)
  void synchronize();                 // waits for every queued copy

  // Change the emulation between steps (applies to copies queued afterwards).
  void set_bandwidth(double bytes_per_s);
  void set_delay(std::function<double(uint64_t copy_index)> delay_s);

  CopyEngineStats stats() const;
  void reset_stats();

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;
    double bandwidth;
    std::function<double(uint64_t)> delay;
  };
  void run();
  // Runs the front job with mu_ held on entry and exit (released while copying).
  void execute_front(std::unique_lock<std::mutex>& lock, bool by_host);

  mutable std::mutex mu_;
  std::condition_variable queued_cv_;
  std::condition_variable done_cv_;
  std::deque<Job> queue_;
  uint64_t next_seq_ = 1;
  uint64_t done_seq_ = 0;
  uint64_t started_ = 0;    // copies started so far (the delay function's index)
  bool executing_ = false;  // a copy is running (on the copy thread or a waiting host)
  bool stop_ = false;
  double bandwidth_ = 0;
  std::function<double(uint64_t)> delay_;
  CopyEngineStats stats_;
  std::thread thread_;
};

// ---- Offload of checkpointed layer inputs ------------------------------------------------------

struct OffloadOptions {
  int num_layers = 0;          // L checkpointed layers, 0..L-1 in forward order
  size_t max_floats = 0;       // size of the largest layer input, in floats
  bool double_buffer = true;   // two reload buffers (overlap) or one (synchronous reload)
  bool offload_last = false;   // the last layer's backward comes right after the forward, so by
                               // default its input stays in the arena (nothing to overlap)
};

// Protocol (the model calls exactly this; every misuse returns invalid_input naming the layer):
//   forward, for l = 0..L-1 (only where offloaded(l)):
//     offload_begin(l, x_l, n)    after x_l is computed; copies it into store slot l
//     ... run layer l (and later layers, while x_l's arena memory is untouched) ...
//     offload_wait(l)             before the arena memory of x_l is overwritten or freed
//   backward, for l = L-1..0:
//     x = reload_wait(l)          the buffer holding x_l (starts the reload now if nobody did)
//     reload_begin(l-1)           if l-1 is offloaded: reload it into the OTHER buffer while...
//     ... recompute + backward of layer l, reading x ...
//     reload_release(l)           layer l no longer reads x; its buffer may be refilled
//   Not-offloaded layers (offloaded(l) false) keep x_l in the arena and make no calls.
// Buffer reuse rules: reload_begin takes a buffer that is neither held (waited, not released)
// nor loading. With double_buffer that is always the other one; with one buffer, a reload_begin
// while the buffer is held is deferred, and reload_wait then copies synchronously (the
// offload_sync_reload baseline). A buffer's contents are valid from reload_wait(l) until
// reload_release(l). The copy engine's FIFO order makes the next step's offload of slot l wait
// for this step's reload of slot l.
//
// LayerOffload is that protocol; ActivationOffload (over the CPU copy engine) is the model's on
// the cpu backend, and Backend::make_layer_offload gives a device backend's (the CUDA double
// buffer: pinned store, copy stream, events; elsewhere synchronous copies through the backend).
// On a device, x and the reloaded buffers are device memory and "wait" orders the backend's queue.
class LayerOffload {
 public:
  virtual ~LayerOffload() = default;
  virtual bool offloaded(int l) const = 0;  // whether layer l's input goes to the store
  virtual Status offload_begin(int l, const float* x, size_t n) = 0;
  virtual Status offload_wait(int l) = 0;
  virtual Status reload_begin(int l) = 0;
  virtual Result<const float*> reload_wait(int l) = 0;
  virtual Status reload_release(int l) = 0;
  virtual size_t reload_buffer_bytes() const = 0;  // both reload buffers (or the one)
  virtual const OffloadOptions& options() const = 0;
  virtual void synchronize() = 0;  // every copy queued so far has completed
};

// Whether layer l's input is offloaded under these options (every layer but the last, unless
// offload_last): the rule every LayerOffload follows.
inline bool offloads_layer(const OffloadOptions& o, int l) {
  return l >= 0 && l < o.num_layers && (o.offload_last || l != o.num_layers - 1);
}

class ActivationOffload final : public LayerOffload {
 public:
  static Result<std::unique_ptr<ActivationOffload>> create(CopyEngine& engine, const OffloadOptions& options);

  bool offloaded(int l) const override;

  Status offload_begin(int l, const float* x, size_t n) override;
  Status offload_wait(int l) override;
  Status reload_begin(int l) override;
  Result<const float*> reload_wait(int l) override;
  Status reload_release(int l) override;
  void synchronize() override;

  size_t reload_buffer_bytes() const override;  // both reload buffers (or the one)
  size_t store_bytes() const;          // host offload store (all slots)
  int sync_reloads() const { return sync_reloads_; }      // reloads that reload_wait had to start itself
  int overlapped_reloads() const { return overlapped_; }  // reloads started early by reload_begin
  const OffloadOptions& options() const override { return options_; }

 private:
  ActivationOffload(CopyEngine& engine, const OffloadOptions& options);
  Status check_layer(int l, const char* what) const;

  struct Buffer {
    std::vector<float> data;
    int layer = -1;        // layer whose input it holds or is loading (-1 = free)
    bool held = false;     // between reload_wait and reload_release
    CopyEvent loaded;
  };
  CopyEngine& engine_;
  OffloadOptions options_;
  std::vector<float> store_;          // (L, max_floats) host slots
  std::vector<size_t> stored_n_;      // floats stored per layer
  std::vector<CopyEvent> offloaded_;  // per layer: the offload copy (seq 0 = not offloaded this step)
  std::vector<Buffer> buffers_;       // 2 (double buffer) or 1
  int sync_reloads_ = 0;
  int overlapped_ = 0;
};

}  // namespace troupe::kernels
