// `troupe run`, `troupe validate`, `troupe eval`: the experiment launcher (issue: end to end).
#include <memory>
#include <vector>

#include "troupe/launch/commands.h"

namespace troupe::launch {

Command add_run_command(CLI::App& root) {
  struct Opts {
    std::string config;
    std::vector<std::string> sets;
    std::string resume;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("run", "Run an experiment described by a YAML file (alone or under mpirun)");
  app->add_option("config", o->config, "Experiment YAML")->required();
  app->add_option("--set", o->sets, "Override a key: --set grpo.max_steps=10 (repeatable)");
  app->add_option("--resume", o->resume, "Resume the run in this run directory from its latest checkpoint");
  return {app, [o]() { return report_error(make_error(ErrorCode::internal, "troupe run is not implemented yet")); }};
}

Command add_validate_command(CLI::App& root) {
  auto config = std::make_shared<std::string>();
  auto* app = root.add_subcommand("validate", "Check an experiment YAML without running it");
  app->add_option("config", *config, "Experiment YAML")->required();
  return {app, [config]() { return report_error(make_error(ErrorCode::internal, "troupe validate is not implemented yet")); }};
}

Command add_eval_command(CLI::App& root) {
  struct Opts {
    std::string config, checkpoint;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("eval", "Held-out metrics of a checkpoint, as one JSON object");
  app->add_option("config", o->config, "Experiment YAML")->required();
  app->add_option("--checkpoint", o->checkpoint, "Model directory (a checkpoint)")->required();
  return {app, [o]() { return report_error(make_error(ErrorCode::internal, "troupe eval is not implemented yet")); }};
}

}  // namespace troupe::launch
