// Supervision: stop, crash, restart with backoff, escalation, monitors and node watchers (see supervision.h).
#include "supervision.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe::runtime {

void Supervision::cancel_timers(ActorCell& c) {
  for (TimerId t : c.timers) timers_.remove(t);
  c.timers.clear();
}

void Supervision::reject(ActorCell& c, Mail& m) {
  if (m.task || !(m.header.flags & kFlagRequest)) return;
  ErrorReply er{static_cast<std::int32_t>(ErrorCode::peer_failed), "actor " + c.label() + " has stopped"};
  (void)sys_.send_from(c.id, m.header.sender, er, kFlagReply, m.header.correlation, Overflow::fail);
}

void Supervision::stopped(ActorCell& c, const std::string& reason) {
  c.state = CellState::stopped;
  cancel_timers(c);
  if (c.actor) run_on_stop_(c);
  c.mailbox.close();
  for (auto& m : c.mailbox.drain_all()) reject(c, m);
  c.mailbox.unschedule();
  std::vector<ActorId> mons;
  {
    std::lock_guard lock(c.monitors_mu);
    mons.swap(c.monitors);
  }
  for (ActorId w : mons)
    (void)sys_.send_from(c.id, w, ActorDown{c.id.packed(), c.name, reason}, 0, 0, Overflow::fail);
}

void Supervision::crashed(ActorCell& c) {
  Error err = *c.fail_requested;
  c.fail_requested.reset();
  spdlog::error("troupe runtime: {}", err.message);
  cancel_timers(c);
  c.actor.reset();
  if (c.restart) {
    const RestartPolicy& p = *c.restart;
    Clock::time_point t = timers_.now();
    while (!c.restarts.empty() && t - c.restarts.front() > p.window) c.restarts.pop_front();
    if (static_cast<int>(c.restarts.size()) < p.max_restarts) {
      Duration backoff = p.backoff_initial;
      for (std::size_t i = 0; i < c.restarts.size() && backoff < p.backoff_max; ++i) backoff *= 2;
      backoff = std::min(backoff, p.backoff_max);
      c.restarts.push_back(t);
      c.state = CellState::suspended;
      c.mailbox.unschedule();
      spdlog::warn("troupe runtime: restarting actor {} in {} (restart {} of {} within {})", c.label(),
                   ms_text(backoff), c.restarts.size(), p.max_restarts, ms_text(p.window));
      ActorCell* cell = &c;
      timers_.add(timers_.now() + backoff, Duration{0}, [this, cell] {
        cell->state = CellState::restarting;
        if (cell->mailbox.reschedule_if_pending()) scheduler_.enqueue(cell);
      });
      return;
    }
    err = make_error(err.code, "actor " + c.label() + " exhausted its restart policy (" +
                                   std::to_string(p.max_restarts) + " restarts within " + ms_text(p.window) +
                                   "); last failure: " + err.message);
  }
  stopped(c, err.message);
  escalate(c, err);
}

void Supervision::escalate(ActorCell& c, const Error& err) {
  if (c.supervisor.valid() && c.supervisor.node == sys_.node_id()) {
    if (ActorCell* sup = actors_.find(c.supervisor.local); sup && sup->state != CellState::stopped) {
      Error e = make_error(err.code, "child " + c.label() + " failed for good: " + err.message);
      scheduler_.post(sup, [e](Context& ctx) { ctx.fail(e); });
      return;
    }
  }
  std::vector<std::function<void(const Error&)>> cbs;
  {
    std::lock_guard lock(watch_mu_);
    cbs = escalation_callbacks_;
  }
  if (cbs.empty()) spdlog::critical("troupe runtime: unsupervised failure: {}", err.message);
  for (auto& f : cbs) f(err);
}

void Supervision::monitor(ActorId watcher, ActorId target) {
  ActorCell* c = target.node == sys_.node_id() ? actors_.find(target.local) : nullptr;
  if (!c || c->state == CellState::stopped) {
    (void)sys_.send_from(node_self(), watcher, ActorDown{target.packed(), c ? c->name : "", "not running"}, 0,
                         0, Overflow::fail);
    return;
  }
  std::lock_guard lock(c->monitors_mu);
  c->monitors.push_back(watcher);
}

void Supervision::on_escalation(std::function<void(const Error&)> fn) {
  std::lock_guard lock(watch_mu_);
  escalation_callbacks_.push_back(std::move(fn));
}

void Supervision::watch_node(ActorId watcher, std::uint32_t node) {
  std::lock_guard lock(watch_mu_);
  node_watchers_[node].push_back(watcher);
}

void Supervision::on_node_down(std::function<void(const NodeDown&)> fn) {
  std::lock_guard lock(watch_mu_);
  down_callbacks_.push_back(std::move(fn));
}

void Supervision::node_down(const NodeDown& nd) {
  std::vector<ActorId> watchers;
  std::vector<std::function<void(const NodeDown&)>> cbs;
  {
    std::lock_guard lock(watch_mu_);
    watchers = node_watchers_[nd.node];
    cbs = down_callbacks_;
  }
  for (ActorId w : watchers) (void)sys_.send_from(node_self(), w, nd, 0, 0, Overflow::fail);
  for (auto& f : cbs) f(nd);
}

}  // namespace troupe::runtime
