// Private helper of the verifiers client: a taskset's own tasks (its load()), read by running
// envs/python/verifiers_tasks.py (verifiers is Python) as a child process, with the env's
// environment and cwd. Invariant: it returns every task of the taskset, or an error quoting why not.
#pragma once

#include <string>
#include <vector>

#include "troupe/envs/client.h"

namespace troupe::envs::detail {

// `taskset` is the taskset's config ({id, ...}); `python` runs the script; at most max_tasks
// tasks (0 = all; an unbounded taskset needs it); the loader gets startup_timeout_s.
Result<std::vector<json>> load_verifiers_taskset(const EnvSpec& spec, const json& taskset, const std::string& python,
                                                 int max_tasks, const std::string& where);

}  // namespace troupe::envs::detail
