// A verifiers taskset's own tasks (verifiers_tasks.h): envs/python/verifiers_tasks.py writes them
// as JSON lines into a temporary file, which is read here and removed; its stderr is in its log
// (a run's logs/ when the spec has one) and quoted when it fails or takes past startup_timeout_s.
#include "verifiers_tasks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "child_process.h"
#include "troupe/base/build_config.h"
#include "troupe/base/clock.h"

namespace troupe::envs::detail {

Result<std::vector<json>> load_verifiers_taskset(const EnvSpec& spec, const json& taskset, const std::string& python,
                                                 int max_tasks, const std::string& where) {
  static std::atomic<int> counter{0};
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("troupe-vf-tasks-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".jsonl"))
                              .string();
  ChildOptions o;
  o.argv = {python, std::string(TROUPE_SOURCE_DIR) + "/envs/python/verifiers_tasks.py", taskset.dump(), out};
  if (max_tasks > 0) o.argv.insert(o.argv.end(), {"--max-tasks", std::to_string(max_tasks)});
  o.env.assign(spec.environment.begin(), spec.environment.end());
  o.cwd = spec.cwd;
  o.stdout_to_null = true;
  place_log(o, spec.log_dir, spec.name + "-tasks");
  ChildProcess loader;
  TROUPE_TRY(loader.start(std::move(o), where + ": config.taskset"));
  const auto t0 = MonoClock::now();
  while (loader.alive()) {
    if (seconds_since(t0) > spec.startup_timeout_s) {
      loader.stop(1.0, SIGTERM);
      std::filesystem::remove(out);
      return make_error(ErrorCode::timeout, where + ": config.taskset: loading its tasks took past startup_timeout_s " +
                                                std::to_string(spec.startup_timeout_s) + " s" + loader.log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int status = loader.exit_status();
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::filesystem::remove(out);
    return invalid_input(where + ": config.taskset: " + loader.command_text() + " " + describe_wait_status(status) +
                         loader.log_tail());
  }
  std::vector<json> tasks;
  std::ifstream in(out);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::filesystem::remove(out);
      return invalid_input(where + ": config.taskset: line " + std::to_string(line_no) + " of the loaded tasks is not a mapping");
    }
    tasks.push_back(std::move(j));
  }
  std::filesystem::remove(out);
  return tasks;
}

}  // namespace troupe::envs::detail
