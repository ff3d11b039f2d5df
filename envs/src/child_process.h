// Private helper: a child process an env client starts and owns (the isolated env worker, a remote
// env's `command`, a NeMo Gym server). Invariants: children start only by fork+exec (posix_spawn;
// the caller holds a ZeroMQ context, so no code of ours ever runs in a bare fork); a child is
// reaped exactly once (alive() and stop() may race from several threads); its stderr goes to a log
// whose tail errors quote, and the log is removed with this object unless keep_log (a run's logs/).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::envs::detail {

struct ChildOptions {
  std::vector<std::string> argv;                          // argv[0] is looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;   // set in the child, replacing inherited values
  std::string log_path;                                   // the child's stderr (truncated at each start unless keep_log)
  bool stdout_to_null = false;                            // else the child shares our stdout (unless stdout_to_log)
  bool stdout_to_log = false;                             // the child's stdout also goes to log_path
  bool keep_log = false;                                  // the log outlives this object, each start appends to it
  bool own_group = false;                                 // a process group of its own: stop() stops its children too
  int stdio_fd = -1;  // >= 0: the child's stdin and stdout are this descriptor (e.g. a socketpair end; still the caller's to close)
  std::string cwd;                                        // the child's working directory ("" = ours)
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // kills a child still running, removes the log (unless keep_log)

  // Starts argv (a child still running from an earlier start must be stopped first). A command
  // that cannot be started (or a cwd that is not a directory) is invalid_input:
  // "<where>: cannot start '<argv[0]>': <reason>".
  Status start(ChildOptions options, const std::string& where);

  pid_t pid() const { return pid_.load(); }  // -1: none running (never started, reaped or stopped)
  // True while the child runs; one that exited is reaped here and its wait status kept.
  bool alive();
  // The wait status of the child last reaped (-1: none since the last start).
  int exit_status() const;
  // Sends first_signal (0: none) to the child (its group with own_group), waits up to grace_s for
  // it to exit, then SIGKILLs what is left (a group always) and reaps it.
  void stop(double grace_s, int first_signal);

  // " (stderr: <the log's last 600 characters>)", or "" when it is empty or there is no log.
  std::string log_tail() const;
  // The command line of the last start, its words joined by spaces.
  std::string command_text() const;

 private:
  ChildOptions options_;
  std::atomic<pid_t> pid_{-1};
  mutable std::mutex mu_;  // reaping: status_
  int status_ = -1;
};

// Where the log of a process an env starts goes: with log_dir (a run's logs/, created here),
// log_dir/env-<name>-<pid>-<n>.log, kept (keep_log); else a temporary file removed with the process.
// Sets options.log_path, keep_log and stdout_to_log (with log_dir both streams go to the log).
void place_log(ChildOptions& options, const std::string& log_dir, const std::string& env_name);

// A wait status in words: "exited with status N", "killed by signal N (Name)" or "stopped".
std::string describe_wait_status(int status);

}  // namespace troupe::envs::detail
