// What this process is blocked in while it waits on other ranks (a learner collective), so that the
// watchdog's message after a peer dies can name it. Invariant: the label in the slot is that of the
// outermost labelled scope still running (an enclosing label is the more specific one), or none.
#pragma once

#include <atomic>
#include <string>

namespace troupe {

struct BlockingCallSlot {
  std::atomic<const char*> what{nullptr};  // a string literal
  std::atomic<int> index{-1};              // a layer or shard number after it; -1 none
};

inline BlockingCallSlot& blocking_call_slot() {
  static BlockingCallSlot slot;
  return slot;
}

// Labels the calls of its scope (`what`: a string literal, e.g. "the all-gather of decoder layer",
// with `index` 3); a label already set by an enclosing scope is kept.
class BlockingCall {
 public:
  explicit BlockingCall(const char* what, int index = -1) {
    auto& s = blocking_call_slot();
    const char* none = nullptr;
    if (s.what.load() != nullptr) return;
    s.index.store(index);
    owner_ = s.what.compare_exchange_strong(none, what);
  }
  ~BlockingCall() {
    if (owner_) blocking_call_slot().what.store(nullptr);
  }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  bool owner_ = false;
};

// "WHAT INDEX", "WHAT" or "" (nothing labelled is running).
inline std::string current_blocking_call() {
  const auto& s = blocking_call_slot();
  const char* what = s.what.load();
  if (!what) return {};
  const int index = s.index.load();
  return index >= 0 ? std::string(what) + " " + std::to_string(index) : std::string(what);
}

}  // namespace troupe
