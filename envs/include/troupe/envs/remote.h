// The remote env protocol (envs/PROTOCOL.md): JSON over ZeroMQ REQ/REP, one request per message.
//   request  {"op": "hello"|"reset"|"step"|"verify"|"release"|"shutdown", "id": N, ...}
//   reply    {"ok": true, "id": N, "result": ...} | {"ok": false, "id": N, "error": {"code", "message"}}
// serve_env() is the server used by `troupe env serve` and troupe-env-worker; the client side is
// make_env_client() (client.h).
#pragma once

#include <atomic>
#include <string>

#include "troupe/envs/client.h"

namespace troupe::envs {

inline constexpr const char* kEnvProtocol = "troupe.env/1";

// Answers one request (no sockets): the whole protocol semantics, testable on its own.
class EnvRequestHandler {
 public:
  explicit EnvRequestHandler(std::unique_ptr<EnvClient> local) : local_(std::move(local)) {}
  json handle(const json& request);
  bool shutdown_requested() const { return shutdown_; }

 private:
  std::unique_ptr<EnvClient> local_;
  bool shutdown_ = false;
};

struct ServeOptions {
  std::string bind;                          // e.g. ipc:///tmp/x.sock, tcp://127.0.0.1:5555
  const std::atomic<bool>* stop = nullptr;   // set to stop serving (checked every poll_ms)
  int poll_ms = 100;
  int parent_pid = 0;                        // > 0: exit when this process is gone (workers)
  bool announce = false;                     // print "troupe env: serving NAME on ADDR" to stderr
  int64_t max_message_bytes = -1;            // > 0: a larger request drops its connection unread (ZMQ_MAXMSGSIZE)
};

// Serves until a shutdown request, *stop, or the parent dies. Errors: bind failure (names the address).
Status serve_env(std::unique_ptr<EnvClient> local, const ServeOptions& options);

// `troupe env serve` / troupe-env-worker: what to serve from a command line.
//   target: a built-in name, or a path ending in .so (a plug-in); config: JSON text ("" = {}).
Result<std::unique_ptr<EnvClient>> make_served_env(const std::string& target, const std::string& config_json);

}  // namespace troupe::envs
