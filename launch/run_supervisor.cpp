// `troupe run --restarts N`: the supervisor, a process outside mpirun/srun that starts
// the job (the --launcher command, or one process) and, when it dies (a learner rank, the
// coordinator's process, any rank), starts it again from its latest complete checkpoint with
// --resume, at most N times, logging each restart with its cause. It holds no ZeroMQ context and
// starts the job by fork+exec (posix_spawn) only; --resume makes the metrics continue with every
// step exactly once (rows after the checkpoint's step are dropped and written again).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "troupe/base/clock.h"
#include "troupe/launch/run.h"

extern char** environ;

namespace troupe::launch {

namespace {

std::atomic<pid_t> g_child{0};
std::atomic<bool> g_stop{false};

void forward_stop(int sig) {
  g_stop = true;
  if (pid_t c = g_child.load(); c > 0) ::kill(-c, sig);  // the job's process group
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The job's command line: the launcher's words, then this binary's `run` with the same config and
// --restarts 0 (a rank never supervises, whatever run.restarts says, also where the launcher does not
// pass TROUPE_SUPERVISED on to other nodes).
std::string job_command(const SupervisorOptions& o, bool resume) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string cmd = o.launcher.empty() ? std::string() : o.launcher + " ";
  cmd += shell_quoted(self) + " run " + shell_quoted(o.config);
  for (const auto& s : o.sets) cmd += " --set " + shell_quoted(s);
  cmd += " --restarts 0";
  if (resume) cmd += " --resume " + shell_quoted(o.run_dir);
  return cmd;
}

// Runs `cmd` under /bin/sh in a process group of its own (TROUPE_SUPERVISED=1 in its
// environment); its exit status as waitpid gives it, or -1 when it could not start.
int run_job(const std::string& cmd) {
  ::setenv("TROUPE_SUPERVISED", "1", 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return -1;
  g_child = pid;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  return status;
}

// Why the job ended. mpirun and srun both report a rank killed by signal N as their exit code
// 128 + N (srun: the highest of its tasks' codes, a signal counting as 128 + N), so such a code is
// named as the signal; the launcher itself killed by a signal is named so too.
std::string cause_of(int status) {
  if (status < 0) return "it could not be started";
  if (WIFSIGNALED(status)) return "it was killed by signal " + std::to_string(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  if (code > 128 && code < 128 + NSIG)
    return "it exited with code " + std::to_string(code) + ": a rank was killed by signal " + std::to_string(code - 128) +
           " (" + strsignal(code - 128) + ")";
  return "it exited with code " + std::to_string(code);
}

void log_restart(const SupervisorOptions& o, const std::string& line) {
  std::fprintf(stderr, "troupe: %s\n", line.c_str());
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(o.run_dir) / "logs", ec);
  std::ofstream(std::filesystem::path(o.run_dir) / "logs" / "restarts.log", std::ios::app) << line << "\n";
}

}  // namespace

int supervise_run(const SupervisorOptions& o) {
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  bool resume = o.resume;
  for (int attempt = 0;; ++attempt) {
    const int status = run_job(job_command(o, resume));
    const int code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (status >= 0 && WIFEXITED(status) && (code == 0 || code == 2)) return code;  // done, or a bad config
    if (g_stop) return code;
    if (attempt >= o.restarts) {
      log_restart(o, "the job failed (" + cause_of(status) + ") after " + std::to_string(attempt) + " restart(s) of " +
                         std::to_string(o.restarts) + "; not restarted again");
      return code == 0 ? 1 : code;
    }
    const auto latest = std::filesystem::path(o.run_dir) / "checkpoints" / "latest";
    std::error_code ec;
    resume = std::filesystem::exists(latest, ec);
    const std::string from = resume ? "from " + std::filesystem::read_symlink(latest, ec).filename().string()
                                    : std::string("afresh (no checkpoint yet)");
    log_restart(o, "restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.restarts) + ": the job failed (" +
                       cause_of(status) + "); starting it again " + from);
  }
}

}  // namespace troupe::launch
