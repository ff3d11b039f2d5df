// run_child, helper_binary, mpirun_command (child_process.h): one way for every suite to start a
// command and read its output; each JSON object line is parsed once, here.
#include "child_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "troupe/base/build_config.h"
#include "troupe/bench/bench.h"

extern char** environ;

namespace troupe::bench {

std::optional<ChildOutput> run_child(const std::string& cmd, const std::string& suite) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    if (!suite.empty()) std::fprintf(stderr, "troupe bench %s: cannot start %s\n", suite.c_str(), cmd.c_str());
    return std::nullopt;
  }
  ChildOutput out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out.text += buf;
  out.status = ::pclose(p);
  for (size_t pos = 0; pos < out.text.size();) {
    size_t end = out.text.find('\n', pos);
    if (end == std::string::npos) end = out.text.size();
    auto j = nlohmann::json::parse(out.text.substr(pos, end - pos), nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.objects.push_back(std::move(j));
    pos = end + 1;
  }
  return out;
}

std::optional<std::string> helper_binary(const std::string& name, const std::string& suite,
                                         const std::string& case_name) {
  const std::string helper = std::string(TROUPE_BINARY_DIR) + "/bin/" + name;
  if (std::filesystem::exists(helper)) return helper;
  skip_baseline(suite, case_name, helper + " is not built");
  return std::nullopt;
}

std::string mpirun_command(const std::string& env, int np, const std::string& mpi_args, const std::string& helper,
                           const std::string& helper_args) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 " + env + "'" +
         TROUPE_MPIEXEC + "' --oversubscribe -np " + std::to_string(np) + mpi_args + " '" + helper + "' " +
         helper_args + " 2>&1";
}

pid_t spawn_troupe(const std::vector<std::string>& args, const std::string& log, std::string* why) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> store = {"/proc/self/exe"};
  store.insert(store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : store) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == 0) return pid;
  if (why) *why = std::string("cannot start troupe: ") + std::strerror(rc);
  return -1;
}

int spawn_piped(pid_t* pid, const int to_child[2], const int from_child[2], char* const argv[], char* const envp[],
                bool search_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  const int rc = search_path ? posix_spawnp(pid, argv[0], &actions, nullptr, argv, envp)
                             : posix_spawn(pid, argv[0], &actions, nullptr, argv, envp);
  posix_spawn_file_actions_destroy(&actions);
  ::close(to_child[0]);
  ::close(from_child[1]);
  return rc;
}

}  // namespace troupe::bench
