// Requests waiting for their reply. Each has a timeout timer and ends exactly once — reply, error
// reply, timeout, its node declared down, or shutdown: whichever comes first takes it out of the
// table under the lock, and the later ones find nothing (a late reply is dropped). The callback
// runs in the requesting actor, as a task in its mailbox, or for an ask from outside any actor
// (owner local id 0) on the completing thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "actor_table.h"
#include "scheduler.h"
#include "timer_queue.h"

namespace troupe::runtime {

class RequestTable {
 public:
  using RawReply = ActorSystem::RawReply;
  using Outcome = Result<std::shared_ptr<Mail>>;

  RequestTable(ActorTable& actors, TimerQueue& timers, Scheduler& scheduler)
      : actors_(actors), timers_(timers), scheduler_(scheduler) {}

  // Registers a request to `to` with its timeout; returns its correlation id (never 0).
  std::uint64_t begin(ActorId owner, ActorId to, Duration timeout, RawReply on_reply);
  // With `runnable`, an owner actor the completion made runnable is handed back there (the caller
  // runs or enqueues it) instead of being enqueued.
  void complete(std::uint64_t correlation, Outcome r, ActorCell** runnable = nullptr);
  void fail_node(std::uint32_t node, const Error& e);  // every request to that node
  // Shutdown: asks from outside any actor get `e`; requests of actors are dropped.
  void abandon_all(const Error& e);
  // Hands `r` to the owner's callback the way a completion does, for a request never registered.
  void answer(ActorId owner, RawReply on_reply, Outcome r, ActorCell** runnable = nullptr);

 private:
  struct Pending {
    ActorId owner;
    std::uint32_t target_node = 0;
    RawReply on_reply;
    TimerId timer = 0;
  };

  ActorTable& actors_;
  TimerQueue& timers_;
  Scheduler& scheduler_;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::atomic<std::uint64_t> next_correlation_{1};
};

}  // namespace troupe::runtime
