// One actor's state on its node: the actor object and the factory it is rebuilt from, its
// mailbox, restart history, timers and monitors. Invariant: only the thread processing the cell
// (the holder of its mailbox's scheduled bit) touches actor, restarts, stop_requested,
// fail_requested and timers; monitors are guarded by monitors_mu.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/runtime/system.h"

namespace troupe::runtime {

enum class CellState { running, suspended, restarting, stopped };

struct ActorCell {
  ActorCell(ActorId i, std::string n, std::size_t cap) : id(i), name(std::move(n)), mailbox(cap) {}
  ActorId id;
  std::string name;
  std::unique_ptr<Actor> actor;
  ActorFactory factory;
  Mailbox mailbox;
  std::optional<RestartPolicy> restart;
  ActorId supervisor;
  std::deque<Clock::time_point> restarts;
  std::atomic<CellState> state{CellState::running};
  // set by the running handler, acted on after it returns (only the processing thread touches them)
  bool stop_requested = false;
  std::optional<Error> fail_requested;
  std::vector<TimerId> timers;
  std::int64_t spin_budget = 20'000;  // ns the scheduler polls for more mail before giving up the turn (adaptive)
  std::mutex monitors_mu;
  std::vector<ActorId> monitors;
  std::string label() const {
    return name.empty() ? to_string(id) : "'" + name + "' (" + to_string(id) + ")";
  }
};

}  // namespace troupe::runtime
