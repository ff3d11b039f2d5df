// Suites that time another process (a helper binary under mpirun, a Python baseline): start a
// shell command, read everything it prints, and pick the JSON objects out of that output. Nothing
// here exits; a command that cannot start is a nullopt, and its status is the caller's to judge.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace troupe::bench {

struct ChildOutput {
  int status = 0;                          // pclose()'s status (0: exited 0)
  std::string text;                        // stdout (and stderr where the command merges it)
  std::vector<nlohmann::json> objects;     // the lines of `text` that are JSON objects, in order
};

// Runs `cmd` through the shell; nullopt when it cannot be started (then, given a suite, says so on
// stderr: "troupe bench SUITE: cannot start CMD").
std::optional<ChildOutput> run_child(const std::string& cmd, const std::string& suite = "");

// TROUPE_BINARY_DIR/bin/NAME; nullopt (and skip_baseline(suite, case_name, ...) says why) when it
// is not built.
std::optional<std::string> helper_binary(const std::string& name, const std::string& suite,
                                         const std::string& case_name);

// The shell command that starts `helper` on `np` ranks of TROUPE_MPIEXEC, as root too and
// oversubscribed: "ENV... 'mpiexec' --oversubscribe -np NP MPI_ARGS 'helper' HELPER_ARGS 2>&1".
// `env` (e.g. "OMP_WAIT_POLICY=PASSIVE ") and `mpi_args` (e.g. " --mca btl self,tcp") may be empty.
std::string mpirun_command(const std::string& env, int np, const std::string& mpi_args, const std::string& helper,
                           const std::string& helper_args);

// Starts argv[0] (looked up on PATH when `search_path`) with `envp`, its stdin the read end of
// `to_child` and its stdout the write end of `from_child` (the child closes the other ends), and
// closes the child's ends here: a baseline answering line by line. posix_spawn's result (0: *pid set).
// Starts `troupe ARGS...` (this binary, /proc/self/exe) with stdout to /dev/null and stderr to the
// file `log`, without waiting; its pid, or -1 with *why set when it cannot start.
pid_t spawn_troupe(const std::vector<std::string>& args, const std::string& log, std::string* why);

int spawn_piped(pid_t* pid, const int to_child[2], const int from_child[2], char* const argv[], char* const envp[],
                bool search_path);

}  // namespace troupe::bench
