// CPU copy engine (one FIFO copy thread) and the double-buffered activation offload (offload.h).
// Happens-before: the copy thread publishes done_seq_ under mu_ after its memcpy, and wait()
// reads it under mu_, so every byte a copy wrote is visible to the thread that waited on it.
#include "troupe/kernels/offload.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

namespace troupe::kernels {
namespace {

using Clock = std::chrono::steady_clock;

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

std::string layer_name(int l) { return "activation offload: layer " + std::to_string(l); }

}  // namespace

// ---- CopyEngine --------------------------------------------------------------------------------

CopyEngine::CopyEngine(CopyEngineOptions options)
    : bandwidth_(options.bandwidth_bytes_per_s), delay_(std::move(options.delay_s)) {
  thread_ = std::thread([this] { run(); });
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  queued_cv_.notify_all();
  thread_.join();
}

CopyEvent CopyEngine::copy_async(void* dst, const void* src, size_t bytes) {
  CopyEvent ev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ev.seq = next_seq_++;
    queue_.push_back(Job{dst, src, bytes, ev.seq, bandwidth_, delay_});
  }
  queued_cv_.notify_one();
  return ev;
}

void CopyEngine::execute_front(std::unique_lock<std::mutex>& lock, bool by_host) {
  Job job = std::move(queue_.front());
  queue_.pop_front();
  executing_ = true;
  const uint64_t index = started_++;
  lock.unlock();
  const auto t0 = Clock::now();
  const double delay = job.delay ? job.delay(index) : 0.0;
  const size_t half = job.bytes / 2;
  sleep_s(delay / 2);
  if (half > 0) std::memcpy(job.dst, job.src, half);
  sleep_s(delay / 2);
  if (job.bytes > half)
    std::memcpy(static_cast<char*>(job.dst) + half, static_cast<const char*>(job.src) + half,
                job.bytes - half);
  if (job.bandwidth > 0) {
    const auto until = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                static_cast<double>(job.bytes) / job.bandwidth));
    std::this_thread::sleep_until(until);
  }
  const double busy = std::chrono::duration<double>(Clock::now() - t0).count();
  lock.lock();
  done_seq_ = job.seq;
  executing_ = false;
  stats_.copies += 1;
  stats_.bytes += job.bytes;
  stats_.busy_s += busy;
  if (by_host) stats_.host_copies += 1;
  done_cv_.notify_all();
  queued_cv_.notify_all();
}

void CopyEngine::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_cv_.wait(lock, [this] { return !executing_ && (stop_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stop_ and drained
    execute_front(lock, false);
  }
}

void CopyEngine::wait(CopyEvent event) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_seq_ >= event.seq) return;
  const auto t0 = Clock::now();
  while (done_seq_ < event.seq) {
    if (!executing_ && !queue_.empty())
      execute_front(lock, true);  // not started yet: copy it here rather than wait for the thread
    else
      done_cv_.wait(lock);
  }
  stats_.host_wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
}

bool CopyEngine::query(CopyEvent event) const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_seq_ >= event.seq;
}

void CopyEngine::synchronize() {
  CopyEvent last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last.seq = next_seq_ - 1;
  }
  wait(last);
}

void CopyEngine::set_bandwidth(double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  bandwidth_ = bytes_per_s;
}

void CopyEngine::set_delay(std::function<double(uint64_t)> delay_s) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = std::move(delay_s);
}

CopyEngineStats CopyEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CopyEngine::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = CopyEngineStats{};
}

// ---- ActivationOffload -------------------------------------------------------------------------

ActivationOffload::ActivationOffload(CopyEngine& engine, const OffloadOptions& options)
    : engine_(engine), options_(options) {
  const size_t L = static_cast<size_t>(options.num_layers);
  store_.assign(L * options.max_floats, 0.0f);
  stored_n_.assign(L, 0);
  offloaded_.assign(L, CopyEvent{});
  buffers_.resize(options.double_buffer ? 2 : 1);
  for (auto& b : buffers_) b.data.assign(options.max_floats, 0.0f);
}

Result<std::unique_ptr<ActivationOffload>> ActivationOffload::create(CopyEngine& engine,
                                                                      const OffloadOptions& options) {
  if (options.num_layers <= 0)
    return invalid_input("activation offload: num_layers must be > 0 (got " + std::to_string(options.num_layers) + ")");
  if (options.max_floats == 0) return invalid_input("activation offload: max_floats must be > 0");
  return std::unique_ptr<ActivationOffload>(new ActivationOffload(engine, options));
}

bool ActivationOffload::offloaded(int l) const { return offloads_layer(options_, l); }

void ActivationOffload::synchronize() { engine_.synchronize(); }

Status ActivationOffload::check_layer(int l, const char* what) const {
  if (l < 0 || l >= options_.num_layers)
    return invalid_input(std::string(what) + ": layer " + std::to_string(l) + " out of range [0, " +
                         std::to_string(options_.num_layers) + ")");
  if (!offloaded(l))
    return invalid_input(std::string(what) + ": " + layer_name(l) +
                         " is not offloaded (last layer keeps its input in the arena)");
  return {};
}

Status ActivationOffload::offload_begin(int l, const float* x, size_t n) {
  TROUPE_TRY(check_layer(l, "offload_begin"));
  if (n > options_.max_floats)
    return invalid_input("offload_begin: " + layer_name(l) + " input has " + std::to_string(n) +
                         " floats, more than max_floats " + std::to_string(options_.max_floats));
  for (const auto& b : buffers_)
    if (b.layer == l)
      return invalid_input("offload_begin: " + layer_name(l) + " is still in a reload buffer (release it first)");
  stored_n_[static_cast<size_t>(l)] = n;
  offloaded_[static_cast<size_t>(l)] =
      engine_.copy_async(store_.data() + static_cast<size_t>(l) * options_.max_floats, x, n * sizeof(float));
  return {};
}

Status ActivationOffload::offload_wait(int l) {
  TROUPE_TRY(check_layer(l, "offload_wait"));
  engine_.wait(offloaded_[static_cast<size_t>(l)]);
  return {};
}

Status ActivationOffload::reload_begin(int l) {
  TROUPE_TRY(check_layer(l, "reload_begin"));
  if (offloaded_[static_cast<size_t>(l)].seq == 0)
    return invalid_input("reload_begin: " + layer_name(l) + " was not offloaded in this step");
  for (const auto& b : buffers_)
    if (b.layer == l) return {};  // already loading or loaded
  for (auto& b : buffers_) {
    if (b.layer >= 0) continue;
    b.layer = l;
    b.held = false;
    // FIFO: this copy starts after the offload copy of slot l has finished.
    b.loaded = engine_.copy_async(b.data.data(), store_.data() + static_cast<size_t>(l) * options_.max_floats,
                                  stored_n_[static_cast<size_t>(l)] * sizeof(float));
    ++overlapped_;
    return {};
  }
  if (!options_.double_buffer) return {};  // the only buffer is busy: reload_wait copies synchronously
  return invalid_input("reload_begin: " + layer_name(l) +
                       ": both reload buffers are in use (release the layer whose backward finished)");
}

Result<const float*> ActivationOffload::reload_wait(int l) {
  TROUPE_TRY(check_layer(l, "reload_wait"));
  Buffer* mine = nullptr;
  for (auto& b : buffers_)
    if (b.layer == l) mine = &b;
  if (!mine) {
    for (auto& b : buffers_)
      if (b.layer < 0) {
        mine = &b;
        break;
      }
    if (!mine)
      return invalid_input("reload_wait: " + layer_name(l) + ": no free reload buffer (release the previous layer)");
    if (offloaded_[static_cast<size_t>(l)].seq == 0)
      return invalid_input("reload_wait: " + layer_name(l) + " was not offloaded in this step");
    mine->layer = l;
    mine->loaded = engine_.copy_async(mine->data.data(), store_.data() + static_cast<size_t>(l) * options_.max_floats,
                                      stored_n_[static_cast<size_t>(l)] * sizeof(float));
    ++sync_reloads_;
  }
  if (mine->held) return invalid_input("reload_wait: " + layer_name(l) + " waited twice without release");
  engine_.wait(mine->loaded);
  mine->held = true;
  return static_cast<const float*>(mine->data.data());
}

Status ActivationOffload::reload_release(int l) {
  TROUPE_TRY(check_layer(l, "reload_release"));
  for (auto& b : buffers_)
    if (b.layer == l) {
      if (!b.held) return invalid_input("reload_release: " + layer_name(l) + " released before reload_wait");
      b.layer = -1;
      b.held = false;
      stored_n_[static_cast<size_t>(l)] = 0;
      offloaded_[static_cast<size_t>(l)] = CopyEvent{};
      return {};
    }
  return invalid_input("reload_release: " + layer_name(l) + " holds no reload buffer");
}

size_t ActivationOffload::reload_buffer_bytes() const { return buffers_.size() * options_.max_floats * sizeof(float); }

size_t ActivationOffload::store_bytes() const { return store_.size() * sizeof(float); }

}  // namespace troupe::kernels
