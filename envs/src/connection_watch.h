// ConnectionWatch: the peers of one ZeroMQ socket's connections and the last one dropped, from a
// socket monitor (zmq_socket_monitor over inproc, a PAIR socket) that the socket's own user reads
// without blocking (drain()) while it waits for a reply. libzmq drops a connection that brings a
// message over ZMQ_MAXMSGSIZE without saying so, or whose; this names the peer (the address
// getpeername gives as the connection is made) and when it went. Not thread-safe: one user, as the socket.
#pragma once

#include <zmq.hpp>

#include <optional>
#include <string>
#include <unordered_map>

namespace troupe::envs {

class ConnectionWatch {
 public:
  struct Drop {
    std::string peer;   // "IP:PORT", "ipc://PATH", or the endpoint when the address was not read
    std::string local;  // our side's address, likewise ("" when not read)
    double mono_s = 0;  // when the drop was read (base/clock.h mono_seconds)
  };
  // Starts monitoring `sock` of `ctx` (both must outlive this); throws zmq::error_t as cppzmq does.
  ConnectionWatch(zmq::context_t& ctx, zmq::socket_t& sock);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // The monitor's PAIR socket, to poll beside the watched one (ZMQ_POLLIN: call drain()).
  void* handle() { return pair_.handle(); }
  // Reads every event that has arrived; never blocks.
  void drain();
  // The last connection dropped since forget_drop() (drain() first).
  const std::optional<Drop>& last_drop() const { return drop_; }
  void forget_drop() { drop_.reset(); }

 private:
  struct Ends {
    std::string peer, local;
  };
  zmq::socket_t* watched_;
  zmq::socket_t pair_;
  std::unordered_map<int, Ends> ends_of_fd_;
  std::optional<Drop> drop_;
};

// " (the connection to PEER, from LOCAL, was dropped S s after the request was sent ...)" for an
// error that waited in vain since sent_mono_s; "" when no connection was dropped since then.
std::string dropped_connection_note(const ConnectionWatch& w, double sent_mono_s);

}  // namespace troupe::envs
