// ConnectionWatch (connection_watch.h): a socket monitor's CONNECTED/ACCEPTED events give each
// connection's file descriptor, whose peer address is read at once; DISCONNECTED names the
// descriptor again, so the drop is told with the peer it was recorded with.
#include "connection_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "troupe/base/clock.h"

namespace troupe::envs {
namespace {

// "IP:PORT" ("[IP6]:PORT"), a unix socket's path, or "" when it cannot be read.
std::string address_text(const sockaddr_storage& a, socklen_t len) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    if (!inet_ntop(AF_INET, &in.sin_addr, ip, sizeof ip)) return {};
    return std::string(ip) + ":" + std::to_string(ntohs(in.sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (!inet_ntop(AF_INET6, &in6.sin6_addr, ip, sizeof ip)) return {};
    std::string out = "[";  // appended step by step: GCC 12 warns (-Wrestrict) on "[" + std::string
    out += ip;
    out += "]:";
    out += std::to_string(ntohs(in6.sin6_port));
    return out;
  }
  if (a.ss_family == AF_UNIX && len > offsetof(sockaddr_un, sun_path)) {
    const auto& un = reinterpret_cast<const sockaddr_un&>(a);
    const std::string path(un.sun_path, strnlen(un.sun_path, len - offsetof(sockaddr_un, sun_path)));
    return path.empty() ? std::string() : "ipc://" + path;
  }
  return {};
}

std::string peer_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? address_text(a, len) : std::string();
}

std::string local_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? address_text(a, len) : std::string();
}

}  // namespace

ConnectionWatch::ConnectionWatch(zmq::context_t& ctx, zmq::socket_t& sock) : watched_(&sock) {
  static std::atomic<unsigned long> counter{0};
  const std::string addr = "inproc://troupe-connection-watch-" + std::to_string(++counter);
  if (zmq_socket_monitor(sock.handle(), addr.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t();
  pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
  pair_.set(zmq::sockopt::linger, 0);
  // no high-water mark: libzmq's I/O thread blocks sending an event into a full monitor pipe, and
  // events pile up between calls (an idle socket's reconnects); they are a few bytes each
  pair_.set(zmq::sockopt::rcvhwm, 0);
  pair_.connect(addr);
}

ConnectionWatch::~ConnectionWatch() {
  if (watched_->handle()) zmq_socket_monitor(watched_->handle(), nullptr, 0);
}

void ConnectionWatch::drain() {
  for (;;) {
    zmq::message_t event, endpoint;  // [u16 event, u32 value (the fd)], the endpoint
    if (!pair_.recv(event, zmq::recv_flags::dontwait)) return;
    if (!event.more() || !pair_.recv(endpoint, zmq::recv_flags::dontwait) || event.size() < 6) continue;
    uint16_t kind = 0;
    int32_t fd = -1;
    std::memcpy(&kind, event.data(), sizeof kind);
    std::memcpy(&fd, static_cast<const char*>(event.data()) + sizeof kind, sizeof fd);
    const std::string where = endpoint.to_string();
    if (kind == ZMQ_EVENT_CONNECTED || kind == ZMQ_EVENT_ACCEPTED) {
      Ends e{peer_of(fd), local_of(fd)};
      if (e.peer.empty()) e.peer = where;  // already gone: the endpoint connected to (or bound)
      ends_of_fd_[fd] = std::move(e);
    } else if (kind == ZMQ_EVENT_DISCONNECTED) {
      Drop d;
      if (auto it = ends_of_fd_.find(fd); it != ends_of_fd_.end()) {
        d.peer = it->second.peer, d.local = it->second.local;
        ends_of_fd_.erase(it);
      } else {
        d.peer = where;
      }
      d.mono_s = mono_seconds();
      drop_ = std::move(d);
    }
  }
}

std::string dropped_connection_note(const ConnectionWatch& w, double sent_mono_s) {
  const auto& d = w.last_drop();
  if (!d) return {};
  char when[32];
  std::snprintf(when, sizeof when, "%.2f", std::max(0.0, d->mono_s - sent_mono_s));
  return "; the connection to " + d->peer + (d->local.empty() ? "" : " (from " + d->local + ")") +
         " was dropped " + when + " s after the request was sent";
}

}  // namespace troupe::envs
