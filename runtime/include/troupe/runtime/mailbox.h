// Mail items and the bounded mailbox each actor owns. A payload is either a typed object handed
// over directly (same process: no encoding) or the bytes of a received envelope (a zero-copy view
// into the ZeroMQ message, which may carry several envelopes). Invariant: a mailbox never holds more than `capacity` user messages;
// pushing to a full one blocks until the deadline or fails — it never grows.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "troupe/base/result.h"
#include "troupe/runtime/bytes.h"
#include "troupe/runtime/envelope.h"

namespace troupe::runtime {

class Context;

// A received ZeroMQ message, shared by the envelopes it carries. The count is intrusive: moving a
// payload copies a pointer, and libzmq is called only when the last envelope is done with it.
// A frame sent with kFlagSegmented arrives as a multipart message: its out-of-line runs are the
// further parts, kept here as `segments`.
// Bytes fields decoded from it share its memory the same way (bytes.h).
class SharedFrame final : public SharedBuffer {
 public:
  static SharedFrame* adopt(zmq::message_t&& msg) { return new SharedFrame(std::move(msg)); }  // count 1
  const char* data() const { return static_cast<const char*>(msg_.data()); }
  std::size_t size() const { return msg_.size(); }
  void add_part(zmq::message_t&& part) {
    segments_.push_back({static_cast<const char*>(part.data()), part.size()});
    parts_.push_back(std::move(part));
  }
  const std::vector<WireSegment>& segments() const { return segments_; }

 private:
  explicit SharedFrame(zmq::message_t&& msg) : msg_(std::move(msg)) {}
  zmq::message_t msg_;
  std::vector<zmq::message_t> parts_;
  std::vector<WireSegment> segments_;
};

class Payload {
 public:
  Payload() = default;
  Payload(Payload&& o) noexcept
      : local_(std::move(o.local_)),
        type_(o.type_),
        frame_(std::exchange(o.frame_, nullptr)),
        data_(o.data_),
        size_(o.size_),
        segmented_(o.segmented_) {}
  Payload& operator=(Payload&& o) noexcept {
    if (this != &o) {
      if (frame_) frame_->release();
      local_ = std::move(o.local_);
      type_ = o.type_;
      frame_ = std::exchange(o.frame_, nullptr);
      data_ = o.data_;
      size_ = o.size_;
      segmented_ = o.segmented_;
    }
    return *this;
  }
  Payload(const Payload&) = delete;
  Payload& operator=(const Payload&) = delete;
  ~Payload() {
    if (frame_) frame_->release();
  }

  template <class M>
  static Payload local(std::shared_ptr<const M> obj) {
    Payload p;
    p.type_ = &typeid(M);
    p.local_ = std::move(obj);
    return p;
  }
  // Bytes [offset, offset + size) of a received message; takes a reference to it. `segmented`:
  // the envelope's long runs are the message's further parts.
  static Payload frame(SharedFrame* f, std::size_t offset, std::size_t size, bool segmented = false) {
    Payload p;
    f->retain();
    p.frame_ = f;
    p.data_ = f->data() + offset;
    p.size_ = size;
    p.segmented_ = segmented;
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
  const char* data() const { return frame_ ? data_ : nullptr; }
  std::size_t size() const { return frame_ ? size_ : 0; }
  bool segmented() const { return frame_ && segmented_; }
  const std::vector<WireSegment>& segments() const { return frame_->segments(); }  // segmented() only
  SharedFrame* shared_frame() const { return frame_; }  // the received message (frames only)

 private:
  std::shared_ptr<const void> local_;
  const std::type_info* type_ = nullptr;
  SharedFrame* frame_ = nullptr;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
  bool segmented_ = false;
};

// Decodes a received payload (out-of-line parts included) into out; its Bytes fields share long
// runs with the received message (bytes.h).
template <class M>
Status decode_payload(const Payload& p, M& out) {
  if (p.segmented())
    return decode_payload(p.data(), p.size(), p.segments().data(), p.segments().size(), out, p.shared_frame());
  return decode_payload(p.data(), p.size(), out, p.shared_frame());
}

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

// The mailbox's lock: held for a few dozen instructions (a push_back, a swap), taken by a
// producer and its consumer at millions of messages a second. A futex mutex puts the loser of
// every collision to sleep and wakes it with a system call; this one polls a little, then
// yields (so a holder preempted on a busy machine gets to run).
class MailboxLock {
 public:
  void lock() noexcept {
    int spins = 0;
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins < 100) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

enum class Overflow {
  block,  // wait for room until the send deadline, then fail with ErrorCode::timeout
  fail,   // fail at once with ErrorCode::timeout ("mailbox full")
};

class Mailbox {
 public:
  explicit Mailbox(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Result: true when the caller must schedule the owner (it was idle).
  Result<bool> push(Mail&& m, Overflow policy, std::chrono::steady_clock::time_point deadline);
  // The same with the deadline `wait` from now, read from the clock only when the mailbox is full
  // (a clock read per message is a measurable share of a small message's cost).
  Result<bool> push_within(Mail&& m, Overflow policy, std::chrono::nanoseconds wait);
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
  template <class Deadline>
  Result<bool> push_impl(Mail&& m, Overflow policy, Deadline deadline);

  mutable MailboxLock mu_;
  std::condition_variable_any not_full_;  // senders waiting for room (rare: a full mailbox)
  std::vector<Mail> q_;  // FIFO; the consumer swaps the whole vector out, so capacity is reused
  std::size_t user_count_ = 0;  // items without a task (the bounded kind)
  std::size_t capacity_;
  std::size_t high_water_ = 0;
  std::size_t waiters_ = 0;
  bool scheduled_ = false;
  bool closed_ = false;
  // On a cache line of its own: a consumer polls it while its producer pushes, and the lock and
  // the queue should not travel between their cores with every poll.
  alignas(64) std::atomic<std::size_t> approx_size_{0};
};

}  // namespace troupe::runtime
