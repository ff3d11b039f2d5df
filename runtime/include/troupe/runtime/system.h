// The actor system: actors with typed handlers, bounded mailboxes, a thread-pool scheduler (or a
// deterministic single-threaded one with a manual clock), request/reply with timeouts, timers,
// broadcast, supervision, and ZeroMQ transports to other nodes with heartbeats.
// Invariants: an actor runs one message at a time; the same send() reaches a local actor by
// direct hand-off and a remote one over ipc/tcp — placement is configuration, never actor code;
// every request ends exactly once (reply, error reply, timeout, or peer down).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "troupe/base/result.h"
#include "troupe/runtime/envelope.h"
#include "troupe/runtime/mailbox.h"

namespace troupe::runtime {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;
using TimerId = std::uint64_t;

class ActorSystem;
struct ActorCell;

// --- runtime notices delivered as ordinary typed messages ---
struct NodeDown {  // a watched peer node stopped answering heartbeats (or was declared dead)
  static constexpr std::uint32_t type_id = kSystemTypeBase + 3;
  static constexpr const char* type_name = "NodeDown";
  std::uint32_t node = 0;
  std::string role;
  std::string reason;
  template <class A>
  void serialize(A& ar) { ar(node, role, reason); }
};
struct ActorDown {  // a monitored actor stopped or exhausted its restarts
  static constexpr std::uint32_t type_id = kSystemTypeBase + 4;
  static constexpr const char* type_name = "ActorDown";
  std::uint64_t actor = 0;  // ActorId::packed()
  std::string name;
  std::string reason;
  template <class A>
  void serialize(A& ar) { ar(actor, name, reason); }
};

struct RestartPolicy {
  int max_restarts = 3;                            // within `window`; one more failure escalates
  Duration window = std::chrono::seconds(10);
  Duration backoff_initial = std::chrono::milliseconds(10);  // doubles per restart in the window
  Duration backoff_max = std::chrono::seconds(1);
};

struct SpawnOptions {
  std::string name;                    // registered name ("" = none); lookup()/named() find it
  std::size_t mailbox_capacity = 0;    // 0 = SystemConfig::mailbox_capacity
  std::optional<RestartPolicy> restart;  // none = a failure stops the actor (and escalates)
  ActorId supervisor;                  // who is failed when restarts are exhausted (none = system)

  // Chainable setters (designated initializers that skip fields trip -Wmissing-field-initializers):
  //   sys.spawn(f, SpawnOptions().named("learner").restart_with(policy).supervised_by(sup))
  SpawnOptions& named(std::string n) { name = std::move(n); return *this; }
  SpawnOptions& capacity(std::size_t c) { mailbox_capacity = c; return *this; }
  SpawnOptions& restart_with(RestartPolicy p) { restart = p; return *this; }
  SpawnOptions& supervised_by(ActorId s) { supervisor = s; return *this; }
};

struct HeartbeatConfig {
  Duration interval = std::chrono::milliseconds(500);
  Duration timeout = std::chrono::seconds(5);  // silence longer than this = node down
};

struct CurveConfig {
  bool enabled = false;
  std::string public_key_file;       // Z85 text (40 chars), see curve.h
  std::string secret_key_file;
  std::string authorized_keys_file;  // one Z85 public key per line; clients not listed are refused
};

struct SystemConfig {
  std::uint32_t node_id = 0;
  std::string role = "main";
  int threads = 2;  // worker threads; 0 = deterministic mode (run_until_idle/advance, manual clock)
  std::size_t mailbox_capacity = 1024;
  Duration send_timeout = std::chrono::seconds(10);  // how long a blocked send waits for room
  std::string bind;  // "" = local only; "ipc:///path" or "tcp://127.0.0.1:*" (port * = ephemeral)
  bool allow_nonlocal_bind = false;  // tcp on anything but loopback needs this (and CURVE advised)
  int hwm = 1000;                    // ZeroMQ send/receive high-water marks (messages)
  // Largest message part (frame) the receiving socket accepts from a peer (ZMQ_MAXMSGSIZE); -1 =
  // no limit. A peer sending a larger one has its connection dropped by libzmq before the part is
  // allocated: that message is lost (a request waiting for it times out), the peer reconnects.
  std::int64_t max_message_bytes = -1;
  // Run an idle recipient's batch of remote mail right on the receive thread instead of waking a
  // worker: one thread hop less per remote message. A handler that runs longer than a
  // millisecond does not stall this node's receiving: a second receive thread takes the socket
  // over meanwhile. false = every remote message goes through the worker pool.
  bool inline_receive = true;
  HeartbeatConfig heartbeat;
  CurveConfig curve;
};

// One row of the address book / node table (filled from config or by the MPI bootstrap).
struct PeerInfo {
  std::uint32_t node = 0;
  std::string endpoint;
  std::string role;
  std::string curve_public_key;  // Z85, required when CURVE is on
};

class Context;
class ActorSystem;

// Where the reply to a request goes, for a handler that answers after it returns (from a timer,
// or from a thread of its own): Context::reply_later() gives it. Empty when the mail handled was
// no request; then send() and send_error() fail.
struct ReplyTo {
  ActorSystem* sys = nullptr;
  ActorId self, to;
  std::uint64_t correlation = 0;
  explicit operator bool() const { return sys != nullptr; }
  template <Message M>
  Status send(M msg) const;
  Status send_error(const Error& e) const;  // the requester gets the error (an ErrorReply)
};

// An actor: handlers by message type, run one at a time. Handlers may return void or Status;
// an error Status answers a request with an ErrorReply; an exception or ctx.fail() is a crash
// (the supervisor's restart policy applies).
class Actor {
 public:
  virtual ~Actor() = default;
  virtual void on_start(Context&) {}
  virtual void on_stop(Context&) {}

  template <Message M, class F>
  void handle(F fn);

  using RawHandler = std::function<Status(Context&, const Mail&)>;
  const RawHandler* find_handler(std::uint32_t type_id) const {
    auto it = handlers_.find(type_id);
    return it == handlers_.end() ? nullptr : &it->second;
  }
  const std::optional<Error>& setup_error() const { return setup_error_; }

 private:
  std::unordered_map<std::uint32_t, RawHandler> handlers_;
  std::optional<Error> setup_error_;
};

using ActorFactory = std::function<std::unique_ptr<Actor>()>;

template <class M>
Result<M> message_from_mail(const Mail& m);

// One frame (header + payload) of a remote send, written once, straight where the transport
// wants it: into a ZeroMQ message of its own or appended to a batch for the same peer.
// A frame with out-of-line runs (kFlagSegmented) lists them in `segments`, pointing into memory
// that `owner` keeps alive until ZeroMQ is done with them (it sends them as they are).
struct FrameWriter {
  std::size_t size = 0;                                     // kHeaderSize + payload
  void (*write)(char* out, const void* state) = nullptr;  // writes exactly `size` bytes
  const void* state = nullptr;
  const std::vector<WireSegment>* segments = nullptr;
  std::shared_ptr<const void> owner;
};
// A frame of unknown size for the one-pass path into a batch: writes it into out[0, room) if it
// fits, and returns its size either way.
struct BoundedFrameWriter {
  std::size_t (*write)(char* out, std::size_t room, const void* state) = nullptr;
  const void* state = nullptr;
};

// The handle an actor's code gets: who it is, what it is handling, and everything it may do.
class Context {
 public:
  ActorSystem& system() const { return *sys_; }
  ActorId self() const { return self_; }
  ActorId sender() const { return mail_ ? mail_->header.sender : ActorId{}; }
  const EnvelopeHeader* header() const { return mail_ ? &mail_->header : nullptr; }
  Clock::time_point now() const;

  template <Message M>
  Status send(ActorId to, M msg);
  template <Message M>
  Status try_send(ActorId to, M msg);  // fails at once if the mailbox/queue is full
  template <Message M>
  Status reply(M msg);
  Status reply_error(const Error& e);
  ReplyTo reply_later() const;  // the reply address of the request being handled (empty if none)
  template <class Rep, Message Req, class F>
  void request(ActorId to, Req req, Duration timeout, F on_reply);  // on_reply(Context&, Result<Rep>)
  // The same request to several actors without a copy each: local recipients share the object
  // (their handlers get it const), a remote one is encoded from it.
  template <class Rep, Message Req, class F>
  void request(ActorId to, std::shared_ptr<const Req> req, Duration timeout, F on_reply);
  template <Message M>
  Status broadcast(std::span<const ActorId> group, const M& msg);

  TimerId after(Duration delay, std::function<void(Context&)> fn);
  TimerId every(Duration period, std::function<void(Context&)> fn);
  void cancel(TimerId id);

  void watch_node(std::uint32_t node);  // NodeDown arrives when it stops answering
  void monitor(ActorId local_actor);    // ActorDown arrives when it stops for good
  void fail(Error e);                   // crash after this handler; supervisor decides
  void stop();                          // stop after this handler

 private:
  friend class ActorSystem;
  Context(ActorSystem* s, ActorCell* c, ActorId self, const Mail* m) : sys_(s), cell_(c), self_(self), mail_(m) {}
  // on_reply(Context&, Result<Rep>) as the system's untyped reply callback
  template <class Rep, class F>
  static std::function<void(Context*, Result<std::shared_ptr<Mail>>)> typed_reply(F on_reply);
  ActorSystem* sys_;
  ActorCell* cell_;
  ActorId self_;
  const Mail* mail_;
};

class ActorSystem {
 public:
  static Result<std::unique_ptr<ActorSystem>> create(SystemConfig config);
  ~ActorSystem();
  ActorSystem(const ActorSystem&) = delete;
  ActorSystem& operator=(const ActorSystem&) = delete;

  std::uint32_t node_id() const { return config_.node_id; }
  const SystemConfig& config() const { return config_; }
  std::string endpoint() const { return endpoint_; }  // the bound address, ephemeral port resolved
  std::string curve_public_key() const { return curve_public_; }

  // --- placement ---
  Status connect(const std::vector<PeerInfo>& peers);  // skips this node's own row
  void set_placement(std::map<std::string, std::uint32_t> name_to_node);
  std::vector<PeerInfo> peers() const;

  // --- actors ---
  Result<ActorId> spawn(ActorFactory factory, SpawnOptions options = {});
  template <class A, class... Args>
  Result<ActorId> spawn_as(SpawnOptions options, Args... args) {
    return spawn([=]() -> std::unique_ptr<Actor> { return std::make_unique<A>(args...); }, std::move(options));
  }
  Status register_name(const std::string& name, ActorId local_actor);
  // Local name first, then the placement table (name -> node, addressed by alias).
  Result<ActorId> lookup(std::string_view name) const;
  // The alias address of `name` on `node` (resolved there on arrival).
  static ActorId named(std::uint32_t node, std::string_view name);
  void stop_actor(ActorId id);
  std::size_t mailbox_size(ActorId id) const;
  std::size_t mailbox_high_water(ActorId id) const;

  // --- messaging from outside any actor (tests, launchers); sender is this node (local id 0) ---
  template <Message M>
  Status send(ActorId to, M msg, Overflow policy = Overflow::block) {
    return send_from(ActorId{config_.node_id, 0}, to, std::move(msg), 0, 0, policy);
  }
  template <class Rep, Message Req>
  std::future<Result<Rep>> ask(ActorId to, Req req, Duration timeout);
  template <Message M>
  Status broadcast(std::span<const ActorId> group, const M& msg, ActorId from = {});

  // --- failure detection ---
  void on_node_down(std::function<void(const NodeDown&)> fn);  // called on the timer thread
  void on_escalation(std::function<void(const Error&)> fn);    // a top-level actor gave up
  bool node_is_down(std::uint32_t node) const;
  void declare_node_down(std::uint32_t node, const std::string& reason);

  // --- deterministic mode (threads == 0) ---
  std::size_t run_until_idle();  // runs queued mail on the caller's thread; returns items run
  void advance(Duration d);      // moves the manual clock, fires due timers, runs until idle
  Clock::time_point now() const;

  // Stops accepting new mail, lets actors drain until `drain` passes, stops everything.
  void shutdown(Duration drain = std::chrono::seconds(2));

  // --- plumbing used by the templates above and by Context (not for actor code) ---
  template <Message M>
  Status send_from(ActorId from, ActorId to, M msg, std::uint16_t flags, std::uint64_t correlation,
                   Overflow policy);
  template <Message M>  // a local recipient gets this object itself (shared, const)
  Status send_from(ActorId from, ActorId to, std::shared_ptr<const M> msg, std::uint16_t flags,
                   std::uint64_t correlation, Overflow policy);
  using RawReply = std::function<void(Context*, Result<std::shared_ptr<Mail>>)>;
  template <Message M>
  static EnvelopeHeader header_for(ActorId from, ActorId to, std::uint16_t flags, std::uint64_t correlation) {
    EnvelopeHeader h;
    h.flags = flags;
    h.type_id = M::type_id;
    h.sender = from;
    h.recipient = to;
    h.correlation = correlation;
    return h;
  }
  template <Message Req>
  void request_from(ActorId from, ActorId to, Req req, Duration timeout, RawReply on_reply);
  template <Message Req>
  void request_from(ActorId from, ActorId to, std::shared_ptr<const Req> req, Duration timeout, RawReply on_reply);
  TimerId start_timer(ActorId owner, Duration delay, Duration period, std::function<void(Context&)> fn);
  void cancel_timer(TimerId id);
  void watch_node_for(ActorId watcher, std::uint32_t node);
  void monitor_for(ActorId watcher, ActorId target);
  void mark_failed(ActorCell* cell, Error e);
  void mark_stop(ActorCell* cell);

 private:
  explicit ActorSystem(SystemConfig config);
  Status start();
  bool is_local(ActorId id) const { return id.node == config_.node_id; }
  Status deliver_local(Mail&& mail, Overflow policy);
  // Remote sends: the frame of m (header h) to h.recipient's node.
  template <Message M>
  Status send_remote(const M& m, const EnvelopeHeader& h, Overflow policy, std::size_t payload);
  // Long runs (wire.h) go to the socket as they are, kept alive by the shared message.
  template <Message M>
  Status send_remote_segmented(std::shared_ptr<const M> m, const EnvelopeHeader& h, Overflow policy);
  Status send_frame(std::uint32_t node, const FrameWriter& frame, Overflow policy);
  // A frame to a peer whose batch is open (a burst): written straight into the batch in one pass.
  // false = not taken (no burst, or too long for a batch): send it with send_frame.
  Result<bool> append_frame(std::uint32_t node, const BoundedFrameWriter& frame, Overflow policy);
  // A reply completes its request; other mail goes into its actor's mailbox. Returns the actor
  // when this push made it runnable (the caller runs or enqueues it), null otherwise. A full
  // mailbox under Overflow::fail leaves `mail` as it was (ErrorCode::timeout).
  Result<ActorCell*> route_local(Mail&& mail, Overflow policy);
  std::uint64_t begin_request(ActorId owner, ActorId to, Duration timeout, RawReply on_reply);
  void fail_request(std::uint64_t correlation, Error e);

  struct Impl;
  friend struct Impl;
  friend class Context;
  SystemConfig config_;
  std::string endpoint_;
  std::string curve_public_;
  std::unique_ptr<Impl> impl_;
};

// ================= template implementations =================

template <Message M, class F>
void Actor::handle(F fn) {
  if (auto st = register_message<M>(); !st.ok()) {
    setup_error_ = st.error();
    return;
  }
  handlers_[M::type_id] = [fn = std::move(fn)](Context& ctx, const Mail& mail) -> Status {
    auto call = [&](const M& m) -> Status {
      if constexpr (std::is_same_v<std::invoke_result_t<F&, Context&, const M&>, void>) {
        fn(ctx, m);
        return {};
      } else {
        return fn(ctx, m);
      }
    };
    if (const M* direct = mail.payload.template local_as<M>()) return call(*direct);  // local: the sender's object
    if (!mail.payload.is_frame())
      return make_error(ErrorCode::internal, std::string("message ") + message_name<M>() + " has no payload");
    M decoded;
    TROUPE_TRY(decode_payload(mail.payload, decoded));
    return call(decoded);
  };
}

template <class M>
Result<M> message_from_mail(const Mail& m) {
  if (m.header.type_id == ErrorReply::type_id) {
    ErrorReply er;
    if (const auto* d = m.payload.template local_as<ErrorReply>()) er = *d;
    else if (auto st = decode_payload(m.payload, er); !st.ok()) return st.error();
    return make_error(static_cast<ErrorCode>(er.code), er.message);
  }
  if (m.header.type_id != M::type_id)
    return invalid_input(std::string("expected reply ") + message_name<M>() + ", got " + registered_type_name(m.header.type_id));
  if (const auto* d = m.payload.template local_as<M>()) {
    if (m.payload.local_ptr().use_count() == 1) return std::move(*const_cast<M*>(d));  // sole owner: move out
    return *d;
  }
  M out;
  if (auto st = decode_payload(m.payload, out); !st.ok()) return st.error();
  return out;
}

template <Message M>
Status ActorSystem::send_remote(const M& m, const EnvelopeHeader& h, Overflow policy, std::size_t payload) {
  struct State {
    const M* m;
    const EnvelopeHeader* h;
    std::size_t payload;
  } state{&m, &h, payload};
  FrameWriter w{kHeaderSize + payload,
                [](char* out, const void* p) {
                  const auto* s = static_cast<const State*>(p);
                  write_frame(out, s->payload, *s->m, *s->h);
                },
                &state, nullptr, nullptr};
  return send_frame(h.recipient.node, w, policy);
}

template <Message M>
bool has_out_of_line_runs(const M& m, std::size_t payload) {
  if (payload < kWireSegmentMin) return false;
  std::vector<WireSegment> segments;
  (void)segmented_payload_size_of(m, segments);
  return !segments.empty();
}

template <Message M>
Status ActorSystem::send_remote_segmented(std::shared_ptr<const M> m, const EnvelopeHeader& h, Overflow policy) {
  std::vector<WireSegment> segments;
  struct State {
    const M* m;
    const EnvelopeHeader* h;
    std::size_t payload;
  } state{m.get(), &h, segmented_payload_size_of(*m, segments)};
  FrameWriter w{kHeaderSize + state.payload,
                [](char* out, const void* p) {
                  const auto* s = static_cast<const State*>(p);
                  write_segmented_frame(out, s->payload, *s->m, *s->h);
                },
                &state, &segments, m};
  return send_frame(h.recipient.node, w, policy);
}

template <Message M>
Status ActorSystem::send_from(ActorId from, ActorId to, M msg, std::uint16_t flags, std::uint64_t correlation,
                              Overflow policy) {
  if (is_local(to)) return send_from(from, to, std::make_shared<const M>(std::move(msg)), flags, correlation, policy);
  if (const Status& registered = register_message<M>(); !registered.ok()) return registered;
  const EnvelopeHeader h = header_for<M>(from, to, flags, correlation);
  {
    struct State {
      const M* m;
      const EnvelopeHeader* h;
    } state{&msg, &h};
    BoundedFrameWriter w{[](char* out, std::size_t room, const void* p) {
                           const auto* s = static_cast<const State*>(p);
                           return write_frame_bounded(out, room, *s->m, *s->h);
                         },
                         &state};
    auto appended = append_frame(to.node, w, policy);
    if (!appended.ok()) return appended.error();
    if (*appended) return {};
  }
  std::size_t payload = payload_size_of(msg);
  if (has_out_of_line_runs(msg, payload))
    return send_remote_segmented(std::make_shared<const M>(std::move(msg)), h, policy);
  return send_remote(msg, h, policy, payload);
}

template <Message M>
Status ActorSystem::send_from(ActorId from, ActorId to, std::shared_ptr<const M> msg, std::uint16_t flags,
                              std::uint64_t correlation, Overflow policy) {
  if (!is_local(to)) return send_from(from, to, M(*msg), flags, correlation, policy);  // encoded per peer anyway
  if (const Status& registered = register_message<M>(); !registered.ok()) return registered;
  return deliver_local(Mail{header_for<M>(from, to, flags, correlation), Payload::local(std::move(msg)), {}}, policy);
}

template <Message M>
Status ActorSystem::broadcast(std::span<const ActorId> group, const M& msg, ActorId from) {
  if (!from.node && !from.local) from = ActorId{config_.node_id, 0};
  std::shared_ptr<const M> shared;  // one object for every local member (and remote long runs)
  std::size_t payload = 0;
  bool long_runs = false, sized = false;
  Status first_error;
  for (ActorId to : group) {
    EnvelopeHeader h;
    h.type_id = M::type_id;
    h.sender = from;
    h.recipient = to;
    Status st;
    if (is_local(to)) {
      if (!shared) shared = std::make_shared<const M>(msg);
      st = deliver_local(Mail{h, Payload::local(shared), {}}, Overflow::block);
    } else {
      if (!sized) {
        payload = payload_size_of(msg);
        long_runs = has_out_of_line_runs(msg, payload);
        sized = true;
      }
      if (long_runs) {
        if (!shared) shared = std::make_shared<const M>(msg);
        st = send_remote_segmented(shared, h, Overflow::block);
      } else {
        st = send_remote(msg, h, Overflow::block, payload);
      }
    }
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  return first_error;
}

template <Message Req>
void ActorSystem::request_from(ActorId from, ActorId to, Req req, Duration timeout, RawReply on_reply) {
  std::uint64_t corr = begin_request(from, to, timeout, std::move(on_reply));
  if (corr == 0) return;  // already failed (target node down)
  Status st = send_from(from, to, std::move(req), kFlagRequest, corr, Overflow::block);
  if (!st.ok()) fail_request(corr, st.error());
}

template <Message Req>
void ActorSystem::request_from(ActorId from, ActorId to, std::shared_ptr<const Req> req, Duration timeout,
                               RawReply on_reply) {
  std::uint64_t corr = begin_request(from, to, timeout, std::move(on_reply));
  if (corr == 0) return;  // already failed (target node down)
  Status st = send_from(from, to, std::move(req), kFlagRequest, corr, Overflow::block);
  if (!st.ok()) fail_request(corr, st.error());
}

template <class Rep, Message Req>
std::future<Result<Rep>> ActorSystem::ask(ActorId to, Req req, Duration timeout) {
  auto promise = std::make_shared<std::promise<Result<Rep>>>();
  auto fut = promise->get_future();
  if (const Status& registered = register_message<Rep>(); !registered.ok()) {  // the reply must decode on arrival
    promise->set_value(registered.error());
    return fut;
  }
  request_from(ActorId{config_.node_id, 0}, to, std::move(req), timeout,
               [promise](Context*, Result<std::shared_ptr<Mail>> r) {
                 if (!r.ok()) promise->set_value(r.error());
                 else promise->set_value(message_from_mail<Rep>(**r));
               });
  return fut;
}

template <Message M>
Status Context::send(ActorId to, M msg) {
  return sys_->send_from(self_, to, std::move(msg), 0, 0, Overflow::block);
}
template <Message M>
Status Context::try_send(ActorId to, M msg) {
  return sys_->send_from(self_, to, std::move(msg), 0, 0, Overflow::fail);
}
template <Message M>
Status Context::reply(M msg) {
  return reply_later().send(std::move(msg));
}
template <Message M>
Status ReplyTo::send(M msg) const {
  if (!sys)
    return make_error(ErrorCode::internal, std::string("reply(") + message_name<M>() + ") outside a request handler");
  return sys->send_from(self, to, std::move(msg), kFlagReply, correlation, Overflow::block);
}
template <class Rep, Message Req, class F>
void Context::request(ActorId to, Req req, Duration timeout, F on_reply) {
  sys_->request_from(self_, to, std::move(req), timeout, typed_reply<Rep>(std::move(on_reply)));
}
template <class Rep, Message Req, class F>
void Context::request(ActorId to, std::shared_ptr<const Req> req, Duration timeout, F on_reply) {
  sys_->request_from(self_, to, std::move(req), timeout, typed_reply<Rep>(std::move(on_reply)));
}
template <class Rep, class F>
std::function<void(Context*, Result<std::shared_ptr<Mail>>)> Context::typed_reply(F on_reply) {
  if (const Status& registered = register_message<Rep>(); !registered.ok())  // the reply must decode on arrival
    return [cb = std::move(on_reply), error = registered.error()](Context* ctx, Result<std::shared_ptr<Mail>>) mutable {
      cb(*ctx, Result<Rep>(error));
    };
  return [cb = std::move(on_reply)](Context* ctx, Result<std::shared_ptr<Mail>> r) mutable {
    if (!r.ok()) cb(*ctx, Result<Rep>(r.error()));
    else cb(*ctx, message_from_mail<Rep>(**r));
  };
}
template <Message M>
Status Context::broadcast(std::span<const ActorId> group, const M& msg) {
  return sys_->broadcast(group, msg, self_);
}

}  // namespace troupe::runtime
