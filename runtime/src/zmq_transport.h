// The node's ZeroMQ transport: one PULL socket bound at SystemConfig::bind, one PUSH socket per
// peer, heartbeats to every peer, and CURVE, whose ZAP handler admits only the client keys of the
// authorized-keys file.
//
// Receiving: two receive threads share the PULL socket; whoever holds the receiver token reads
// it. A burst of frames is split into envelopes (a frame may carry several) and delivered to the
// mailboxes in order; when the burst makes an idle actor runnable, the receive thread runs that
// actor's batch itself (SystemConfig::inline_receive) instead of waking a worker, and hands the
// token to the other receive thread for the time being: should the handler run longer than
// kTakeover, the other thread takes over the socket, so a slow handler never stops this node's
// receiving (nor its heartbeats) for longer than that.
//
// Sending: a frame goes to the peer's socket at once, unless the previous send to that peer was
// moments ago (a burst) or the socket's queue is full. Then it is appended to the peer's open
// batch — several envelopes in one ZeroMQ message, whose buffer ZeroMQ takes over without a copy
// — which is handed over when it is full or kLinger old, at the end of the sending actor's batch
// of handlers, or by the flush thread. Frames to one peer leave in the order they were sent.
//
// A peer silent (no message, no heartbeat) for heartbeat.timeout is reported through `on_silent`;
// while a receive thread waits for room in a full mailbox nobody is, since then the silence is ours.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <zmq.hpp>

#include "actor_cell.h"
#include "timer_queue.h"
#include "tsan_handoff.h"
#include "troupe/runtime/system.h"

namespace troupe::runtime {

// Buffers for batches, reused: ZeroMQ frees a batch on its I/O thread once written out, and a
// malloc/free of tens of KiB across threads per batch would have the allocator return memory
// to the system and fault it back in. Bounded; what does not fit is freed.
class BatchBuffers {
 public:
  static constexpr std::size_t kCapacity = 80 * 1024;  // every pooled buffer's size
  ~BatchBuffers();
  char* take();
  void give(char* buf);
  static void free_fn(void* data, void* hint) {
    tsan_handoff_acquire(data);  // the batch was written on the sending thread (seal_open)
    static_cast<BatchBuffers*>(hint)->give(static_cast<char*>(data));
  }

 private:
  std::mutex mu_;
  std::vector<char*> free_;
};

struct Peer {
  PeerInfo info;
  std::mutex mu;  // guards push and the batches below
  zmq::socket_t push;
  // Envelopes coalesced into one message, not yet handed to ZeroMQ (a malloc'd buffer, which
  // ZeroMQ frees once it is written out); `open_since_ns` is when its first envelope came.
  char* open = nullptr;
  std::size_t open_size = 0;
  std::size_t open_capacity = 0;
  std::int64_t open_since = 0;  // batch-clock ticks (see BatchClock)
  // Batches ZeroMQ refused (its queue was full), oldest first: they leave before anything else.
  std::deque<zmq::message_t> sealed;
  // Written under mu, also read without it as a hint (a send that is no burst skips the lock).
  std::atomic<std::int64_t> last_send{0};
  std::atomic<bool> batching{false};  // open or sealed batches exist
  bool on_flush_list = false;
  std::atomic<std::int64_t> last_seen_ns{0};
  std::atomic<bool> down{false};
};

class ZmqTransport {
 public:
  // Where received mail goes: the actor system.
  class Sink {
   public:
    // Delivers a burst of received mail in order (emptying `burst`). When may_run_inline, it may
    // return one actor the burst made runnable whose turn the caller now owns and runs with
    // run_inline; every other runnable actor goes to the workers.
    virtual ActorCell* deliver(std::vector<Mail>& burst, bool may_run_inline) = 0;
    virtual void run_inline(ActorCell* c, std::vector<Mail>& batch) = 0;

   protected:
    ~Sink() = default;
  };
  using OnSilent = std::function<void(std::uint32_t node, const std::string& reason)>;

  ZmqTransport(const SystemConfig& config, TimerQueue& timers, Sink& sink, OnSilent on_silent)
      : config_(config), timers_(timers), sink_(sink), on_silent_(std::move(on_silent)) {}

  // Checks the address, loads the CURVE keys, binds, starts the receive (and ZAP) threads.
  Status bind();
  bool bound() const { return zctx_ != nullptr; }
  const std::string& endpoint() const { return endpoint_; }  // ephemeral port resolved
  const std::string& curve_public_key() const { return curve_public_; }

  Status connect(const std::vector<PeerInfo>& peers);  // skips this node's own row
  Status send(std::uint32_t node, const FrameWriter& frame, Overflow policy);
  // The one-pass path into a peer's open batch (ActorSystem::append_frame).
  Result<bool> append(std::uint32_t node, const BoundedFrameWriter& frame, Overflow policy);
  // Hands every open batch to ZeroMQ now (the end of an actor's batch of handlers).
  void flush_open_batches() {
    if (open_batches_.load(std::memory_order_relaxed) != 0) flush_listed(/*from_flusher=*/false);
  }
  Peer* find_peer(std::uint32_t node) const;
  std::vector<PeerInfo> peers() const;

  void stop();  // the threads end at their next poll
  void join();
  void close();  // sockets (after a last flush of the batches), context, the ipc socket file

 private:
  // Benchmarks only: TROUPE_BENCH_LINK_BYTES_PER_S in the environment (troupe bench weight_sync's
  // _1gbps rows; no run sets it) limits this node's link to that rate, one way each. Egress: every
  // frame joins one queue, in the order sent, and the pacer thread hands it to ZeroMQ once its
  // bytes would have left (after the bytes queued before it); the sender never waits, so an actor
  // that forwards what it receives goes on with its own work. Ingress: a message is taken as
  // having streamed in up to its arrival; it is delivered once the bytes before it and it would
  // have come in (and at once, not held for the rest of a burst).
  struct PacedSend {
    Peer* peer = nullptr;
    std::vector<zmq::message_t> parts;  // a frame, then its out-of-line runs
    std::int64_t at_ns = 0;             // when its bytes would have left
  };
  Status send_paced(Peer& p, const FrameWriter& frame);
  void pacer_loop();
  bool pace_ingress(std::size_t bytes);  // true when it waited
  std::mutex pace_mu_;
  std::condition_variable paced_cv_;
  std::deque<PacedSend> paced_;  // guarded by pace_mu_, oldest first
  std::thread pacer_thread_;
  std::int64_t egress_free_ns_ = 0, ingress_free_ns_ = 0;
  double link_bytes_per_s_ = bench_link_rate();  // 0 = off
  static double bench_link_rate();
  // --- receiving ---
  void receive_loop(bool primary);
  bool stand_by();  // waits until this thread should take the receiver token; false = stopping
  // A received message (and its further parts, a segmented frame's long runs) into envelopes.
  void split_frame(zmq::message_t& msg, std::vector<zmq::message_t>& parts, std::vector<Mail>& out);
  bool accept_envelope(const char* data, std::size_t size, EnvelopeHeader& h, std::size_t frame_size);
  void zap_loop(zmq::socket_t sock);
  void heartbeat_tick();

  // --- sending (p.mu held) ---
  // The coalescing branch: frame goes into p's open batch (room first, then hand-over if due).
  Status coalesce(Peer& p, std::int64_t now, bool block, const FrameWriter* sized, const BoundedFrameWriter* bounded,
                  bool& taken);
  void seal_open(Peer& p);
  void release_open(Peer& p);  // an unsealed buffer (empty batch) back to where it came from
  Status drain(Peer& p, bool block);  // sealed batches, in order; stops at a full queue unless block
  Status send_message(Peer& p, zmq::message_t& msg, bool block);
  Status send_segmented(Peer& p, const FrameWriter& frame, bool block);
  // A long run of a segmented frame as a ZeroMQ message part, without a copy (frame.owner keeps
  // it alive until ZeroMQ has written it).
  static zmq::message_t segment_part(const WireSegment& seg, const std::shared_ptr<const void>& owner);
  // A part over max_message_bytes (every rank of a cluster has the same) would be dropped unread
  // by the peer: refused here instead, naming the limit.
  Status check_size(const Peer& p, const FrameWriter& frame) const;
  void list_for_flush(Peer& p);
  void flush_listed(bool from_flusher);
  void flush_loop();

  const SystemConfig& config_;
  TimerQueue& timers_;
  Sink& sink_;
  OnSilent on_silent_;
  std::string endpoint_;
  std::string curve_public_;
  std::string curve_secret_;
  std::unordered_set<std::string> authorized_;
  BatchBuffers buffers_;  // declared before the context: outlives every batch ZeroMQ still holds
  std::unique_ptr<zmq::context_t> zctx_;
  std::unique_ptr<zmq::socket_t> pull_;
  std::thread receive_threads_[2], zap_thread_, flush_thread_;
  std::atomic<bool> stopping_{false};
  mutable std::shared_mutex peers_mu_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Peer>> peers_;
  // Peers by node id below kDirectPeers, read without the lock on every send (set once, at connect).
  static constexpr std::uint32_t kDirectPeers = 4096;
  std::unique_ptr<std::atomic<Peer*>[]> by_node_ = std::make_unique<std::atomic<Peer*>[]>(kDirectPeers);
  std::atomic<std::uint64_t> dropped_frames_{0};

  // The receiver token: its holder reads the PULL socket. Released (with the time) while its
  // holder runs an actor inline; the other receive thread takes it when that lasts kTakeover.
  std::mutex receiver_token_;
  std::atomic<std::int64_t> token_released_ns_{0};  // 0 = held, or nobody runs inline
  std::atomic<int> running_inline_{0};              // receive threads inside an actor's batch
  std::mutex standby_mu_;
  std::condition_variable standby_cv_;
  std::atomic<bool> standby_deep_{false};  // the standby sleeps until told (no inline runs lately)
  // A receive thread is waiting for room in a full mailbox: peers' frames queue up unread
  // meanwhile, so their silence is ours, not theirs — no one is declared down for it.
  std::atomic<bool> delivering_{false};
  TimerId heartbeat_timer_ = 0;
  std::uint64_t heartbeat_seq_ = 0;
  // receiver-token-holder-only caches: type ids already checked against the (grow-only)
  // registry, and the last sender whose liveness was stamped
  std::unordered_set<std::uint32_t> verified_types_;
  std::int64_t last_verified_type_ = -1;  // the previous envelope's (none yet)
  std::uint32_t stamped_node_ = ~0u;
  int frames_since_stamp_ = 0;

  // Peers with an open or sealed batch, for the flush thread and flush_open_batches.
  std::mutex flush_mu_;
  std::condition_variable flush_cv_;
  std::vector<Peer*> flush_list_;
  bool flusher_asleep_ = false;
  std::atomic<int> open_batches_{0};
};

}  // namespace troupe::runtime
