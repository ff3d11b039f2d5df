// Mail items and the bounded mailbox each actor owns. A payload is either a typed object handed
// over directly (same process: no encoding) or the bytes of a received frame (zero-copy view into
// the ZeroMQ message). Invariant: a mailbox never holds more than `capacity` user messages;
// pushing to a full one blocks until the deadline or fails — it never grows.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <typeinfo>
#include <vector>

#include <zmq.hpp>

#include "troupe/base/result.h"
#include "troupe/runtime/envelope.h"

namespace troupe::runtime {

class Context;

class Payload {
 public:
  Payload() = default;
  template <class M>
  static Payload local(std::shared_ptr<const M> obj) {
    Payload p;
    p.type_ = &typeid(M);
    p.local_ = std::move(obj);
    return p;
  }
  // A received frame; the payload starts at `offset` (after the header).
  static Payload frame(zmq::message_t msg, std::size_t offset) {
    Payload p;
    p.frame_ = std::make_unique<zmq::message_t>(std::move(msg));
    p.offset_ = offset;
    return p;
  }
  bool is_local() const { return local_ != nullptr; }
  bool is_frame() const { return frame_ != nullptr; }
  template <class M>
  const M* local_as() const {
    return (local_ && *type_ == typeid(M)) ? static_cast<const M*>(local_.get()) : nullptr;
  }
  const std::shared_ptr<const void>& local_ptr() const { return local_; }
  const std::type_info* local_type() const { return type_; }
  const char* data() const { return frame_ ? static_cast<const char*>(frame_->data()) + offset_ : nullptr; }
  std::size_t size() const { return frame_ ? frame_->size() - offset_ : 0; }

 private:
  std::shared_ptr<const void> local_;
  const std::type_info* type_ = nullptr;
  std::unique_ptr<zmq::message_t> frame_;  // boxed: keeps Mail small on the local hand-off path
  std::size_t offset_ = 0;
};

// One mail item. `task` set = a runtime-internal closure run in the actor's context (reply
// callbacks, timers, restarts); such items bypass the capacity bound so replies cannot deadlock.
using MailTask = std::unique_ptr<std::function<void(Context&)>>;
struct Mail {
  EnvelopeHeader header;
  Payload payload;
  MailTask task;
};
inline MailTask make_task(std::function<void(Context&)> fn) {
  return std::make_unique<std::function<void(Context&)>>(std::move(fn));
}

enum class Overflow {
  block,  // wait for room until the send deadline, then fail with ErrorCode::timeout
  fail,   // fail at once with ErrorCode::timeout ("mailbox full")
};

class Mailbox {
 public:
  explicit Mailbox(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Result: true when the caller must schedule the owner (it was idle).
  Result<bool> push(Mail&& m, Overflow policy, std::chrono::steady_clock::time_point deadline);
  // Moves every queued item into `out` (which must be empty) in O(1); stays scheduled.
  std::size_t pop_batch(std::vector<Mail>& out);
  // After a batch: true = mail arrived meanwhile, stay scheduled; false = idle (unscheduled) now.
  bool finish_batch();
  // Lock-free peek for a consumer spinning before it gives up its turn.
  bool has_mail() const { return approx_size_.load(std::memory_order_relaxed) != 0; }
  // Puts unprocessed items back at the front (actor failed mid-batch).
  void requeue_front(std::vector<Mail>& items, std::size_t from);
  // Owner suspended: clear the scheduled flag even though mail may wait.
  void unschedule();
  // Claims the scheduled bit (restart/resume): true when the caller must schedule the owner now.
  bool reschedule_if_pending();
  // Drops every item; returns them so pending requests can be answered.
  std::vector<Mail> drain_all();
  void close();  // further pushes fail

  std::size_t size() const;
  std::size_t capacity() const { return capacity_; }
  std::size_t high_water() const;  // the largest user-message depth ever reached

 private:
  mutable std::mutex mu_;
  std::condition_variable not_full_;
  std::vector<Mail> q_;  // FIFO; the consumer swaps the whole vector out, so capacity is reused
  std::size_t user_count_ = 0;  // items without a task (the bounded kind)
  std::size_t capacity_;
  std::size_t high_water_ = 0;
  std::size_t waiters_ = 0;
  bool scheduled_ = false;
  bool closed_ = false;
  std::atomic<std::size_t> approx_size_{0};
};

}  // namespace troupe::runtime
