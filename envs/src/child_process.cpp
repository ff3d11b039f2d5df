// ChildProcess (child_process.h): posix_spawn with the child's stderr in a log, non-blocking exit
// checks, stop with a grace period then SIGKILL. Each child is waited for exactly once, under mu_.
#include "child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "troupe/base/clock.h"

extern char** environ;

namespace troupe::envs::detail {

namespace {

// Our environment without the variables `set` names, then `set` itself ("NAME=value").
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    bool replaced = false;
    for (const auto& [name, value] : set)
      replaced = replaced || (std::strncmp(*e, name.c_str(), name.size()) == 0 && (*e)[name.size()] == '=');
    if (!replaced) out.emplace_back(*e);
  }
  for (const auto& [name, value] : set) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

ChildProcess::~ChildProcess() {
  stop(0.0, 0);
  if (!options_.log_path.empty() && !options_.keep_log) {
    std::error_code ec;
    std::filesystem::remove(options_.log_path, ec);
  }
}

Status ChildProcess::start(ChildOptions options, const std::string& where) {
  options_ = std::move(options);
  if (!options_.cwd.empty() && !std::filesystem::is_directory(options_.cwd))
    return invalid_input(where + ": cannot start '" + options_.argv[0] + "': its cwd '" + options_.cwd +
                         "' is not a directory");
  std::vector<std::string> env_strings = child_environment(options_.env);
  std::vector<std::string> argv_strings = options_.argv;
  std::vector<char*> envp = pointers(env_strings), argv = pointers(argv_strings);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options_.stdio_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, options_.stdio_fd, 0);
    posix_spawn_file_actions_adddup2(&actions, options_.stdio_fd, 1);
  } else if (options_.stdout_to_null) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  }
  if (!options_.log_path.empty()) {
    const int mode = O_WRONLY | O_CREAT | (options_.keep_log ? O_APPEND : O_TRUNC);
    posix_spawn_file_actions_addopen(&actions, 2, options_.log_path.c_str(), mode, 0644);
    if (options_.stdout_to_log && options_.stdio_fd < 0) posix_spawn_file_actions_adddup2(&actions, 2, 1);
  }
  if (!options_.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options_.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (options_.own_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return invalid_input(where + ": cannot start '" + options_.argv[0] + "': " + std::strerror(rc));
  std::lock_guard lock(mu_);
  status_ = -1;
  pid_ = pid;
  return {};
}

bool ChildProcess::alive() {
  std::lock_guard lock(mu_);
  const pid_t pid = pid_;
  if (pid <= 0) return false;
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return true;
  status_ = status;
  pid_ = -1;
  return false;
}

int ChildProcess::exit_status() const {
  std::lock_guard lock(mu_);
  return status_;
}

void ChildProcess::stop(double grace_s, int first_signal) {
  std::lock_guard lock(mu_);
  const pid_t pid = pid_;
  if (pid <= 0) return;
  const pid_t target = options_.own_group ? -pid : pid;
  if (first_signal != 0) ::kill(target, first_signal);
  int status = 0;
  bool gone = false;
  for (const double until = mono_seconds() + grace_s; grace_s > 0;) {
    gone = ::waitpid(pid, &status, WNOHANG) == pid;
    if (gone || mono_seconds() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!gone || options_.own_group) ::kill(target, SIGKILL);  // the group's other members may outlive its leader
  if (!gone) ::waitpid(pid, &status, 0);
  status_ = status;
  pid_ = -1;
}

std::string ChildProcess::log_tail() const {
  if (options_.log_path.empty()) return "";
  std::ifstream in(options_.log_path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!all.empty() && (all.back() == '\n' || all.back() == ' ')) all.pop_back();
  if (all.empty()) return "";
  if (all.size() > 600) all = "..." + all.substr(all.size() - 600);
  return " (" + (options_.keep_log ? "its log " + options_.log_path : std::string("stderr")) + ": " + all + ")";
}

std::string ChildProcess::command_text() const {
  std::string cmd;
  for (const auto& a : options_.argv) cmd += (cmd.empty() ? "" : " ") + a;
  return cmd;
}

void place_log(ChildOptions& options, const std::string& log_dir, const std::string& env_name) {
  static std::atomic<int> counter{0};
  const std::string stem = "env-" + env_name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log";
  std::error_code ec;
  if (!log_dir.empty() && (std::filesystem::create_directories(log_dir, ec), std::filesystem::is_directory(log_dir))) {
    options.log_path = (std::filesystem::path(log_dir) / stem).string();
    options.keep_log = true;
    options.stdout_to_log = true;
    options.stdout_to_null = false;
    return;
  }
  options.log_path = (std::filesystem::temp_directory_path() / ("troupe-" + stem)).string();
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "stopped";
}

}  // namespace troupe::envs::detail
