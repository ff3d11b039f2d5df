// `troupe validate`'s env check: every built-in env of the config is made as a run would make it
// (its config read, the dataset env's files read row by row), without starting anything else, so
// data that `run` would refuse is refused here first, naming the file and line.
#include "troupe/envs/registry.h"
#include "troupe/launch/run.h"
#include "run/steps.h"

namespace troupe::launch {

Status check_env_data(const LoadedConfig& loaded) {
  TROUPE_ASSIGN_OR_RETURN(auto specs, actors::env_specs(loaded.config, run::base_dir_of(loaded.file)));
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    if (spec.type != envs::EnvType::builtin) continue;
    auto env = envs::EnvRegistry::global().create(spec.env.empty() ? spec.name : spec.env, spec.config);
    if (!env.ok())
      return make_error(env.error().code, "envs[" + std::to_string(i) + "] (" + spec.name + "): " + env.error().message);
  }
  return {};
}

}  // namespace troupe::launch
