// ZmqTransport: bind, connect, send, the receive and ZAP threads, heartbeats (see zmq_transport.h).
#include "zmq_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include <unistd.h>

#include "troupe/runtime/curve.h"

namespace troupe::runtime {

namespace {
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
      zap_thread_ = std::thread([this, s = std::move(zap)]() mutable { zap_loop(std::move(s)); });
    }
    pull_ = std::make_unique<zmq::socket_t>(*zctx_, zmq::socket_type::pull);
    pull_->set(zmq::sockopt::rcvhwm, config_.hwm);
    pull_->set(zmq::sockopt::linger, 0);
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
  receive_thread_ = std::thread([this] { receive_loop(); });
  return {};
}

Status ZmqTransport::connect(const std::vector<PeerInfo>& peers) {
  if (!zctx_)
    return invalid_input("runtime: node " + std::to_string(config_.node_id) +
                         " has no bind address, cannot connect to peers");
  bool any = false;
  for (const PeerInfo& info : peers) {
    if (info.node == config_.node_id) continue;
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
    peers_[info.node] = std::move(p);
    any = true;
  }
  const Duration interval = config_.heartbeat.interval;
  if (any && !heartbeat_timer_ && interval.count() > 0)
    heartbeat_timer_ = timers_.add(timers_.now() + interval, interval, [this] { heartbeat_tick(); });
  return {};
}

Status ZmqTransport::send(std::uint32_t node, zmq::message_t frame, Overflow policy) {
  Peer* p = find_peer(node);
  if (!p)
    return invalid_input("runtime: no route to node " + std::to_string(node) + ": not in node " +
                         std::to_string(config_.node_id) + "'s address book");
  if (p->down)
    return make_error(ErrorCode::peer_failed,
                      "runtime: node " + std::to_string(node) + " (role " + p->info.role + ") is down");
  std::lock_guard lock(p->mu);
  try {
    auto sent =
        p->push.send(frame, policy == Overflow::fail ? zmq::send_flags::dontwait : zmq::send_flags::none);
    if (!sent)
      return make_error(ErrorCode::timeout, "runtime: send queue to node " + std::to_string(node) +
                                                " (role " + p->info.role + ", " + p->info.endpoint +
                                                ") is full (hwm " + std::to_string(config_.hwm) +
                                                "): receiver too slow or gone");
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "runtime: send to node " + std::to_string(node) + ": " + e.what());
  }
  return {};
}

Peer* ZmqTransport::find_peer(std::uint32_t node) const {
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

void ZmqTransport::handle_frame(zmq::message_t& msg) {
  auto h = decode_header(static_cast<const char*>(msg.data()), msg.size(), /*check_type=*/false);
  if (h.ok() && !verified_types_.count(h->type_id)) {
    if (is_registered_type(h->type_id))
      verified_types_.insert(h->type_id);
    else
      h = invalid_input("unknown message type id " + std::to_string(h->type_id) + " from " +
                        to_string(h->sender));
  }
  if (!h.ok()) {
    dropped_frames_.fetch_add(1);
    spdlog::error("troupe runtime: node {} dropped a malformed frame ({} bytes): {}", config_.node_id,
                  msg.size(), h.error().message);
    return;
  }
  if (h->sender.node != stamped_node_ || ++frames_since_stamp_ >= 64 || h->type_id == Heartbeat::type_id) {
    if (Peer* p = find_peer(h->sender.node)) p->last_seen_ns.store(timers_.now().time_since_epoch().count());
    stamped_node_ = h->sender.node;
    frames_since_stamp_ = 0;
  }
  if (h->type_id == Heartbeat::type_id) return;
  if (h->recipient.node != config_.node_id) {
    dropped_frames_.fetch_add(1);
    spdlog::error("troupe runtime: node {} got a frame for {} (wrong node); dropped", config_.node_id,
                  to_string(h->recipient));
    return;
  }
  Mail mail{*h, Payload::frame(std::move(msg), kHeaderSize), {}};
  delivering_.store(true, std::memory_order_relaxed);
  Status st = deliver_(std::move(mail));
  delivering_.store(false, std::memory_order_relaxed);
  if (!st.ok()) spdlog::warn("troupe runtime: node {}: {}", config_.node_id, st.error().message);
}

void ZmqTransport::receive_loop() {
  zmq::pollitem_t items[] = {{pull_->handle(), 0, ZMQ_POLLIN, 0}};
  while (!stopping_) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(50));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      for (int i = 0; i < 256; ++i) {
        zmq::message_t msg;
        auto got = pull_->recv(msg, zmq::recv_flags::dontwait);
        if (!got) break;
        handle_frame(msg);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::error("troupe runtime: node {} receive loop: {}", config_.node_id, e.what());
    }
  }
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
  for (Peer* p : ps) {
    if (p->down) continue;
    EnvelopeHeader h;
    h.sender = ActorId{config_.node_id, 0};
    h.recipient = ActorId{p->info.node, 0};
    {
      std::lock_guard lock(p->mu);
      try {
        (void)p->push.send(encode_zmq_frame(hb, h), zmq::send_flags::dontwait);
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

void ZmqTransport::stop() { stopping_ = true; }

void ZmqTransport::join() {
  if (receive_thread_.joinable()) receive_thread_.join();
  if (zap_thread_.joinable()) zap_thread_.join();
}

void ZmqTransport::close() {
  {
    std::unique_lock lock(peers_mu_);
    for (auto& [n, p] : peers_) {
      p->push.set(zmq::sockopt::linger, 0);
      p->push.close();
    }
  }
  if (pull_) pull_->close();
  if (zctx_) zctx_->close();
  if (endpoint_.rfind("ipc://", 0) == 0) ::unlink(endpoint_.substr(6).c_str());  // zmq leaves the socket file
}

}  // namespace troupe::runtime
