// ActorSystem: cells, scheduler (thread pool or deterministic), timers, request table, and the
// ZeroMQ transport (one PULL socket in, one PUSH socket per peer out) with heartbeats and CURVE.
// Invariant: a cell is processed by at most one thread at a time — its mailbox's scheduled bit
// is the lock; every pending request is completed exactly once under requests_mu.
#include "troupe/runtime/system.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <unordered_set>

#include <unistd.h>

#include "troupe/runtime/curve.h"

namespace troupe::runtime {

namespace {
constexpr std::uint32_t kAliasBit = 0x80000000u;
constexpr std::size_t kMaxActors = 1u << 16;
constexpr std::size_t kBatch = 64;
constexpr int kSpin = 1000;      // ~tens of microseconds of polling before a consumer gives up its turn
constexpr int kIdleSpin = 2000;  // a worker's polling of the run queue before it sleeps
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

std::uint32_t name_hash(std::string_view name) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return (h & 0x7fffffffu) | kAliasBit;
}
std::string ms_text(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}
}  // namespace

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
  std::mutex monitors_mu;
  std::vector<ActorId> monitors;
  std::string label() const { return name.empty() ? to_string(id) : "'" + name + "' (" + to_string(id) + ")"; }
};

struct Peer {
  PeerInfo info;
  std::mutex mu;
  zmq::socket_t push;
  std::atomic<std::int64_t> last_seen_ns{0};
  std::atomic<bool> down{false};
};

struct Pending {
  ActorId owner;
  std::uint32_t target_node = 0;
  ActorSystem::RawReply on_reply;
  TimerId timer = 0;
};

struct TimerEntry {
  TimerId id = 0;
  Duration period{0};
  std::function<void()> fn;
};

struct ActorSystem::Impl {
  ActorSystem* self;
  bool manual = false;

  // cells
  std::mutex cells_mu;
  std::vector<std::unique_ptr<ActorCell>> owned;
  std::unique_ptr<std::atomic<ActorCell*>[]> slots{new std::atomic<ActorCell*>[kMaxActors]};
  std::atomic<std::uint32_t> next_local{1};
  mutable std::shared_mutex names_mu;
  std::unordered_map<std::string, std::uint32_t> names;     // name -> local id
  std::unordered_map<std::uint32_t, std::uint32_t> aliases;  // alias -> local id
  std::map<std::string, std::uint32_t> placement;

  // scheduler
  std::mutex runq_mu;
  std::condition_variable runq_cv;
  std::deque<ActorCell*> runq;
  std::atomic<std::size_t> runq_size{0};
  int idle_workers = 0;
  std::atomic<bool> stopping{false};
  std::vector<std::thread> workers;
  std::atomic<std::int64_t> busy{0};  // cells being processed right now

  // timers
  std::mutex timers_mu;
  std::condition_variable timers_cv;
  std::multimap<Clock::time_point, TimerEntry> timers;
  std::unordered_map<TimerId, Clock::time_point> timer_index;
  std::unordered_set<TimerId> live_timers;
  std::atomic<TimerId> next_timer{1};
  std::thread timer_thread;
  Clock::time_point timer_wait_until = Clock::time_point::min();  // what the timer thread sleeps until
  std::atomic<std::int64_t> manual_now_ns{3600'000'000'000};

  // requests
  std::mutex requests_mu;
  std::unordered_map<std::uint64_t, Pending> requests;
  std::atomic<std::uint64_t> next_corr{1};

  // transport
  std::unique_ptr<zmq::context_t> zctx;
  std::unique_ptr<zmq::socket_t> pull;
  std::thread io_thread, zap_thread;
  mutable std::shared_mutex peers_mu;
  std::unordered_map<std::uint32_t, std::unique_ptr<Peer>> peers;
  std::atomic<std::uint64_t> dropped_frames{0};
  // The receive thread is waiting for room in a full mailbox: peers' frames queue up unread
  // meanwhile, so their silence is ours, not theirs — no one is declared down for it.
  std::atomic<bool> io_delivering{false};
  std::string curve_secret;
  std::unordered_set<std::string> authorized;
  TimerId heartbeat_timer = 0;
  std::uint64_t heartbeat_seq = 0;

  // failure detection
  std::mutex watch_mu;
  std::unordered_map<std::uint32_t, std::vector<ActorId>> node_watchers;
  std::vector<std::function<void(const NodeDown&)>> down_callbacks;
  std::vector<std::function<void(const Error&)>> escalation_callbacks;
  bool shut_down = false;

  explicit Impl(ActorSystem* s) : self(s) {
    for (std::size_t i = 0; i < kMaxActors; ++i) slots[i].store(nullptr, std::memory_order_relaxed);
  }

  Clock::time_point now() const {
    if (manual) return Clock::time_point(std::chrono::nanoseconds(manual_now_ns.load()));
    return Clock::now();
  }

  bool runq_waiting() const { return runq_size.load(std::memory_order_relaxed) != 0; }

  ActorCell* find_cell(std::uint32_t local) const {
    if (local & kAliasBit) {
      std::shared_lock lock(names_mu);
      auto it = aliases.find(local);
      if (it == aliases.end()) return nullptr;
      local = it->second;
    }
    if (local == 0 || local >= kMaxActors) return nullptr;
    return slots[local].load(std::memory_order_acquire);
  }

  void enqueue(ActorCell* c) {
    if (manual) {
      std::lock_guard lock(runq_mu);
      runq.push_back(c);
      runq_size = runq.size();
      return;
    }
    bool wake;
    {
      std::lock_guard lock(runq_mu);
      runq.push_back(c);
      runq_size = runq.size();
      wake = idle_workers > 0;
    }
    if (wake) runq_cv.notify_one();
  }

  ActorCell* pop_runnable_blocking() {
    // Spin briefly before sleeping: a futex wake per message would dominate small-message cost.
    for (int spin = 0; spin < kIdleSpin; ++spin) {
      if (runq_waiting() || stopping) {
        std::lock_guard lock(runq_mu);
        if (!runq.empty()) {
          ActorCell* c = runq.front();
          runq.pop_front();
          runq_size = runq.size();
          return c;
        }
        if (stopping) return nullptr;
      }
      cpu_relax();  // no sched_yield: on a busy box it hands the core to threads we then wait for
    }
    std::unique_lock lock(runq_mu);
    ++idle_workers;
    runq_cv.wait(lock, [&] { return stopping || !runq.empty(); });
    --idle_workers;
    if (runq.empty()) return nullptr;
    ActorCell* c = runq.front();
    runq.pop_front();
    runq_size = runq.size();
    return c;
  }

  void worker_loop() {
    std::vector<Mail> batch;
    batch.reserve(kBatch);
    while (ActorCell* c = pop_runnable_blocking()) {
      busy.fetch_add(1);
      process(c, batch);
      busy.fetch_sub(1);
    }
  }

  void post_task(ActorCell* c, std::function<void(Context&)> fn) {
    Mail m;
    m.header.recipient = c->id;
    m.task = make_task(std::move(fn));
    auto r = c->mailbox.push(std::move(m), Overflow::fail, Clock::now());
    if (r.ok() && r.value()) enqueue(c);
  }

  void reject_mail(ActorCell* c, Mail& m, const std::string& why) {
    if (m.task || !(m.header.flags & kFlagRequest)) return;
    ErrorReply er{static_cast<std::int32_t>(ErrorCode::peer_failed), why};
    (void)self->send_from(c->id, m.header.sender, er, kFlagReply, m.header.correlation, Overflow::fail);
  }

  void run_one(ActorCell* c, Mail& m) {
    Context ctx(self, c, c->id, &m);
    try {
      if (m.task) {
        (*m.task)(ctx);
        return;
      }
      const Actor::RawHandler* handler = c->actor->find_handler(m.header.type_id);
      if (!handler) {
        std::string why = "actor " + c->label() + " has no handler for " + registered_type_name(m.header.type_id) +
                          " (from " + to_string(m.header.sender) + ")";
        spdlog::error("troupe runtime: {}", why);
        if (m.header.flags & kFlagRequest) (void)ctx.reply_error(invalid_input(why));
        return;
      }
      Status st = (*handler)(ctx, m);
      if (!st.ok()) {
        if (m.header.flags & kFlagRequest) (void)ctx.reply_error(st.error());
        else spdlog::warn("troupe runtime: actor {} handling {}: {}", c->label(), registered_type_name(m.header.type_id), st.error().message);
      }
    } catch (const std::exception& e) {
      std::string what = m.task ? std::string("a timer/reply callback") : registered_type_name(m.header.type_id);
      Error err = make_error(ErrorCode::internal, "actor " + c->label() + " threw while handling " + what + ": " + e.what());
      if (!m.task && (m.header.flags & kFlagRequest)) (void)ctx.reply_error(err);
      c->fail_requested = err;
    }
  }

  void start_actor(ActorCell* c) {
    c->actor = c->factory();
    if (!c->actor) {
      c->fail_requested = make_error(ErrorCode::internal, "factory of actor " + c->label() + " returned null");
      return;
    }
    Context ctx(self, c, c->id, nullptr);
    try {
      c->actor->on_start(ctx);
    } catch (const std::exception& e) {
      c->fail_requested = make_error(ErrorCode::internal, "actor " + c->label() + " threw in on_start: " + e.what());
    }
  }

  std::vector<Mail> io_batch;  // the receive thread's batch when it runs handlers inline

  void process(ActorCell* c, std::vector<Mail>& batch, bool spin = true) {
    CellState s = c->state.load();
    if (s == CellState::restarting) {
      c->state = CellState::running;
      start_actor(c);
      if (c->fail_requested) {
        handle_failure(c);
        return;
      }
    } else if (s != CellState::running) {
      c->mailbox.unschedule();
      if (s == CellState::stopped) {
        for (auto& m : c->mailbox.drain_all()) reject_mail(c, m, "actor " + c->label() + " has stopped");
      }
      return;
    }
    // Keep the turn while mail keeps coming (spinning briefly when the mailbox runs dry), so a
    // streaming sender does not pay a run-queue hand-off per message; yield when others wait.
    for (int turn = 0;; ++turn) {
      batch.clear();
      std::size_t n = c->mailbox.pop_batch(batch);
      if (n == 0) {
        bool more = false;
        if (!manual && spin)
          for (int s = 0; s < kSpin && !runq_waiting(); ++s) {
            if (c->mailbox.has_mail()) {
              more = true;
              break;
            }
            cpu_relax();
          }
        if (more) continue;
        if (c->mailbox.finish_batch()) continue;  // mail raced in: still scheduled
        return;
      }
      for (std::size_t i = 0; i < n; ++i) {
        run_one(c, batch[i]);
        if (c->fail_requested) {
          c->mailbox.requeue_front(batch, i + 1);
          batch.clear();
          handle_failure(c);
          return;
        }
        if (c->stop_requested) {
          for (std::size_t j = i + 1; j < n; ++j) reject_mail(c, batch[j], "actor " + c->label() + " has stopped");
          batch.clear();
          finish_stop(c, "stopped");
          return;
        }
      }
      batch.clear();
      if (turn >= 16 && runq_waiting()) {  // fairness: still scheduled, go to the back of the queue
        enqueue(c);
        return;
      }
    }
  }

  void cancel_cell_timers(ActorCell* c) {
    for (TimerId t : c->timers) self->cancel_timer(t);
    c->timers.clear();
  }

  void finish_stop(ActorCell* c, const std::string& reason) {
    c->state = CellState::stopped;
    cancel_cell_timers(c);
    if (c->actor) {
      Context ctx(self, c, c->id, nullptr);
      try {
        c->actor->on_stop(ctx);
      } catch (const std::exception& e) {
        spdlog::warn("troupe runtime: actor {} threw in on_stop: {}", c->label(), e.what());
      }
    }
    c->mailbox.close();
    for (auto& m : c->mailbox.drain_all()) reject_mail(c, m, "actor " + c->label() + " has stopped");
    c->mailbox.unschedule();
    std::vector<ActorId> mons;
    {
      std::lock_guard lock(c->monitors_mu);
      mons.swap(c->monitors);
    }
    for (ActorId w : mons) (void)self->send_from(c->id, w, ActorDown{c->id.packed(), c->name, reason}, 0, 0, Overflow::fail);
  }

  void handle_failure(ActorCell* c) {
    Error err = *c->fail_requested;
    c->fail_requested.reset();
    spdlog::error("troupe runtime: {}", err.message);
    cancel_cell_timers(c);
    c->actor.reset();
    if (c->restart) {
      const RestartPolicy& p = *c->restart;
      Clock::time_point t = now();
      while (!c->restarts.empty() && t - c->restarts.front() > p.window) c->restarts.pop_front();
      if (static_cast<int>(c->restarts.size()) < p.max_restarts) {
        Duration backoff = p.backoff_initial;
        for (std::size_t i = 0; i < c->restarts.size() && backoff < p.backoff_max; ++i) backoff *= 2;
        backoff = std::min(backoff, p.backoff_max);
        c->restarts.push_back(t);
        c->state = CellState::suspended;
        c->mailbox.unschedule();
        spdlog::warn("troupe runtime: restarting actor {} in {} (restart {} of {} within {})", c->label(), ms_text(backoff),
                     c->restarts.size(), p.max_restarts, ms_text(p.window));
        add_timer(now() + backoff, Duration{0}, [this, c] {
          c->state = CellState::restarting;
          if (c->mailbox.reschedule_if_pending()) enqueue(c);
        });
        return;
      }
      err = make_error(err.code, "actor " + c->label() + " exhausted its restart policy (" + std::to_string(p.max_restarts) +
                                     " restarts within " + ms_text(p.window) + "); last failure: " + err.message);
    }
    finish_stop(c, err.message);
    escalate(c, err);
  }

  void escalate(ActorCell* c, const Error& err) {
    if (c->supervisor.valid() && self->is_local(c->supervisor)) {
      if (ActorCell* sup = find_cell(c->supervisor.local); sup && sup->state != CellState::stopped) {
        Error e = make_error(err.code, "child " + c->label() + " failed for good: " + err.message);
        post_task(sup, [e](Context& ctx) { ctx.fail(e); });
        return;
      }
    }
    std::vector<std::function<void(const Error&)>> cbs;
    {
      std::lock_guard lock(watch_mu);
      cbs = escalation_callbacks;
    }
    if (cbs.empty()) spdlog::critical("troupe runtime: unsupervised failure: {}", err.message);
    for (auto& f : cbs) f(err);
  }

  // ---- timers ----
  TimerId add_timer(Clock::time_point when, Duration period, std::function<void()> fn) {
    TimerId id = next_timer.fetch_add(1);
    bool wake;
    {
      std::lock_guard lock(timers_mu);
      timers.emplace(when, TimerEntry{id, period, std::move(fn)});
      timer_index[id] = when;
      live_timers.insert(id);
      wake = when < timer_wait_until;  // only wake the timer thread when it would sleep past this one
    }
    if (wake) timers_cv.notify_one();
    return id;
  }

  void remove_timer(TimerId id) {
    std::lock_guard lock(timers_mu);
    live_timers.erase(id);
    auto it = timer_index.find(id);
    if (it == timer_index.end()) return;
    auto range = timers.equal_range(it->second);
    for (auto t = range.first; t != range.second; ++t)
      if (t->second.id == id) {
        timers.erase(t);
        break;
      }
    timer_index.erase(it);
  }

  bool timer_live(TimerId id) {
    std::lock_guard lock(timers_mu);
    return live_timers.count(id) != 0;
  }

  // Fires every timer due at `t`; returns how many fired.
  std::size_t fire_due(Clock::time_point t) {
    std::size_t fired = 0;
    for (;;) {
      TimerEntry e;
      {
        std::lock_guard lock(timers_mu);
        if (timers.empty() || timers.begin()->first > t) break;
        auto it = timers.begin();
        Clock::time_point when = it->first;
        e = std::move(it->second);
        timers.erase(it);
        if (e.period.count() > 0) {
          Clock::time_point next = when + e.period;
          if (next <= t && !manual) next = t + e.period;  // fell behind: do not burst
          timers.emplace(next, TimerEntry{e.id, e.period, e.fn});
          timer_index[e.id] = next;
        } else {
          timer_index.erase(e.id);
        }
      }
      ++fired;
      e.fn();
    }
    return fired;
  }

  void timer_loop() {
    std::unique_lock lock(timers_mu);
    while (!stopping) {
      Clock::time_point cap = Clock::now() + std::chrono::milliseconds(100);
      timer_wait_until = timers.empty() ? cap : std::min(timers.begin()->first, cap);
      if (timer_wait_until > Clock::now()) timers_cv.wait_until(lock, timer_wait_until);
      timer_wait_until = Clock::time_point::min();  // awake: every new timer is seen on the next pass
      if (stopping) break;
      lock.unlock();
      fire_due(Clock::now());
      lock.lock();
    }
  }

  // ---- requests ----
  void complete(std::uint64_t corr, Result<std::shared_ptr<Mail>> r) {
    Pending p;
    {
      std::lock_guard lock(requests_mu);
      auto it = requests.find(corr);
      if (it == requests.end()) return;  // late reply after a timeout: dropped
      p = std::move(it->second);
      requests.erase(it);
    }
    if (p.timer) remove_timer(p.timer);
    if (p.owner.local == 0) {
      p.on_reply(nullptr, std::move(r));
      return;
    }
    ActorCell* c = find_cell(p.owner.local);
    if (!c) return;
    auto shared = std::make_shared<Result<std::shared_ptr<Mail>>>(std::move(r));
    auto cb = std::make_shared<ActorSystem::RawReply>(std::move(p.on_reply));
    post_task(c, [shared, cb](Context& ctx) { (*cb)(&ctx, std::move(*shared)); });
  }

  // ---- transport ----
  // receive-thread-only caches: type ids already checked against the (grow-only) registry, and
  // the last sender whose liveness was stamped
  std::unordered_set<std::uint32_t> verified_types;
  std::uint32_t stamped_node = ~0u;
  int frames_since_stamp = 0;

  void handle_frame(zmq::message_t& msg) {
    auto h = decode_header(static_cast<const char*>(msg.data()), msg.size(), /*check_type=*/false);
    if (h.ok() && !verified_types.count(h->type_id)) {
      if (is_registered_type(h->type_id)) verified_types.insert(h->type_id);
      else h = invalid_input("unknown message type id " + std::to_string(h->type_id) + " from " + to_string(h->sender));
    }
    if (!h.ok()) {
      dropped_frames.fetch_add(1);
      spdlog::error("troupe runtime: node {} dropped a malformed frame ({} bytes): {}", self->config_.node_id, msg.size(),
                    h.error().message);
      return;
    }
    if (h->sender.node != stamped_node || ++frames_since_stamp >= 64 || h->type_id == Heartbeat::type_id) {
      if (Peer* p = find_peer(h->sender.node)) p->last_seen_ns.store(now().time_since_epoch().count());
      stamped_node = h->sender.node;
      frames_since_stamp = 0;
    }
    if (h->type_id == Heartbeat::type_id) return;
    if (h->recipient.node != self->config_.node_id) {
      dropped_frames.fetch_add(1);
      spdlog::error("troupe runtime: node {} got a frame for {} (wrong node); dropped", self->config_.node_id,
                    to_string(h->recipient));
      return;
    }
    Mail mail{*h, Payload::frame(std::move(msg), kHeaderSize), {}};
    io_delivering.store(true, std::memory_order_relaxed);
    Status st = self->deliver_local(std::move(mail), Overflow::block, /*on_receive_thread=*/true);
    io_delivering.store(false, std::memory_order_relaxed);
    if (!st.ok()) spdlog::warn("troupe runtime: node {}: {}", self->config_.node_id, st.error().message);
  }

  void io_loop() {
    zmq::pollitem_t items[] = {{pull->handle(), 0, ZMQ_POLLIN, 0}};
    while (!stopping) {
      try {
        zmq::poll(items, 1, std::chrono::milliseconds(50));
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        for (int i = 0; i < 256; ++i) {
          zmq::message_t msg;
          auto got = pull->recv(msg, zmq::recv_flags::dontwait);
          if (!got) break;
          handle_frame(msg);
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        spdlog::error("troupe runtime: node {} receive loop: {}", self->config_.node_id, e.what());
      }
    }
  }

  void zap_loop(zmq::socket_t sock) {
    zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
    while (!stopping) {
      try {
        zmq::poll(items, 1, std::chrono::milliseconds(50));
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> parts;
        for (;;) {
          zmq::message_t part;
          if (!sock.recv(part, zmq::recv_flags::none)) break;
          bool more = part.more();
          parts.push_back(std::move(part));
          if (!more) break;
        }
        if (parts.size() < 6) continue;
        std::string mechanism = parts[5].to_string();
        std::string key;
        if (mechanism == "CURVE" && parts.size() >= 7 && parts[6].size() == 32) {
          char z85[41];
          zmq_z85_encode(z85, static_cast<const std::uint8_t*>(parts[6].data()), 32);
          key = z85;
        }
        bool ok = !key.empty() && authorized.count(key);
        if (!ok)
          spdlog::error("troupe runtime: node {} refused a {} peer from {}: key {} is not in {}", self->config_.node_id,
                        mechanism, parts[3].to_string(), key.empty() ? "(none)" : key,
                        self->config_.curve.authorized_keys_file);
        sock.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
        sock.send(parts[1], zmq::send_flags::sndmore);
        sock.send(zmq::buffer(std::string(ok ? "200" : "400")), zmq::send_flags::sndmore);
        sock.send(zmq::buffer(std::string(ok ? "OK" : "key not authorized")), zmq::send_flags::sndmore);
        sock.send(zmq::buffer(std::string(ok ? key : "")), zmq::send_flags::sndmore);
        sock.send(zmq::message_t(), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        spdlog::error("troupe runtime: ZAP handler: {}", e.what());
      }
    }
  }

  Peer* find_peer(std::uint32_t node) const {
    std::shared_lock lock(peers_mu);
    auto it = peers.find(node);
    return it == peers.end() ? nullptr : it->second.get();
  }

  void heartbeat_tick() {
    Clock::time_point t = now();
    std::vector<Peer*> ps;
    {
      std::shared_lock lock(peers_mu);
      for (auto& [n, p] : peers) ps.push_back(p.get());
    }
    Heartbeat hb{++heartbeat_seq};
    for (Peer* p : ps) {
      if (p->down) continue;
      EnvelopeHeader h;
      h.sender = ActorId{self->config_.node_id, 0};
      h.recipient = ActorId{p->info.node, 0};
      {
        std::lock_guard lock(p->mu);
        try {
          (void)p->push.send(encode_zmq_heartbeat(hb, h), zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
        }
      }
      if (io_delivering.load(std::memory_order_relaxed)) p->last_seen_ns.store(t.time_since_epoch().count());
      Duration silent = t - Clock::time_point(Duration(p->last_seen_ns.load()));
      if (silent > self->config_.heartbeat.timeout)
        self->declare_node_down(p->info.node, "no message or heartbeat for " + ms_text(silent) + " (timeout " +
                                                  ms_text(self->config_.heartbeat.timeout) + ")");
    }
  }
  static zmq::message_t encode_zmq_heartbeat(const Heartbeat& hb, EnvelopeHeader h) {
    return ActorSystem::encode_zmq(hb, h);
  }
};

// ================= ActorSystem =================

ActorSystem::ActorSystem(SystemConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>(this)) {}

Result<std::unique_ptr<ActorSystem>> ActorSystem::create(SystemConfig config) {
  if (config.threads < 0) return invalid_input("runtime: threads must be >= 0, got " + std::to_string(config.threads));
  if (config.mailbox_capacity == 0) return invalid_input("runtime: mailbox_capacity must be >= 1");
  std::unique_ptr<ActorSystem> sys(new ActorSystem(std::move(config)));
  TROUPE_TRY(sys->start());
  return sys;
}

static Status check_bind(const SystemConfig& c) {
  const std::string& b = c.bind;
  if (b.rfind("ipc://", 0) == 0) return {};
  if (b.rfind("tcp://", 0) == 0) {
    std::string host = b.substr(6, b.rfind(':') == std::string::npos || b.rfind(':') < 6 ? std::string::npos : b.rfind(':') - 6);
    bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
    if (!loopback && !c.allow_nonlocal_bind)
      return invalid_input("runtime: refusing to bind " + b +
                           ": tcp binds to loopback unless runtime.allow_nonlocal_bind is set (enable CURVE for cross-node traffic)");
    return {};
  }
  return invalid_input("runtime: bind address '" + b + "' must start with ipc:// or tcp://");
}

Status ActorSystem::start() {
  Impl& I = *impl_;
  I.manual = config_.threads == 0;
  if (!config_.bind.empty()) {
    TROUPE_TRY(check_bind(config_));
    try {
      I.zctx = std::make_unique<zmq::context_t>(1);
      if (config_.curve.enabled) {
        if (!zmq_has("curve")) return invalid_input("runtime: CURVE requested but this libzmq was built without it");
        TROUPE_ASSIGN_OR_RETURN(auto kp, load_curve_keypair(config_.curve.public_key_file, config_.curve.secret_key_file));
        curve_public_ = kp.public_key;
        I.curve_secret = kp.secret_key;
        TROUPE_ASSIGN_OR_RETURN(auto keys, load_authorized_keys(config_.curve.authorized_keys_file));
        I.authorized.insert(keys.begin(), keys.end());
        zmq::socket_t zap(*I.zctx, zmq::socket_type::rep);
        zap.bind("inproc://zeromq.zap.01");
        I.zap_thread = std::thread([this, s = std::move(zap)]() mutable { impl_->zap_loop(std::move(s)); });
      }
      I.pull = std::make_unique<zmq::socket_t>(*I.zctx, zmq::socket_type::pull);
      I.pull->set(zmq::sockopt::rcvhwm, config_.hwm);
      I.pull->set(zmq::sockopt::linger, 0);
      if (config_.curve.enabled) {
        I.pull->set(zmq::sockopt::curve_server, 1);
        I.pull->set(zmq::sockopt::curve_secretkey, I.curve_secret);
        I.pull->set(zmq::sockopt::zap_domain, std::string("troupe"));
      }
      I.pull->bind(config_.bind);
      endpoint_ = I.pull->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return make_error(ErrorCode::io, "runtime: cannot bind " + config_.bind + ": " + e.what());
    }
    I.io_thread = std::thread([this] { impl_->io_loop(); });
  }
  for (int i = 0; i < config_.threads; ++i) I.workers.emplace_back([this] { impl_->worker_loop(); });
  if (!I.manual) I.timer_thread = std::thread([this] { impl_->timer_loop(); });
  return {};
}

ActorSystem::~ActorSystem() { shutdown(Duration{0}); }

Status ActorSystem::connect(const std::vector<PeerInfo>& peers) {
  Impl& I = *impl_;
  if (!I.zctx) return invalid_input("runtime: node " + std::to_string(config_.node_id) + " has no bind address, cannot connect to peers");
  bool any = false;
  for (const PeerInfo& info : peers) {
    if (info.node == config_.node_id) continue;
    auto p = std::make_unique<Peer>();
    p->info = info;
    try {
      p->push = zmq::socket_t(*I.zctx, zmq::socket_type::push);
      p->push.set(zmq::sockopt::sndhwm, config_.hwm);
      p->push.set(zmq::sockopt::linger, 200);
      p->push.set(zmq::sockopt::sndtimeo, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(config_.send_timeout).count()));
      if (config_.curve.enabled) {
        if (info.curve_public_key.size() != 40)
          return invalid_input("runtime: peer node " + std::to_string(info.node) + " (" + info.role + ") has no valid CURVE public key");
        p->push.set(zmq::sockopt::curve_serverkey, info.curve_public_key);
        p->push.set(zmq::sockopt::curve_publickey, curve_public_);
        p->push.set(zmq::sockopt::curve_secretkey, I.curve_secret);
      }
      p->push.connect(info.endpoint);
    } catch (const zmq::error_t& e) {
      return invalid_input("runtime: cannot connect to node " + std::to_string(info.node) + " (" + info.role + ") at '" +
                           info.endpoint + "': " + e.what());
    }
    p->last_seen_ns = I.now().time_since_epoch().count();
    std::unique_lock lock(I.peers_mu);
    I.peers[info.node] = std::move(p);
    any = true;
  }
  if (any && !I.heartbeat_timer && config_.heartbeat.interval.count() > 0)
    I.heartbeat_timer = I.add_timer(now() + config_.heartbeat.interval, config_.heartbeat.interval, [this] { impl_->heartbeat_tick(); });
  return {};
}

void ActorSystem::set_placement(std::map<std::string, std::uint32_t> name_to_node) {
  std::unique_lock lock(impl_->names_mu);
  impl_->placement = std::move(name_to_node);
}

std::vector<PeerInfo> ActorSystem::peers() const {
  std::vector<PeerInfo> out;
  std::shared_lock lock(impl_->peers_mu);
  for (auto& [n, p] : impl_->peers) out.push_back(p->info);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.node < b.node; });
  return out;
}

Result<ActorId> ActorSystem::spawn(ActorFactory factory, SpawnOptions options) {
  Impl& I = *impl_;
  if (I.stopping) return make_error(ErrorCode::internal, "runtime: spawn after shutdown");
  std::uint32_t local = I.next_local.fetch_add(1);
  if (local >= kMaxActors) return make_error(ErrorCode::internal, "runtime: more than 65535 actors on one node");
  ActorId id{config_.node_id, local};
  auto cell = std::make_unique<ActorCell>(id, options.name, options.mailbox_capacity ? options.mailbox_capacity : config_.mailbox_capacity);
  cell->factory = std::move(factory);
  cell->restart = options.restart;
  cell->supervisor = options.supervisor;
  cell->actor = cell->factory();
  if (!cell->actor) return make_error(ErrorCode::internal, "runtime: factory for actor '" + options.name + "' returned null");
  if (cell->actor->setup_error()) return *cell->actor->setup_error();
  if (!options.name.empty()) TROUPE_TRY(register_name(options.name, id));
  ActorCell* raw = cell.get();
  {
    std::lock_guard lock(I.cells_mu);
    I.owned.push_back(std::move(cell));
  }
  I.slots[local].store(raw, std::memory_order_release);
  I.post_task(raw, [raw](Context& ctx) {
    try {
      raw->actor->on_start(ctx);
    } catch (const std::exception& e) {
      raw->fail_requested = make_error(ErrorCode::internal, "actor " + raw->label() + " threw in on_start: " + e.what());
    }
  });
  return id;
}

Status ActorSystem::register_name(const std::string& name, ActorId id) {
  if (!is_local(id)) return invalid_input("runtime: register_name('" + name + "'): " + to_string(id) + " is not on this node");
  std::uint32_t alias = name_hash(name);
  std::unique_lock lock(impl_->names_mu);
  if (impl_->names.count(name)) return invalid_input("runtime: actor name '" + name + "' is already registered on node " + std::to_string(config_.node_id));
  if (impl_->aliases.count(alias)) return invalid_input("runtime: actor name '" + name + "' collides with another name's hash; rename it");
  impl_->names[name] = id.local;
  impl_->aliases[alias] = id.local;
  return {};
}

ActorId ActorSystem::named(std::uint32_t node, std::string_view name) { return ActorId{node, name_hash(name)}; }

Result<ActorId> ActorSystem::lookup(std::string_view name) const {
  std::shared_lock lock(impl_->names_mu);
  auto it = impl_->names.find(std::string(name));
  if (it != impl_->names.end()) return ActorId{config_.node_id, it->second};
  auto pl = impl_->placement.find(std::string(name));
  if (pl != impl_->placement.end()) return named(pl->second, name);
  return invalid_input("runtime: no actor named '" + std::string(name) + "' on node " + std::to_string(config_.node_id) +
                       " and none in the placement table");
}

void ActorSystem::stop_actor(ActorId id) {
  if (!is_local(id)) return;
  if (ActorCell* c = impl_->find_cell(id.local)) impl_->post_task(c, [](Context& ctx) { ctx.stop(); });
}

std::size_t ActorSystem::mailbox_size(ActorId id) const {
  ActorCell* c = is_local(id) ? impl_->find_cell(id.local) : nullptr;
  return c ? c->mailbox.size() : 0;
}
std::size_t ActorSystem::mailbox_high_water(ActorId id) const {
  ActorCell* c = is_local(id) ? impl_->find_cell(id.local) : nullptr;
  return c ? c->mailbox.high_water() : 0;
}

Status ActorSystem::deliver_local(Mail&& mail, Overflow policy, bool on_receive_thread) {
  Impl& I = *impl_;
  if (mail.header.flags & kFlagReply) {
    I.complete(mail.header.correlation, std::make_shared<Mail>(std::move(mail)));
    return {};
  }
  ActorCell* c = I.find_cell(mail.header.recipient.local);
  if (!c || c->state == CellState::stopped) {
    std::string why = "no live actor " + to_string(mail.header.recipient) + " on node " + std::to_string(config_.node_id) +
                      " for " + registered_type_name(mail.header.type_id);
    if (mail.header.flags & kFlagRequest) {
      ErrorReply er{static_cast<std::int32_t>(ErrorCode::peer_failed), why};
      (void)send_from(ActorId{config_.node_id, 0}, mail.header.sender, er, kFlagReply, mail.header.correlation, Overflow::fail);
    }
    return make_error(ErrorCode::peer_failed, "runtime: " + why);
  }
  if (I.manual) policy = Overflow::fail;  // one thread: waiting for room would wait forever
  auto r = c->mailbox.push(std::move(mail), policy, Clock::now() + config_.send_timeout);
  if (!r.ok()) return make_error(r.error().code, "runtime: send to actor " + c->label() + ": " + r.error().message);
  if (r.value()) {
    if (on_receive_thread && config_.inline_receive && !I.manual) {
      I.busy.fetch_add(1);
      I.process(c, I.io_batch, /*spin=*/false);  // we own the scheduled bit: exclusive, like a worker
      I.busy.fetch_sub(1);
    } else {
      I.enqueue(c);
    }
  }
  return {};
}

Status ActorSystem::send_frame(std::uint32_t node, zmq::message_t frame, Overflow policy) {
  Peer* p = impl_->find_peer(node);
  if (!p) return invalid_input("runtime: no route to node " + std::to_string(node) + ": not in node " + std::to_string(config_.node_id) + "'s address book");
  if (p->down) return make_error(ErrorCode::peer_failed, "runtime: node " + std::to_string(node) + " (role " + p->info.role + ") is down");
  std::lock_guard lock(p->mu);
  try {
    auto sent = p->push.send(frame, policy == Overflow::fail ? zmq::send_flags::dontwait : zmq::send_flags::none);
    if (!sent)
      return make_error(ErrorCode::timeout, "runtime: send queue to node " + std::to_string(node) + " (role " + p->info.role + ", " +
                                                p->info.endpoint + ") is full (hwm " + std::to_string(config_.hwm) + "): receiver too slow or gone");
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "runtime: send to node " + std::to_string(node) + ": " + e.what());
  }
  return {};
}

std::uint64_t ActorSystem::begin_request(ActorId owner, ActorId to, Duration timeout, RawReply on_reply) {
  Impl& I = *impl_;
  if (!is_local(to)) {
    Peer* p = I.find_peer(to.node);
    if (p && p->down) {
      Error e = make_error(ErrorCode::peer_failed, "runtime: request to " + to_string(to) + ": node " + std::to_string(to.node) +
                                                       " (role " + p->info.role + ") is down");
      if (owner.local == 0) on_reply(nullptr, e);
      else if (ActorCell* c = I.find_cell(owner.local)) {
        auto cb = std::make_shared<RawReply>(std::move(on_reply));
        I.post_task(c, [cb, e](Context& ctx) { (*cb)(&ctx, e); });
      }
      return 0;
    }
  }
  std::uint64_t corr = I.next_corr.fetch_add(1);
  {
    std::lock_guard lock(I.requests_mu);
    I.requests[corr] = Pending{owner, to.node, std::move(on_reply), 0};
  }
  TimerId t = I.add_timer(now() + timeout, Duration{0}, [this, corr, to, timeout] {
    fail_request(corr, make_error(ErrorCode::timeout, "runtime: request " + std::to_string(corr) + " to " + to_string(to) +
                                                          " timed out after " + ms_text(timeout)));
  });
  {
    std::lock_guard lock(I.requests_mu);
    auto it = I.requests.find(corr);
    if (it != I.requests.end()) it->second.timer = t;
  }
  return corr;
}

void ActorSystem::fail_request(std::uint64_t correlation, Error e) { impl_->complete(correlation, std::move(e)); }

TimerId ActorSystem::start_timer(ActorId owner, Duration delay, Duration period, std::function<void(Context&)> fn) {
  Impl& I = *impl_;
  ActorCell* c = I.find_cell(owner.local);
  if (!c) return 0;
  auto shared = std::make_shared<std::function<void(Context&)>>(std::move(fn));
  auto id_holder = std::make_shared<TimerId>(0);
  bool one_shot = period.count() <= 0;
  TimerId id = I.add_timer(now() + delay, period, [this, c, shared, id_holder, one_shot] {
    TimerId id = *id_holder;
    impl_->post_task(c, [this, shared, id, one_shot](Context& ctx) {
      if (!impl_->timer_live(id)) return;  // cancelled after it fired but before it ran
      if (one_shot) {
        std::lock_guard lock(impl_->timers_mu);
        impl_->live_timers.erase(id);
      }
      (*shared)(ctx);
    });
  });
  *id_holder = id;
  return id;
}

void ActorSystem::cancel_timer(TimerId id) { impl_->remove_timer(id); }

void ActorSystem::watch_node_for(ActorId watcher, std::uint32_t node) {
  bool already_down = node_is_down(node);
  {
    std::lock_guard lock(impl_->watch_mu);
    impl_->node_watchers[node].push_back(watcher);
  }
  if (already_down) {
    Peer* p = impl_->find_peer(node);
    (void)send_from(ActorId{config_.node_id, 0}, watcher, NodeDown{node, p ? p->info.role : "", "already down"}, 0, 0, Overflow::fail);
  }
}

void ActorSystem::monitor_for(ActorId watcher, ActorId target) {
  ActorCell* c = is_local(target) ? impl_->find_cell(target.local) : nullptr;
  if (!c || c->state == CellState::stopped) {
    (void)send_from(ActorId{config_.node_id, 0}, watcher, ActorDown{target.packed(), c ? c->name : "", "not running"}, 0, 0, Overflow::fail);
    return;
  }
  std::lock_guard lock(c->monitors_mu);
  c->monitors.push_back(watcher);
}

void ActorSystem::mark_failed(ActorCell* cell, Error e) {
  if (!cell->fail_requested) cell->fail_requested = std::move(e);
}
void ActorSystem::mark_stop(ActorCell* cell) { cell->stop_requested = true; }

void ActorSystem::on_node_down(std::function<void(const NodeDown&)> fn) {
  std::lock_guard lock(impl_->watch_mu);
  impl_->down_callbacks.push_back(std::move(fn));
}
void ActorSystem::on_escalation(std::function<void(const Error&)> fn) {
  std::lock_guard lock(impl_->watch_mu);
  impl_->escalation_callbacks.push_back(std::move(fn));
}

bool ActorSystem::node_is_down(std::uint32_t node) const {
  Peer* p = impl_->find_peer(node);
  return p && p->down;
}

void ActorSystem::declare_node_down(std::uint32_t node, const std::string& reason) {
  Impl& I = *impl_;
  Peer* p = I.find_peer(node);
  if (!p || p->down.exchange(true)) return;
  NodeDown nd{node, p->info.role, reason};
  spdlog::error("troupe runtime: node {} (role {}, {}) is down: {}", node, p->info.role, p->info.endpoint, reason);
  std::vector<std::uint64_t> doomed;
  {
    std::lock_guard lock(I.requests_mu);
    for (auto& [corr, pend] : I.requests)
      if (pend.target_node == node) doomed.push_back(corr);
  }
  for (auto corr : doomed)
    fail_request(corr, make_error(ErrorCode::peer_failed, "runtime: node " + std::to_string(node) + " (role " + p->info.role + ") is down: " + reason));
  std::vector<ActorId> watchers;
  std::vector<std::function<void(const NodeDown&)>> cbs;
  {
    std::lock_guard lock(I.watch_mu);
    watchers = I.node_watchers[node];
    cbs = I.down_callbacks;
  }
  for (ActorId w : watchers) (void)send_from(ActorId{config_.node_id, 0}, w, nd, 0, 0, Overflow::fail);
  for (auto& f : cbs) f(nd);
}

std::size_t ActorSystem::run_until_idle() {
  Impl& I = *impl_;
  std::size_t ran = 0;
  std::vector<Mail> batch;
  for (;;) {
    ActorCell* c;
    {
      std::lock_guard lock(I.runq_mu);
      if (I.runq.empty()) break;
      c = I.runq.front();
      I.runq.pop_front();
      I.runq_size = I.runq.size();
    }
    std::size_t before = c->mailbox.size();
    I.process(c, batch);
    ran += 1 + (before > c->mailbox.size() ? before - c->mailbox.size() : 0);
  }
  return ran;
}

void ActorSystem::advance(Duration d) {
  Impl& I = *impl_;
  run_until_idle();
  Clock::time_point target = now() + d;
  // Fire timers in deadline order, running the mail each produces before the next fires.
  for (;;) {
    Clock::time_point next;
    {
      std::lock_guard lock(I.timers_mu);
      if (I.timers.empty() || I.timers.begin()->first > target) break;
      next = I.timers.begin()->first;
    }
    if (I.manual) I.manual_now_ns = std::max(I.manual_now_ns.load(), next.time_since_epoch().count());
    I.fire_due(next);
    run_until_idle();
  }
  if (I.manual) I.manual_now_ns = target.time_since_epoch().count();
  run_until_idle();
}

Clock::time_point ActorSystem::now() const { return impl_->now(); }

void ActorSystem::shutdown(Duration drain) {
  Impl& I = *impl_;
  if (I.shut_down) return;
  I.shut_down = true;
  Clock::time_point deadline = Clock::now() + drain;
  if (I.manual) {
    run_until_idle();
  } else {
    // Drain: wait until no cell is queued or running, or the deadline passes.
    while (Clock::now() < deadline) {
      bool idle;
      {
        std::lock_guard lock(I.runq_mu);
        idle = I.runq.empty() && I.busy.load() == 0;
      }
      if (idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  I.stopping = true;
  I.runq_cv.notify_all();
  I.timers_cv.notify_all();
  for (auto& w : I.workers) w.join();
  if (I.timer_thread.joinable()) I.timer_thread.join();
  if (I.io_thread.joinable()) I.io_thread.join();
  if (I.zap_thread.joinable()) I.zap_thread.join();
  // Close every mailbox so blocked senders return; fail every pending request.
  std::vector<ActorCell*> cells;
  {
    std::lock_guard lock(I.cells_mu);
    for (auto& c : I.owned) cells.push_back(c.get());
  }
  for (ActorCell* c : cells) c->mailbox.close();
  std::vector<std::uint64_t> pending;
  {
    std::lock_guard lock(I.requests_mu);
    for (auto& [corr, p] : I.requests) pending.push_back(corr);
  }
  for (auto corr : pending) {
    Pending p;
    {
      std::lock_guard lock(I.requests_mu);
      auto it = I.requests.find(corr);
      if (it == I.requests.end()) continue;
      p = std::move(it->second);
      I.requests.erase(it);
    }
    if (p.owner.local == 0) p.on_reply(nullptr, make_error(ErrorCode::peer_failed, "runtime: actor system shut down"));
  }
  for (ActorCell* c : cells) {
    if (c->state != CellState::stopped && c->actor) {
      Context ctx(this, c, c->id, nullptr);
      try {
        c->actor->on_stop(ctx);
      } catch (const std::exception& e) {
        spdlog::warn("troupe runtime: actor {} threw in on_stop: {}", c->label(), e.what());
      }
      c->state = CellState::stopped;
    }
  }
  {
    std::unique_lock lock(I.peers_mu);
    for (auto& [n, p] : I.peers) {
      p->push.set(zmq::sockopt::linger, 0);
      p->push.close();
    }
  }
  if (I.pull) I.pull->close();
  if (I.zctx) I.zctx->close();
  if (endpoint_.rfind("ipc://", 0) == 0) ::unlink(endpoint_.substr(6).c_str());  // zmq leaves the socket file
}

// ================= Context =================

Clock::time_point Context::now() const { return sys_->now(); }

Status Context::reply_error(const Error& e) {
  if (!mail_ || !(mail_->header.flags & kFlagRequest)) return make_error(ErrorCode::internal, "reply_error outside a request handler");
  ErrorReply er{static_cast<std::int32_t>(e.code), e.message};
  return sys_->send_from(self_, mail_->header.sender, std::move(er), kFlagReply, mail_->header.correlation, Overflow::block);
}

TimerId Context::after(Duration delay, std::function<void(Context&)> fn) {
  TimerId id = sys_->start_timer(self_, delay, Duration{0}, std::move(fn));
  cell_->timers.push_back(id);
  return id;
}
TimerId Context::every(Duration period, std::function<void(Context&)> fn) {
  TimerId id = sys_->start_timer(self_, period, period, std::move(fn));
  cell_->timers.push_back(id);
  return id;
}
void Context::cancel(TimerId id) {
  sys_->cancel_timer(id);
  auto& ts = cell_->timers;
  ts.erase(std::remove(ts.begin(), ts.end(), id), ts.end());
}
void Context::watch_node(std::uint32_t node) { sys_->watch_node_for(self_, node); }
void Context::monitor(ActorId a) { sys_->monitor_for(self_, a); }
void Context::fail(Error e) { sys_->mark_failed(cell_, std::move(e)); }
void Context::stop() { sys_->mark_stop(cell_); }

}  // namespace troupe::runtime
