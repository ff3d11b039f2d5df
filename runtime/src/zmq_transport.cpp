// ZmqTransport: bind, connect, send and its batches, the receive threads and their token, the ZAP
// and flush threads, heartbeats (see zmq_transport.h).
#include "zmq_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <pthread.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include "troupe/base/clock.h"
#include "troupe/runtime/curve.h"

namespace troupe::runtime {

namespace {
using std::chrono::microseconds;
using std::chrono::milliseconds;

// --- receiving ---
// Envelopes read before the burst is delivered (and, inline, run: a bounded batch, far below the
// takeover time for short handlers).
constexpr std::size_t kBurstEnvelopes = 256;
// How long an inline actor batch may hold up receiving before the other receive thread takes the
// socket, how often that thread looks meanwhile, and after how many quiet looks it sleeps until told.
constexpr std::int64_t kTakeoverNs = 1'000'000;
constexpr milliseconds kStandbyTick{1};
constexpr int kQuietTicksBeforeSleep = 200;

// --- sending ---
// A frame this size or smaller may be coalesced; larger ones always travel as a message of their own.
constexpr std::size_t kCoalesceMax = 16 * 1024;
constexpr std::size_t kBatchBytes = 64 * 1024;  // an open batch this full is handed over
constexpr std::int64_t kLingerNs = 100'000;     // ... and one this old, at the next send to its peer
// A send this soon after the previous one to the same peer is part of a burst: it is coalesced
// (an isolated message, such as a request in a round trip, always leaves at once).
constexpr std::int64_t kBurstGapNs = 3'000;
constexpr std::size_t kMaxSealed = 4;  // batches ZeroMQ refused before a sender waits for room
constexpr microseconds kFlushTick{200};  // the flush thread's pace while batches are open

// The batching heuristics' clock, read on every remote send: the CPU's time-stamp counter where
// it runs at a constant rate (about a third of a steady_clock read), else steady_clock; the
// thresholds are converted to its ticks once.
struct BatchClock {
  bool tsc = false;
  std::int64_t burst_gap = kBurstGapNs;
  std::int64_t linger = kLingerNs;
  std::int64_t now() const {
#if defined(__x86_64__)
    if (tsc) return static_cast<std::int64_t>(__rdtsc());
#endif
    return mono_nanoseconds();
  }
};

const BatchClock& batch_clock() {
  static const BatchClock clock = [] {
    BatchClock c;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (__get_cpuid(0x80000007, &a, &b, &cx, &d) && (d & (1u << 8))) {  // invariant TSC
      const std::int64_t t0 = mono_nanoseconds(), c0 = static_cast<std::int64_t>(__rdtsc());
      while (mono_nanoseconds() - t0 < 2'000'000) {
      }
      const std::int64_t t1 = mono_nanoseconds(), c1 = static_cast<std::int64_t>(__rdtsc());
      const double per_ns = double(c1 - c0) / double(t1 - t0);
      if (per_ns > 0.1) {
        c.tsc = true;
        c.burst_gap = static_cast<std::int64_t>(kBurstGapNs * per_ns);
        c.linger = static_cast<std::int64_t>(kLingerNs * per_ns);
      }
    }
#endif
    return c;
  }();
  return clock;
}

Status check_bind(const SystemConfig& c) {
  const std::string& b = c.bind;
  if (b.rfind("ipc://", 0) == 0) return {};
  if (b.rfind("tcp://", 0) == 0) {
    std::string host = b.substr(
        6, b.rfind(':') == std::string::npos || b.rfind(':') < 6 ? std::string::npos : b.rfind(':') - 6);
    bool loopback =
        host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
    if (!loopback && !c.allow_nonlocal_bind)
      return invalid_input("runtime: refusing to bind " + b +
                           ": tcp binds to loopback unless runtime.allow_nonlocal_bind is set (enable CURVE "
                           "for cross-node traffic)");
    return {};
  }
  return invalid_input("runtime: bind address '" + b + "' must start with ipc:// or tcp://");
}
}  // namespace

Status ZmqTransport::bind() {
  TROUPE_TRY(check_bind(config_));
  (void)batch_clock();  // calibrated here, not on the first send
  try {
    zctx_ = std::make_unique<zmq::context_t>(1);
    if (config_.curve.enabled) {
      if (!zmq_has("curve"))
        return invalid_input("runtime: CURVE requested but this libzmq was built without it");
      TROUPE_ASSIGN_OR_RETURN(
          auto kp, load_curve_keypair(config_.curve.public_key_file, config_.curve.secret_key_file));
      curve_public_ = kp.public_key;
      curve_secret_ = kp.secret_key;
      TROUPE_ASSIGN_OR_RETURN(auto keys, load_authorized_keys(config_.curve.authorized_keys_file));
      authorized_.insert(keys.begin(), keys.end());
      zmq::socket_t zap(*zctx_, zmq::socket_type::rep);
      zap.bind("inproc://zeromq.zap.01");
      zap_thread_ = std::thread([this, s = std::move(zap)]() mutable {
        pthread_setname_np(pthread_self(), "troupe-zap");
        zap_loop(std::move(s));
      });
    }
    pull_ = std::make_unique<zmq::socket_t>(*zctx_, zmq::socket_type::pull);
    pull_->set(zmq::sockopt::rcvhwm, config_.hwm);
    pull_->set(zmq::sockopt::linger, 0);
    if (config_.max_message_bytes > 0) pull_->set(zmq::sockopt::maxmsgsize, config_.max_message_bytes);
    if (config_.curve.enabled) {
      pull_->set(zmq::sockopt::curve_server, 1);
      pull_->set(zmq::sockopt::curve_secretkey, curve_secret_);
      pull_->set(zmq::sockopt::zap_domain, std::string("troupe"));
    }
    pull_->bind(config_.bind);
    endpoint_ = pull_->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "runtime: cannot bind " + config_.bind + ": " + e.what());
  }
  receive_threads_[0] = std::thread([this] { receive_loop(/*primary=*/true); });
  if (config_.inline_receive && config_.threads > 0)
    receive_threads_[1] = std::thread([this] { receive_loop(/*primary=*/false); });
  flush_thread_ = std::thread([this] { flush_loop(); });
  if (link_bytes_per_s_ > 0) pacer_thread_ = std::thread([this] { pacer_loop(); });
  return {};
}

Status ZmqTransport::connect(const std::vector<PeerInfo>& peers) {
  if (!zctx_)
    return invalid_input("runtime: node " + std::to_string(config_.node_id) +
                         " has no bind address, cannot connect to peers");
  bool any = false;
  for (const PeerInfo& info : peers) {
    if (info.node == config_.node_id) continue;
    if (Peer* known = find_peer(info.node)) {
      // A peer's socket and batches live as long as the transport: a node is connected once.
      if (known->info.endpoint == info.endpoint) continue;
      return invalid_input("runtime: node " + std::to_string(info.node) + " is already connected at '" +
                           known->info.endpoint + "', not '" + info.endpoint + "'");
    }
    auto p = std::make_unique<Peer>();
    p->info = info;
    try {
      p->push = zmq::socket_t(*zctx_, zmq::socket_type::push);
      p->push.set(zmq::sockopt::sndhwm, config_.hwm);
      p->push.set(zmq::sockopt::linger, 200);
      p->push.set(zmq::sockopt::sndtimeo,
                  static_cast<int>(
                      std::chrono::duration_cast<std::chrono::milliseconds>(config_.send_timeout).count()));
      if (config_.curve.enabled) {
        if (info.curve_public_key.size() != 40)
          return invalid_input("runtime: peer node " + std::to_string(info.node) + " (" + info.role +
                               ") has no valid CURVE public key");
        p->push.set(zmq::sockopt::curve_serverkey, info.curve_public_key);
        p->push.set(zmq::sockopt::curve_publickey, curve_public_);
        p->push.set(zmq::sockopt::curve_secretkey, curve_secret_);
      }
      p->push.connect(info.endpoint);
    } catch (const zmq::error_t& e) {
      return invalid_input("runtime: cannot connect to node " + std::to_string(info.node) + " (" + info.role +
                           ") at '" + info.endpoint + "': " + e.what());
    }
    p->last_seen_ns = timers_.now().time_since_epoch().count();
    std::unique_lock lock(peers_mu_);
    Peer* raw = p.get();
    peers_[info.node] = std::move(p);
    if (info.node < kDirectPeers) by_node_[info.node].store(raw, std::memory_order_release);
    any = true;
  }
  const Duration interval = config_.heartbeat.interval;
  if (any && !heartbeat_timer_ && interval.count() > 0)
    heartbeat_timer_ = timers_.add(timers_.now() + interval, interval, [this] { heartbeat_tick(); });
  return {};
}

// ---- sending ----

Status ZmqTransport::send(std::uint32_t node, const FrameWriter& frame, Overflow policy) {
  Peer* p = find_peer(node);
  if (!p)
    return invalid_input("runtime: no route to node " + std::to_string(node) + ": not in node " +
                         std::to_string(config_.node_id) + "'s address book");
  if (p->down)
    return make_error(ErrorCode::peer_failed,
                      "runtime: node " + std::to_string(node) + " (role " + p->info.role + ") is down");
  TROUPE_TRY(check_size(*p, frame));
  if (link_bytes_per_s_ > 0) return send_paced(*p, frame);
  const bool block = policy == Overflow::block;
  const BatchClock& clock = batch_clock();
  const std::int64_t now = clock.now();
  std::lock_guard lock(p->mu);
  const bool backlog = p->open_size || !p->sealed.empty();
  if (frame.segments && !frame.segments->empty()) {
    p->last_send.store(now, std::memory_order_relaxed);
    if (backlog) {
      if (p->open_size) seal_open(*p);
      TROUPE_TRY(drain(*p, block));
    }
    return send_segmented(*p, frame, block);
  }
  const bool burst = now - p->last_send.load(std::memory_order_relaxed) < clock.burst_gap;
  if (frame.size <= kCoalesceMax && (backlog || burst)) {
    bool taken = false;
    return coalesce(*p, now, block, &frame, nullptr, taken);
  }
  p->last_send.store(now, std::memory_order_relaxed);
  if (backlog) {  // what was coalesced goes first: frames to a peer leave in order
    if (p->open_size) seal_open(*p);
    TROUPE_TRY(drain(*p, block));
    p->batching.store(false, std::memory_order_relaxed);
  }
  zmq::message_t msg(frame.size);
  frame.write(static_cast<char*>(msg.data()), frame.state);
  return send_message(*p, msg, block);
}

Status ZmqTransport::check_size(const Peer& p, const FrameWriter& frame) const {
  if (config_.max_message_bytes <= 0) return {};
  std::size_t largest = frame.size;
  if (frame.segments)
    for (const WireSegment& s : *frame.segments) largest = std::max(largest, s.size);
  if (static_cast<std::int64_t>(largest) <= config_.max_message_bytes) return {};
  return invalid_input("runtime: a message part of " + std::to_string(largest) + " bytes to node " +
                       std::to_string(p.info.node) + " (role " + p.info.role + ") is over max_message_bytes " +
                       std::to_string(config_.max_message_bytes) + " (the receiver would drop it unread)");
}

Result<bool> ZmqTransport::append(std::uint32_t node, const BoundedFrameWriter& frame, Overflow policy) {
  Peer* p = find_peer(node);
  if (!p || p->down || link_bytes_per_s_ > 0) return false;  // send() says why (or paces it)
  const BatchClock& clock = batch_clock();
  const std::int64_t now = clock.now();
  if (!p->batching.load(std::memory_order_relaxed) &&
      now - p->last_send.load(std::memory_order_relaxed) >= clock.burst_gap)
    return false;  // no burst: an isolated frame leaves at once, by send()
  std::lock_guard lock(p->mu);
  const bool backlog = p->open_size || !p->sealed.empty();
  if (!backlog && now - p->last_send.load(std::memory_order_relaxed) >= clock.burst_gap) return false;
  bool taken = false;
  TROUPE_TRY(coalesce(*p, now, policy == Overflow::block, nullptr, &frame, taken));
  return taken;
}

Status ZmqTransport::coalesce(Peer& p, std::int64_t now, bool block, const FrameWriter* sized,
                              const BoundedFrameWriter* bounded, bool& taken) {
  // Room first: a sender that cannot queue the frame waits (block) or fails, as with a full socket.
  if (p.sealed.size() >= kMaxSealed) TROUPE_TRY(drain(p, block));
  const std::size_t at = p.open_size;
  if (!p.open) {
    p.open = buffers_.take();
    if (!p.open) throw std::bad_alloc();
    p.open_capacity = BatchBuffers::kCapacity;
  }
  // An open batch is sealed at kBatchBytes, so a frame up to kCoalesceMax always fits.
  const std::size_t room = std::min(p.open_capacity - at, kCoalesceMax);
  std::size_t size;
  if (sized) {
    size = sized->size;
    sized->write(p.open + at, sized->state);  // throws only when the size pass disagrees: nothing is counted
  } else {
    size = bounded->write(p.open + at, room, bounded->state);
    if (size > room) return {};  // too long for a batch: not taken
  }
  taken = true;
  if (at == 0) {
    p.open_since = now;
    open_batches_.fetch_add(1, std::memory_order_relaxed);
  }
  p.open_size = at + size;
  p.last_send.store(now, std::memory_order_relaxed);
  p.batching.store(true, std::memory_order_relaxed);
  if (p.open_size >= kBatchBytes || now - p.open_since >= batch_clock().linger) {
    seal_open(p);
    (void)drain(p, /*block=*/false);  // the frame is queued: what ZeroMQ refuses now waits sealed
  }
  if (p.open_size || !p.sealed.empty())
    list_for_flush(p);
  else
    p.batching.store(false, std::memory_order_relaxed);
  return {};
}

Status ZmqTransport::send_segmented(Peer& p, const FrameWriter& frame, bool block) {
  // One multipart message: the frame, then each long run as it is in the sender's message (kept
  // alive by frame.owner until ZeroMQ has written it).
  zmq::message_t head(frame.size);
  frame.write(static_cast<char*>(head.data()), frame.state);
  try {
    auto first = (block ? zmq::send_flags::none : zmq::send_flags::dontwait) | zmq::send_flags::sndmore;
    if (!p.push.send(head, first))
      return make_error(ErrorCode::timeout, "runtime: send queue to node " + std::to_string(p.info.node) +
                                                " (role " + p.info.role + ", " + p.info.endpoint +
                                                ") is full (hwm " + std::to_string(config_.hwm) +
                                                "): receiver too slow or gone");
    const std::vector<WireSegment>& segs = *frame.segments;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      zmq::message_t part = segment_part(segs[i], frame.owner);
      // the rest of a message ZeroMQ has begun to take is never refused for room
      (void)p.push.send(part, i + 1 < segs.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "runtime: send to node " + std::to_string(p.info.node) + ": " + e.what());
  }
  return {};
}

zmq::message_t ZmqTransport::segment_part(const WireSegment& seg, const std::shared_ptr<const void>& owner) {
  auto* keep = new std::shared_ptr<const void>(owner);
  tsan_handoff_release(keep);  // freed on libzmq's I/O thread (the callback below)
  return zmq::message_t(
      const_cast<char*>(seg.data), seg.size,
      [](void*, void* hint) {
        tsan_handoff_acquire(hint);
        delete static_cast<std::shared_ptr<const void>*>(hint);
      },
      keep);
}

void ZmqTransport::seal_open(Peer& p) {
  // ZeroMQ takes the batch's buffer as it is (no copy) and gives it back once it is written out.
  tsan_handoff_release(p.open);  // given back on libzmq's I/O thread (BatchBuffers::free_fn)
  p.sealed.emplace_back(p.open, p.open_size, &BatchBuffers::free_fn, &buffers_);
  p.open = nullptr;
  p.open_size = p.open_capacity = 0;
  open_batches_.fetch_sub(1, std::memory_order_relaxed);
}

void ZmqTransport::release_open(Peer& p) {
  if (!p.open) return;
  buffers_.give(p.open);
  p.open = nullptr;
  p.open_capacity = 0;
}

BatchBuffers::~BatchBuffers() {
  for (char* b : free_) std::free(b);
}

char* BatchBuffers::take() {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      char* b = free_.back();
      free_.pop_back();
      return b;
    }
  }
  return static_cast<char*>(std::malloc(kCapacity));
}

void BatchBuffers::give(char* buf) {
  {
    std::lock_guard lock(mu_);
    if (free_.size() < 64) {
      free_.push_back(buf);
      return;
    }
  }
  std::free(buf);
}

Status ZmqTransport::drain(Peer& p, bool block) {
  while (!p.sealed.empty()) {
    TROUPE_TRY(send_message(p, p.sealed.front(), block));
    p.sealed.pop_front();
  }
  return {};
}

Status ZmqTransport::send_message(Peer& p, zmq::message_t& msg, bool block) {
  try {
    if (!p.push.send(msg, block ? zmq::send_flags::none : zmq::send_flags::dontwait))
      return make_error(ErrorCode::timeout, "runtime: send queue to node " + std::to_string(p.info.node) +
                                                " (role " + p.info.role + ", " + p.info.endpoint +
                                                ") is full (hwm " + std::to_string(config_.hwm) +
                                                "): receiver too slow or gone");
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "runtime: send to node " + std::to_string(p.info.node) + ": " + e.what());
  }
  return {};
}

void ZmqTransport::list_for_flush(Peer& p) {
  if (p.on_flush_list) return;
  p.on_flush_list = true;
  bool wake;
  {
    std::lock_guard lock(flush_mu_);
    flush_list_.push_back(&p);
    wake = flusher_asleep_;
  }
  if (wake) flush_cv_.notify_one();
}

void ZmqTransport::flush_listed(bool from_flusher) {
  std::vector<Peer*> listed;
  {
    std::lock_guard lock(flush_mu_);
    if (from_flusher)
      listed.swap(flush_list_);
    else
      listed = flush_list_;
  }
  std::vector<Peer*> still;
  for (Peer* p : listed) {
    // Nobody waits here behind a sender blocked on a full socket: that sender hands the batch
    // over, or the flush thread at a later tick.
    std::unique_lock lock(p->mu, std::try_to_lock);
    if (!lock.owns_lock()) {
      if (from_flusher) still.push_back(p);
      continue;
    }
    if (p->open_size) seal_open(*p);
    (void)drain(*p, /*block=*/false);
    if (p->sealed.empty()) p->batching.store(false, std::memory_order_relaxed);
    if (!from_flusher) continue;
    if (p->sealed.empty() || p->down)
      p->on_flush_list = false;  // a down peer's batches wait for close(), which drops them
    else
      still.push_back(p);
  }
  if (!still.empty()) {
    std::lock_guard lock(flush_mu_);
    flush_list_.insert(flush_list_.end(), still.begin(), still.end());
  }
}

void ZmqTransport::flush_loop() {
  pthread_setname_np(pthread_self(), "troupe-flush");
  std::unique_lock lock(flush_mu_);
  while (!stopping_) {
    if (flush_list_.empty()) {
      flusher_asleep_ = true;
      flush_cv_.wait_for(lock, milliseconds(100));
      flusher_asleep_ = false;
      continue;
    }
    flush_cv_.wait_for(lock, kFlushTick);  // batches grow meanwhile; their senders usually hand them over first
    lock.unlock();
    flush_listed(/*from_flusher=*/true);
    lock.lock();
  }
}

Peer* ZmqTransport::find_peer(std::uint32_t node) const {
  if (node < kDirectPeers) return by_node_[node].load(std::memory_order_acquire);
  std::shared_lock lock(peers_mu_);
  auto it = peers_.find(node);
  return it == peers_.end() ? nullptr : it->second.get();
}

std::vector<PeerInfo> ZmqTransport::peers() const {
  std::vector<PeerInfo> out;
  std::shared_lock lock(peers_mu_);
  for (auto& [n, p] : peers_) out.push_back(p->info);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.node < b.node; });
  return out;
}

// ---- receiving ----

bool ZmqTransport::accept_envelope(const char* data, std::size_t size, EnvelopeHeader& h, std::size_t frame_size) {
  auto r = decode_batched_header(data, size);
  if (r.ok() && std::int64_t{r->type_id} != last_verified_type_ && !verified_types_.count(r->type_id)) {
    if (is_registered_type(r->type_id))
      verified_types_.insert(r->type_id);
    else
      r = invalid_input("unknown message type id " + std::to_string(r->type_id) + " from " + to_string(r->sender));
  }
  if (!r.ok()) {
    dropped_frames_.fetch_add(1);
    spdlog::error("troupe runtime: node {} dropped a malformed frame ({} bytes): {}", config_.node_id, frame_size,
                  r.error().message);
    return false;
  }
  h = *r;
  last_verified_type_ = h.type_id;
  return true;
}

void ZmqTransport::split_frame(zmq::message_t& msg, std::vector<zmq::message_t>& parts, std::vector<Mail>& out) {
  SharedFrame* frame = SharedFrame::adopt(std::move(msg));
  const char* base = frame->data();
  const std::size_t size = frame->size();
  std::size_t at = 0;
  do {
    EnvelopeHeader h;
    if (!accept_envelope(base + at, size - at, h, size)) break;  // the rest cannot be framed: dropped
    const bool segmented = (h.flags & kFlagSegmented) != 0;
    if (segmented != !parts.empty() || (segmented && kHeaderSize + h.payload_size != size)) {
      dropped_frames_.fetch_add(1);
      spdlog::error("troupe runtime: node {} dropped a frame from {} ({} bytes, {} further parts): {}", config_.node_id,
                    to_string(h.sender), size, parts.size(),
                    segmented ? "its out-of-line runs must be the message's further parts, the frame alone in its first"
                              : "further parts belong only to a frame with out-of-line runs");
      break;
    }
    if (h.sender.node != stamped_node_ || ++frames_since_stamp_ >= 64 || h.type_id == Heartbeat::type_id) {
      if (Peer* p = find_peer(h.sender.node)) p->last_seen_ns.store(timers_.now().time_since_epoch().count());
      stamped_node_ = h.sender.node;
      frames_since_stamp_ = 0;
    }
    if (h.type_id == Heartbeat::type_id) {
      // liveness only
    } else if (h.recipient.node != config_.node_id) {
      dropped_frames_.fetch_add(1);
      spdlog::error("troupe runtime: node {} got a frame for {} (wrong node); dropped", config_.node_id,
                    to_string(h.recipient));
    } else {
      if (segmented)
        for (auto& part : parts) frame->add_part(std::move(part));
      out.push_back(Mail{h, Payload::frame(frame, at + kHeaderSize, h.payload_size, segmented), {}});
    }
    at += kHeaderSize + h.payload_size;
  } while (at < size);
  frame->release();
}

double ZmqTransport::bench_link_rate() {
  const char* v = std::getenv("TROUPE_BENCH_LINK_BYTES_PER_S");
  return v ? std::max(0.0, std::atof(v)) : 0.0;
}

Status ZmqTransport::send_paced(Peer& p, const FrameWriter& frame) {
  PacedSend s;
  s.peer = &p;
  s.parts.emplace_back(frame.size);
  frame.write(static_cast<char*>(s.parts.back().data()), frame.state);
  std::size_t bytes = frame.size;
  if (frame.segments)
    for (const WireSegment& seg : *frame.segments) {
      s.parts.push_back(segment_part(seg, frame.owner));
      bytes += seg.size;
    }
  const auto took = static_cast<std::int64_t>(1e9 * static_cast<double>(bytes) / link_bytes_per_s_);
  {
    std::lock_guard lock(pace_mu_);  // (the queue's order is the order of the release times)
    egress_free_ns_ = std::max(mono_nanoseconds(), egress_free_ns_) + took;
    s.at_ns = egress_free_ns_;
    paced_.push_back(std::move(s));
  }
  paced_cv_.notify_one();
  return {};
}

void ZmqTransport::pacer_loop() {
  pthread_setname_np(pthread_self(), "troupe-pacer");
  std::unique_lock lock(pace_mu_);
  while (!stopping_) {
    if (paced_.empty()) {
      paced_cv_.wait_for(lock, milliseconds(50));
      continue;
    }
    const std::int64_t wait = paced_.front().at_ns - mono_nanoseconds();
    if (wait > 0) {
      paced_cv_.wait_for(lock, std::chrono::nanoseconds(wait));
      continue;
    }
    PacedSend s = std::move(paced_.front());
    paced_.pop_front();
    lock.unlock();
    {
      std::lock_guard plock(s.peer->mu);
      try {
        for (std::size_t i = 0; i < s.parts.size(); ++i)
          (void)s.peer->push.send(s.parts[i], i + 1 < s.parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        spdlog::error("troupe runtime: node {}: paced send to node {}: {}", config_.node_id, s.peer->info.node, e.what());
      }
    }
    lock.lock();
  }
}

bool ZmqTransport::pace_ingress(std::size_t bytes) {
  const auto took = static_cast<std::int64_t>(1e9 * static_cast<double>(bytes) / link_bytes_per_s_);
  std::int64_t until;
  {
    std::lock_guard lock(pace_mu_);
    ingress_free_ns_ = std::max(mono_nanoseconds() - took, ingress_free_ns_) + took;
    until = ingress_free_ns_;
  }
  const std::int64_t wait = until - mono_nanoseconds();
  if (wait <= 0) return false;
  std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
  return true;
}

void ZmqTransport::receive_loop(bool primary) {
  pthread_setname_np(pthread_self(), primary ? "troupe-recv" : "troupe-recv2");
  bool holding = false;
  if (primary) {
    receiver_token_.lock();
    holding = true;
  }
  std::vector<Mail> burst, batch;
  std::vector<zmq::message_t> parts;
  burst.reserve(2 * kBurstEnvelopes);
  batch.reserve(64);
  zmq::pollitem_t items[] = {{pull_->handle(), 0, ZMQ_POLLIN, 0}};
  while (!stopping_) {
    if (!holding) {
      if (!stand_by()) break;
      holding = true;
    }
    ActorCell* run = nullptr;
    try {
      zmq::poll(items, 1, milliseconds(50));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      while (burst.size() < kBurstEnvelopes) {
        zmq::message_t msg;
        if (!pull_->recv(msg, zmq::recv_flags::dontwait)) break;
        parts.clear();
        for (bool more = msg.more(); more;) {  // a segmented frame's long runs
          zmq::message_t part;
          if (!pull_->recv(part, zmq::recv_flags::dontwait)) break;  // a message's parts arrive together
          more = part.more();
          parts.push_back(std::move(part));
        }
        bool paced = false;
        if (link_bytes_per_s_ > 0) {
          std::size_t bytes = msg.size();
          for (const auto& part : parts) bytes += part.size();
          paced = pace_ingress(bytes);
        }
        split_frame(msg, parts, burst);
        if (paced) break;  // delivered now: what came in is not held until the rest of the burst is in
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      spdlog::error("troupe runtime: node {} receive loop: {}", config_.node_id, e.what());
    }
    if (burst.empty()) continue;
    bool may_run_inline = config_.inline_receive && config_.threads > 0 &&
                          running_inline_.load(std::memory_order_relaxed) == 0;  // the other one stands by
    delivering_.store(true, std::memory_order_relaxed);
    run = sink_.deliver(burst, may_run_inline);
    delivering_.store(false, std::memory_order_relaxed);
    if (!run) continue;
    // Run the actor's batch here, without a worker's wake-up; the other receive thread takes the
    // socket if this lasts.
    running_inline_.fetch_add(1);
    token_released_ns_.store(mono_nanoseconds());
    receiver_token_.unlock();
    holding = false;
    if (standby_deep_.load()) {
      std::lock_guard lock(standby_mu_);
      standby_cv_.notify_one();
    }
    sink_.run_inline(run, batch);
    running_inline_.fetch_sub(1);
    if (receiver_token_.try_lock()) {
      holding = true;
      token_released_ns_.store(0);
    }  // else the other thread took the socket: this one stands by now
  }
  if (holding) receiver_token_.unlock();
}

bool ZmqTransport::stand_by() {
  int quiet_ticks = 0;
  std::unique_lock lock(standby_mu_);
  while (!stopping_) {
    std::int64_t released = token_released_ns_.load();
    if (released != 0) {
      quiet_ticks = 0;
      std::int64_t waited = mono_nanoseconds() - released;
      if (waited >= kTakeoverNs) {
        if (receiver_token_.try_lock()) {
          token_released_ns_.store(0);
          return true;
        }
        standby_cv_.wait_for(lock, kStandbyTick);  // its holder is back
      } else {
        standby_cv_.wait_for(lock, std::chrono::nanoseconds(kTakeoverNs - waited));
      }
      continue;
    }
    if (++quiet_ticks < kQuietTicksBeforeSleep) {
      standby_cv_.wait_for(lock, kStandbyTick);
      continue;
    }
    // No inline runs lately: sleep until the next one says so (the look below closes the race
    // with a release that did not see this flag).
    standby_deep_.store(true);
    if (token_released_ns_.load() == 0) standby_cv_.wait_for(lock, milliseconds(50));
    standby_deep_.store(false);
    quiet_ticks = kQuietTicksBeforeSleep;  // stay asleep next time round unless an inline run began
  }
  return false;
}

void ZmqTransport::zap_loop(zmq::socket_t sock) {
  zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stopping_) {
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
      bool ok = !key.empty() && authorized_.count(key);
      if (!ok)
        spdlog::error("troupe runtime: node {} refused a {} peer from {}: key {} is not in {}",
                      config_.node_id, mechanism, parts[3].to_string(), key.empty() ? "(none)" : key,
                      config_.curve.authorized_keys_file);
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

void ZmqTransport::heartbeat_tick() {
  Clock::time_point t = timers_.now();
  std::vector<Peer*> ps;
  {
    std::shared_lock lock(peers_mu_);
    for (auto& [n, p] : peers_) ps.push_back(p.get());
  }
  Heartbeat hb{++heartbeat_seq_};
  const std::size_t n = payload_size_of(hb);
  for (Peer* p : ps) {
    if (p->down) continue;
    EnvelopeHeader h;
    h.sender = ActorId{config_.node_id, 0};
    h.recipient = ActorId{p->info.node, 0};
    {
      zmq::message_t frame(kHeaderSize + n);
      write_frame(static_cast<char*>(frame.data()), n, hb, h);
      std::lock_guard lock(p->mu);  // liveness only: it may overtake coalesced mail
      try {
        (void)p->push.send(frame, zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
      }
    }
    if (delivering_.load(std::memory_order_relaxed)) p->last_seen_ns.store(t.time_since_epoch().count());
    Duration silent = t - Clock::time_point(Duration(p->last_seen_ns.load()));
    if (silent > config_.heartbeat.timeout)
      on_silent_(p->info.node, "no message or heartbeat for " + ms_text(silent) + " (timeout " +
                                   ms_text(config_.heartbeat.timeout) + ")");
  }
}

void ZmqTransport::stop() {
  stopping_ = true;
  {
    std::lock_guard lock(flush_mu_);
    flush_cv_.notify_all();
  }
  {
    std::lock_guard lock(pace_mu_);
    paced_cv_.notify_all();
  }
  {
    std::lock_guard lock(standby_mu_);
    standby_cv_.notify_all();
  }
}

void ZmqTransport::join() {
  for (auto& t : receive_threads_)
    if (t.joinable()) t.join();
  if (zap_thread_.joinable()) zap_thread_.join();
  if (flush_thread_.joinable()) flush_thread_.join();
  if (pacer_thread_.joinable()) pacer_thread_.join();
}

void ZmqTransport::close() {
  {
    std::lock_guard lock(pace_mu_);
    paced_.clear();  // (a benchmark's frames not yet due: dropped with the sockets)
  }
  {
    std::unique_lock lock(peers_mu_);
    for (auto& [n, p] : peers_) {
      {
        std::lock_guard plock(p->mu);  // a last hand-over of what is still batched
        if (p->open_size) seal_open(*p);
        if (!p->down) (void)drain(*p, /*block=*/false);
        p->sealed.clear();
        release_open(*p);
      }
      p->push.set(zmq::sockopt::linger, 0);
      p->push.close();
    }
  }
  if (pull_) pull_->close();
  if (zctx_) zctx_->close();
  if (endpoint_.rfind("ipc://", 0) == 0) ::unlink(endpoint_.substr(6).c_str());  // zmq leaves the socket file
}

}  // namespace troupe::runtime
