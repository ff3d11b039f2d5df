// `troupe validate`'s env check: every built-in env of the config is made as a run would make it
// (its config read, the dataset env's files read row by row), without starting anything else, so
// data that `run` would refuse is refused here first, naming the file and line; and each must give a
// held-out prompt, as evaluation will ask it to.
#include "troupe/envs/registry.h"
#include "troupe/launch/run.h"
#include "run/steps.h"

namespace troupe::launch {

Status check_env_data(const LoadedConfig& loaded) {
  TROUPE_ASSIGN_OR_RETURN(auto specs, actors::env_specs(loaded.config, run::base_dir_of(loaded.file)));
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    if (spec.type != envs::EnvType::builtin) continue;
    const std::string which = "envs[" + std::to_string(i) + "] (" + spec.name + "): ";
    auto env = envs::EnvRegistry::global().create(spec.env.empty() ? spec.name : spec.env, spec.config);
    if (!env.ok()) return make_error(env.error().code, which + env.error().message);
    // evaluation draws from the held-out split, and an eval that cannot be drawn stops the run
    TROUPE_TRY((*env)->setup());
    envs::ResetOptions held_out;
    held_out.split = envs::Split::eval;
    auto first = (*env)->reset(0, held_out);
    (*env)->release();
    (*env)->teardown();
    if (!first.ok())
      return invalid_input(which + "its held-out split cannot be drawn, which evaluation needs (" + first.error().message +
                           "; the dataset env: give an eval file or an eval_fraction above 0)");
  }
  return {};
}

}  // namespace troupe::launch
