// `troupe bench SUITE [--quick] [--filter CASE]`: dispatches to one suite in launch/bench/.
#include <map>
#include <memory>

#include "troupe/bench/bench.h"
#include "troupe/launch/commands.h"

namespace troupe::launch {

Command add_bench_command(CLI::App& root) {
  struct Opts {
    std::string suite;
    bench::BenchOptions bench;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("bench", "Measure troupe against its baselines (JSON lines on stdout)");
  app->add_option("suite", o->suite, "runtime | policy | kernels | envs | learner | e2e | reliability | weight_sync | scale")
      ->required()
      ->check(CLI::IsMember({"runtime", "policy", "kernels", "envs", "learner", "e2e", "reliability", "weight_sync", "scale"}));
  app->add_flag("--quick", o->bench.quick, "Fewer repetitions (>= 5 per figure, 2 for the SmolLM2-sized policy rows and the SmolLM2 serving row; each row says its reps); every case still runs");
  app->add_option("--filter", o->bench.filter, "Only cases whose name contains this text");
  app->add_option("--reps", o->bench.reps, "Repetitions per figure (>= 5)")->check(CLI::Range(5, 1000));
  return {app, [o]() -> int {
            static const std::map<std::string, int (*)(const bench::BenchOptions&)> suites = {
                {"runtime", bench::run_runtime_suite}, {"policy", bench::run_policy_suite},
                {"kernels", bench::run_kernels_suite}, {"envs", bench::run_envs_suite},
                {"learner", bench::run_learner_suite}, {"e2e", bench::run_e2e_suite},
                {"reliability", bench::run_reliability_suite}, {"weight_sync", bench::run_weight_sync_suite},
                {"scale", bench::run_scale_suite},
            };
            return suites.at(o->suite)(o->bench);
          }};
}

}  // namespace troupe::launch
