// The remote EnvClient: JSON requests over a ZeroMQ REQ socket to a server speaking PROTOCOL.md.
// When troupe owns the server process (isolated builtin/plugin, or a remote `command`), every call
// is watched: a worker that dies (signal, exit) or does not answer within timeout_s is killed,
// restarted (ChildProcess: fork+exec, as this process holds a ZeroMQ context), and only the
// episodes that lived on it fail, with the reason.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <zmq.hpp>

#include "child_process.h"
#include "connection_watch.h"
#include "troupe/base/clock.h"
#include "troupe/envs/client.h"
#include "troupe/envs/remote.h"

namespace troupe::envs {

namespace {

zmq::context_t& shared_context() {
  static auto* ctx = new zmq::context_t(1);  // never destroyed: sockets may outlive static teardown
  return *ctx;
}

ErrorCode code_from_name(const std::string& s) {
  if (s == "invalid_input") return ErrorCode::invalid_input;
  if (s == "timeout") return ErrorCode::timeout;
  if (s == "peer_failed") return ErrorCode::peer_failed;
  if (s == "io") return ErrorCode::io;
  return ErrorCode::internal;
}

class RemoteEnvClient final : public EnvClient {
 public:
  explicit RemoteEnvClient(EnvSpec spec) : spec_(std::move(spec)) {}

  ~RemoteEnvClient() override {
    stop_worker(/*graceful=*/true);
  }

  Status start() {
    if (!spec_.command.empty() || spec_.type != EnvType::remote) {
      TROUPE_TRY(build_command());
    } else {
      address_ = spec_.address;
    }
    return connect_and_hello();
  }

  const EnvInfo& info() const override { return info_; }
  int restarts() const override { return restarts_; }
  bool gave_up() const override { return gave_up_; }
  int worker_pid() const override { return worker_.pid(); }
  bool corrupt_next_reply() override {
    corrupt_ = true;
    return true;
  }
  bool drop_next_request() override {
    drop_ = true;
    return true;
  }
  // A server troupe did not start is reached over one REQ socket per call in flight, so one hung
  // call never delays the next (each has its own deadline).
  bool concurrent() const override { return !owns_process(); }

  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override {
    json req = {{"op", "reset"}, {"session", episode_id}, {"seed", seed}, {"options", to_json(options)}};
    if (concurrent()) {
      TROUPE_ASSIGN_OR_RETURN(json r, call_concurrent(std::move(req), "reset", episode_id));
      std::lock_guard lock(sessions_mu_);
      sessions_[episode_id] = 0;
      return parsed(observation_from_json(r, where()));
    }
    std::lock_guard lock(mu_);
    TROUPE_ASSIGN_OR_RETURN(json r, call(req, "reset", episode_id));
    {
      std::lock_guard slock(sessions_mu_);
      sessions_[episode_id] = generation_;
    }
    return parsed(observation_from_json(r, where()));
  }

  Result<StepResult> step(const std::string& episode_id, const std::string& action) override {
    json req = {{"op", "step"}, {"session", episode_id}, {"action", action}};
    if (concurrent()) {
      TROUPE_ASSIGN_OR_RETURN(json r, call_concurrent(std::move(req), "step", episode_id));
      return parsed(step_result_from_json(r, where()));
    }
    std::lock_guard lock(mu_);
    {
      std::lock_guard slock(sessions_mu_);
      if (auto it = sessions_.find(episode_id); it != sessions_.end() && it->second != generation_)
        return make_error(ErrorCode::peer_failed, where() + ": episode '" + episode_id +
                                                      "' was lost when the env worker restarted (" + last_failure_ + ")");
    }
    TROUPE_ASSIGN_OR_RETURN(json r, call(req, "step", episode_id));
    return parsed(step_result_from_json(r, where()));
  }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    json req = {{"op", "verify"}, {"metadata", metadata.is_null() ? json::object() : metadata}, {"completion", completion}};
    if (concurrent()) {
      TROUPE_ASSIGN_OR_RETURN(json r, call_concurrent(std::move(req), "verify", ""));
      return parsed(verify_result_from_json(r, where()));
    }
    std::lock_guard lock(mu_);
    TROUPE_ASSIGN_OR_RETURN(json r, call(req, "verify", ""));
    return parsed(verify_result_from_json(r, where()));
  }

  void release(const std::string& episode_id) override {
    bool live = false;
    {
      std::lock_guard slock(sessions_mu_);
      auto it = sessions_.find(episode_id);
      if (it == sessions_.end()) return;
      live = it->second == generation_;
      sessions_.erase(it);
    }
    if (!live) return;
    if (concurrent()) {
      (void)call_concurrent({{"op", "release"}, {"session", episode_id}}, "release", episode_id);
      return;
    }
    std::lock_guard lock(mu_);
    if (sock_) (void)call({{"op", "release"}, {"session", episode_id}}, "release", episode_id);
  }

 private:
  // A reply whose fields have the wrong shape is a protocol error of the server.
  template <class T>
  static Result<T> parsed(Result<T> r) {
    if (r.ok()) return r;
    return make_error(ErrorCode::invalid_input, std::string(kProtocolErrorTag) + r.error().message);
  }

  std::string where() const { return where(worker_.pid()); }
  std::string where(pid_t pid) const {
    return "env " + spec_.name + (pid > 0 ? " (worker pid " + std::to_string(pid) + ")" : " (" + address_ + ")");
  }

  Status build_command() {
    static std::atomic<int> counter{0};
    address_ = spec_.address;
    if (address_.empty()) {
      address_ = "ipc://" + (std::filesystem::temp_directory_path() /
                             ("troupe-env-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".sock"))
                                .string();
      owned_ipc_ = address_.substr(6);
    }
    detail::ChildOptions placed;
    detail::place_log(placed, spec_.log_dir, spec_.name);  // with a run's logs/: kept there, stdout too
    log_path_ = placed.log_path;
    keep_log_ = placed.keep_log;
    if (spec_.type == EnvType::remote) {
      argv_ = spec_.command;
    } else {
      TROUPE_ASSIGN_OR_RETURN(std::string worker, find_env_worker(spec_.worker));
      std::string target = spec_.type == EnvType::plugin ? spec_.path : (spec_.env.empty() ? spec_.name : spec_.env);
      argv_ = {worker, "--bind", "{bind}", "--env", target, "--config", spec_.config.dump(),
               "--parent-pid", std::to_string(::getpid()), "--max-message-bytes",
               std::to_string(spec_.max_message_bytes)};
    }
    for (auto& a : argv_) {
      for (size_t p; (p = a.find("{bind}")) != std::string::npos;) a.replace(p, 6, address_);
    }
    return {};
  }

  Status spawn() {
    if (!owned_ipc_.empty()) std::filesystem::remove(owned_ipc_);
    detail::ChildOptions o;
    o.argv = argv_;
    o.env = {{"TROUPE_ENV_BIND", address_},
             {"TROUPE_ENV_PARENT_PID", std::to_string(::getpid())},
             {"TROUPE_ENV_MAX_MESSAGE_BYTES", std::to_string(spec_.max_message_bytes)},
             {"TROUPE_ENV_CONFIG", spec_.config.dump()}};  // for remote commands (the SDK reads it)
    o.log_path = log_path_;  // quoted when the worker dies
    o.keep_log = keep_log_;
    o.stdout_to_log = keep_log_;
    if (spec_.type == EnvType::remote) {  // a command of the YAML: its environment and cwd
      for (const auto& [name, value] : spec_.environment) o.env.emplace_back(name, value);
      o.cwd = spec_.cwd;
    }
    return worker_.start(std::move(o), "env " + spec_.name);
  }

  bool owns_process() const { return !argv_.empty(); }

  Status connect_and_hello() {
    if (owns_process()) TROUPE_TRY(spawn());
    new_socket();
    auto r = call_raw({{"op", "hello"}}, spec_.startup_timeout_s, "hello", "");
    if (!r.ok()) {
      Error e = r.error();
      stop_worker(false);
      if (owns_process()) e.message += " [command: " + worker_.command_text() + "]";
      // a worker that exits with 2 while starting refused its config or plug-in: bad input
      const int status = worker_.exit_status();
      if (WIFEXITED(status) && WEXITSTATUS(status) == 2) e.code = ErrorCode::invalid_input;
      return e;
    }
    const json& res = *r;
    std::string proto = res.value("protocol", "");
    if (proto != kEnvProtocol) {
      stop_worker(false);
      return invalid_input(where() + ": speaks protocol '" + proto + "', troupe needs '" + kEnvProtocol + "'");
    }
    auto info = env_info_from_json(res.value("env", json::object()), where() + ": hello");
    if (!info.ok()) {
      stop_worker(false);
      return info.error();
    }
    info_ = *info;
    return {};
  }

  // A REQ socket and the watch on its connection (declared after it: detached first).
  struct WatchedSocket {
    zmq::socket_t sock;
    std::unique_ptr<ConnectionWatch> watch;
  };

  std::unique_ptr<WatchedSocket> make_socket() const {
    auto ws = std::make_unique<WatchedSocket>();
    ws->sock = zmq::socket_t(shared_context(), zmq::socket_type::req);
    ws->sock.set(zmq::sockopt::linger, 0);
    // a reply over the limit is never read: libzmq drops the connection, and the call times out;
    // the watch tells which connection went, and when
    ws->sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(spec_.max_message_bytes));
    ws->watch = std::make_unique<ConnectionWatch>(shared_context(), ws->sock);
    ws->sock.connect(address_);
    return ws;
  }
  void new_socket() { sock_ = make_socket(); }

  // One call on its own socket (taken from the idle ones, or new); a socket whose call failed is
  // dropped (a REQ socket that missed its reply is stuck).
  Result<json> call_concurrent(json req, const char* op, const std::string& episode) {
    std::unique_ptr<WatchedSocket> sock;
    {
      std::lock_guard lock(idle_mu_);
      if (!idle_.empty()) {
        sock = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (!sock) sock = make_socket();
    auto r = call_raw(*sock, std::move(req), spec_.timeout_s, op, episode);
    if (r.ok()) {
      std::lock_guard lock(idle_mu_);
      idle_.push_back(std::move(sock));
    }
    return r;
  }

  Result<json> call_raw(json req, double timeout_s, const char* op, const std::string& episode) {
    return call_raw(*sock_, std::move(req), timeout_s, op, episode);
  }

  // Sends one request and waits for its reply, watching the worker and the connection. No recovery here.
  Result<json> call_raw(WatchedSocket& ws, json req, double timeout_s, const char* op, const std::string& episode) {
    zmq::socket_t& sock = ws.sock;
    ws.watch->drain();
    ws.watch->forget_drop();
    const int64_t id = ++next_id_;
    req["id"] = id;
    const std::string text = req.dump(-1, ' ', false, json::error_handler_t::replace);
    const std::string what = std::string(op) + (episode.empty() ? "" : " of episode '" + episode + "'");
    const std::string proto = std::string(kProtocolErrorTag);
    try {
      if (drop_.exchange(false)) {  // an injected lost request (faults.h): nothing is sent, the deadline runs
      } else if (!sock.send(zmq::buffer(text), zmq::send_flags::dontwait)) {
        // REQ with no connected peer yet queues; dontwait only fails if the pipe is full.
        if (!sock.send(zmq::buffer(text), zmq::send_flags::none))
          return make_error(ErrorCode::io, where() + ": cannot send " + what);
      }
      const double sent = mono_seconds(), deadline = sent + timeout_s;
      for (;;) {
        zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}, {ws.watch->handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 2, std::chrono::milliseconds(20));
        if (items[1].revents & ZMQ_POLLIN) ws.watch->drain();
        if (items[0].revents & ZMQ_POLLIN) break;
        if (const pid_t pid = worker_.pid(); pid > 0 && !worker_.alive())
          return make_error(ErrorCode::peer_failed, where(pid) + ": env worker " +
                                                        detail::describe_wait_status(worker_.exit_status()) +
                                                        " during " + what + worker_.log_tail());
        if (mono_seconds() > deadline) {
          std::ostringstream os;
          ws.watch->drain();
          os << where() << ": no answer to " << what << " within " << timeout_s << " s";
          if (const std::string note = dropped_connection_note(*ws.watch, sent); !note.empty())
            os << note << " (a reply over max_message_bytes " << spec_.max_message_bytes
               << ", or a request over the server's limit, is dropped so, unread)";
          else
            os << " (a reply over max_message_bytes " << spec_.max_message_bytes
               << " is dropped with its connection, unread)";
          return make_error(ErrorCode::timeout, os.str());
        }
      }
      zmq::message_t msg;
      if (!sock.recv(msg, zmq::recv_flags::none)) return make_error(ErrorCode::io, where() + ": receive failed");
      if (msg.more()) {  // the protocol has one frame per reply: drain the rest, fail the call
        int frames = 1;
        for (zmq::message_t extra; sock.recv(extra, zmq::recv_flags::dontwait); ++frames)
          if (!extra.more()) {
            ++frames;
            break;
          }
        return make_error(ErrorCode::peer_failed, where() + ": " + proto + "reply to " + what + " has " +
                                                      std::to_string(frames) + " frames (the protocol has one)");
      }
      // an injected malformed reply (faults.h) goes through the same checks as a real one
      const bool corrupt = corrupt_.exchange(false);
      json reply = json::parse(corrupt ? std::string_view("\x01 injected fault: not JSON") : msg.to_string_view(),
                               nullptr, false);
      if (reply.is_discarded() || !reply.is_object())
        return make_error(ErrorCode::peer_failed, where() + ": " + proto + "reply to " + what +
                                                      " is not a JSON object in UTF-8");
      const json& rid = reply.contains("id") ? reply["id"] : json();
      if (!rid.is_number_integer() || rid.get<int64_t>() != id)
        return make_error(ErrorCode::peer_failed, where() + ": " + proto + "reply id " + rid.dump() +
                                                      " does not match request " + std::to_string(id) + " (" + what + ")");
      if (!reply.value("ok", false)) {
        json e = reply.value("error", json::object());
        std::string m = e.is_object() ? e.value("message", std::string("(no message)")) : std::string("(no message)");
        return make_error(code_from_name(e.is_object() ? e.value("code", std::string("internal")) : "internal"),
                          where() + ": " + op + " failed: " + m);
      }
      if (!reply.contains("result")) return json::object();
      return reply["result"];
    } catch (const zmq::error_t& e) {
      return make_error(ErrorCode::io, where() + ": ZeroMQ error during " + what + ": " + e.what());
    }
  }

  // call_raw plus recovery: a timeout or a dead worker kills/restarts it and fails this call.
  Result<json> call(json req, const char* op, const std::string& episode) {
    if (!sock_) {
      Status st = recover(last_failure_.empty() ? "worker not running" : last_failure_);
      if (!st.ok()) return st.error();
    }
    auto r = call_raw(std::move(req), spec_.timeout_s, op, episode);
    if (r.ok()) return r;
    const Error& e = r.error();
    bool broken = e.code == ErrorCode::timeout || e.code == ErrorCode::peer_failed || e.code == ErrorCode::io;
    if (broken) {
      last_failure_ = e.message;
      Status st = recover(e.message);
      if (!st.ok()) return make_error(e.code, e.message + "; restart failed: " + st.error().message);
    }
    return e;
  }

  Status recover(const std::string& why) {
    sock_.reset();  // a REQ socket that missed its reply is stuck: make a new one
    if (!owns_process()) {
      new_socket();  // someone else's server: sessions may still be alive there
      return {};
    }
    stop_worker(false);
    ++generation_;  // every episode on the old worker is gone
    if (restarts_ >= spec_.max_restarts) {
      gave_up_ = true;
      return make_error(ErrorCode::peer_failed, where() + ": gave up after " + std::to_string(restarts_) +
                                                    " env worker restarts (last: " + why + ")");
    }
    ++restarts_;
    return connect_and_hello();
  }

  // Graceful: a shutdown request, then half a second to exit; else (or then) SIGKILL.
  void stop_worker(bool graceful) {
    if (graceful && sock_ && worker_.pid() > 0) (void)call_raw({{"op", "shutdown"}}, 1.0, "shutdown", "");
    sock_.reset();
    worker_.stop(graceful ? 0.5 : 0.0, 0);
    if (!owned_ipc_.empty()) {
      std::error_code ec;
      std::filesystem::remove(owned_ipc_, ec);
    }
  }
  EnvSpec spec_;
  EnvInfo info_;
  std::string address_, owned_ipc_, log_path_, last_failure_;
  bool keep_log_ = false;  // log_path_ is in the run's logs/
  std::vector<std::string> argv_;  // empty: not ours to start
  detail::ChildProcess worker_;  // the server troupe started (owns_process()); removes log_path_
  std::atomic<bool> corrupt_{false};
  std::atomic<bool> drop_{false};
  std::unique_ptr<WatchedSocket> sock_;
  std::mutex mu_;           // the owned worker's socket (one call at a time)
  std::mutex sessions_mu_;  // sessions_
  std::map<std::string, int> sessions_;  // episode -> worker generation it lives on
  std::mutex idle_mu_;
  std::vector<std::unique_ptr<WatchedSocket>> idle_;  // concurrent(): sockets with no call in flight
  int generation_ = 0, restarts_ = 0;
  bool gave_up_ = false;
  std::atomic<int64_t> next_id_{0};
};

}  // namespace

std::unique_ptr<EnvClient> make_remote_client_impl(const EnvSpec& spec, Status& status) {
  auto client = std::make_unique<RemoteEnvClient>(spec);
  status = client->start();
  if (!status.ok()) return nullptr;
  return client;
}

}  // namespace troupe::envs
