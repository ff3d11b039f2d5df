// What follows when an actor stops or crashes, and who is told. A stop cancels the actor's
// timers, runs on_stop, answers its remaining mail (requests get an ErrorReply) and sends
// ActorDown to its monitors. A crash under a RestartPolicy suspends the cell and rebuilds the
// actor at the same ActorId after a doubling backoff (mail waits in its mailbox); a crash past
// the policy, or without one, stops the actor and escalates: its supervisor is failed in turn,
// and at the top the on_escalation callbacks run. Node watchers (NodeDown) are kept here too.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "actor_cell.h"
#include "actor_table.h"
#include "scheduler.h"
#include "timer_queue.h"

namespace troupe::runtime {

class Supervision {
 public:
  // run_on_stop calls the actor's on_stop (a Context only the actor system makes).
  Supervision(ActorSystem& sys, ActorTable& actors, TimerQueue& timers, Scheduler& scheduler,
              std::function<void(ActorCell&)> run_on_stop)
      : sys_(sys),
        actors_(actors),
        timers_(timers),
        scheduler_(scheduler),
        run_on_stop_(std::move(run_on_stop)) {}

  void stopped(ActorCell& c, const std::string& reason);
  void crashed(ActorCell& c);          // c.fail_requested is set
  void reject(ActorCell& c, Mail& m);  // mail that reached a stopped actor

  void monitor(ActorId watcher, ActorId target);  // ActorDown now if target is not running
  void on_escalation(std::function<void(const Error&)> fn);

  void watch_node(ActorId watcher, std::uint32_t node);
  void on_node_down(std::function<void(const NodeDown&)> fn);
  void node_down(const NodeDown& nd);  // tells the node's watchers and the callbacks

 private:
  void cancel_timers(ActorCell& c);
  void escalate(ActorCell& c, const Error& err);
  ActorId node_self() const { return ActorId{sys_.node_id(), 0}; }

  ActorSystem& sys_;
  ActorTable& actors_;
  TimerQueue& timers_;
  Scheduler& scheduler_;
  std::function<void(ActorCell&)> run_on_stop_;
  std::mutex watch_mu_;
  std::unordered_map<std::uint32_t, std::vector<ActorId>> node_watchers_;
  std::vector<std::function<void(const NodeDown&)>> down_callbacks_;
  std::vector<std::function<void(const Error&)>> escalation_callbacks_;
};

}  // namespace troupe::runtime
