// The node's ZeroMQ transport: one PULL socket bound at SystemConfig::bind and drained by one
// receive thread, one PUSH socket per peer, heartbeats to every peer, and CURVE, whose ZAP
// handler admits only the client keys of the authorized-keys file. A peer silent (no message,
// no heartbeat) for heartbeat.timeout is reported through `on_silent`; while the receive thread
// waits for room in a full mailbox nobody is, since then the silence is ours.
#pragma once

#include <atomic>
#include <cstdint>
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

#include "timer_queue.h"
#include "troupe/runtime/system.h"

namespace troupe::runtime {

struct Peer {
  PeerInfo info;
  std::mutex mu;  // guards push
  zmq::socket_t push;
  std::atomic<std::int64_t> last_seen_ns{0};
  std::atomic<bool> down{false};
};

class ZmqTransport {
 public:
  using Deliver = std::function<Status(Mail&&)>;  // a received frame for this node (receive thread)
  using OnSilent = std::function<void(std::uint32_t node, const std::string& reason)>;

  ZmqTransport(const SystemConfig& config, TimerQueue& timers, Deliver deliver, OnSilent on_silent)
      : config_(config), timers_(timers), deliver_(std::move(deliver)), on_silent_(std::move(on_silent)) {}

  // Checks the address, loads the CURVE keys, binds, starts the receive (and ZAP) thread.
  Status bind();
  bool bound() const { return zctx_ != nullptr; }
  const std::string& endpoint() const { return endpoint_; }  // ephemeral port resolved
  const std::string& curve_public_key() const { return curve_public_; }

  Status connect(const std::vector<PeerInfo>& peers);  // skips this node's own row
  Status send(std::uint32_t node, zmq::message_t frame, Overflow policy);
  Peer* find_peer(std::uint32_t node) const;
  std::vector<PeerInfo> peers() const;  // sorted by node

  void stop();  // the threads end at their next poll
  void join();
  void close();  // sockets, context, the ipc socket file

 private:
  void handle_frame(zmq::message_t& msg);
  void receive_loop();
  void zap_loop(zmq::socket_t sock);
  void heartbeat_tick();

  const SystemConfig& config_;
  TimerQueue& timers_;
  Deliver deliver_;
  OnSilent on_silent_;
  std::string endpoint_;
  std::string curve_public_;
  std::string curve_secret_;
  std::unordered_set<std::string> authorized_;
  std::unique_ptr<zmq::context_t> zctx_;
  std::unique_ptr<zmq::socket_t> pull_;
  std::thread receive_thread_, zap_thread_;
  std::atomic<bool> stopping_{false};
  mutable std::shared_mutex peers_mu_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Peer>> peers_;
  std::atomic<std::uint64_t> dropped_frames_{0};
  // The receive thread is waiting for room in a full mailbox: peers' frames queue up unread
  // meanwhile, so their silence is ours, not theirs — no one is declared down for it.
  std::atomic<bool> delivering_{false};
  TimerId heartbeat_timer_ = 0;
  std::uint64_t heartbeat_seq_ = 0;
  // receive-thread-only caches: type ids already checked against the (grow-only) registry, and
  // the last sender whose liveness was stamped
  std::unordered_set<std::uint32_t> verified_types_;
  std::uint32_t stamped_node_ = ~0u;
  int frames_since_stamp_ = 0;
};

}  // namespace troupe::runtime
