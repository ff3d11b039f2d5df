// The W&B sink (wandb_sink.h): starts launch/wandb_sink.py by posix_spawn (its own process group,
// so a Ctrl-C reaches troupe, which finishes the W&B run in order), talks to it over a socketpair
// (fd 3 in the child) and never lets it fail training once it answered `ready`.
#include "troupe/launch/wandb_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/base/build_config.h"
#include "troupe/base/clock.h"
#include "troupe/base/enum_names.h"

extern char** environ;

namespace troupe::launch {
namespace fs = std::filesystem;

namespace {

constexpr int kChildFd = 3;               // the socket's number in the W&B process
constexpr double kWriteStallS = 30;       // a row not taken within this gives the sink up

std::string file_tail(const std::string& path, size_t max_bytes = 3000) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Waits for `pid` to exit for up to `timeout_s`; true (and *status) once it did.
bool wait_exit(pid_t pid, double timeout_s, int* status) {
  const auto t0 = MonoClock::now();
  for (;;) {
    pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (seconds_since(t0) >= timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Reads the child's first line ("ready", or nothing when it exits) within timeout_s.
std::string read_handshake(int fd, double timeout_s) {
  std::string got;
  const auto t0 = MonoClock::now();
  while (got.find('\n') == std::string::npos) {
    const double left = timeout_s - seconds_since(t0);
    if (left <= 0) return got + "<no answer>";
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return got + "<closed>";
    got.append(buf, static_cast<size_t>(n));
  }
  return got.substr(0, got.find('\n'));
}

std::vector<std::string> sink_argv(const WandbOptions& o) {
  std::vector<std::string> argv = {o.python.empty() ? troupe::python_executable() : o.python,
                                   std::string(TROUPE_SOURCE_DIR) + "/launch/wandb_sink.py",
                                   "--fd", std::to_string(kChildFd),
                                   "--project", o.project,
                                   "--name", o.name,
                                   "--mode", std::string(enum_name(o.mode)),
                                   "--dir", o.run_dir};
  if (!o.config_file.empty()) {
    argv.push_back("--config");
    argv.push_back(o.config_file);
  }
  return argv;
}

// posix_spawn with the socket at fd 3 and stdout/stderr into the log, in a process group of its own.
Result<pid_t> spawn_sink(const std::vector<std::string>& args, int child_end, const std::string& log_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_adddup2(&fa, child_end, kChildFd);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    return make_error(ErrorCode::invalid_input,
                      "logger.wandb: cannot start " + args[0] + " (the Python of $TROUPE_PYTHON): " + std::strerror(rc));
  return pid;
}

}  // namespace

Result<std::unique_ptr<WandbSink>> WandbSink::start(const WandbOptions& o, std::function<void(const std::string&)> warn) {
  std::error_code ec;
  fs::create_directories(fs::path(o.run_dir) / "logs", ec);
  if (ec) return make_error(ErrorCode::io, "cannot create " + o.run_dir + "/logs: " + ec.message());
  std::unique_ptr<WandbSink> s(new WandbSink());
  s->log_path_ = (fs::path(o.run_dir) / "logs" / "wandb.log").string();
  s->finish_timeout_s_ = o.finish_timeout_s;
  s->warn_ = std::move(warn);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(ErrorCode::io, std::string("logger.wandb: socketpair: ") + std::strerror(errno));
  const auto args = sink_argv(o);
  auto pid = spawn_sink(args, sv[1], s->log_path_);
  ::close(sv[1]);
  if (!pid.ok()) {
    ::close(sv[0]);
    return pid.error();
  }
  s->pid_ = *pid;
  s->fd_ = sv[0];
  const std::string answer = read_handshake(s->fd_, o.start_timeout_s);
  if (answer == "ready") return s;
  int status = 0;
  const bool exited = wait_exit(s->pid_, 5, &status);
  if (!exited) ::kill(-s->pid_, SIGKILL), wait_exit(s->pid_, 5, &status);
  s->pid_ = -1;
  ::close(s->fd_);
  s->fd_ = -1;
  const std::string tail = file_tail(s->log_path_);
  std::string why = exited ? "it stopped (" + describe_status(status) + ")"
                           : "no answer within " + std::to_string(static_cast<int>(o.start_timeout_s)) + " s";
  return make_error(ErrorCode::invalid_input,
                    "logger.wandb: the W&B process (" + args[0] + " " + args[1] + ") did not start: " + why +
                        "; its log " + s->log_path_ + (tail.empty() ? std::string(" is empty") : ":\n" + tail));
}

WandbSink::~WandbSink() { finish(); }

std::string WandbSink::exit_status_text() {
  int status = 0;
  if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return " (" + describe_status(status) + ")";
  }
  return "";
}

void WandbSink::give_up(const std::string& why) {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  const std::string status = exit_status_text();
  if (warn_)
    warn_("W&B logging stopped: " + why + status + "; training goes on without it (log: " + log_path_ + ")");
}

void WandbSink::log(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (fd_ < 0) return;
  nlohmann::json data = nlohmann::json::object();
  for (const auto& [tag, value] : scalars) data[tag] = value;
  const std::string line = nlohmann::json{{"step", step}, {"data", data}}.dump() + "\n";
  size_t off = 0;
  const auto t0 = MonoClock::now();
  while (off < line.size()) {
    pollfd p{fd_, POLLOUT, 0};
    const double left = kWriteStallS - seconds_since(t0);
    if (left <= 0) return give_up("the W&B process took no row for " + std::to_string(static_cast<int>(kWriteStallS)) + " s");
    int r = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno != EINTR) return give_up(std::string("poll: ") + std::strerror(errno));
    if (r <= 0) continue;
    ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) return give_up("the W&B process is gone");
    off += static_cast<size_t>(n);
  }
}

void WandbSink::finish() {
  if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);  // end of rows: the process calls wandb.finish() and exits
    ::close(fd_);
    fd_ = -1;
  }
  if (pid_ <= 0) return;
  int status = 0;
  if (!wait_exit(pid_, finish_timeout_s_, &status)) {
    if (warn_) warn_("the W&B process did not finish within " + std::to_string(static_cast<int>(finish_timeout_s_)) + " s; stopping it (log: " + log_path_ + ")");
    ::kill(-pid_, SIGTERM);
    if (!wait_exit(pid_, 10, &status)) ::kill(-pid_, SIGKILL), wait_exit(pid_, 5, &status);
  } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && warn_) {
    warn_("the W&B process ended with " + describe_status(status) + " (log: " + log_path_ + ")");
  }
  pid_ = -1;
}

}  // namespace troupe::launch
