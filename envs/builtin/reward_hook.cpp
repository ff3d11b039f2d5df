// The reward hook (reward_hook.h): a pool of Python workers, each started by fork+exec
// (ChildProcess) with a socketpair as its stdin and stdout, speaking one JSON line per request.
// Invariant: a worker is either idle, busy with exactly one call, or stopped (restarted by the next
// call that picks it); a call past its deadline or a worker gone mid-call fails that call only.
#include "builtin/reward_hook.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "src/child_process.h"
#include "troupe/base/build_config.h"
#include "troupe/base/clock.h"
#include "troupe/envs/trajectory.h"

namespace troupe::envs::detail {

namespace {

constexpr double kStartupTimeoutS = 60;  // a worker must import the function and say ready within this

// An error of a failed call: invalid_input (the env itself is fine), its reason leading the message
// so termination_for names it.
Error hook_error(Termination reason, const std::string& message) {
  return invalid_input(std::string(termination_name(reason)) + ": " + message);
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace

struct RewardHook::Worker {
  std::string log_path;  // its stderr, the same file at every restart (removed with proc)
  ChildProcess proc;
  int fd = -1;          // our end of the socketpair (-1: not running)
  std::string pending;  // bytes received after the last complete line
  bool busy = false;
  int64_t next_id = 0;

  void stop() {
    if (fd >= 0) ::close(fd);  // the worker reads EOF and exits
    fd = -1;
    pending.clear();
    proc.stop(0.0, 0);
  }
};

Result<RewardHookConfig> read_reward_hook_config(ConfigReader& r) {
  RewardHookConfig c;
  c.where = r.where();
  TROUPE_ASSIGN_OR_RETURN(c.reward, r.string("reward", ""));
  TROUPE_ASSIGN_OR_RETURN(c.python, r.string("python", ""));
  TROUPE_ASSIGN_OR_RETURN(c.timeout_s, r.number("reward_timeout_s", 10.0, 0.001, 86400.0));
  TROUPE_ASSIGN_OR_RETURN(int64_t workers, r.integer("reward_workers", 2, 1, 64));
  c.workers = static_cast<int>(workers);
  return c;
}

RewardHook::RewardHook(RewardHookConfig config) : config_(std::move(config)) {
  if (config_.python.empty()) config_.python = troupe::python_executable();
  script_ = std::string(TROUPE_SOURCE_DIR) + "/envs/python/troupe_env/reward_worker.py";
}

RewardHook::~RewardHook() {
  for (auto& w : workers_) w->stop();
}

std::string RewardHook::name() const { return config_.where + ": reward hook '" + config_.reward + "'"; }

Result<std::shared_ptr<RewardHook>> RewardHook::open(const RewardHookConfig& config) {
  const std::string key = config.reward + '\n' + config.python + '\n' + config.base_dir + '\n' +
                          seconds_text(config.timeout_s) + '\n' + std::to_string(config.workers);
  static std::mutex registry_mu;
  static auto* registry = new std::map<std::string, std::weak_ptr<RewardHook>>();  // never destroyed
  std::lock_guard lock(registry_mu);
  if (auto live = (*registry)[key].lock()) return live;
  auto hook = std::make_shared<RewardHook>(config);
  const std::string where = hook->name();
  if (config.reward.find(':') == std::string::npos)
    return invalid_input(where + ": 'reward' must be MODULE:FUNCTION (e.g. my_reward.py:score, a file beside the "
                                 "YAML, or my_pkg.rewards:score)");
  if (!std::filesystem::exists(hook->script_))
    return invalid_input(where + ": the worker script " + hook->script_ + " is missing");
  static std::atomic<int> counter{0};
  for (int i = 0; i < config.workers; ++i) {
    hook->workers_.push_back(std::make_unique<Worker>());
    hook->workers_.back()->log_path =
        (std::filesystem::temp_directory_path() /
         ("troupe-reward-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log")).string();
  }
  for (auto& w : hook->workers_) TROUPE_TRY(hook->start(*w));
  (*registry)[key] = hook;
  return hook;
}

// Starts one worker and waits for its {"ready": true}: the function imported.
Status RewardHook::start(Worker& w) {
  w.stop();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(ErrorCode::io, name() + ": socketpair: " + std::strerror(errno));
  ChildOptions o;
  o.argv = {config_.python, script_, "--reward", config_.reward, "--base-dir", config_.base_dir};
  o.env = {{"PYTHONDONTWRITEBYTECODE", "1"}};  // no __pycache__ beside the user's file
  o.log_path = w.log_path;
  o.stdio_fd = sv[1];
  o.own_group = true;  // a terminal's Ctrl-C for troupe does not reach it (troupe finishes the step first)
  Status st = w.proc.start(std::move(o), name());
  ::close(sv[1]);
  if (!st.ok()) {
    ::close(sv[0]);
    return st;
  }
  w.fd = sv[0];
  auto ready = read_line(w, mono_seconds() + std::max(kStartupTimeoutS, config_.timeout_s), "start-up");
  if (!ready.ok()) {
    const std::string tail = w.proc.log_tail();
    w.stop();
    return invalid_input(name() + " (python " + config_.python + ") did not start: " + ready.error().message + tail);
  }
  if (!ready->value("ready", false)) {
    const std::string error = ready->value("error", std::string("(no reason given)"));
    w.stop();
    return invalid_input(name() + " cannot be loaded (python " + config_.python + ", base_dir " + config_.base_dir +
                         "): " + error);
  }
  return {};
}

// The next line from the worker as a JSON object. Errors: "no answer within ..." (timeout, code
// timeout), the worker gone (peer_failed), a line that is not a JSON object (internal).
Result<json> RewardHook::read_line(Worker& w, double deadline, const char* what) {
  for (;;) {
    if (const size_t nl = w.pending.find('\n'); nl != std::string::npos) {
      json j = json::parse(w.pending.substr(0, nl), nullptr, false);
      w.pending.erase(0, nl + 1);
      if (j.is_discarded() || !j.is_object())
        return make_error(ErrorCode::internal, "its worker answered the " + std::string(what) +
                                                   " with a line that is not a JSON object");
      return j;
    }
    pollfd p{w.fd, POLLIN, 0};
    const int n = ::poll(&p, 1, 20);
    if (n > 0) {
      char buf[65536];
      const ssize_t got = ::recv(w.fd, buf, sizeof buf, 0);
      if (got > 0) {
        w.pending.append(buf, static_cast<size_t>(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      w.proc.stop(1.0, 0);  // it closed its end: it is exiting (or exited)
      return make_error(ErrorCode::peer_failed, "its worker " + describe_wait_status(w.proc.exit_status()) +
                                                    " during the " + what);
    }
    if (n == 0 && !w.proc.alive())  // gone, though something else holds its end of the socket
      return make_error(ErrorCode::peer_failed, "its worker " + describe_wait_status(w.proc.exit_status()) +
                                                    " during the " + what);
    if (mono_seconds() > deadline) return make_error(ErrorCode::timeout, "no answer to the " + std::string(what) + " in time");
  }
}

// One request on one worker (started first if it is not running).
Result<VerifyResult> RewardHook::call(Worker& w, const json& request_in) {
  if (w.fd < 0) {
    Status st = start(w);
    if (!st.ok()) return hook_error(Termination::reward_crash, "could not restart its worker: " + st.error().message);
  }
  json request = request_in;
  const int64_t id = ++w.next_id;
  request["id"] = id;
  const std::string line = request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const pid_t pid = w.proc.pid();
  const std::string who = name() + " (worker pid " + std::to_string(pid) + ")";
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(w.fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      w.proc.stop(1.0, 0);
      std::string why = describe_wait_status(w.proc.exit_status());
      const std::string tail = w.proc.log_tail();
      w.stop();
      return hook_error(Termination::reward_crash, who + ": its worker " + why + " before the call" + tail);
    }
    sent += static_cast<size_t>(n);
  }
  auto reply = read_line(w, mono_seconds() + config_.timeout_s, "call");
  if (!reply.ok()) {
    const bool hung = reply.error().code == ErrorCode::timeout;
    if (hung) w.proc.stop(0.0, 0);  // killed: the next call restarts it
    const std::string tail = w.proc.log_tail();
    w.stop();
    if (hung)
      return hook_error(Termination::reward_timeout, who + ": no answer within reward_timeout_s " +
                                                         seconds_text(config_.timeout_s) + " s (worker killed)" + tail);
    return hook_error(Termination::reward_crash, who + ": " + reply.error().message + tail);
  }
  if (!reply->contains("id") || (*reply)["id"] != id) {
    w.stop();
    return hook_error(Termination::reward_crash, who + ": its worker answered out of turn (id " +
                                                     reply->value("id", json()).dump() + ", not " + std::to_string(id) + ")");
  }
  if (!reply->value("ok", false)) {
    const std::string reason = reply->value("reason", std::string("reward_error"));
    const std::string message = reply->value("message", std::string("(no message)"));
    return hook_error(reason == "reward_bad_return" ? Termination::reward_bad_return : Termination::reward_error,
                      name() + ": the function " + message);
  }
  VerifyResult v;
  const json& reward = reply->value("reward", json());
  if (!reward.is_number()) return hook_error(Termination::reward_crash, who + ": its worker's reply has no reward");
  v.reward = reward.get<double>();
  if (auto c = reply->find("components"); c != reply->end() && c->is_object())
    for (auto it = c->begin(); it != c->end(); ++it)
      if (it->is_number()) v.components[it.key()] = it->get<double>();
  return v;
}

Result<VerifyResult> RewardHook::score(const std::string& prompt, const std::string& response, const json& reference,
                                       const json& row) {
  Worker* w = nullptr;
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] {
      for (auto& x : workers_)
        if (!x->busy) {
          w = x.get();
          return true;
        }
      return false;
    });
    w->busy = true;
  }
  auto r = call(*w, {{"prompt", prompt}, {"response", response}, {"reference", reference}, {"row", row}});
  {
    std::lock_guard lock(mu_);
    w->busy = false;
  }
  idle_.notify_one();
  return r;
}

}  // namespace troupe::envs::detail
