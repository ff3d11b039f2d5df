// Bounded mailbox: a mutex-guarded deque plus the owner's "scheduled" bit, so that the push
// that finds the owner idle is the one that schedules it (exactly once).
#include "troupe/runtime/mailbox.h"

namespace troupe::runtime {

Result<bool> Mailbox::push(Mail&& m, Overflow policy, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (closed_) return make_error(ErrorCode::peer_failed, "mailbox closed (actor stopped)");
  if (!m.task) {
    if (user_count_ >= capacity_) {
      if (policy == Overflow::fail)
        return make_error(ErrorCode::timeout, "mailbox full (capacity " + std::to_string(capacity_) + ")");
      ++waiters_;
      bool room = not_full_.wait_until(lock, deadline, [&] { return closed_ || user_count_ < capacity_; });
      --waiters_;
      if (closed_) return make_error(ErrorCode::peer_failed, "mailbox closed (actor stopped)");
      if (!room)
        return make_error(ErrorCode::timeout, "mailbox full (capacity " + std::to_string(capacity_) +
                                                  ") until the send deadline: receiver too slow");
    }
    ++user_count_;
    if (user_count_ > high_water_) high_water_ = user_count_;
  }
  q_.push_back(std::move(m));
  if (!scheduled_) {
    scheduled_ = true;
    return true;
  }
  return false;
}

std::size_t Mailbox::pop_batch(std::vector<Mail>& out, std::size_t max) {
  std::lock_guard lock(mu_);
  if (q_.empty()) {
    scheduled_ = false;
    return 0;
  }
  std::size_t n = 0, freed = 0;
  while (n < max && !q_.empty()) {
    if (!q_.front().task) ++freed;
    out.push_back(std::move(q_.front()));
    q_.pop_front();
    ++n;
  }
  user_count_ -= freed;
  if (freed && waiters_) not_full_.notify_all();
  return n;
}

bool Mailbox::finish_batch() {
  std::lock_guard lock(mu_);
  if (q_.empty()) {
    scheduled_ = false;
    return false;
  }
  return true;
}

void Mailbox::requeue_front(std::vector<Mail>& items, std::size_t from) {
  std::lock_guard lock(mu_);
  for (std::size_t i = items.size(); i > from; --i) {
    if (!items[i - 1].task) ++user_count_;
    q_.push_front(std::move(items[i - 1]));
  }
}

void Mailbox::unschedule() {
  std::lock_guard lock(mu_);
  scheduled_ = false;
}

bool Mailbox::reschedule_if_pending() {
  std::lock_guard lock(mu_);
  if (scheduled_) return false;
  scheduled_ = true;
  return true;
}

std::vector<Mail> Mailbox::drain_all() {
  std::lock_guard lock(mu_);
  std::vector<Mail> out;
  out.reserve(q_.size());
  for (auto& m : q_) out.push_back(std::move(m));
  q_.clear();
  user_count_ = 0;
  if (waiters_) not_full_.notify_all();
  return out;
}

void Mailbox::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  not_full_.notify_all();
}

std::size_t Mailbox::size() const {
  std::lock_guard lock(mu_);
  return user_count_;
}

std::size_t Mailbox::high_water() const {
  std::lock_guard lock(mu_);
  return high_water_;
}

}  // namespace troupe::runtime
