// `troupe run --restarts N`: the supervisor, a process outside mpirun/srun that starts
// the job (the --launcher command, or one process) and, when it dies (a learner rank, the
// coordinator's process, any rank), starts it again from its latest complete checkpoint with
// --resume, at most N times, logging each restart with its cause. It holds no ZeroMQ context and
// starts the job by fork+exec (posix_spawn) only; --resume makes the metrics continue with every
// step exactly once (rows after the checkpoint's step are dropped and written again). With
// run.restart_remaining_ranks it reads the launcher's stderr (passed on to its own) for the ranks
// that died and restarts without their roles (restart_ranks.h), {np} in the launcher filled in.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "restart_ranks.h"
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

// The job's command line: the launcher's words ({np}: the world size of `cluster`), then this
// binary's `run` with the same config, `extra` --set overrides (the cluster counts of a restart
// without lost ranks) and --restarts 0 (a rank never supervises, whatever run.restarts says, also
// where the launcher does not pass TROUPE_SUPERVISED on to other nodes).
std::string job_command(const SupervisorOptions& o, bool resume, const actors::ClusterSection& cluster,
                        const std::vector<std::string>& extra) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string cmd = o.launcher.empty() ? std::string() : with_np(o.launcher, world_size(cluster)) + " ";
  cmd += shell_quoted(self) + " run " + shell_quoted(o.config);
  for (const auto& s : o.sets) cmd += " --set " + shell_quoted(s);
  for (const auto& s : extra) cmd += " --set " + shell_quoted(s);
  cmd += " --restarts 0";
  if (resume) cmd += " --resume " + shell_quoted(o.run_dir);
  return cmd;
}

// Copies the job's stderr (the read end `fd`) to ours until it closes, keeping its last 64 KiB in
// *tail (where the launcher's report of a dead rank is).
void pass_on_stderr(int fd, std::string* tail) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    (void)!::write(2, buf, static_cast<size_t>(n));
    tail->append(buf, static_cast<size_t>(n));
    if (tail->size() > (1u << 17)) tail->erase(0, tail->size() - (1u << 16));
  }
  ::close(fd);
}

// Runs `cmd` under /bin/sh in a process group of its own (TROUPE_SUPERVISED=1 in its
// environment); its exit status as waitpid gives it, or -1 when it could not start. With
// `stderr_tail`, the job's stderr goes through this process (and its end into *stderr_tail).
int run_job(const std::string& cmd, std::string* stderr_tail) {
  ::setenv("TROUPE_SUPERVISED", "1", 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int pipe_fds[2] = {-1, -1};
  if (stderr_tail && ::pipe(pipe_fds) == 0) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  }
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
  if (rc != 0) {
    if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
    return -1;
  }
  g_child = pid;
  if (pipe_fds[0] >= 0) pass_on_stderr(pipe_fds[0], stderr_tail);
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

// run.restart_remaining_ranks: the cluster of the next start, without the roles of the ranks the
// launcher reported dead in `said`; the --set overrides for it in *extra, what changed in the return.
std::string leave_out_lost_ranks(const std::string& said, actors::ClusterSection* cluster,
                                 std::vector<std::string>* extra) {
  const std::vector<int> lost = lost_ranks_in(said);
  if (lost.empty()) return "; the launcher named no dead rank: same ranks";
  const RemainingRanks r = without_ranks(*cluster, lost);
  std::string what = "; lost";
  for (int rank : lost) what += " rank " + std::to_string(rank);
  if (!r.left_out.empty()) {
    what += ", left out:";
    for (const auto& n : r.left_out) what += " " + n;
  }
  if (!r.kept.empty()) {
    what += ", started again in its place (the last of its kind):";
    for (const auto& n : r.kept) what += " " + n;
  }
  *cluster = r.cluster;
  *extra = {"cluster.learners=" + std::to_string(cluster->learners),
            "cluster.generators=" + std::to_string(cluster->generators),
            "cluster.env_workers=" + std::to_string(cluster->env_workers),
            "cluster.scorers=" + std::to_string(cluster->scorers)};
  return what + "; " + std::to_string(world_size(*cluster)) + " ranks (cluster.learners " +
         std::to_string(cluster->learners) + ", generators " + std::to_string(cluster->generators) + ", env_workers " +
         std::to_string(cluster->env_workers) + ", scorers " + std::to_string(cluster->scorers) + ")";
}

}  // namespace

int supervise_run(const SupervisorOptions& o) {
  if (o.remaining_ranks && o.launcher.find("{np}") == std::string::npos) {
    std::fprintf(stderr, "troupe run: run.restart_remaining_ranks: the launcher (%s) has no {np}: a restart with "
                         "fewer ranks needs the rank count in it, e.g. \"mpirun -np {np}\" or \"srun -n {np}\"\n",
                 o.launcher.empty() ? "none: one process" : o.launcher.c_str());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  bool resume = o.resume;
  actors::ClusterSection cluster = o.cluster;
  std::vector<std::string> extra;
  for (int attempt = 0;; ++attempt) {
    std::string said;
    const int status = run_job(job_command(o, resume, cluster, extra), o.remaining_ranks ? &said : nullptr);
    const int code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (status >= 0 && WIFEXITED(status) && (code == 0 || code == 2)) return code;  // done, or a bad config
    if (g_stop) return code;
    if (attempt >= o.restarts) {
      log_restart(o, "the job failed (" + cause_of(status) + ") after " + std::to_string(attempt) + " restart(s) of " +
                         std::to_string(o.restarts) + "; not restarted again");
      return code == 0 ? 1 : code;
    }
    const std::string ranks = o.remaining_ranks ? leave_out_lost_ranks(said, &cluster, &extra) : std::string();
    const auto latest = std::filesystem::path(o.run_dir) / "checkpoints" / "latest";
    std::error_code ec;
    resume = std::filesystem::exists(latest, ec);
    const std::string from = resume ? "from " + std::filesystem::read_symlink(latest, ec).filename().string()
                                    : std::string("afresh (no checkpoint yet)");
    log_restart(o, "restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.restarts) + ": the job failed (" +
                       cause_of(status) + ")" + ranks + "; starting it again " + from);
  }
}

}  // namespace troupe::launch
