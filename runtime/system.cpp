// ActorSystem: wires the parts in runtime/src/ — actor table, scheduler, timers, supervision,
// request table, ZeroMQ transport — and builds the public API on them: spawn and names, local
// delivery, requests, actor timers, node-down fan-out, the start and shutdown order. Its Impl is
// also the one place that calls into actor code (handlers, on_start, on_stop): a Context is made
// only here.
#include "troupe/runtime/system.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "src/actor_cell.h"
#include "src/actor_table.h"
#include "src/request_table.h"
#include "src/scheduler.h"
#include "src/supervision.h"
#include "src/timer_queue.h"
#include "src/zmq_transport.h"

namespace troupe::runtime {

struct ActorSystem::Impl final : TurnHandler, ZmqTransport::Sink {
  explicit Impl(ActorSystem* s)
      : self(s),
        actors(s->config_.node_id),
        timers(/*manual_clock=*/s->config_.threads == 0),
        scheduler(/*manual=*/s->config_.threads == 0, timers, *this),
        supervision(*s, actors, timers, scheduler, [this](ActorCell& c) { run_on_stop(c); }),
        requests(actors, timers, scheduler),
        transport(s->config_, timers, *this,
                  [s](std::uint32_t node, const std::string& reason) { s->declare_node_down(node, reason); }) {}

  ActorSystem* self;
  ActorTable actors;
  TimerQueue timers;
  Scheduler scheduler;
  Supervision supervision;
  RequestTable requests;
  ZmqTransport transport;
  bool shut_down = false;

  static void run_on_start(ActorCell& c, Context& ctx) {
    try {
      c.actor->on_start(ctx);
    } catch (const std::exception& e) {
      c.fail_requested =
          make_error(ErrorCode::internal, "actor " + c.label() + " threw in on_start: " + e.what());
    }
  }

  void run_on_stop(ActorCell& c) {
    Context ctx(self, &c, c.id, nullptr);
    try {
      c.actor->on_stop(ctx);
    } catch (const std::exception& e) {
      spdlog::warn("troupe runtime: actor {} threw in on_stop: {}", c.label(), e.what());
    }
  }

  // --- TurnHandler ---
  void restart(ActorCell& c) override {
    c.actor = c.factory();
    if (!c.actor) {
      c.fail_requested = make_error(ErrorCode::internal, "factory of actor " + c.label() + " returned null");
      return;
    }
    Context ctx(self, &c, c.id, nullptr);
    run_on_start(c, ctx);
  }

  void run(ActorCell& c, Mail& m) override {
    Context ctx(self, &c, c.id, &m);
    try {
      if (m.task) {
        (*m.task)(ctx);
        return;
      }
      const Actor::RawHandler* handler = c.actor->find_handler(m.header.type_id);
      if (!handler) {
        std::string why = "actor " + c.label() + " has no handler for " +
                          registered_type_name(m.header.type_id) + " (from " + to_string(m.header.sender) +
                          ")";
        spdlog::error("troupe runtime: {}", why);
        if (m.header.flags & kFlagRequest) (void)ctx.reply_error(invalid_input(why));
        return;
      }
      Status st = (*handler)(ctx, m);
      if (!st.ok()) {
        if (m.header.flags & kFlagRequest)
          (void)ctx.reply_error(st.error());
        else
          spdlog::warn("troupe runtime: actor {} handling {}: {}", c.label(),
                       registered_type_name(m.header.type_id), st.error().message);
      }
    } catch (const std::exception& e) {
      std::string what =
          m.task ? std::string("a timer/reply callback") : registered_type_name(m.header.type_id);
      Error err = make_error(ErrorCode::internal,
                             "actor " + c.label() + " threw while handling " + what + ": " + e.what());
      if (!m.task && (m.header.flags & kFlagRequest)) (void)ctx.reply_error(err);
      c.fail_requested = err;
    }
  }

  void reject(ActorCell& c, Mail& m) override { supervision.reject(c, m); }
  void crashed(ActorCell& c) override { supervision.crashed(c); }
  void stopped(ActorCell& c) override { supervision.stopped(c, "stopped"); }
  void after_batch() override { transport.flush_open_batches(); }

  // --- ZmqTransport::Sink (a receive thread) ---
  ActorCell* deliver(std::vector<Mail>& burst, bool may_run_inline) override {
    ActorCell* inline_cell = nullptr;
    for (Mail& m : burst) {
      auto r = self->route_local(std::move(m), Overflow::fail);
      if (!r.ok() && r.error().code == ErrorCode::timeout && !scheduler.manual()) {
        // A full mailbox: wait for room (remote senders are throttled meanwhile), but first give
        // the actor this burst was to run here to the workers: it may be the one we wait for.
        if (inline_cell) scheduler.enqueue(std::exchange(inline_cell, nullptr));
        r = self->route_local(std::move(m), Overflow::block);
      }
      if (!r.ok()) {
        spdlog::warn("troupe runtime: node {}: {}", self->config_.node_id, r.error().message);
        continue;
      }
      if (ActorCell* c = *r) {
        if (may_run_inline && !inline_cell)
          inline_cell = c;
        else
          scheduler.enqueue(c);
      }
    }
    burst.clear();
    return inline_cell;
  }
  void run_inline(ActorCell* c, std::vector<Mail>& batch) override { scheduler.turn_inline(c, batch); }
};

// ---- lifetime ----

ActorSystem::ActorSystem(SystemConfig config)
    : config_(std::move(config)), impl_(std::make_unique<Impl>(this)) {}

Result<std::unique_ptr<ActorSystem>> ActorSystem::create(SystemConfig config) {
  if (config.threads < 0)
    return invalid_input("runtime: threads must be >= 0, got " + std::to_string(config.threads));
  if (config.mailbox_capacity == 0) return invalid_input("runtime: mailbox_capacity must be >= 1");
  std::unique_ptr<ActorSystem> sys(new ActorSystem(std::move(config)));
  TROUPE_TRY(sys->start());
  return sys;
}

Status ActorSystem::start() {
  Impl& I = *impl_;
  // spdlog's registry is a function-local static of libspdlog, made on first use: make it here,
  // before the runtime's threads log, so they never race to make it (ThreadSanitizer cannot see
  // the guard inside the uninstrumented library, and reported that race in runtime.curve_auth).
  (void)spdlog::default_logger_raw();
  if (!config_.bind.empty()) {
    TROUPE_TRY(I.transport.bind());
    endpoint_ = I.transport.endpoint();
    curve_public_ = I.transport.curve_public_key();
  }
  I.scheduler.start(config_.threads);
  if (!I.scheduler.manual()) I.timers.start_thread();
  return {};
}

ActorSystem::~ActorSystem() { shutdown(Duration{0}); }

void ActorSystem::shutdown(Duration drain) {
  Impl& I = *impl_;
  if (I.shut_down) return;
  I.shut_down = true;
  I.scheduler.drain(Clock::now() + drain);  // until no cell is queued or running, or the deadline
  I.scheduler.stop();
  I.timers.stop();
  I.transport.stop();
  I.scheduler.join();
  I.timers.join();
  I.transport.join();
  // Close every mailbox so blocked senders return; fail every pending request.
  std::vector<ActorCell*> cells = I.actors.all();
  for (ActorCell* c : cells) c->mailbox.close();
  I.requests.abandon_all(make_error(ErrorCode::peer_failed, "runtime: actor system shut down"));
  for (ActorCell* c : cells) {
    if (c->state != CellState::stopped && c->actor) {
      I.run_on_stop(*c);
      c->state = CellState::stopped;
    }
  }
  I.transport.close();
}

// ---- placement ----

Status ActorSystem::connect(const std::vector<PeerInfo>& peers) { return impl_->transport.connect(peers); }
void ActorSystem::set_placement(std::map<std::string, std::uint32_t> name_to_node) {
  impl_->actors.set_placement(std::move(name_to_node));
}
std::vector<PeerInfo> ActorSystem::peers() const { return impl_->transport.peers(); }

// ---- actors ----

Result<ActorId> ActorSystem::spawn(ActorFactory factory, SpawnOptions options) {
  Impl& I = *impl_;
  if (I.scheduler.stopping()) return make_error(ErrorCode::internal, "runtime: spawn after shutdown");
  std::uint32_t local = I.actors.next_local();
  if (local >= ActorTable::kMaxActors)
    return make_error(ErrorCode::internal, "runtime: more than 65535 actors on one node");
  ActorId id{config_.node_id, local};
  auto cell = std::make_unique<ActorCell>(
      id, options.name, options.mailbox_capacity ? options.mailbox_capacity : config_.mailbox_capacity);
  cell->factory = std::move(factory);
  cell->restart = options.restart;
  cell->supervisor = options.supervisor;
  cell->actor = cell->factory();
  if (!cell->actor)
    return make_error(ErrorCode::internal, "runtime: factory for actor '" + options.name + "' returned null");
  if (cell->actor->setup_error()) return *cell->actor->setup_error();
  if (!options.name.empty()) TROUPE_TRY(register_name(options.name, id));
  ActorCell* raw = I.actors.add(std::move(cell));
  I.scheduler.post(raw, [raw](Context& ctx) { Impl::run_on_start(*raw, ctx); });
  return id;
}

Status ActorSystem::register_name(const std::string& name, ActorId id) {
  return impl_->actors.register_name(name, id);
}
ActorId ActorSystem::named(std::uint32_t node, std::string_view name) {
  return ActorId{node, ActorTable::alias_of(name)};
}
Result<ActorId> ActorSystem::lookup(std::string_view name) const { return impl_->actors.lookup(name); }

void ActorSystem::stop_actor(ActorId id) {
  if (!is_local(id)) return;
  if (ActorCell* c = impl_->actors.find(id.local)) impl_->scheduler.post(c, [](Context& ctx) { ctx.stop(); });
}

std::size_t ActorSystem::mailbox_size(ActorId id) const {
  ActorCell* c = is_local(id) ? impl_->actors.find(id.local) : nullptr;
  return c ? c->mailbox.size() : 0;
}
std::size_t ActorSystem::mailbox_high_water(ActorId id) const {
  ActorCell* c = is_local(id) ? impl_->actors.find(id.local) : nullptr;
  return c ? c->mailbox.high_water() : 0;
}

// ---- messaging ----

Result<ActorCell*> ActorSystem::route_local(Mail&& mail, Overflow policy) {
  Impl& I = *impl_;
  if (mail.header.flags & kFlagReply) {
    ActorCell* runnable = nullptr;  // the requester, when its continuation is the first thing it has to do
    I.requests.complete(mail.header.correlation, std::make_shared<Mail>(std::move(mail)), &runnable);
    return runnable;
  }
  ActorCell* c = I.actors.find(mail.header.recipient.local);
  if (!c || c->state == CellState::stopped) {
    std::string why = "no live actor " + to_string(mail.header.recipient) + " on node " +
                      std::to_string(config_.node_id) + " for " + registered_type_name(mail.header.type_id);
    if (mail.header.flags & kFlagRequest) {
      ErrorReply er{static_cast<std::int32_t>(ErrorCode::peer_failed), why};
      (void)send_from(ActorId{config_.node_id, 0}, mail.header.sender, er, kFlagReply,
                      mail.header.correlation, Overflow::fail);
    }
    return make_error(ErrorCode::peer_failed, "runtime: " + why);
  }
  if (I.scheduler.manual()) policy = Overflow::fail;  // one thread: waiting for room would wait forever
  auto r = c->mailbox.push_within(std::move(mail), policy, config_.send_timeout);
  if (!r.ok())
    return make_error(r.error().code, "runtime: send to actor " + c->label() + ": " + r.error().message);
  return r.value() ? c : nullptr;
}

Status ActorSystem::deliver_local(Mail&& mail, Overflow policy) {
  auto r = route_local(std::move(mail), policy);
  if (!r.ok()) return r.error();
  if (*r) impl_->scheduler.enqueue(*r);
  return {};
}

Status ActorSystem::send_frame(std::uint32_t node, const FrameWriter& frame, Overflow policy) {
  return impl_->transport.send(node, frame, policy);
}

Result<bool> ActorSystem::append_frame(std::uint32_t node, const BoundedFrameWriter& frame, Overflow policy) {
  return impl_->transport.append(node, frame, policy);
}

std::uint64_t ActorSystem::begin_request(ActorId owner, ActorId to, Duration timeout, RawReply on_reply) {
  Impl& I = *impl_;
  if (!is_local(to)) {
    Peer* p = I.transport.find_peer(to.node);
    if (p && p->down) {
      Error e = make_error(ErrorCode::peer_failed, "runtime: request to " + to_string(to) + ": node " +
                                                       std::to_string(to.node) + " (role " + p->info.role +
                                                       ") is down");
      I.requests.answer(owner, std::move(on_reply), e);
      return 0;
    }
  }
  return I.requests.begin(owner, to, timeout, std::move(on_reply));
}

void ActorSystem::fail_request(std::uint64_t correlation, Error e) {
  impl_->requests.complete(correlation, std::move(e));
}

// ---- actor timers: the callback runs as a task in the owner's mailbox ----

TimerId ActorSystem::start_timer(ActorId owner, Duration delay, Duration period,
                                 std::function<void(Context&)> fn) {
  Impl& I = *impl_;
  ActorCell* c = I.actors.find(owner.local);
  if (!c) return 0;
  auto shared = std::make_shared<std::function<void(Context&)>>(std::move(fn));
  auto id_holder = std::make_shared<TimerId>(0);
  bool one_shot = period.count() <= 0;
  TimerId id = I.timers.add(now() + delay, period, [this, c, shared, id_holder, one_shot] {
    TimerId id = *id_holder;
    impl_->scheduler.post(c, [this, shared, id, one_shot](Context& ctx) {
      if (!impl_->timers.live(id)) return;  // cancelled after it fired but before it ran
      if (one_shot) impl_->timers.forget(id);
      (*shared)(ctx);
    });
  });
  *id_holder = id;
  return id;
}

void ActorSystem::cancel_timer(TimerId id) { impl_->timers.remove(id); }

// ---- failure detection ----

void ActorSystem::watch_node_for(ActorId watcher, std::uint32_t node) {
  bool already_down = node_is_down(node);
  impl_->supervision.watch_node(watcher, node);
  if (already_down) {
    Peer* p = impl_->transport.find_peer(node);
    (void)send_from(ActorId{config_.node_id, 0}, watcher,
                    NodeDown{node, p ? p->info.role : "", "already down"}, 0, 0, Overflow::fail);
  }
}

void ActorSystem::monitor_for(ActorId watcher, ActorId target) {
  impl_->supervision.monitor(watcher, target);
}

void ActorSystem::mark_failed(ActorCell* cell, Error e) {
  if (!cell->fail_requested) cell->fail_requested = std::move(e);
}
void ActorSystem::mark_stop(ActorCell* cell) { cell->stop_requested = true; }

void ActorSystem::on_node_down(std::function<void(const NodeDown&)> fn) {
  impl_->supervision.on_node_down(std::move(fn));
}
void ActorSystem::on_escalation(std::function<void(const Error&)> fn) {
  impl_->supervision.on_escalation(std::move(fn));
}

bool ActorSystem::node_is_down(std::uint32_t node) const {
  Peer* p = impl_->transport.find_peer(node);
  return p && p->down;
}

void ActorSystem::declare_node_down(std::uint32_t node, const std::string& reason) {
  Impl& I = *impl_;
  Peer* p = I.transport.find_peer(node);
  if (!p || p->down.exchange(true)) return;
  NodeDown nd{node, p->info.role, reason};
  spdlog::error("troupe runtime: node {} (role {}, {}) is down: {}", node, p->info.role, p->info.endpoint,
                reason);
  I.requests.fail_node(
      node, make_error(ErrorCode::peer_failed, "runtime: node " + std::to_string(node) + " (role " +
                                                   p->info.role + ") is down: " + reason));
  I.supervision.node_down(nd);
}

// ---- deterministic mode ----

std::size_t ActorSystem::run_until_idle() { return impl_->scheduler.run_until_idle(); }
void ActorSystem::advance(Duration d) { impl_->scheduler.advance(d); }
Clock::time_point ActorSystem::now() const { return impl_->timers.now(); }

}  // namespace troupe::runtime
